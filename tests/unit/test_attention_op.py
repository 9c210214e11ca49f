"""``op.attention`` / ``graph.attention``: one op forward and backward, its flash kernels
(``kernels="triton"``: run in Triton's interpreter on a CPU) against torch in float64.

References: ``F.scaled_dot_product_attention`` and ``torch.autograd`` on float64 copies
of the inputs (a hand-written masked softmax where positions shift the causal mask).
Tolerances (absolute and relative): float64 1e-10, float32 2e-5 forward and 1e-4 for
gradients, bfloat16 3e-2.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import tessera as ts
from tessera import op
from tessera.codegen.kernels import kernel_class
from tessera.frontend.tracer import current_trace
from tessera.ir import graph, schedule, tile

_triton = functools.partial(ts.jit, kernels="triton")  # the tests' default is the reference
TOLERANCE = {torch.float64: 1e-10, torch.float32: 2e-5, torch.bfloat16: 3e-2}
GRAD_TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-4, torch.bfloat16: 3e-2}


def _inputs(
    batch: tuple[int, ...],
    tq: int,
    tk: int,
    d: int,
    dv: int,
    dtype: torch.dtype,
    kv_heads: int | None = None,
    seed: int = 0,
) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    kv_batch = (*batch[:-1], kv_heads) if kv_heads is not None else batch
    shapes = ((*batch, tq, d), (*kv_batch, tk, d), (*kv_batch, tk, dv), (*batch, tq, dv))
    return tuple(torch.randn(s, generator=g, dtype=torch.float64).to(dtype) for s in shapes)


def _reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, q0: int = 0, k0: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention and its log-sum-exp in float64 with torch ops (differentiable): query i
    sees key j iff q0 + i >= k0 + j; a row that sees no key gives 0 (its gradient too)."""
    q, k, v = (t.double() for t in (q, k, v))
    if q.dim() > 2 and k.shape[-3] != q.shape[-3]:  # grouped k/v heads
        k, v = (t.repeat_interleave(q.shape[-3] // t.shape[-3], dim=-3) for t in (k, v))
    scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    if not causal:
        return F.scaled_dot_product_attention(q, k, v), torch.logsumexp(scores, -1)
    rows = torch.arange(q.shape[-2])[:, None] + q0
    mask = rows >= torch.arange(k.shape[-2])[None, :] + k0
    seen = mask.any(-1)
    masked = scores.masked_fill(~mask, float("-inf")).masked_fill(~seen[:, None], 0.0)
    out = torch.where(seen[:, None], torch.softmax(masked, -1) @ v, 0.0)
    return out, torch.where(seen, torch.logsumexp(masked, -1), float("-inf"))


def _with_lse(causal: bool, q0: int | None = None, k0: int | None = None) -> Callable:
    """A traced function returning graph.attention's two results (op.attention gives one)."""

    def fn(q, k, v):
        positions = [] if q0 is None else [op.constant(np.int32(q0)), op.constant(np.int32(k0))]
        scale = 1 / q.shape[-1] ** 0.5
        out, lse = current_trace().bind(
            graph.AttentionOp, [q, k, v, *positions], causal=causal, scale=scale
        )
        return out, lse

    return fn


def _close(got: torch.Tensor, want: torch.Tensor, tolerance: float, what: str = "") -> None:
    assert not got.isnan().any(), what
    torch.testing.assert_close(
        got.double(), want.double(), rtol=tolerance, atol=tolerance, msg=what
    )


# --- forward -----------------------------------------------------------------------------------

SHAPES = [  # batch dims, Tq, Tk, D, Dv
    ((2,), 7, 7, 16, 16),
    ((2, 3), 33, 33, 24, 24),
    ((1, 2), 40, 50, 64, 32),
    ((3,), 20, 5, 8, 8),
    ((), 45, 20, 16, 16),
]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize(("batch", "tq", "tk", "d", "dv"), SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_forward_and_lse_match_torch(causal, batch, tq, tk, d, dv, dtype) -> None:
    q, k, v, _ = _inputs(batch, tq, tk, d, dv, dtype)
    out, lse = _triton(_with_lse(causal))(q, k, v)
    assert out.dtype == dtype and lse.dtype == (
        torch.float64 if dtype == torch.float64 else torch.float32
    )
    want_out, want_lse = _reference(q, k, v, causal)
    if causal:
        want_out = (
            F.scaled_dot_product_attention(*(t.double() for t in (q, k, v)), is_causal=True)
            if tq <= tk
            else want_out
        )  # torch's is_causal: query i sees keys j <= i
    _close(out, want_out, TOLERANCE[dtype], "output")
    _close(lse, want_lse, TOLERANCE[dtype], "lse")


def test_bf16_forward_and_backward() -> None:
    q, k, v, w = _inputs((2, 2), 40, 40, 32, 32, torch.bfloat16)
    _close(
        _triton(lambda q, k, v: op.attention(q, k, v, causal=True))(q, k, v),
        _reference(q, k, v, True)[0],
        TOLERANCE[torch.bfloat16],
    )
    grads = _triton(
        ts.grad(
            lambda q, k, v, w: op.sum(op.attention(q, k, v, causal=True) * w), argnums=(0, 1, 2)
        )
    )(q, k, v, w)
    _check_grads(grads, q, k, v, w, True, tolerance=GRAD_TOLERANCE[torch.bfloat16])


# --- backward ----------------------------------------------------------------------------------


def _check_grads(grads, q, k, v, w, causal, q0=0, k0=0, tolerance=1e-10) -> None:
    leaves = [t.double().clone().requires_grad_() for t in (q, k, v)]
    out, _ = _reference(*leaves, causal, q0, k0)
    (out * w.double()).sum().backward()
    for got, leaf, name in zip(grads, leaves, ("dq", "dk", "dv"), strict=True):
        assert got.shape == leaf.shape, name
        _close(got, leaf.grad, tolerance, name)


def _loss(causal: bool, **kwargs) -> Callable:
    def loss(q, k, v, w):
        return op.sum(op.attention(q, k, v, causal=causal, **kwargs) * w)

    return loss


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize(("batch", "tq", "tk", "d", "dv"), SHAPES[:4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_backward_matches_autograd(causal, batch, tq, tk, d, dv, dtype) -> None:
    q, k, v, w = _inputs(batch, tq, tk, d, dv, dtype)
    grads = _triton(ts.grad(_loss(causal), argnums=(0, 1, 2)))(q, k, v, w)
    _check_grads(grads, q, k, v, w, causal, tolerance=GRAD_TOLERANCE[dtype])


@pytest.mark.parametrize(("q0", "k0"), [(0, 0), (25, 0), (3, 10), (0, 30), (-5, 2)])
def test_position_offsets_forward_and_backward(q0: int, k0: int) -> None:
    """Query i sees key j iff q0 + i >= k0 + j: a block of a longer sequence; with
    (0, 30) no query sees a key (output 0, lse -inf, zero gradients, no NaN)."""
    q, k, v, w = _inputs((2,), 20, 45, 16, 16, torch.float64)
    out, lse = _triton(_with_lse(True, q0, k0))(q, k, v)
    want_out, want_lse = _reference(q, k, v, True, q0, k0)
    _close(out, want_out, 1e-10, "output")
    assert torch.equal(torch.isneginf(lse), torch.isneginf(want_lse))
    _close(lse.nan_to_num(neginf=0.0), want_lse.nan_to_num(neginf=0.0), 1e-10, "lse")
    grads = _triton(ts.grad(_loss(True, q_offset=q0, k_offset=k0), argnums=(0, 1, 2)))(q, k, v, w)
    _check_grads(grads, q, k, v, w, True, q0, k0)


def test_traced_offsets_are_operands() -> None:
    """Offsets given as traced i32 scalars: one compiled program serves every offset."""
    q, k, v, w = _inputs((2,), 24, 40, 16, 16, torch.float64)

    def loss(q, k, v, w, q0, k0):
        return op.sum(op.attention(q, k, v, causal=True, q_offset=q0, k_offset=k0) * w)

    step = _triton(ts.grad(loss, argnums=(0, 1, 2)))
    offsets = [
        (torch.tensor(a, dtype=torch.int32), torch.tensor(b, dtype=torch.int32))
        for a, b in [(16, 0), (0, 8)]
    ]
    for q0, k0 in offsets:
        _check_grads(step(q, k, v, w, q0, k0), q, k, v, w, True, int(q0), int(k0))
    assert step.lower(q, k, v, w, *offsets[0]) is step.lower(q, k, v, w, *offsets[1])  # one program


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_grouped_query_heads(causal: bool) -> None:
    """k and v with fewer heads than q: each serves a group of query heads; dk and dv sum
    over the group."""
    q, k, v, w = _inputs((2, 4), 33, 33, 16, 16, torch.float64, kv_heads=2)
    _close(
        _triton(lambda q, k, v: op.attention(q, k, v, causal=causal))(q, k, v),
        _reference(q, k, v, causal)[0],
        1e-10,
    )
    grads = _triton(ts.grad(_loss(causal), argnums=(0, 1, 2)))(q, k, v, w)
    _check_grads(grads, q, k, v, w, causal)


@pytest.mark.parametrize(
    ("batch", "tq", "tk", "d"),
    [((2,), 0, 8, 16), ((2,), 8, 0, 16), ((0, 2), 8, 8, 16), ((2,), 0, 0, 16)],
    ids=["no-queries", "no-keys", "no-batch", "nothing"],
)
def test_zero_size(batch, tq, tk, d) -> None:
    """Empty tensors: no keys gives 0 (and zero gradients); empty outputs stay empty."""
    q, k, v, w = _inputs(batch, tq, tk, d, d, torch.float64)
    for kernels in ("triton", "reference"):
        out = ts.jit(lambda q, k, v: op.attention(q, k, v, causal=True), kernels=kernels)(q, k, v)
        assert out.shape == (*batch, tq, d) and torch.equal(out, torch.zeros_like(out))
        grads = ts.jit(ts.grad(_loss(True), argnums=(0, 1, 2)), kernels=kernels)(q, k, v, w)
        for got, like in zip(grads, (q, k, v), strict=True):
            assert got.shape == like.shape and torch.equal(got, torch.zeros_like(got))


# --- kernels --------------------------------------------------------------------------------------


def _hand_written(q, k, v, w):  # the pattern: the backward materialises [Tq, Tk]
    t = q.shape[-2]
    scores = op.where(np.tril(np.ones((t, t), dtype=bool)), q @ op.swapaxes(k, -1, -2) * 0.25, -1e9)
    return op.sum((op.softmax(scores, axis=-1) @ v) * w)


def test_backward_is_one_kernel_without_a_scores_buffer() -> None:
    """The gradient of op.attention runs the forward kernel, delta = rowsum(do * o) and one
    backward kernel; no buffer between kernels is [Tq, Tk], unlike the hand-written
    pattern's backward, and the per-rank peak memory is smaller."""
    q, k, v, w = _inputs((2, 2), 64, 64, 16, 16, torch.float32)
    fused = _triton(ts.grad(_loss(True), argnums=(0, 1, 2))).lower(q, k, v, w)
    pattern = _triton(ts.grad(_hand_written, argnums=(0, 1, 2))).lower(q, k, v, w)

    def kernels(lowered):
        return [k for k in lowered.module_at("schedule").walk() if isinstance(k, schedule.KernelOp)]

    def scores_buffers(lowered) -> int:
        return sum(
            tuple(r.type.get_shape())[-2:] == (64, 64) for k in kernels(lowered) for r in k.results
        )

    classes = [kernel_class(k) for k in kernels(fused)]
    assert classes == ["attention", "reduction", "attention_backward"], classes
    assert scores_buffers(fused) == 0 and scores_buffers(pattern) > 0
    assert fused.memory().peak_bytes < pattern.memory().peak_bytes
    (backward,) = [
        t
        for t in fused.module_at("tile").walk()
        if isinstance(t, tile.KernelOp) and t.kernel_name.endswith("attention_backward")
    ]
    assert backward.grid_size == (2, 4, 1)  # max(query, key blocks of 32) x batch
    names = [o.name for o in backward.walk()]
    # dk, dv: k qᵀ, pᵀ do, v doᵀ, dsᵀ q; dq: q kᵀ, do vᵀ, ds k (atomic-free: two recomputed)
    assert names.count("tile.dot") == 7 and "tile.trans" in names
    grads = _triton(ts.grad(_loss(True), argnums=(0, 1, 2)))(q, k, v, w)
    _check_grads(grads, q, k, v, w, True, tolerance=GRAD_TOLERANCE[torch.float32])


def test_causal_kernels_skip_masked_blocks() -> None:
    """Causal: the forward's key loop stops at the diagonal (two loops: below it and on
    it); the backward's loops start (dk, dv) or stop (dq) there."""
    q, k, v, w = _inputs((1,), 64, 64, 16, 16, torch.float32)
    module = _triton(ts.grad(_loss(True), argnums=(0, 1, 2))).lower(q, k, v, w).module_at("tile")
    forward, backward = (
        t for t in module.walk() if isinstance(t, tile.KernelOp) and "attention" in t.kernel_name
    )
    assert [o.name for o in forward.walk()].count("scf.for") == 2
    assert [o.name for o in backward.walk()].count("scf.for") == 2
    assert "arith.minsi" in [o.name for o in forward.walk()] and "arith.divsi" in [
        o.name for o in backward.walk()
    ]


# --- errors at the user's line ------------------------------------------------------------------


def test_bad_inputs_are_errors_at_the_users_line() -> None:
    q = torch.randn(2, 8, 16)
    with pytest.raises(
        ts.ShapeError, match=r"(?s)q and k must have one head dim .*test_attention_op.py:"
    ):
        _triton(lambda q, k: op.attention(q, k, k))(q, torch.randn(2, 8, 12))
    with pytest.raises(ts.ShapeError, match=r"query heads .* must be a multiple"):
        _triton(lambda q, k: op.attention(q, k, k))(torch.randn(3, 8, 16), torch.randn(2, 8, 16))
    with pytest.raises(
        ts.ShapeError,
        match=r"(?s)q_offset must be an int or an integer scalar tensor.*test_attention_op.py:",
    ):
        _triton(lambda q: op.attention(q, q, q, causal=True, q_offset=1.5))(q)
    with pytest.raises(ts.ShapeError, match=r"scale must be a Python number"):
        _triton(lambda q: op.attention(q, q, q, scale="big"))(q)
    with pytest.raises(
        ts.ShapeError, match=r"(?s)expected floating-point q, k and v.*test_attention_op.py:"
    ):
        _triton(lambda q: op.attention(q, q, q))(torch.ones(2, 8, 16, dtype=torch.int64))
    # mixed float dtypes promote as in torch
    out = _triton(lambda q, k: op.attention(q, k, k))(q, q.double())
    assert out.dtype == torch.float64


# --- the interface ring attention builds on (issue 19, phase 2) -------------------------------


def _positions(q0: int, k0: int) -> list:
    return [op.constant(np.int32(q0)), op.constant(np.int32(k0))]


def test_key_blocks_merge_by_their_lse() -> None:
    """Attention over two blocks of keys (each at its offset), merged by their log-sum-exps,
    is attention over all keys: ``lse = logaddexp(lse1, lse2)``, ``o = o1 exp(lse1 - lse) +
    o2 exp(lse2 - lse)``. Causal, so some rows see no key of the second block (0, -inf),
    and rows 0..3 see no key at all (the queries start 4 before the keys)."""
    q, k, v, _ = _inputs((2,), 24, 40, 16, 16, torch.float64)

    def blocks(q, k, v):
        results = []
        for start in (0, 20):
            block_k, block_v = k[:, start : start + 20], v[:, start : start + 20]
            results += current_trace().bind(
                graph.AttentionOp,
                [q, block_k, block_v, *_positions(0, start + 4)],
                causal=True,
                scale=0.25,
            )
        return results

    o1, l1, o2, l2 = _triton(blocks)(q, k, v)
    lse = torch.logaddexp(l1, l2)
    safe = torch.where(torch.isneginf(lse), 0.0, lse)
    merged = o1 * torch.exp(l1 - safe)[..., None] + o2 * torch.exp(l2 - safe)[..., None]
    want_out, want_lse = _reference(q, k, v, True, 0, 4)  # its scale: 1 / sqrt(16) = 0.25
    assert torch.isneginf(l2[:, :24]).any() and torch.isneginf(lse[:, :4]).all()
    _close(merged, want_out, 1e-10, "merged output")
    _close(lse.nan_to_num(neginf=0.0), want_lse.nan_to_num(neginf=0.0), 1e-10, "merged lse")


def test_backward_by_key_blocks_sums_to_the_whole() -> None:
    """attention_backward on each block of keys (its offset), with the whole attention's
    lse and delta: the dq of the blocks sum to dq, their dk and dv are the blocks of dk
    and dv (what a ring's backward steps compute)."""
    q, k, v, do = _inputs((2, 2), 24, 48, 16, 16, torch.float64)
    scale = 16**-0.5

    def whole_and_blocks(q, k, v, do):
        out, lse = current_trace().bind(
            graph.AttentionOp, [q, k, v, *_positions(8, 0)], causal=True, scale=scale
        )
        delta = op.sum(out * do, axis=-1)
        whole = current_trace().bind(
            graph.AttentionBackwardOp,
            [q, k, v, do, lse, delta, *_positions(8, 0)],
            causal=True,
            scale=scale,
        )
        parts = []
        for start in (0, 16, 32):
            kb, vb = k[:, :, start : start + 16], v[:, :, start : start + 16]
            parts += current_trace().bind(
                graph.AttentionBackwardOp,
                [q, kb, vb, do, lse, delta, *_positions(8, start)],
                causal=True,
                scale=scale,
            )
        return (*whole, *parts)

    dq, dk, dv, *parts = _triton(whole_and_blocks)(q, k, v, do)
    _close(sum(parts[0::3]), dq, 1e-10, "dq")
    _close(torch.cat(parts[1::3], dim=-2), dk, 1e-10, "dk")
    _close(torch.cat(parts[2::3], dim=-2), dv, 1e-10, "dv")
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    (_reference(*leaves, True, 8, 0)[0] * do).sum().backward()
    for got, leaf in zip((dq, dk, dv), leaves, strict=True):
        _close(got, leaf.grad, 1e-10)
