"""ZeRO stages on a training step whose layers are one ``graph.scan``, against the same
layers unrolled: per-rank peak memory, the dp collectives and the bytes they move.

The step is ``benchmarks/comm_volume.py``'s (pre-LN transformer layers with Megatron
tensor parallelism, a mean-square loss, ``graph.backward`` and AdamW) on a dp × tp =
2 × 2 virtual mesh; ``scan`` stacks each parameter over the layers and steps one
``graph.scan`` over them. For each layer count, ZeRO stage and form it compiles the step
to its schedule (nothing runs) and prints ``plan-memory``'s per-rank peak, the dp
collectives of the schedule by kind (a scan's step counted once per layer), the bytes
they move per rank, and the step time ``tessera.perf`` simulates (DGX H100).

    python benchmarks/scan_zero.py                     # 8 and 32 layers, width 256
    python benchmarks/scan_zero.py --layers 4 --dim 64
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import comm_volume
from comm_volume import received

from tessera import dist
from tessera.backends.collective_info import collectives


def measure(layers: int, zero: int, scan: bool, args: argparse.Namespace) -> dict[str, object]:
    """Peak bytes, dp collective counts, dp bytes received per rank and simulated seconds."""
    mesh = dist.mesh({"dp": 2, "tp": 2})
    shapes = comm_volume.layer_params(args.dim, layers, materialize=False)
    params = {k: torch.empty(v.shape) for k, v in shapes.items()}
    if scan:
        params = comm_volume.stacked(params, layers)
        step = comm_volume.scan_training_step(mesh, zero, args.heads)
    else:
        step = comm_volume.training_step(mesh, zero, layers, args.heads, True)
    lowered = step.lower(step.init(params), torch.empty(args.batch, args.seq, args.dim))
    moves = [i for i in collectives(lowered.module_at("schedule")) if "dp" in i.mesh_axes]
    return {
        "peak": lowered.memory().peak_bytes,
        "kinds": Counter(i.kind for i in lowered.collectives() if "dp" in i.mesh_axes),
        "moved": received(moves),
        "step": lowered.simulate().step_time_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--batch", type=int, default=4)
    args = parser.parse_args()
    print(
        f"dp × tp = 2 × 2, hidden {args.dim}, {args.heads} heads, batch {args.batch}, "
        f"sequence {args.seq}, AdamW, f32; compiled, not run"
    )
    print("| layers | zero | layers as | peak MiB/rank | dp collectives | dp MiB received/rank "
          "| step ms (sim.) |")
    print("|---:|---:|---|---:|---|---:|---:|")
    for layers in args.layers:
        for zero in (0, 1, 2, 3):
            for scan in (False, True):
                row = measure(layers, zero, scan, args)
                kinds = ", ".join(f"{n}× {k}" for k, n in sorted(row["kinds"].items()))  # type: ignore[attr-defined]
                print(
                    f"| {layers} | {zero} | {'scan' if scan else 'unrolled'} "
                    f"| {row['peak'] / 2**20:.1f} | {kinds} | {row['moved'] / 2**20:.2f} "  # type: ignore[operator]
                    f"| {row['step'] * 1e3:.3f} |",  # type: ignore[operator]
                    flush=True,
                )


if __name__ == "__main__":
    main()
