"""``bucket-gradients``: data-parallel gradient all-reduces fused into buckets, results
unchanged, fewer collectives, and a faster simulated step where latency dominates."""

from __future__ import annotations

import pytest
import torch

import tessera as ts
from tessera import dist, graph, op, optim, schedule
from tessera.ir import schedule as schedule_ir

ROWS = dist.ShardSpec(partition=(0,), mesh_axes=("dp",))


def mlp(p, x):
    h = x
    for i in range(3):
        h = op.gelu(h @ p[f"w{i}"] + p[f"b{i}"])
    return h


def training_step(p, state, x, y):
    loss = op.mean((mlp(p, x) - y) ** 2)
    p, state = optim.sgd(p, graph.backward(loss, p), state, lr=0.1, momentum=0.9)
    return p, state, loss


def setup(width: int = 8, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    params = {}
    for i in range(3):
        params[f"w{i}"] = torch.randn(width, width, generator=g) / width**0.5
        params[f"b{i}"] = torch.randn(width, generator=g) / 10
    x, y = torch.randn(16, width, generator=g), torch.randn(16, width, generator=g)
    return params, optim.sgd_state(params), x, y


def _lowered(bucket_bytes: int, mesh: dist.Mesh, width: int = 8) -> ts.Lowered:
    with schedule.options(bucket_bytes=bucket_bytes):
        f = ts.jit(
            training_step, mesh=mesh, in_shardings=(None, None, ROWS, ROWS), kernels="reference"
        )
        return f.lower(*setup(width))


def _starts(lowered: ts.Lowered) -> list[schedule_ir.StartOp]:
    return [o for o in lowered.module_at("schedule").walk() if isinstance(o, schedule_ir.StartOp)]


def test_buckets_keep_every_step_bit_identical() -> None:
    """Three SGD steps on dp=2: the six gradients' all-reduces fused or not, the same bits
    (an all-reduce is elementwise across ranks, so each element is reduced alike)."""
    mesh = dist.mesh({"dp": 2})
    runs = {}
    for bucket_bytes in (0, 2**20):
        with schedule.options(bucket_bytes=bucket_bytes):
            f = ts.jit(
                training_step, mesh=mesh, in_shardings=(None, None, ROWS, ROWS), kernels="reference"
            )
            params, state, x, y = setup()
            losses = []
            for _ in range(3):
                params, state, loss = f(params, state, x, y)
                losses.append(loss)
            runs[bucket_bytes] = (params, losses)
    (p0, l0), (p1, l1) = runs[0], runs[2**20]
    assert all(torch.equal(a, b) for a, b in zip(l0, l1, strict=True))
    assert all(torch.equal(p0[k], p1[k]) for k in p0)
    # and the step is right: float64 torch reference for the first loss
    params, _, x, y = setup()
    ref = {k: v.double() for k, v in params.items()}
    h = x.double()
    for i in range(3):
        h = torch.nn.functional.gelu(h @ ref[f"w{i}"] + ref[f"b{i}"])
    assert abs(l0[0].item() - ((h - y.double()) ** 2).mean().item()) <= 1e-5


def test_gradients_share_a_bucket_up_to_its_size() -> None:
    mesh = dist.mesh({"dp": 2})
    unbucketed = _starts(_lowered(0, mesh))
    gradients = [s for s in unbucketed if s.attrs()["kind"] == "sum"]
    assert len(gradients) == 6  # three weights and three biases
    one_bucket = [s for s in _starts(_lowered(2**20, mesh)) if s.attrs()["kind"] == "sum"]
    assert len(one_bucket) == 1
    total = sum(s.handle.type.tensor.element_count() * 4 for s in gradients)  # type: ignore[attr-defined]
    assert one_bucket[0].handle.type.tensor.element_count() * 4 == total  # type: ignore[attr-defined]
    # a 300-byte cap: a 256-byte weight gradient with at most one 32-byte bias
    capped = [s for s in _starts(_lowered(300, mesh)) if s.attrs()["kind"] == "sum"]
    sizes = sorted(s.handle.type.tensor.element_count() * 4 for s in capped)  # type: ignore[attr-defined]
    assert 3 <= len(capped) < 6 and max(sizes) <= 300 and sum(sizes) == total


def test_buckets_save_latency_in_the_simulated_step() -> None:
    """Many small gradients across two DGX nodes: each all-reduce pays the InfiniBand
    latency, so one bucket is faster than six all-reduces."""
    mesh = dist.mesh({"dp": 16})
    serial_latency = _lowered(0, mesh).simulate("dgx_h100x2")
    bucketed = _lowered(25 * 2**20, mesh).simulate("dgx_h100x2")
    assert bucketed.comm_time_s < serial_latency.comm_time_s
    assert bucketed.step_time_s < serial_latency.step_time_s


def test_tensor_parallel_all_reduces_are_not_bucketed() -> None:
    """Each all-reduce of a Megatron MLP pair is used at once: nothing to fuse."""
    mesh = dist.mesh({"tp": 2})
    cols = dist.ShardSpec(partition=(1,), mesh_axes=("tp",))
    rows = dist.ShardSpec(partition=(0,), mesh_axes=("tp",))

    def two_mlps(x, w1, w2, v1, v2):
        return op.gelu(op.gelu(x @ w1) @ w2 @ v1) @ v2

    shapes = ((4, 8), (8, 16), (16, 8), (8, 16), (16, 8))
    args = [torch.randn(s) for s in shapes]
    f = ts.jit(
        two_mlps, mesh=mesh, in_shardings=(None, cols, rows, cols, rows), kernels="reference"
    )
    assert len(_starts(f.lower(*args))) == 2


def test_negative_bucket_size_is_an_error() -> None:
    with pytest.raises(ts.TesseraError, match="bucket_bytes must be >= 0"):
        _lowered(-1, dist.mesh({"dp": 2})).module_at("schedule")
