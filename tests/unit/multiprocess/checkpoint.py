"""Run under ``tessera run -n N checkpoint.py MODE DIR``: trains the model of
:func:`make_step` for two steps, then rank 0 saves ``step.state_dict(state)`` to
``DIR/two_steps.pt``; every rank resumes from the state dict rank 0 saved and trains one
more step, and rank 0 saves ``DIR/three_steps.pt``. The test compares both files with
the same training on the virtual mesh.

MODE: ``zero3`` (-n 4: a 2 x 2 dp x tp mesh, ZeRO-3: every parameter and optimizer
tensor split over dp and tp) or ``pipeline`` (-n 2: two pipeline stages).

Each rank also checks the per-rank contract: the state holds this rank's shards
(``DistTensor``), whose ``.data`` says how to get the whole value, and the tensors
passed to ``init`` are never written.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as tdist

from tessera import dist, graph, op, optim, schedule
from tessera.dist.tensor import DistTensor
from tessera.errors import ShardingError


def make_step(mode: str) -> Any:
    """The training step of ``mode`` (reference kernels: bit-identical everywhere)."""
    if mode == "pipeline":
        mesh = dist.mesh({"pp": 2})

        @graph.training_step(optimizer=optim.AdamW(lr=1e-2), mesh=mesh, kernels="reference")
        def step(p: Any, x: Any, y: Any) -> Any:
            h = op.tanh(x @ p["w0"])
            graph.stage()
            loss = op.mean((h @ p["w1"] - y) ** 2)
            return graph.backward(loss), {"loss": loss}

        return step
    mesh = dist.mesh({"dp": 2, "tp": 2})
    cols = dist.ShardSpec(partition=(1,), mesh_axes=("tp",))
    rows = dist.ShardSpec(partition=(0,), mesh_axes=("tp",))

    @graph.training_step(optimizer=optim.AdamW(lr=1e-2), mesh=mesh, zero=3, kernels="reference",
                         param_shardings={"w0": cols, "w1": rows})  # fmt: skip
    def step(p: Any, x: Any, y: Any) -> Any:
        out = op.gelu(x @ p["w0"]) @ p["w1"]
        loss = op.mean((out - y) * (out - y))
        return graph.backward(loss), {"loss": loss}

    return step


def initial() -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
    """The parameters and the batch (the same on every rank and in the test)."""
    g = torch.Generator().manual_seed(7)
    params = {"w0": torch.randn(8, 16, generator=g) / 3, "w1": torch.randn(16, 8, generator=g) / 4}
    return params, torch.randn(8, 8, generator=g), torch.randn(8, 8, generator=g)


def train(step: Any, state: Any, x: torch.Tensor, y: torch.Tensor, steps: int) -> None:
    with schedule.options(pipeline_microbatches=2):
        for _ in range(steps):
            step(state, x, y)


def main() -> None:
    mode, folder = sys.argv[1], Path(sys.argv[2])
    rank = int(os.environ["RANK"])
    step = make_step(mode)
    params, x, y = initial()
    before = {k: v.clone() for k, v in params.items()}
    state = step.init(params)
    train(step, state, x, y, 2)
    shard = state.params["w0"]
    assert isinstance(shard, DistTensor), type(shard)
    try:
        _ = shard.data
        raise AssertionError("the global data of a rank's shard is not in this process")
    except ShardingError as error:
        assert "step.gather(state) or step.state_dict(state)" in str(error), error
    assert all(torch.equal(params[k], before[k]) for k in params), "init's tensors were written"
    whole = step.state_dict(state)  # a collective: every rank
    if rank == 0:
        torch.save(whole, folder / "two_steps.pt")
    tdist.barrier()  # the file is written
    saved = torch.load(folder / "two_steps.pt")
    for name, value in whole["params"].items():
        assert torch.equal(saved["params"][name], value), name
    resumed = step.load_state_dict(saved)
    train(step, resumed, x, y, 1)
    whole = step.state_dict(resumed)
    if rank == 0:
        torch.save(whole, folder / "three_steps.pt")
    print(f"rank {rank} OK", flush=True)


if __name__ == "__main__":
    main()
