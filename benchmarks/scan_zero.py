"""ZeRO stages on a training step whose layers are one ``graph.scan`` or ``graph.region``
calls, against the same layers unrolled: per-rank peak memory, the dp collectives and
the bytes they move.

The step is ``benchmarks/comm_volume.py``'s (pre-LN transformer layers with Megatron
tensor parallelism, a mean-square loss, ``graph.backward`` and AdamW) on a dp × tp =
2 × 2 virtual mesh; ``regions`` makes each layer a call of one ``graph.region`` (which
the training step stacks and rolls into one scan: ``tessera.training.layer_stacks``),
``calls`` the same kept as calls (``scan_layers=False``), ``scan`` stacks each parameter over the layers and steps one ``graph.scan`` over them.
For each layer count, ZeRO stage and form it compiles the step to its schedule (nothing
runs) and prints ``plan-memory``'s per-rank peak, the dp collectives by kind (a scan's
step counted once per layer), the bytes they move per rank (in their dtypes), and the
step time ``tessera.perf`` simulates (DGX H100).

    python benchmarks/scan_zero.py                     # 8 and 32 layers, width 256
    python benchmarks/scan_zero.py --layers 4 --dim 64
    python benchmarks/scan_zero.py --precision bf16 --accumulate 2 --forms regions scan
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


def measure(layers: int, zero: int, form: str, args: argparse.Namespace) -> dict[str, object]:
    """Peak bytes, dp collective counts, dp bytes received per rank and simulated seconds
    (``form``: unrolled, regions, calls or scan)."""
    mesh = dist.mesh({"dp": 2, "tp": 2})
    shapes = comm_volume.layer_params(args.dim, layers, materialize=False)
    params = {k: torch.empty(v.shape) for k, v in shapes.items()}
    options = {"precision": args.precision, "accumulate": args.accumulate}
    if form == "scan":
        params = comm_volume.stacked(params, layers)
        step = comm_volume.scan_training_step(mesh, zero, args.heads, **options)
    else:
        regions = form in ("regions", "calls")
        step = comm_volume.training_step(
            mesh, zero, layers, args.heads, True, regions, scan_layers=form != "calls", **options
        )
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
    parser.add_argument("--precision", default=None, help="the step's precision (bf16, fp16...)")
    parser.add_argument("--accumulate", type=int, default=1, help="microbatches per step")
    parser.add_argument("--forms", nargs="+", default=["unrolled", "scan"],
                        choices=["unrolled", "regions", "calls", "scan"])  # fmt: skip
    args = parser.parse_args()
    print(
        f"dp × tp = 2 × 2, hidden {args.dim}, {args.heads} heads, batch {args.batch}, "
        f"sequence {args.seq}, AdamW, precision {args.precision or 'f32'}, "
        f"{args.accumulate} microbatch(es); compiled, not run"
    )
    print("| layers | zero | layers as | peak MiB/rank | dp collectives | dp MiB received/rank "
          "| step ms (sim.) |")
    print("|---:|---:|---|---:|---|---:|---:|")
    for layers in args.layers:
        for zero in (0, 1, 2, 3):
            for form in args.forms:
                row = measure(layers, zero, form, args)
                kinds = ", ".join(f"{n}× {k}" for k, n in sorted(row["kinds"].items()))  # type: ignore[attr-defined]
                print(
                    f"| {layers} | {zero} | {form} "
                    f"| {row['peak'] / 2**20:.1f} | {kinds} | {row['moved'] / 2**20:.2f} "  # type: ignore[operator]
                    f"| {row['step'] * 1e3:.3f} |",  # type: ignore[operator]
                    flush=True,
                )


if __name__ == "__main__":
    main()
