"""Attention over a sequence stored in zig-zag order (issue 19): ``op.attention(...,
zigzag=n)`` with q, k, v stored as ``x[..., dist.zigzag_order(T, n), :]`` (a data
loader's choice, Megatron-LM's load-balanced context parallelism) equals torch's causal
attention on the natural order, stored the same way; with the sequence split over ``n``
ranks the ring moves k and v only (no relayout), and the all-gather and the unsharded
program put chunks in true order locally (``unzigzag-attention``).

Results and gradients are compared with torch autograd on random float64 inputs
(tolerance 1e-10 absolute and relative; 1e-9 through the Triton kernels).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from attention_reference import close, inputs, spec, torch_attention, torch_grads
from hypothesis import given, settings
from hypothesis import strategies as st

import tessera as ts
from tessera import dist, op, schedule
from tessera.errors import ShapeError, TesseraError
from tessera.ir.zigzag import true_chunk


def _stored(ranks: int, *tensors: torch.Tensor) -> list[torch.Tensor]:
    """``tensors`` with their sequence (dim -2) stored in zig-zag order over ``ranks``."""
    order = torch.from_numpy(dist.zigzag_order(tensors[0].shape[-2], ranks))
    return [t[..., order, :] for t in tensors]


def _loss(zigzag: int, causal: bool = True, **offsets: int):
    def loss(q, k, v, w):
        return op.sum(op.attention(q, k, v, causal=causal, zigzag=zigzag, **offsets) * w)

    return loss


def _expected(ranks: int, q, k, v, w, causal: bool = True) -> list[torch.Tensor]:
    """torch's output and dq, dk, dv on the natural order, each stored zig-zag."""
    return _stored(ranks, torch_attention(q, k, v, causal), *torch_grads(q, k, v, w, causal))


def _ring_shifts(collectives, cp: int) -> list:
    shift = tuple((i, (i + 1) % cp) for i in range(cp))
    return [c for c in collectives if c.kind == "collective_permute" and tuple(c.pairs) == shift]


# --- the order ------------------------------------------------------------------------------


@given(ranks=st.integers(1, 8), chunk=st.integers(1, 5))
def test_the_contiguous_split_of_the_stored_order_is_each_ranks_zigzag_pair(ranks, chunk) -> None:
    """``zigzag_order`` is a permutation; rank r's contiguous block of the stored sequence
    holds true chunks r and 2n - 1 - r, so every rank has the same causal work."""
    order = dist.zigzag_order(2 * ranks * chunk, ranks)
    assert sorted(order.tolist()) == list(range(2 * ranks * chunk))
    for rank in range(ranks):
        block = order[2 * rank * chunk : 2 * (rank + 1) * chunk]
        pair = (rank, 2 * ranks - 1 - rank)
        assert block.tolist() == [c * chunk + i for c in pair for i in range(chunk)]
        assert [true_chunk(2 * rank + s, ranks) for s in (0, 1)] == list(pair)
    # causal work (visible keys) per rank: equal
    work = [
        sum(int(p) + 1 for p in order[r * 2 * chunk : (r + 1) * 2 * chunk]) for r in range(ranks)
    ]
    assert len(set(work)) == 1


# --- one device ---------------------------------------------------------------------------------


@pytest.mark.parametrize("kernels", ["reference", "triton"])
@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_unsharded_equals_torch_on_the_natural_order(kernels: str, ranks: int) -> None:
    """Forward and gradients on one device, by the reference executor and through the
    Triton kernels (``unzigzag-attention`` puts the chunks in true order)."""
    q, k, v, w = inputs((1, 2, 12 * ranks, 8), 4, seed=ranks)
    f = ts.jit(lambda q, k, v: op.attention(q, k, v, causal=True, zigzag=ranks), kernels=kernels)
    g = ts.jit(ts.grad(_loss(ranks), argnums=(0, 1, 2)), kernels=kernels)
    stored = _stored(ranks, q, k, v, w)
    close([f(*stored[:3]), *g(*stored)], _expected(ranks, q, k, v, w), tolerance=1e-9)


