"""Transforms compose as in JAX: ``ts.jit(ts.grad(f))``, ``ts.grad(ts.jit(f))``, jitted
helpers inside jitted code, ``has_aux``, with the outer ``ts.jit``'s options governing the
whole program. Gradients are checked against ``torch.autograd`` in float64 on random
inputs; programs run in f32 with the generated Triton kernels (interpreted on a CPU):
tolerance 1e-4 relative to the largest reference value."""

from __future__ import annotations

import math

import pytest
import torch

import tessera as ts
from tessera import dist, op, schedule

RTOL = 1e-4


def close(got: torch.Tensor, want: torch.Tensor) -> None:
    scale = max(want.abs().max().item(), 1.0)
    assert tuple(got.shape) == tuple(want.shape)
    assert (got.double() - want).abs().max().item() <= RTOL * scale


def randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def mlp_loss(params, x, y):
    h = op.tanh(x @ params["w1"])
    out = h @ params["w2"]
    return op.mean((out - y) * (out - y))


def torch_mlp_loss(params, x, y):
    out = torch.tanh(x @ params["w1"]) @ params["w2"]
    return ((out - y) ** 2).mean()


def problem(seed: int = 0, batch: int = 8):
    params = {"w1": randn(8, 16, seed=seed) / 3, "w2": randn(16, 4, seed=seed + 1) / 4}
    return params, randn(batch, 8, seed=seed + 2), randn(batch, 4, seed=seed + 3)


def torch_value_and_grads(params, x, y):
    leaves = {k: v.double().requires_grad_() for k, v in params.items()}
    loss = torch_mlp_loss(leaves, x.double(), y.double())
    loss.backward()
    return loss.detach(), {k: v.grad for k, v in leaves.items()}


def test_jit_of_grad() -> None:
    params, x, y = problem()
    grads = ts.jit(ts.grad(mlp_loss))(params, x, y)
    _, want = torch_value_and_grads(params, x, y)
    assert set(grads) == {"w1", "w2"}
    for key in want:
        close(grads[key], want[key])


def test_grad_of_jit() -> None:
    params, x, y = problem(seed=10)
    grads = ts.grad(ts.jit(mlp_loss))(params, x, y)
    _, want = torch_value_and_grads(params, x, y)
    for key in want:
        close(grads[key], want[key])


def test_jit_helper_inside_jit_is_inlined() -> None:
    layer = ts.jit(lambda x, w: op.tanh(x @ w))

    @ts.jit
    def model(x, w1, w2):
        return layer(layer(x, w1), w2)

    x, w1, w2 = randn(4, 8, seed=1), randn(8, 8, seed=2), randn(8, 8, seed=3)
    got = model(x, w1, w2)
    close(got, torch.tanh(torch.tanh(x.double() @ w1.double()) @ w2.double()))
    assert layer.trace_count == 0  # traced into model's program, never compiled alone
    assert model.lower(x, w1, w2).as_text("graph").count("graph.tanh") == 2


def test_value_and_grad_has_aux_and_grad_has_aux() -> None:
    params, x, y = problem(seed=20)

    def loss_and_out(params, x, y):
        out = op.tanh(x @ params["w1"]) @ params["w2"]
        return op.mean((out - y) * (out - y)), {"out": out}

    (loss, aux), grads = ts.jit(ts.value_and_grad(loss_and_out, has_aux=True))(params, x, y)
    want_loss, want = torch_value_and_grads(params, x, y)
    close(loss, want_loss)
    close(aux["out"], torch.tanh(x.double() @ params["w1"].double()) @ params["w2"].double())
    for key in want:
        close(grads[key], want[key])
    grads, aux = ts.grad(loss_and_out, has_aux=True)(params, x, y)
    close(grads["w2"], want["w2"])
    assert set(aux) == {"out"}
    with pytest.raises(ts.TraceError, match="has_aux=True"):
        ts.grad(loss_and_out)(params, x, y)
    with pytest.raises(ts.TraceError, match=r"pair \(loss, aux\)"):
        ts.grad(mlp_loss, has_aux=True)(params, x, y)


