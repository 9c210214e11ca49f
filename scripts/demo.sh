#!/usr/bin/env bash
# The main demo: traces the GPT block example, prints its Graph IR, checks it vs torch.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/scripts/setup-env.sh"
cd "$root"
python examples/gpt_block.py "$@"
