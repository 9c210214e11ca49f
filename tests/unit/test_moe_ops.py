"""Mixture-of-experts ops (``graph.top_k``, ``moe_route``, ``moe_dispatch``,
``moe_combine``) and ``tessera.op.moe`` against torch in float64.

The reference routes by a plain Python loop (first choices first, tokens in order, a
counter per expert), computes each kept choice's expert MLP token by token and weights
it by the router; ``torch.autograd`` on it gives the reference gradients of the router
and the experts. Ties (equal scores, experts over capacity) are engineered and checked
exactly against the loops. Tolerances: float64 1e-10 (values and gradients), float32
1e-5 (the routing weights 1e-6).
"""

from __future__ import annotations

import pytest
import torch
from moe_reference import loop_route as _loop_route
from moe_reference import loop_top_k as _loop_top_k
from moe_reference import reference_moe as _reference_moe

import tessera as ts
from tessera import op
from tessera.errors import ExecutionError, ShapeError

F64 = 1e-10


def _moe(k: int, capacity: int, score: str = "softmax"):
    def layer(x, wr, w1, w2):
        weights, experts, _ = op.router(x @ wr, k=k, score=score)
        routing = op.route(experts, num_experts=wr.shape[1], capacity=capacity)
        ye = op.relu(op.dispatch(x, routing) @ w1) @ w2
        return op.combine(ye, routing, weights)

    return layer


def _inputs(
    g: int, t: int, h: int, e: int, f: int, seed: int = 0, dtype: torch.dtype = torch.float64
) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    shapes = [(g, t, h), (h, e), (e, h, f), (e, f, h)]
    return [torch.randn(s, generator=gen, dtype=torch.float64).to(dtype) for s in shapes]


# --- top_k ------------------------------------------------------------------------------


