#!/usr/bin/env bash
# The whole test suite: ruff, the import-layer contracts (import-linter, pyproject.toml),
# pytest (tests/unit) and lit (tests/lit).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/scripts/setup-env.sh"
cd "$root"
export TRITON_INTERPRET="${TRITON_INTERPRET:-1}"
echo "== ruff"
ruff check .
echo "== import layers"
lint-imports
echo "== pytest"
python -m pytest tests/unit -p no:cacheprovider "$@"
echo "== lit"
lit -sv tests/lit
