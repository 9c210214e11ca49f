"""A dp x tp = 2 x 2 training step over four processes (gloo), its layers unrolled, as
graph.region calls (stacked by the step and rolled into one scan, and kept as calls:
``scan_layers=False``) and as one graph.scan over stacked parameters: on every process
the four give the same losses (float32, relative tolerance 1e-5), and the stacked
step's state holds each layer's shard as a view into its stack's. The ZeRO stage is the
first argument (default 0)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
import comm_volume

from tessera import dist

LAYERS, STEPS = 3, 2
ZERO = int(sys.argv[1]) if len(sys.argv) > 1 else 0


def losses(mode: str) -> list[float]:
    mesh = dist.mesh({"dp": 2, "tp": 2})
    if mode == "scan":
        step = comm_volume.scan_training_step(mesh, ZERO, 4)
        params = comm_volume.stacked(comm_volume.layer_params(32, LAYERS), LAYERS)
    else:
        regions, stacked = mode in ("regions", "calls"), mode == "regions"
        step = comm_volume.training_step(
            mesh, ZERO, LAYERS, 4, True, regions, scan_layers=stacked
        )
        params = comm_volume.layer_params(32, LAYERS)
    state = step.init(params)
    x = torch.randn(4, 8, 32, generator=torch.Generator().manual_seed(5))
    found = [float(step(state, x)["loss"]) for _ in range(STEPS)]
    if mode == "regions":  # this rank's shard of each layer: a view into its stack's
        rank = int(os.environ["RANK"])
        pieces = [state.params[f"w1{i}"].local(rank) for i in range(LAYERS)]
        assert all(p._base is pieces[0]._base is not None for p in pieces), mode
    return found


def main() -> None:
    rank = int(os.environ["RANK"])
    found = {mode: losses(mode) for mode in ("unrolled", "regions", "calls", "scan")}
    reference = found["unrolled"]
    for mode, values in found.items():
        for a, b in zip(values, reference, strict=True):
            assert abs(a - b) <= 1e-5 * abs(b), f"rank {rank}: {mode} losses {values} vs {reference}"
    print(f"rank {rank}: unrolled, regions, calls and scan losses {reference} agree", flush=True)


if __name__ == "__main__":
    main()
