#!/usr/bin/env bash
# Creates (or reuses) .venv and installs Tessera with its dev tools. Sourced by the
# README's commands; safe to run again. When torch is absent it installs torch==2.13.0:
# on a machine without an NVIDIA GPU (no nvidia-smi, no /proc/driver/nvidia) the CPU build
# from PyTorch's CPU index, so pip does not pull a multi-GB CUDA build; with a GPU the
# default index's (CUDA) build. Either way it falls back to the other index, and then to
# the newest torch the index has (pyproject.toml asks for torch>=2.4).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${TESSERA_VENV:-$root/.venv}"
python="${PYTHON:-python3}"
if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv"
fi
torch_pin="torch==2.13.0"
cpu_index=(--index-url https://download.pytorch.org/whl/cpu)
if ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1 || [ -e /proc/driver/nvidia ]; then
    first=() second=("${cpu_index[@]}")   # an NVIDIA GPU: the CUDA build first
  else
    first=("${cpu_index[@]}") second=()   # none: the CPU build first
  fi
  "$venv/bin/pip" install --quiet "$torch_pin" ${first[@]+"${first[@]}"} \
    || "$venv/bin/pip" install --quiet "$torch_pin" ${second[@]+"${second[@]}"} \
    || "$venv/bin/pip" install --quiet torch ${first[@]+"${first[@]}"}
fi
stamp="$venv/.tessera-installed"
if [ ! -f "$stamp" ] || [ "$root/pyproject.toml" -nt "$stamp" ]; then
  "$venv/bin/pip" install --quiet -e "$root[dev]"
  touch "$stamp"
fi
export PATH="$venv/bin:$PATH"
