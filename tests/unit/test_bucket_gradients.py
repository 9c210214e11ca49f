"""``bucket-gradients``: data-parallel gradient all-reduces fused into buckets, results
unchanged, fewer collectives, and a faster simulated step where latency dominates."""

from __future__ import annotations

import pytest
import torch

import tessera as ts
from tessera import dist, graph, op, optim, schedule
from tessera.ir import graph as ir_graph
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


def _reduce_scatters(lowered: ts.Lowered) -> int:
    return sum(s.collective.data == "reduce_scatter" for s in _starts(lowered))


def _zero2_step(kernels: str = "reference") -> graph.TrainingStep:
    """ZeRO-2 AdamW on dp × tp = 2 × 2: each gradient reduce-scattered over dp."""
    cols = dist.ShardSpec(partition=(1,), mesh_axes=("tp",))
    rows = dist.ShardSpec(partition=(0,), mesh_axes=("tp",))

    @graph.training_step(
        optimizer=optim.AdamW(lr=1e-2, weight_decay=0.1),
        mesh=dist.mesh({"dp": 2, "tp": 2}),
        zero=2,
        param_shardings={"w1": cols, "b1": rows, "w2": rows},
        kernels=kernels,
    )
    def step(p, x, y):
        loss = op.mean((op.gelu(x @ p["w1"] + p["b1"]) @ p["w2"] - y) ** 2)
        return graph.backward(loss), {"loss": loss}

    return step


def _zero2_inputs() -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    params = {
        "w1": torch.randn(8, 32, generator=g) / 8**0.5,
        "b1": 0.1 * torch.randn(32, generator=g),
        "w2": torch.randn(32, 8, generator=g) / 32**0.5,
    }
    return params, torch.randn(64, 8, generator=g), torch.randn(64, 8, generator=g)


def _all_gathers(lowered: ts.Lowered) -> int:
    return sum(s.collective.data == "all_gather" for s in _starts(lowered))


def test_zero_reduce_scatters_and_parameter_gathers_share_buckets_bit_identically() -> None:
    """ZeRO-2 over dp: the gradient reduce-scatters of w1, b1 and w2 (each split on dim 0 over
    dp; w2's inside tp's rows, so a rank's block is still contiguous) become one, their
    operands packed as rows of ranks, and so do the all-gathers of their updated values
    (never moved earlier: they wait for the update). Three AdamW steps give the same bits
    as without buckets, and the first loss is torch's in float64 (1e-6 relative)."""
    runs = {}
    for bucket_bytes in (0, 2**20):
        step = _zero2_step()
        params, x, y = _zero2_inputs()
        state = step.init(params)
        with schedule.options(bucket_bytes=bucket_bytes):
            lowered = step.lower(state, x, y)
            counts = (_reduce_scatters(lowered), _all_gathers(lowered))
            losses = [step(state, x, y)["loss"] for _ in range(3)]
        runs[bucket_bytes] = (counts, losses, {k: v.clone() for k, v in state.params.items()})
    (n0, l0, p0), (n1, l1, p1) = runs[0], runs[2**20]
    assert (n0, n1) == ((3, 3), (1, 1))
    assert all(torch.equal(a, b) for a, b in zip(l0, l1, strict=True))
    assert all(torch.equal(p0[k], p1[k]) for k in p0)
    params, x, y = _zero2_inputs()
    ref = {k: v.double() for k, v in params.items()}
    out = torch.nn.functional.gelu(x.double() @ ref["w1"] + ref["b1"]) @ ref["w2"]
    assert l0[0].item() == pytest.approx(((out - y.double()) ** 2).mean().item(), rel=1e-6)


def test_a_bucket_of_gathers_is_copied_out_in_one_kernel() -> None:
    """ZeRO-2's updated parameters, gathered as one bucket of rows (a rank's blocks per
    row), are copied out of the rows by one split kernel, as FSDP2's
    ``split_with_sizes_copy`` does, not by one strided slice kernel per parameter; then
    only reshapes, which cost nothing."""
    step = _zero2_step()
    params, x, y = _zero2_inputs()
    lowered = step.lower(step.init(params), x, y)
    (gather,) = [s for s in _starts(lowered) if s.collective.data == "all_gather"]
    (wait,) = [use.operation for use in gather.handle.uses]
    (kernel,) = {use.operation for use in wait.results[0].uses}
    assert isinstance(kernel, schedule_ir.KernelOp)
    (split,) = [o for o in kernel.body.block.ops if isinstance(o, ir_graph.SplitOp)]
    assert len(split.results) == 3


def test_generated_kernels_unpack_a_bucket_of_gathers_as_the_references_do() -> None:
    """The same ZeRO-2 step with Triton kernels (the bucket's split among them) gives the
    reference kernels' losses and parameters over three AdamW steps, to float32 rounding
    (1e-5 relative: the kernels' matmuls sum in another order)."""
    runs = []
    for kernels in ("reference", "triton"):
        step = _zero2_step(kernels)
        params, x, y = _zero2_inputs()
        state = step.init(params)
        losses = torch.stack([step(state, x, y)["loss"] for _ in range(3)])
        runs.append((losses, state.params))
    (want_losses, want), (losses, got) = runs
    torch.testing.assert_close(losses, want_losses, rtol=1e-5, atol=0)
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_context_parallel_sequence_collectives_stay_apart(causal: bool) -> None:
    """Attention's gradient with the sequence (dim 2 of [B, H, T, D]: blocks of ranks not
    contiguous) over cp = 4: k and v are gathered and dk and dv reduce-scattered one by
    one (packing them would copy each whole tensor), so buckets change neither the
    collectives nor the peak memory; the gradients equal torch autograd's in float64
    (1e-10 absolute and relative)."""
    layout = dist.ShardSpec(partition=(2,), mesh_axes=("cp",))
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 2, 32, 8, generator=g, dtype=torch.float64) for _ in range(3))

    def loss(q, k, v):
        return op.sum(op.attention(q, k, v, causal=causal) ** 2)

    seen = {}
    for bucket_bytes in (0, 2**20):
        with schedule.options(bucket_bytes=bucket_bytes, context_parallel="all_gather"):
            f = ts.jit(
                ts.grad(loss, argnums=(0, 1, 2)),
                mesh=dist.mesh({"cp": 4}),
                in_shardings=(layout,) * 3,
                out_shardings=(layout,) * 3,
                kernels="reference",
            )
            lowered = f.lower(q, k, v)
            kinds = sorted(s.collective.data for s in _starts(lowered))
            seen[bucket_bytes] = (kinds, lowered.memory().peak_bytes)
            grads = f(q, k, v)
    assert seen[0] == seen[2**20]
    assert seen[0][0] == ["all_gather"] * 2 + ["reduce_scatter"] * 2
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=causal)
    for got, want in zip(grads, torch.autograd.grad((out**2).sum(), leaves), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
