"""A whole training step in one program: forward, ``graph.backward`` and an optimizer
update (``optim.adamw`` / ``optim.sgd``), against torch.optim in float64."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import tessera as ts
from tessera import dist, graph, op, optim


def model(p, x):
    return op.gelu(x @ p["w1"] + p["b1"]) @ p["w2"]


def torch_loss(p, x, y):
    return ((F.gelu(x @ p["w1"] + p["b1"]) @ p["w2"] - y) ** 2).mean()


def setup(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    params = {
        "w1": torch.randn(8, 16, generator=g) / 3,
        "b1": torch.zeros(16),
        "w2": torch.randn(16, 4, generator=g) / 4,
    }
    return params, torch.randn(32, 8, generator=g), torch.randn(32, 4, generator=g)


@pytest.mark.parametrize("kernels", ["reference", "triton"])
def test_adamw_steps_match_torch(kernels: str) -> None:
    @ts.jit(kernels=kernels)
    def step(p, state, x, y):
        loss = op.mean((model(p, x) - y) ** 2)
        grads = graph.backward(loss, p)
        p, state = optim.adamw(p, grads, state, lr=1e-2)
        return p, state, loss

    params, x, y = setup()
    state = optim.adamw_state(params)
    ref = {k: v.double().clone().requires_grad_() for k, v in params.items()}
    opt = torch.optim.AdamW(ref.values(), lr=1e-2, weight_decay=1e-2)
    losses = []
    for _ in range(4):
        params, state, loss = step(params, state, x, y)
        opt.zero_grad()
        want = torch_loss(ref, x.double(), y.double())
        want.backward()
        opt.step()
        assert abs(loss.item() - want.item()) <= 1e-5 * max(1.0, want.item())
        losses.append(loss.item())
    assert losses == sorted(losses, reverse=True)  # the loss decreases
    for name in params:
        assert (params[name].double() - ref[name]).abs().max().item() <= 1e-5
    assert step.trace_count == 1  # state and parameters keep their signature


def test_sgd_with_momentum_on_a_data_parallel_mesh() -> None:
    """Data split over dp: the weight gradients are partial over dp and the sharding
    passes all-reduce them; no synchronisation is written in the step."""
    mesh = dist.Mesh(axes=["dp"], shape=(2,))
    rows = dist.ShardSpec(partition=(0,), mesh_axes=("dp",))

    def step(p, state, x, y):
        loss = op.mean((model(p, x) - y) ** 2)
        p, state = optim.sgd(p, graph.backward(loss, p), state, lr=0.1, momentum=0.9)
        return p, state, loss

    f = ts.jit(step, mesh=mesh, in_shardings=(None, None, rows, rows), kernels="reference")
    params, x, y = setup(1)
    state = optim.sgd_state(params)
    kinds = {(c.kind, c.mesh_axes) for c in f.lower(params, state, x, y).collectives()}
    assert ("all_reduce", ("dp",)) in kinds
    ref = {k: v.double().clone().requires_grad_() for k, v in params.items()}
    opt = torch.optim.SGD(ref.values(), lr=0.1, momentum=0.9)
    for _ in range(3):
        params, state, _ = f(params, state, x, y)
        opt.zero_grad()
        torch_loss(ref, x.double(), y.double()).backward()
        opt.step()
    for name in params:
        assert (params[name].double() - ref[name]).abs().max().item() <= 1e-5


def test_backward_errors() -> None:
    with pytest.raises(ts.TraceError, match="float scalar"):
        ts.jit(lambda x: graph.backward(x * 2, x))(torch.ones(3))