def test_grouped_query_heads_offsets_and_full_attention() -> None:
    """Grouped k/v heads and user offsets (a block of a longer sequence: true positions
    plus the offsets), and non-causal attention, which the order does not change."""
    q, k, v, w = inputs((1, 4, 16, 8), 4, seed=5, kv_heads=2)
    stored = _stored(2, q, k, v, w)
    g = ts.jit(ts.grad(_loss(2, q_offset=8, k_offset=4), argnums=(0, 1, 2)), kernels="reference")
    plain = ts.jit(
        ts.grad(
            lambda q, k, v, w: op.sum(
                op.attention(q, k, v, causal=True, q_offset=8, k_offset=4) * w
            ),
            argnums=(0, 1, 2),
        ),
        kernels="reference",
    )
    close(g(*stored), _stored(2, *plain(q, k, v, w)))
    full = ts.jit(ts.grad(_loss(2, causal=False), argnums=(0, 1, 2)), kernels="reference")
    close(full(*stored), _stored(2, *torch_grads(q, k, v, w, False)))


# --- context parallel -------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["ring", "all_gather"])
@pytest.mark.parametrize(
    ("axes", "layout", "ranks"),
    [
        ({"cp": 2}, ((2, "cp"),), 2),
        ({"cp": 4}, ((2, "cp"),), 4),
        ({"cp": 2}, ((2, "cp"),), 4),  # 4 stored chunks per rank: gathered
        ({"dp": 2, "cp": 2}, ((0, "dp"), (2, "cp")), 2),
    ],
    ids=["cp2", "cp4", "cp2-order4", "dp2xcp2"],
)
def test_sharded_equals_torch(method, axes, layout, ranks) -> None:
    """Forward and gradients with the sequence split over cp equal torch's (stored)."""
    q, k, v, w = inputs((2, 2, 32, 8), 4, seed=7)
    stored = _stored(ranks, q, k, v, w)
    mesh, shard = dist.mesh(axes), spec(*layout)
    with schedule.options(context_parallel=method):
        f = ts.jit(
            lambda q, k, v: op.attention(q, k, v, causal=True, zigzag=ranks),
            mesh=mesh, in_shardings=(shard,) * 3, kernels="reference",
        )  # fmt: skip
        g = ts.jit(
            ts.grad(_loss(ranks), argnums=(0, 1, 2)),
            mesh=mesh, in_shardings=(shard,) * 4, kernels="reference",
        )  # fmt: skip
        close([f(*stored[:3]), *g(*stored)], _expected(ranks, q, k, v, w))
        kinds = {c.kind for c in g.lower(*stored).collectives()}
    if method == "ring" and ranks == axes["cp"]:
        assert kinds == {"collective_permute"}, kinds
    else:  # the gathered keys are put in true order locally: nothing else moves
        assert "collective_permute" not in kinds, kinds


@settings(max_examples=6, deadline=None)
@given(
    cp=st.sampled_from([2, 4]),
    chunk=st.sampled_from([1, 2, 3]),
    method=st.sampled_from(["ring", "all_gather"]),
    seed=st.integers(0, 2**16),
)
def test_property_sharded_equals_unsharded(cp, chunk, method, seed) -> None:
    """For random chunk lengths, cp and methods, the context-parallel gradient step
    equals the same program on one device."""
    q, k, v, w = inputs((1, 2, 2 * cp * chunk, 4), 4, seed=seed)
    stored = _stored(cp, q, k, v, w)
    with schedule.options(context_parallel=method):
        g = ts.jit(
            ts.grad(_loss(cp), argnums=(0, 1, 2)),
            mesh=dist.mesh({"cp": cp}), in_shardings=(spec((2, "cp")),) * 4, kernels="reference",
        )  # fmt: skip
        got = g(*stored)
    alone = ts.jit(ts.grad(_loss(cp), argnums=(0, 1, 2)), kernels="reference")
    close(got, alone(*stored))


# --- what moves --------------------------------------------------------------------------------