def test_grad_inside_traced_code_with_closure_and_second_argument() -> None:
    """A gradient taken in the middle of a traced function: closed-over tensors are
    constants of the differentiated function, and a value used before the call does not
    leak its other uses into the gradient."""
    x, w = randn(6, 5, seed=30), randn(5, 5, seed=31)

    @ts.jit
    def f(x, w):
        h = x * 2.0  # used below and outside the differentiated function
        g = ts.grad(lambda w: op.sum(op.tanh(h @ w)))(w)
        return g + op.sum(h)

    x64, w64 = x.double(), w.double().requires_grad_()
    torch.tanh((2 * x64) @ w64).sum().backward()
    close(f(x, w), w64.grad + (2 * x64).sum())


def test_same_tensor_for_two_differentiated_arguments() -> None:
    x = randn(3, 3, seed=40)
    gx, gy = ts.jit(ts.grad(lambda a, b: op.sum(a * a * b), argnums=(0, 1)))(x, x)
    close(gx, 2 * x.double() * x.double())
    close(gy, x.double() * x.double())

    @ts.jit
    def both(x):
        return ts.grad(lambda a, b: op.sum(a * a * b), argnums=(0, 1))(x, x)

    gx, gy = both(x)
    close(gx, 2 * x.double() * x.double())
    close(gy, x.double() * x.double())


def test_sharded_jit_of_value_and_grad_all_reduces_the_gradients_once() -> None:
    """Data parallelism: batch split over dp, parameters replicated. The gradients come
    out partial over dp and are reduced by exactly one all-reduce of the parameters'
    bytes (plus the scalar loss). The batch is larger than the layers' widths, so
    reducing the weights' gradients moves fewer bytes than gathering activations."""
    params, x, y = problem(seed=50, batch=64)
    mesh = dist.mesh({"dp": 2})
    batch = dist.ShardSpec(partition=(0,), mesh_axes=("dp",))
    step = ts.jit(
        ts.value_and_grad(mlp_loss),
        mesh=mesh,
        in_shardings=(dist.ShardSpec(replicate=True), batch, batch),
    )
    loss, grads = step(params, x, y)
    want_loss, want = torch_value_and_grads(params, x, y)
    close(loss, want_loss)
    for key in want:
        close(grads[key], want[key])
    collectives = step.lower(params, x, y).collectives()
    assert {c.kind for c in collectives} == {"all_reduce"}
    assert all(c.mesh_axes == ("dp",) for c in collectives)
    param_bytes = sum(p.numel() * 4 for p in params.values())
    assert sum(c.nbytes for c in collectives) == param_bytes + 4  # gradients + the loss


def test_sharded_composition_matches_unsharded() -> None:
    """ts.grad inside a tensor-parallel ts.jit, and a sharded jitted helper inside it."""
    params, x, y = problem(seed=60)
    mesh = dist.mesh({"tp": 2})
    cols = dist.ShardSpec(partition=(1,), mesh_axes=("tp",))
    rows = dist.ShardSpec(partition=(0,), mesh_axes=("tp",))
    hidden = ts.jit(lambda x, w: op.tanh(x @ w), mesh=mesh, in_shardings=(None, cols))

    def loss(params, x, y):
        out = hidden(x, params["w1"]) @ params["w2"]
        return op.mean((out - y) * (out - y))

    step = ts.jit(ts.grad(loss), mesh=mesh, in_shardings=({"w1": cols, "w2": rows}, None, None))
    grads = step(params, x, y)
    _, want = torch_value_and_grads(params, x, y)
    for key in want:
        close(grads[key], want[key])
    sharded = step.lower(params, x, y).as_text("sharded")
    assert "graph.shard" in sharded  # the helper's in_shardings became a constraint
    assert {c.kind for c in step.lower(params, x, y).collectives()} <= {"all_reduce"}


