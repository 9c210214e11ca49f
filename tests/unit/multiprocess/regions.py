"""A dp x tp = 2 x 2 training step over four processes (gloo), its layers unrolled, as
graph.region calls and as one graph.scan over stacked parameters: on every process the
three give the same losses (float32, relative tolerance 1e-5). The ZeRO stage is the
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
        step = comm_volume.training_step(mesh, ZERO, LAYERS, 4, True, mode == "regions")
        params = comm_volume.layer_params(32, LAYERS)
    state = step.init(params)
    x = torch.randn(4, 8, 32, generator=torch.Generator().manual_seed(5))
    return [float(step(state, x)["loss"]) for _ in range(STEPS)]


def main() -> None:
    rank = int(os.environ["RANK"])
    found = {mode: losses(mode) for mode in ("unrolled", "regions", "scan")}
    reference = found["unrolled"]
    for mode, values in found.items():
        for a, b in zip(values, reference, strict=True):
            assert abs(a - b) <= 1e-5 * abs(b), f"rank {rank}: {mode} losses {values} vs {reference}"
    print(f"rank {rank}: unrolled, regions and scan losses {reference} agree", flush=True)


if __name__ == "__main__":
    main()
