"""Compile time per stage of a GPT-like training step, at model depth.

The step is ``benchmarks/comm_volume.py``'s: pre-LN transformer layers (attention and
MLP, Megatron tensor parallelism), a mean-square loss, ``graph.backward`` and AdamW, on a
dp × tp = 2 × 2 virtual mesh. For each layer count the script traces the step, then
times each compile stage (``tessera.driver.STAGES``) in order on a copy of the previous
stage, and prints the seconds and the number of ops after each stage. Nothing runs.

    python benchmarks/compile_stages.py                      # graph, sharded, partitioned
    python benchmarks/compile_stages.py --layers 2 4 --stages graph sharded partitioned schedule tile

A stage's time should grow linearly with the layer count (see issue 17).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import comm_volume

from tessera import dist
from tessera.driver import STAGES


def measure(layers: int, stages: list[str], dims: tuple[int, int, int, int]) -> dict[str, float]:
    batch, seq, dim, heads = dims
    params = {
        k: torch.empty(v.shape)
        for k, v in comm_volume.layer_params(dim, layers, materialize=False).items()
    }
    step = comm_volume.training_step(dist.mesh({"dp": 2, "tp": 2}), 0, layers, heads, True)
    began = time.perf_counter()
    lowered = step.lower(step.init(params), torch.empty(batch, seq, dim))
    row: dict[str, float] = {"trace s": time.perf_counter() - began}
    row["traced ops"] = sum(1 for _ in lowered.module_at("traced").walk())
    for stage in STAGES[1 : STAGES.index(stages[-1]) + 1]:
        began = time.perf_counter()
        module = lowered.module_at(stage)
        if stage in stages:
            row[f"{stage} s"] = time.perf_counter() - began
            row[f"{stage} ops"] = sum(1 for _ in module.walk())
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[2, 4, 8, 16])
    parser.add_argument("--stages", nargs="+", default=["graph", "sharded", "partitioned"])
    parser.add_argument(
        "--dims", type=int, nargs=4, default=[4, 64, 256, 4], metavar=("B", "T", "C", "HEADS")
    )
    args = parser.parse_args()
    unknown = [s for s in args.stages if s not in STAGES[1:]]
    if unknown:
        parser.error(f"unknown stages {unknown}; stages: {', '.join(STAGES[1:])}")
    stages = sorted(args.stages, key=STAGES.index)
    rows = [(layers, measure(layers, stages, tuple(args.dims))) for layers in args.layers]
    columns = list(rows[0][1])
    print(f"GPT-like training step, dp × tp = 2 × 2, (B, T, C, heads) = {tuple(args.dims)}")
    print("| layers | " + " | ".join(columns) + " |")
    print("|---:|" + "---:|" * len(columns))
    for layers, row in rows:
        cells = [f"{row[c]:.2f}" if c.endswith(" s") else f"{int(row[c])}" for c in columns]
        print(f"| {layers} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
