#!/usr/bin/env bash
# The GPU check: every measurement a lent GPU should give, in one run of about 8 minutes
# on an H100, from the repository root, without network or installs (python from $PYTHON,
# else .venv/bin/python when there is one, else python on PATH).
#
#   scripts/device_check.sh [--dry-run] [--output FILE]
#
# Writes one markdown file (FILE; default $OUT/device_check.md when $OUT is set, else
# device_check.md) and echoes it: the environment, then (a) the GPU tests, (b)
# benchmarks/kernels.py, (c) attention forward and backward vs torch SDPA, (d) a GPT
# training step's tokens/s and MFU, (e) CUDA graphs vs plain dispatch. Each step has its
# own timeout; a step that fails or times out is recorded ("FAILED: ...") and the next
# one runs. --dry-run runs the same steps on the CPU at tiny sizes (Triton's interpreter;
# GPU-only steps recorded as "skipped: no CUDA"), which is how the script is tested.
# Exit status: 0 when no step failed.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

dry=0
file=""
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) dry=1 ;;
    --output) file="$2"; shift ;;
    -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "device_check.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
file="${file:-${OUT:+$OUT/}device_check.md}"
mkdir -p "$(dirname "$file")"
file="$(cd "$(dirname "$file")" && pwd)/$(basename "$file")"  # relative to the caller's directory
cd "$root"
if [ -n "${PYTHON:-}" ]; then py="$PYTHON"
elif [ -x "$root/.venv/bin/python" ]; then py="$root/.venv/bin/python"
else py="$(command -v python || command -v python3)"
fi
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
if [ "$dry" = 1 ]; then  # the CPU path, even on a machine with a GPU
  export CUDA_VISIBLE_DEVICES="" TRITON_INTERPRET=1
fi

: > "$file"
emit() { tee -a "$file"; }          # stdin to the file and to stdout
say() { printf '%s\n' "$@" | emit; }  # one line per argument
failures=0
started=$SECONDS
last_output=""  # the stdout of the last step

# step TITLE SECONDS FORMAT COMMAND...: runs COMMAND under its timeout; FORMAT "table"
# copies its stdout as is (markdown), "text" inside a code block
step() {
  local title="$1" limit="$2" format="$3"; shift 3
  local log err rc began=$SECONDS
  log="$(mktemp)" err="$(mktemp)"
  say "" "## $title" "" "\`$*\` (timeout ${limit} s)" ""
  timeout -k 10 "$limit" "$@" >"$log" 2>"$err"
  rc=$?
  last_output="$(cat "$log")"
  if [ "$format" = text ]; then { echo '```text'; tail -n 60 "$log"; echo '```'; } | emit
  else emit < "$log"
  fi
  if [ "$rc" = 0 ]; then
    say "" "ok in $((SECONDS - began)) s"
  else
    failures=$((failures + 1))
    if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then say "" "FAILED: timed out after ${limit} s"
    else say "" "FAILED: exit status $rc after $((SECONDS - began)) s"
    fi
    { echo '```text'; tail -n 30 "$err"; echo '```'; } | emit
  fi
  rm -f "$log" "$err"
}

skip() { say "" "## $1" "" "skipped: $2"; }

say "# Tessera device check ($(date -u +%Y-%m-%dT%H:%MZ)$([ "$dry" = 1 ] && echo ', dry run on the CPU'))"
step "Environment" 60 text "$py" scripts/device_info.py
if [ "$dry" = 0 ] && ! grep -q '^device ' <<<"$last_output"; then  # device_info.py found none
  say "" "FAILED: no CUDA device; nothing measured (scripts/device_check.sh --dry-run runs the steps on the CPU)"
  exit 1
fi

A="(a) GPU tests"
B="(b) Generated kernels vs torch (benchmarks/kernels.py)"
C="(c) Attention forward and backward vs torch SDPA"
D="(d) GPT training step on one GPU: tokens/s and MFU"
E="(e) CUDA graphs vs plain dispatch"
if [ "$dry" = 1 ]; then
  skip "$A" "no CUDA"
  skip "$B" "no CUDA"
  step "$C" 60 table "$py" benchmarks/attention_vs_sdpa.py --tiny --causal only
  step "$D" 90 table "$py" benchmarks/gpt_step.py --tiny
  step "$E" 60 table "$py" benchmarks/cuda_graphs.py --tiny
else
  step "$A" 150 text "$py" -m pytest -q -rs -p no:cacheprovider tests/unit/test_gpu.py tests/unit/test_cuda_graphs.py
  step "$B" 80 table "$py" benchmarks/kernels.py --quick --only matmul,memory
  step "$C" 90 table "$py" benchmarks/attention_vs_sdpa.py --shape 4x16x2048x64 --causal only
  # default block configurations: tuning every kernel of the step takes minutes
  step "$D" 100 table env TESSERA_AUTOTUNE=0 "$py" benchmarks/gpt_step.py
  step "$E" 50 table "$py" benchmarks/cuda_graphs.py
fi
say "" "## Summary" ""
if [ "$failures" = 0 ]; then say "every step passed in $((SECONDS - started)) s"
else say "$failures step(s) FAILED; $((SECONDS - started)) s"
fi
[ "$failures" = 0 ]
