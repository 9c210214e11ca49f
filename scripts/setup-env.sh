#!/usr/bin/env bash
# Creates (or reuses) .venv and installs Tessera with its dev tools. Sourced by the
# README's commands; safe to run again. Installs the CPU build of torch first when torch
# is absent, so pip does not pull a multi-GB CUDA build.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${TESSERA_VENV:-$root/.venv}"
python="${PYTHON:-python3}"
if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv"
fi
if ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
  "$venv/bin/pip" install --quiet "torch==2.13.0" || "$venv/bin/pip" install --quiet torch \
    --index-url https://download.pytorch.org/whl/cpu
fi
stamp="$venv/.tessera-installed"
if [ ! -f "$stamp" ] || [ "$root/pyproject.toml" -nt "$stamp" ]; then
  "$venv/bin/pip" install --quiet -e "$root[dev]"
  touch "$stamp"
fi
export PATH="$venv/bin:$PATH"
