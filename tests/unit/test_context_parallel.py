"""Context parallelism, all-gather variant (issue 19): ``op.attention`` with the sequence
split over a mesh axis ``cp`` runs on the virtual mesh, forward and ``ts.grad``, against
torch in float64 (tolerance 1e-10 absolute and relative; 2e-5 for float32 layers).

Each rank keeps its block of queries, all-gathers k and v over cp (once per layer: the
backward reuses the forward's gathers), computes its rows with its block's causal
offset, and in the backward keeps dq local and reduce-scatters dk and dv over cp.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from attention_reference import TOLERANCE
from attention_reference import close as _close
from attention_reference import inputs as _inputs
from attention_reference import spec as _spec
from attention_reference import torch_attention as _torch_attention
from attention_reference import torch_grads as _torch_grads
from machines import BANDWIDTH_BOUND

import tessera as ts
from tessera import dist, op, schedule


def _loss(causal):
    def loss(q, k, v, w):
        return op.sum(op.attention(q, k, v, causal=causal) * w)

    return loss


# --- results ---------------------------------------------------------------------------------


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize(
    ("axes", "spec"),
    [
        ({"dp": 2, "cp": 2}, ((0, "dp"), (2, "cp"))),
        ({"tp": 2, "cp": 2}, ((1, "tp"), (2, "cp"))),
        ({"cp": 4}, ((2, "cp"),)),
    ],
    ids=["dp2xcp2", "tp2xcp2", "cp4"],
)
def test_forward_and_grad_equal_the_unsharded_attention(causal, axes, spec) -> None:
    """dp x cp, tp x cp (heads over tp, sequence over cp) and cp alone: the reference
    kernels run every rank on the virtual mesh; results and gradients match torch."""
    q, k, v, w = _inputs((2, 4, 16, 8), 4)
    mesh, layout = dist.mesh(axes), _spec(*spec)
    f = ts.jit(
        lambda q, k, v: op.attention(q, k, v, causal=causal),
        mesh=mesh,
        in_shardings=(layout,) * 3,
        kernels="reference",
    )
    _close([f(q, k, v)], [_torch_attention(q, k, v, causal)])
    g = ts.jit(
        ts.grad(_loss(causal), argnums=(0, 1, 2)),
        mesh=mesh,
        in_shardings=(layout,) * 4,
        kernels="reference",
    )
    _close(g(q, k, v, w), _torch_grads(q, k, v, w, causal))
    kinds = {(c.kind, c.mesh_axes) for c in g.lower(q, k, v, w).collectives()}
    assert kinds == {("all_gather", ("cp",)), ("reduce_scatter", ("cp",))}, kinds


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_generated_kernels_on_dp_x_cp(causal: bool) -> None:
    """The same through the Triton kernels (the rank's query offset evaluated in the
    attention kernels from its position along cp), sizes not multiples of the blocks."""
    q, k, v, w = _inputs((2, 2, 40, 8), 4, seed=1)
    layout = _spec((0, "dp"), (2, "cp"))
    g = ts.jit(
        ts.grad(_loss(causal), argnums=(0, 1, 2)),
        mesh=dist.mesh({"dp": 2, "cp": 2}),
        in_shardings=(layout,) * 4,
        kernels="triton",
    )
    _close(g(q, k, v, w), _torch_grads(q, k, v, w, causal))


def test_sequence_split_over_two_axes() -> None:
    """The sequence split over (a, b), a major: each rank's query offset is its block's
    start in that order."""
    q, k, v, w = _inputs((1, 2, 16, 8), 4, seed=2)
    layout = dist.ShardSpec(partition=(2, 2), mesh_axes=("a", "b"))
    g = ts.jit(
        ts.grad(_loss(True), argnums=(0, 1, 2)),
        mesh=dist.mesh({"a": 2, "b": 2}),
        in_shardings=(layout,) * 4,
        kernels="reference",
    )
    _close(g(q, k, v, w), _torch_grads(q, k, v, w, True))


def test_grouped_query_heads_with_context_parallelism() -> None:
    """k and v with fewer heads: the gathers move only their (smaller) heads."""
    q, k, v, w = _inputs((2, 4, 16, 8), 4, seed=3, kv_heads=2)
    layout = _spec((2, "cp"))
    g = ts.jit(
        ts.grad(_loss(True), argnums=(0, 1, 2)),
        mesh=dist.mesh({"cp": 2}),
        in_shardings=(layout,) * 4,
        kernels="reference",
    )
    _close(g(q, k, v, w), _torch_grads(q, k, v, w, True))
    gathered = [c.nbytes for c in g.lower(q, k, v, w).collectives() if c.kind == "all_gather"]
    assert gathered == [k.numel() * k.element_size()] * 2  # k and v whole on every rank: 2 heads


def test_offsets_given_by_the_user_shift_with_the_split() -> None:
    """User offsets (a block of a longer sequence) add to each rank's start."""
    q, k, v, w = _inputs((1, 2, 16, 8), 4, seed=4)
    layout = _spec((2, "cp"))

    def loss(q, k, v, w):
        return op.sum(op.attention(q, k, v, causal=True, q_offset=8, k_offset=4) * w)

    g = ts.jit(
        ts.grad(loss, argnums=(0, 1, 2)),
        mesh=dist.mesh({"cp": 2}),
        in_shardings=(layout,) * 4,
        kernels="reference",
    )
    single = ts.jit(ts.grad(loss, argnums=(0, 1, 2)), kernels="reference")
    _close(g(q, k, v, w), single(q, k, v, w))


