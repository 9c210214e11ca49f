"""Run under ``tessera run -n 4 training_options.py DIR PRECISION [MESH]``: the step of
:func:`make_step` (MESH ``dp_tp``: dp x tp = 2 x 2 with ZeRO-3; ``pp_dp``: pp x dp =
2 x 2, 1F1B over 2 microbatches, with ZeRO-2; checkpointed blocks recomputed, gradients
clipped by global norm, accumulated microbatches, computing in PRECISION: f32, bf16 or
fp16 with dynamic loss scaling; deterministic numerics) trains three steps; rank 0 saves
the losses, gradient norms (plain floats: every rank holds the metrics' values) and the
whole state to ``DIR/state.pt``. The test compares them bit for bit with the same
training on the virtual mesh (reference kernels)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import torch

from tessera import dist, graph, op, optim, schedule

COLS = dist.ShardSpec(partition=(1,), mesh_axes=("tp",))
ROWS = dist.ShardSpec(partition=(0,), mesh_axes=("tp",))


@graph.checkpoint
def block(p: Any, x: Any) -> Any:
    return x + op.gelu(op.layer_norm(x) @ p["w1"]) @ p["w2"]


def make_step(precision: str = "f32", mesh: str = "dp_tp") -> Any:
    pipelined = mesh == "pp_dp"
    layout = dict(mesh=dist.mesh({"pp": 2, "dp": 2}), zero=2, accumulate=2) if pipelined else dict(
        mesh=dist.mesh({"dp": 2, "tp": 2}), zero=3, accumulate=4,
        param_shardings=[{"w1": COLS, "w2": ROWS}] * 2)  # fmt: skip

    @graph.training_step(optimizer=optim.AdamW(lr=1e-2), kernels="reference", remat="nothing",
                         clip_grad_norm=0.5, precision=precision, numerics="deterministic",
                         **layout)  # fmt: skip
    def step(params: Any, x: Any, y: Any) -> Any:
        for p in params:
            x = block(p, x)
        loss = op.mean(op.astype((x - y) ** 2, "float32"))
        return graph.backward(loss), {"loss": loss}

    return step


def initial() -> tuple[list[dict[str, torch.Tensor]], torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    params = [
        {"w1": torch.randn(8, 32, generator=g) / 2, "w2": torch.randn(32, 8, generator=g) / 4}
        for _ in range(2)
    ]
    return params, torch.randn(64, 8, generator=g), torch.randn(64, 8, generator=g)


def train(step: Any, state: Any, x: torch.Tensor, y: torch.Tensor) -> list[tuple[float, float]]:
    """Three steps' (loss, gradient norm before clipping)."""
    out = []
    with schedule.options(pipeline_microbatches=2, pipeline_schedule="1f1b"):
        for _ in range(3):
            metrics = step(state, x, y)
            out.append(tuple(float(metrics[k]) for k in ("loss", "grad_norm")))
    return out


def main() -> None:
    folder = Path(sys.argv[1])
    step = make_step(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else "dp_tp")
    params, x, y = initial()
    state = step.init(params)
    metrics = train(step, state, x, y)
    whole = step.state_dict(state)  # a collective: every rank
    if int(os.environ["RANK"]) == 0:
        torch.save({"metrics": metrics, "state": whole}, folder / "state.pt")
    print(f"rank {os.environ['RANK']} OK", flush=True)


if __name__ == "__main__":
    main()