def test_grad_drops_the_unused_loss() -> None:
    """ts.grad drops the loss: the ops that only compute it (here the cross-entropy of a
    vocab-parallel logits matrix, and its all-gather) never reach sharding."""
    mesh = dist.mesh({"tp": 2})
    vocab = dist.ShardSpec(partition=(1,), mesh_axes=("tp",))
    x, w = randn(8, 16, seed=70), randn(16, 32, seed=71) / 4
    labels = torch.randint(0, 32, (8,), generator=torch.Generator().manual_seed(72))

    def loss(w, x, labels):
        return op.cross_entropy(x @ w, labels)

    grad = ts.grad(loss, mesh=mesh, in_shardings=(vocab, None, None))
    lowered = grad.lower(w, x, labels)
    assert "graph.cross_entropy" in lowered.as_text("traced")
    assert "graph.cross_entropy" not in lowered.as_text("graph")
    w64 = w.double().requires_grad_()
    torch.nn.functional.cross_entropy(x.double() @ w64, labels).backward()
    close(grad(w, x, labels), w64.grad)


def test_grad_lower_honours_schedule_options() -> None:
    params, x, y = problem(seed=80, batch=64)
    mesh = dist.mesh({"dp": 2})
    batch = dist.ShardSpec(partition=(0,), mesh_axes=("dp",))
    grad = ts.grad(mlp_loss, mesh=mesh, in_shardings=(None, batch, batch))
    with schedule.options(bucket_bytes=0, overlap=False):
        lowered = grad.lower(params, x, y)
    assert lowered.schedule_options.bucket_bytes == 0
    assert "overlap-comm" not in lowered.pipeline()
    assert "bucket-gradients" not in lowered.pipeline()
    assert "bucket-gradients" in grad.lower(params, x, y).pipeline()


def test_inner_jit_on_another_mesh_is_an_error() -> None:
    inner = ts.jit(lambda x: x * 2.0, mesh=dist.mesh({"tp": 2}))
    outer = ts.jit(lambda x: inner(x) + 1.0, mesh=dist.mesh({"dp": 2}))
    with pytest.raises(ts.ShardingError, match=r"give the outer ts\.jit the same mesh"):
        outer(randn(4, 4, seed=90))
    with pytest.raises(ts.ShardingError, match="no mesh"):
        ts.jit(lambda x: inner(x))(randn(4, 4, seed=91))


def test_jit_of_grad_trains() -> None:
    """A training loop written as in JAX: the step is jit(value_and_grad), traced once."""
    params, x, y = problem(seed=100)
    step = ts.jit(ts.value_and_grad(mlp_loss))
    losses = []
    for _ in range(5):
        loss, grads = step(params, x, y)
        params = {k: params[k] - 0.5 * grads[k] for k in params}
        losses.append(float(loss))
    assert step.trace_count == 1
    assert losses[-1] < losses[0] and all(math.isfinite(v) for v in losses)


def test_sharded_grad_of_jit_and_has_aux() -> None:
    """ts.grad of a jitted function with a mesh runs on that mesh (its shardings become
    constraints); has_aux passes a sharded value through."""
    params, x, y = problem(seed=110, batch=32)
    mesh = dist.mesh({"dp": 2, "tp": 2})
    batch = dist.ShardSpec(partition=(0,), mesh_axes=("dp",))
    cols = dist.ShardSpec(partition=(1,), mesh_axes=("tp",))
    rows = dist.ShardSpec(partition=(0,), mesh_axes=("tp",))

    def loss_and_out(params, x, y):
        out = op.tanh(x @ params["w1"]) @ params["w2"]
        return op.mean((out - y) * (out - y)), out

    jitted = ts.jit(loss_and_out, mesh=mesh, in_shardings=({"w1": cols, "w2": rows}, batch, batch))
    grads, out = ts.grad(jitted, has_aux=True)(params, x, y)
    _, want = torch_value_and_grads(params, x, y)
    for key in want:
        close(grads[key], want[key])
    close(out, torch.tanh(x.double() @ params["w1"].double()) @ params["w2"].double())
    lowered = ts.grad(jitted, has_aux=True).lower(params, x, y)
    assert lowered.mesh == mesh
    assert "tp" in {axis for c in lowered.collectives() for axis in c.mesh_axes}
