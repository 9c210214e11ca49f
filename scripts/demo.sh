#!/usr/bin/env bash
# The main demo: the GPT block (Graph IR, checked vs torch) and the Megatron MLP sharded
# over a 2 x 4 virtual mesh (partitioned IR, its one all-reduce, checked vs torch), then
# 10 ZeRO-2 training steps of a small GPT on a 2 x 2 mesh, each loss checked vs torch.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/scripts/setup-env.sh"
cd "$root"
python examples/gpt_block.py "$@"
python examples/megatron_mlp.py
python examples/train_gpt.py --steps 10 --zero 2