# --- what moves ------------------------------------------------------------------------------


def test_bytes_moved_equal_the_formula() -> None:
    """Per layer and rank: the all-gathers receive (cp-1)/cp of this dp shard's k and v
    (forward; the backward reuses them), the reduce-scatters (cp-1)/cp of its dk and dv."""
    batch, heads, seq, dim, dp, cp = 2, 2, 64, 8, 2, 4
    q, k, v, w = (t.float() for t in _inputs((batch, heads, seq, dim), 4))
    layout = _spec((0, "dp"), (2, "cp"))
    lowered = ts.jit(
        ts.grad(_loss(True), argnums=(0, 1, 2)),
        mesh=dist.mesh({"dp": dp, "cp": cp}),
        in_shardings=(layout,) * 4,
    ).lower(q, k, v, w)
    received: dict[str, float] = {}
    for c in lowered.collectives():
        assert c.mesh_axes == ("cp",) and c.group_size == cp
        # nbytes: the gathered result of an all_gather, the unscattered input of a reduce_scatter
        received[c.kind] = received.get(c.kind, 0.0) + c.nbytes * (cp - 1) / cp
    kv_bytes = 2 * (batch // dp) * heads * seq * dim * 4  # k and v of this dp shard, f32
    assert received == {
        "all_gather": kv_bytes * (cp - 1) / cp,
        "reduce_scatter": kv_bytes * (cp - 1) / cp,
    }
    sharded = lowered.as_text("sharded")
    assert "all_gather" not in sharded and "reduce_scatter" not in sharded  # expanded at partition


def test_per_rank_memory_falls_with_cp() -> None:
    """The per-rank peak bytes of the attention (forward and backward) fall as cp grows."""
    q, k, v, w = (t.float() for t in _inputs((1, 2, 256, 16), 4))
    peaks = []
    for cp in (1, 2, 4):
        layout = _spec((2, "cp"))
        lowered = ts.jit(
            ts.grad(_loss(True), argnums=(0, 1, 2)),
            mesh=dist.mesh({"cp": cp}),
            in_shardings=(layout,) * 4,
        ).lower(q, k, v, w)
        peaks.append(lowered.memory().peak_bytes)
    assert peaks[0] > peaks[1] > peaks[2], peaks


def test_heads_over_tp_move_nothing() -> None:
    """Megatron: q, k and v split by heads over tp, the attention moves nothing."""
    q, k, v, w = _inputs((2, 4, 16, 8), 4)
    layout = _spec((1, "tp"))
    g = ts.jit(
        ts.grad(_loss(True), argnums=(0, 1, 2)),
        mesh=dist.mesh({"tp": 2}),
        in_shardings=(layout,) * 4,
        kernels="reference",
    )
    assert g.lower(q, k, v, w).collectives() == []
    _close(g(q, k, v, w), _torch_grads(q, k, v, w, True))


def test_ulysses_all_to_all_keeps_working() -> None:
    """DeepSpeed Ulysses: the sequence split over cp moves to the heads before attention
    and back after (dist.shard constraints): all-to-alls by the reshard machinery, no
    gather; forward and gradients match torch."""
    q, k, v, w = _inputs((2, 4, 16, 8), 4, seed=5)
    by_sequence, by_heads = _spec((2, "cp")), _spec((1, "cp"))

    def loss(q, k, v, w):
        q, k, v = (dist.shard(t, by_heads) for t in (q, k, v))
        out = dist.shard(op.attention(q, k, v, causal=True), by_sequence)
        return op.sum(out * w)

    g = ts.jit(
        ts.grad(loss, argnums=(0, 1, 2)),
        mesh=dist.mesh({"cp": 2}),
        in_shardings=(by_sequence,) * 4,
        kernels="reference",
    )
    _close(g(q, k, v, w), _torch_grads(q, k, v, w, True))
    kinds = {c.kind for c in g.lower(q, k, v, w).collectives()}
    assert kinds == {"all_to_all"}, kinds


# --- a transformer layer, sequence-sharded ----------------------------------------------------


def _layer(x, p, heads):
    batch, seq, dim = x.shape
    h = op.layer_norm(x, weight=p["ln_w"], bias=p["ln_b"])

    def split(t):
        return op.transpose(op.reshape(t, (batch, seq, heads, dim // heads)), (0, 2, 1, 3))

    q, k, v = split(h @ p["wq"]), split(h @ p["wk"]), split(h @ p["wv"])
    attn = op.reshape(
        op.transpose(op.attention(q, k, v, causal=True), (0, 2, 1, 3)), (batch, seq, dim)
    )
    x = x + attn @ p["wo"]
    return x + op.gelu(op.layer_norm(x) @ p["w1"]) @ p["w2"]


def _torch_layer(x, p, heads):
    batch, seq, dim = x.shape
    h = F.layer_norm(x, (dim,), p["ln_w"], p["ln_b"])

    def split(t):
        return t.reshape(batch, seq, heads, dim // heads).transpose(1, 2)

    q, k, v = split(h @ p["wq"]), split(h @ p["wk"]), split(h @ p["wv"])
    attn = (
        F.scaled_dot_product_attention(q, k, v, is_causal=True)
        .transpose(1, 2)
        .reshape(batch, seq, dim)
    )
    x = x + attn @ p["wo"]
    return x + F.gelu(F.layer_norm(x, (dim,)) @ p["w1"]) @ p["w2"]


def test_transformer_layer_trains_sequence_sharded() -> None:
    """A pre-LN layer with x split over cp along the sequence (dp x cp): norms, MLP and
    projections run sequence-sharded, attention all-gathers k and v; the loss and the
    weight gradients match torch.autograd in float64."""
    dim, heads = 16, 2
    g = torch.Generator().manual_seed(6)
    p = {n: torch.randn(s, generator=g, dtype=torch.float64) / np.sqrt(s[0]) for n, s in {
        "wq": (dim, dim), "wk": (dim, dim), "wv": (dim, dim), "wo": (dim, dim), "w1": (dim, 4 * dim), "w2": (4 * dim, dim),
    }.items()}  # fmt: skip
    p["ln_w"], p["ln_b"] = (
        1 + 0.1 * torch.randn(dim, generator=g, dtype=torch.float64),
        0.1 * torch.randn(dim, generator=g, dtype=torch.float64),
    )
    x = torch.randn(2, 16, dim, generator=g, dtype=torch.float64)

    def loss(p, x):
        return op.mean(_layer(x, p, heads) ** 2)

    step = ts.jit(
        ts.value_and_grad(loss),
        mesh=dist.mesh({"dp": 2, "cp": 2}, topology=BANDWIDTH_BOUND),  # toy sizes as large
        in_shardings=(None, _spec((0, "dp"), (1, "cp"))),
        kernels="reference",
    )
    value, grads = step(p, x)
    leaves = {n: t.clone().requires_grad_() for n, t in p.items()}
    want = (_torch_layer(x, leaves, heads) ** 2).mean()
    want.backward()
    torch.testing.assert_close(value.double(), want.detach(), rtol=TOLERANCE, atol=TOLERANCE)
    _close([grads[n] for n in p], [leaves[n].grad for n in p])
    kinds = {(c.kind, c.mesh_axes) for c in step.lower(p, x).collectives()}
    assert ("all_gather", ("cp",)) in kinds and ("reduce_scatter", ("cp",)) in kinds
    assert not any(kind == "all_gather" and "dp" in axes for kind, axes in kinds)


def test_the_cost_model_prices_the_expansion() -> None:
    """shard-propagate's cost of attention_backward with q, k and v split over cp is what
    its expansion moves: all-gathers of k and v ((cp-1) x the local block each) and
    reduce-scatters of dk and dv ((cp-1)/cp of the whole each), received per rank; the
    alternative (k and v gathered, dk and dv left partial) is dearer: an all-reduce."""
    from tessera.analysis import op_sharding
    from tessera.analysis.reduction_points import ReductionPoints
    from tessera.analysis.sharding_clock import ShardingClock
    from tessera.ir import graph
    from tessera.ir.sharding import AxisSizes, Sharding
    from tessera.ir.sharding_rules import FactorKind
    from tessera.opdefs import sharding_rule

    batch, heads, seq, dim, cp = 2, 2, 64, 8, 4
    q, k, v, w = (t.float() for t in _inputs((batch, heads, seq, dim), 4))
    lowered = ts.jit(ts.grad(_loss(True), argnums=(0, 1, 2))).lower(q, k, v, w)
    function = next(iter(lowered.module_at("graph").ops))
    (backward,) = [o for o in function.body.block.ops if isinstance(o, graph.AttentionBackwardOp)]
    mesh = AxisSizes((("cp", cp),))
    split, rows = Sharding(((), (), ("cp",), ())), Sharding(((), (), ("cp",)))
    known = [split, split, split, split, rows, rows]
    rule, points = sharding_rule(backward), ReductionPoints()
    assignment = op_sharding.choose(backward, rule, known, mesh, points)
    local = batch * heads * seq // cp * dim * 4  # one rank's block of k (f32)
    clock = ShardingClock(mesh)
    gather = clock.collective("all_gather", ("cp",), local * cp)  # k, v: the gathered whole
    scatter = clock.collective("reduce_scatter", ("cp",), local * cp)  # dk, dv: the whole
    expected = 2 * gather + 2 * scatter
    assert op_sharding._cost(backward, rule, assignment, known, mesh, points) == expected
    without = {f: a for f, a in assignment.items() if rule.kind(f) is not FactorKind.CONTEXT}
    assert op_sharding._cost(backward, rule, without, known, mesh, points) > expected


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_grad_on_a_dgx_h100_shares_the_forward_gathers(causal, dtype) -> None:
    """dq + dk + dv of sum(attention²) (``benchmarks/sharding_vs_jax.py``'s CP grad rows)
    with the sequence over cp = 8 on a named DGX H100 (latency priced):
    k and v are gathered once, the backward reading the forward's gathers, and dk, dv
    reduce-scattered once each (the gathers of the expansion are moves other users share,
    as reshards are: not a second pair of gathers for the backward). Values equal torch's
    in float64 (tolerance 1e-10 absolute and relative)."""

    def loss(q, k, v):
        out = op.attention(q, k, v, causal=causal)
        return op.sum(out * out)

    def step(q, k, v):
        dq, dk, dv = ts.grad(loss, argnums=(0, 1, 2))(q, k, v)
        return dq + dk + dv

    q, k, v = (t.to(dtype) for t in _inputs((1, 2, 64, 16), 3))
    layout = _spec((2, "cp"))
    with schedule.options(context_parallel="all_gather"):
        f = ts.jit(
            step,
            mesh=dist.mesh({"cp": 8}, topology="dgx_h100"),
            in_shardings=(layout,) * 3,
            out_shardings=layout,
            kernels="reference",
        )
        kinds = sorted(c.kind for c in f.lower(q, k, v).collectives())
        assert kinds == ["all_gather"] * 2 + ["reduce_scatter"] * 2
        if dtype == torch.float64:
            leaves = [t.clone().requires_grad_() for t in (q, k, v)]
            (_torch_attention(*leaves, causal) ** 2).sum().backward()
            _close([f(q, k, v)], [sum(t.grad for t in leaves)])