def test_top_k_values_indices_and_gradient_match_torch() -> None:
    x = torch.randn(3, 5, 9, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    w = torch.randn(3, 5, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    values, indices = ts.jit(lambda x: op.top_k(x, 4))(x)
    want_values, want_indices = torch.topk(x, 4, dim=-1)
    assert indices.dtype == torch.int32 and torch.equal(indices.long(), want_indices)
    torch.testing.assert_close(values, want_values, rtol=0, atol=0)
    grad = ts.grad(lambda x, w: op.sum(op.top_k(x, 4)[0] * w))(x, w)
    xr = x.clone().requires_grad_()
    (torch.topk(xr, 4, dim=-1).values * w).sum().backward()
    torch.testing.assert_close(grad, xr.grad, rtol=F64, atol=F64)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_top_k_breaks_ties_to_the_lower_index(dtype: torch.dtype) -> None:
    """Equal values in index order, as the Python loop sorting ``(-value, index)`` has
    them; exact. ``torch.topk`` on a CPU gives 6, 5 for a row of eight equal values and
    42, 43 for 64: its order among ties is unspecified."""
    gen = torch.Generator().manual_seed(3)
    x = torch.randint(0, 3, (5, 64), generator=gen).to(dtype)  # many ties at every rank
    x[0] = 0.5  # all equal
    x[1, 40:] = 7.0  # the top 24 all equal, past the first 40
    for width in (8, 64):
        values, indices = ts.jit(lambda x: op.top_k(x, 3))(x[:, :width])
        want_values, want_indices = _loop_top_k(x[:, :width], 3)
        assert torch.equal(indices.long(), want_indices), (width, indices, want_indices)
        torch.testing.assert_close(values, want_values, rtol=0, atol=0)
    assert ts.jit(lambda x: op.top_k(x, 2))(x[:1, :8])[1].tolist() == [[0, 1]]


def test_top_k_rejects_k_larger_than_the_dim_at_the_user_line() -> None:
    with pytest.raises(ShapeError, match=r"(?s)k must be in \[1, 3\].*test_moe_ops.py"):
        ts.jit(lambda x: op.top_k(x, 4)[0])(torch.zeros(2, 3))


# --- routing ----------------------------------------------------------------------------


@pytest.mark.parametrize(("experts", "capacity"), [(4, 1), (4, 3), (3, 16)])
def test_route_matches_a_counter_per_expert(experts: int, capacity: int) -> None:
    choices = torch.randint(
        0,
        experts,
        (3, 16, 2),
        generator=torch.Generator().manual_seed(experts + capacity),
        dtype=torch.int32,
    )
    slots, sources = ts.jit(
        lambda c: (lambda r: (r.slots, r.sources))(op.route(c, experts, capacity))
    )(choices)
    kept = _loop_route(choices, experts, capacity)
    want_slots = torch.full_like(slots, -1)
    want_sources = torch.full((3, experts, capacity), -1, dtype=torch.int32)
    for (g, t, j), (e, c) in kept.items():
        want_slots[g, t, j] = e * capacity + c
        want_sources[g, e, c] = t * 2 + j
    assert torch.equal(slots, want_slots) and torch.equal(sources, want_sources)
    if capacity == 16:
        assert (slots >= 0).all()  # dropless: a capacity of T keeps every choice


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_router_and_route_with_ties_and_overflow_match_the_loops(dtype: torch.dtype) -> None:
    """Which choices keep a slot when scores tie and experts overflow: the router's top 2
    (the lower expert index wins a tie) and the route (first choices first, then tokens
    in order; the rest dropped), exactly as the plain loops of ``moe_reference`` do it.
    Logits of 0 and 1 only make equal softmax scores at every rank; capacity 2 of 12
    tokens x 2 choices over 4 experts drops about half of them."""
    gen = torch.Generator().manual_seed(5)
    logits = torch.randint(0, 2, (3, 12, 4), generator=gen).to(dtype)
    logits[0] = 0.0  # every expert ties for every token: all choose experts 0 and 1
    experts, capacity = 4, 2

    def routed(logits):
        weights, chosen, _ = op.router(logits, k=2)
        routing = op.route(chosen, experts, capacity)
        return weights, chosen, routing.slots, routing.sources

    weights, chosen, slots, sources = ts.jit(routed)(logits)
    top, want_chosen = _loop_top_k(torch.softmax(logits.double(), -1), 2)
    assert torch.equal(chosen.long(), want_chosen)
    tol = 1e-6 if dtype == torch.float32 else F64
    torch.testing.assert_close(
        weights.double(), top / top.sum(-1, keepdim=True), rtol=tol, atol=tol
    )
    want_slots = torch.full_like(slots, -1)
    want_sources = torch.full((3, experts, capacity), -1, dtype=torch.int32)
    for (g, t, j), (e, c) in _loop_route(want_chosen, experts, capacity).items():
        want_slots[g, t, j] = e * capacity + c
        want_sources[g, e, c] = t * 2 + j
    assert torch.equal(slots, want_slots) and torch.equal(sources, want_sources)
    # group 0: tokens 0 and 1 take experts 0 and 1's slots, the rest are dropped
    assert want_slots[0, :2].tolist() == [[0, 2], [1, 3]] and (want_slots[0, 2:] == -1).all()
    assert (want_slots == -1).float().mean() > 0.3  # the case overflows


def test_route_rejects_an_expert_out_of_range() -> None:
    with pytest.raises(ExecutionError, match=r"expert choices must be in \[0, 4\)"):
        ts.jit(lambda c: op.route(c, 4, 2).slots)(torch.tensor([[[0], [4]]], dtype=torch.int32))


def test_expert_capacity() -> None:
    assert op.expert_capacity(16, 8, 2, 1.0) == 4
    assert op.expert_capacity(16, 8, 2, 1.25) == 5
    assert op.expert_capacity(16, 8, 2, None) == 16  # dropless
    assert op.expert_capacity(16, 2, 2, 4.0) == 16  # never more than the tokens


# --- the layer: values and gradients ----------------------------------------------------------


@pytest.mark.parametrize(
    ("k", "capacity", "score"),
    [(2, 2, "softmax"), (2, 5, "softmax"), (1, 3, "sigmoid"), (2, 8, "sigmoid")],
)
def test_moe_layer_and_gradients_match_torch(k: int, capacity: int, score: str) -> None:
    """Capacity 2 drops many choices, 8 (= T) none: dropless."""
    x, wr, w1, w2 = _inputs(2, 8, 6, 4, 10, seed=k + capacity)
    got = ts.jit(_moe(k, capacity, score))(x, wr, w1, w2)
    torch.testing.assert_close(
        got, _reference_moe(x, wr, w1, w2, k, capacity, score), rtol=F64, atol=F64
    )
    upstream = torch.randn(x.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(9))
    layer = _moe(k, capacity, score)
    grads = ts.grad(
        lambda x, wr, w1, w2, u: op.sum(layer(x, wr, w1, w2) * u), argnums=(0, 1, 2, 3)
    )(x, wr, w1, w2, upstream)
    leaves = [t.clone().requires_grad_() for t in (x, wr, w1, w2)]
    (_reference_moe(*leaves, k, capacity, score) * upstream).sum().backward()
    for name, got_grad, leaf in zip(("x", "router", "w1", "w2"), grads, leaves, strict=True):
        torch.testing.assert_close(got_grad, leaf.grad, rtol=F64, atol=F64, msg=name)


def test_moe_layer_float32() -> None:
    x, wr, w1, w2 = _inputs(2, 8, 6, 4, 10, seed=3, dtype=torch.float32)
    got = ts.jit(_moe(2, 4))(x, wr, w1, w2)
    want = _reference_moe(*(t.double() for t in (x, wr, w1, w2)), 2, 4)
    torch.testing.assert_close(got, want.float(), rtol=1e-5, atol=1e-5)


def test_dispatch_of_per_choice_rows_is_the_transpose_of_combine() -> None:
    """<dispatch(r), y> == <r, combine(y)> for rows r [G, T, K, H]."""
    choices = torch.randint(
        0, 3, (2, 5, 2), generator=torch.Generator().manual_seed(4), dtype=torch.int32
    )
    rows = torch.randn(2, 5, 2, 4, dtype=torch.float64)
    y = torch.randn(2, 3, 3, 4, dtype=torch.float64)

    def pair(c, r, y):
        routing = op.route(c, 3, 3)
        dispatched = ts.frontend.tracer.current_trace().bind(
            ts.ir.graph.MoeDispatchOp, [r, routing.slots, routing.sources]
        )[0]
        combined = ts.frontend.tracer.current_trace().bind(
            ts.ir.graph.MoeCombineOp, [y, routing.slots, routing.sources]
        )[0]
        return op.sum(dispatched * y), op.sum(r * combined)

    left, right = ts.jit(pair)(choices, rows, y)
    torch.testing.assert_close(left, right, rtol=F64, atol=F64)
    assert left.abs() > 0


# --- router losses --------------------------------------------------------------------------


def test_load_balancing_and_z_loss_match_torch_with_gradients() -> None:
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(2, 7, 4, dtype=torch.float64, generator=gen)

    def losses(logits):
        _, experts, scores = op.router(logits, k=2)
        return op.load_balancing_loss(scores, experts) + 0.1 * op.router_z_loss(logits)

    def reference(logits):
        scores = torch.softmax(logits, -1)
        chosen = torch.topk(scores, 2, -1).indices
        fraction = torch.nn.functional.one_hot(chosen, 4).double().mean((0, 1, 2))
        balance = 4 * (fraction * scores.mean((0, 1))).sum()
        return balance + 0.1 * (torch.logsumexp(logits, -1) ** 2).mean()

    torch.testing.assert_close(ts.jit(losses)(logits), reference(logits), rtol=F64, atol=F64)
    grad = ts.grad(losses)(logits)
    leaf = logits.clone().requires_grad_()
    reference(leaf).backward()
    torch.testing.assert_close(grad, leaf.grad, rtol=F64, atol=F64)


def test_uniform_routing_has_balance_loss_one() -> None:
    scores = torch.full((1, 4, 4), 0.25, dtype=torch.float64)
    experts = torch.tensor([[[0], [1], [2], [3]]], dtype=torch.int32)
    assert float(ts.jit(op.load_balancing_loss)(scores, experts)) == pytest.approx(1.0)


def test_router_rejects_an_unknown_score() -> None:
    with pytest.raises(ShapeError, match=r"score must be one of.*test_moe_ops.py"):
        ts.jit(lambda x: op.router(x, 2, score="relu")[0])(torch.zeros(2, 4))


# --- generated kernels ------------------------------------------------------------------------


def test_grouped_expert_matmul_runs_as_a_triton_kernel_with_its_activation() -> None:
    """Through the generated kernels (Triton's interpreter): the experts' matmul
    ``[G, E, C, H] @ [E, H, F]`` is one batched (grouped) matmul kernel over the experts
    with the relu fused as its epilogue; dispatch and combine are generated gathers
    (zero for an empty slot or a dropped choice); only top_k and the routing run on the
    host. Against the float64 loop reference, f32 tolerance 1e-5."""
    x, wr, w1, w2 = _inputs(2, 6, 8, 4, 16, seed=7, dtype=torch.float32)
    f = ts.jit(_moe(2, 3), kernels="triton")
    want = _reference_moe(*(t.double() for t in (x, wr, w1, w2)), 2, 3).float()
    torch.testing.assert_close(f(x, wr, w1, w2), want, rtol=1e-5, atol=1e-5)
    sources = f.lower(x, wr, w1, w2).triton_source()
    grouped = [name for name, source in sources.items() if "matmul" in name and "maximum" in source]
    assert len(grouped) == 1, sorted(sources)
    assert not any("moe_route" in name or "top_k" in name for name in sources)
    assert any(name.endswith("moe_dispatch") for name in sources), sorted(sources)
    assert any(name.endswith("moe_combine") for name in sources), sorted(sources)


def test_dispatch_and_combine_kernels_in_the_backward_match_the_reference_kernels() -> None:
    """The gradients through the generated kernels (the VJPs are dispatch and combine
    again, dispatch of per-choice rows ``[G, T, K, H]`` included) equal the reference
    kernels' (f32: 1e-4, the matmuls' summation orders differ); capacity 2 drops
    choices, so zeros are read too (a wrong gather is off by O(1))."""
    x, wr, w1, w2 = _inputs(2, 6, 8, 4, 16, seed=8, dtype=torch.float32)

    def loss(x, wr, w1, w2):
        return op.sum(_moe(2, 2)(x, wr, w1, w2) ** 2)

    grads = ts.jit(ts.grad(loss, argnums=(0, 1, 2, 3)), kernels="triton")
    reference = ts.jit(ts.grad(loss, argnums=(0, 1, 2, 3)), kernels="reference")
    for got, want in zip(grads(x, wr, w1, w2), reference(x, wr, w1, w2), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
