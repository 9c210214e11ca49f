#!/usr/bin/env bash
# The whole test suite: ruff, the import-layer contracts (import-linter, pyproject.toml),
# pytest (tests/unit) and lit (tests/lit).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/scripts/setup-env.sh"
cd "$root"
export TRITON_INTERPRET="${TRITON_INTERPRET:-1}"
export PYTHONUNBUFFERED=1  # progress reaches a log file as it happens, not when a buffer fills
echo "== ruff"
ruff check .
echo "== import layers"
lint-imports
echo "== pytest"
# one worker per CPU (pytest-xdist), each test file kept on one worker (its module
# fixtures built once); TESSERA_TEST_WORKERS=0 runs in this process
python -m pytest tests/unit -p no:cacheprovider -n "${TESSERA_TEST_WORKERS:-auto}" --dist loadfile "$@"
echo "== lit"
# -v, no -s: a flushed "PASS: <test> (i of n)" line as each test finishes (-s shows only a
# progress bar, nothing line by line when the output goes to a file); failures in full
lit -v tests/lit