@pytest.mark.parametrize("cp", [2, 4])
def test_the_ring_moves_only_k_and_v(cp: int) -> None:
    """Causal ring attention over inputs stored zig-zag: every permute is a ring shift;
    the forward receives (cp-1)/cp of k and v per rank, the grad step k and v again and
    the dk/dv accumulators, (cp-1) blocks each. Inputs in natural order need the
    relayout: more permutes and more bytes."""
    batch, heads, seq, dim = 1, 2, 64, 8
    q, k, v, w = (t.float() for t in inputs((batch, heads, seq, dim), 4))
    stored = _stored(cp, q, k, v, w)
    mesh, shard = dist.mesh({"cp": cp}), spec((2, "cp"))
    kv_bytes = 2 * batch * heads * seq * dim * 4
    with schedule.options(context_parallel="ring"):
        forward = ts.jit(
            lambda q, k, v: op.attention(q, k, v, causal=True, zigzag=cp),
            mesh=mesh, in_shardings=(shard,) * 3,
        )  # fmt: skip
        moved = forward.lower(*stored[:3]).collectives()
        assert _ring_shifts(moved, cp) == moved
        assert sum(c.nbytes for c in moved) == kv_bytes * (cp - 1) / cp
        grad = ts.jit(ts.grad(_loss(cp), argnums=(0, 1, 2)), mesh=mesh, in_shardings=(shard,) * 4)
        moved = grad.lower(*stored).collectives()
        assert _ring_shifts(moved, cp) == moved
        assert sum(c.nbytes for c in moved) == 3 * (cp - 1) * kv_bytes / cp
        natural = ts.jit(
            ts.grad(
                lambda q, k, v, w: op.sum(op.attention(q, k, v, causal=True) * w), argnums=(0, 1, 2)
            ),
            mesh=mesh, in_shardings=(shard,) * 4,
        )  # fmt: skip
        relaid = natural.lower(q, k, v, w).collectives()
    assert len(relaid) > len(moved)
    assert sum(c.nbytes for c in relaid) > sum(c.nbytes for c in moved)


def test_the_cost_model_prices_no_relayout_for_stored_order() -> None:
    """A long causal sequence stored zig-zag: the ring (no relayout) is chosen and priced
    below the same ring with the relayout."""
    from tessera.perf.context_parallel import context_cost
    from tessera.topology import load_topology

    kwargs = dict(
        block_flops=1e12, kv_bytes=2**27, io_bytes=2**28, dtype="bf16", calls_per_step=3,
        merge_bytes=2**26,
    )  # fmt: skip
    machine = load_topology("dgx_h100")
    stored = context_cost(machine, 8, **kwargs)
    relaid = context_cost(machine, 8, relayout_bytes=2**28, **kwargs)
    assert stored.ring < relaid.ring and stored.all_gather == relaid.all_gather
    q = torch.empty(1, 8, 65536, 128, dtype=torch.bfloat16)
    f = ts.jit(
        lambda q, k, v: op.attention(q, k, v, causal=True, zigzag=8),
        mesh=dist.mesh({"cp": 8}), in_shardings=(spec((2, "cp")),) * 3,
    )  # fmt: skip
    moved = f.lower(q, q, q).collectives()
    assert moved and _ring_shifts(moved, 8) == moved


# --- errors --------------------------------------------------------------------------------


def test_bad_orders_are_named_at_the_users_line() -> None:
    q = np.zeros((1, 2, 12, 4), np.float32)
    for ranks, message in (
        (4, "cuts the query sequence into 8 chunks, but its length 12 is not divisible by 8"),
        (0, "zigzag must be a positive number of ranks, found 0"),
        (True, "zigzag must be a positive number of ranks, found True"),
        (1.5, "zigzag must be a positive number of ranks, found 1.5"),
    ):
        f = ts.jit(lambda q, ranks=ranks: op.attention(q, q, q, causal=True, zigzag=ranks))
        with pytest.raises(ShapeError, match=message) as error:
            f(q)
        assert "test_zigzag_attention.py" in str(error.value)


def test_queries_split_finer_than_the_order_are_named() -> None:
    """An order over 2 ranks cannot give each of 4 ranks whole chunk pairs."""
    q = torch.zeros(1, 2, 16, 4)
    with schedule.options(context_parallel="all_gather"):
        f = ts.jit(
            lambda q, k, v: op.attention(q, k, v, causal=True, zigzag=2),
            mesh=dist.mesh({"cp": 4}), in_shardings=(spec((2, "cp")),) * 3,
        )  # fmt: skip
        with pytest.raises(
            TesseraError, match="split into 4 pieces over \\['cp'\\], which does not divide"
        ):
            f(q, q, q)
