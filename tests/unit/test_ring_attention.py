"""Ring attention (issue 19): ``op.attention`` with the sequence split over ``cp`` and
``schedule.options(context_parallel="ring")`` passes k/v blocks round the ring by
collective permutes, merges the partial results by the online softmax, passes the dk/dv
accumulators round in the backward, and balances causal work by the zig-zag split.

Results and gradients are compared with torch autograd on random float64 inputs
(tolerance 1e-10 absolute and relative; 2e-5 for the float32 Triton-kernel case); what
moves is read from the compiled program's collectives, memory from its memory plan.
"""

from __future__ import annotations

import pytest
import torch
from attention_reference import close as _close
from attention_reference import inputs as _inputs
from attention_reference import spec as _spec
from attention_reference import torch_attention as _torch_attention
from attention_reference import torch_grads as _torch_grads

import tessera as ts
from tessera import dist, op, schedule
from tessera.errors import TesseraError


def _loss(causal):
    def loss(q, k, v, w):
        return op.sum(op.attention(q, k, v, causal=causal) * w)

    return loss


def _ring_shifts(collectives, cp: int) -> list:
    """The permutes that pass a block one step round the ring (rank i to i + 1)."""
    shift = tuple((i, (i + 1) % cp) for i in range(cp))
    return [c for c in collectives if c.kind == "collective_permute" and tuple(c.pairs) == shift]


# --- results ---------------------------------------------------------------------------------


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize(
    ("axes", "spec"),
    [
        ({"cp": 4}, ((2, "cp"),)),
        ({"dp": 2, "cp": 2}, ((0, "dp"), (2, "cp"))),
        ({"tp": 2, "cp": 2}, ((1, "tp"), (2, "cp"))),
    ],
    ids=["cp4", "dp2xcp2", "tp2xcp2"],
)
def test_forward_and_grad_equal_the_unsharded_attention(causal, axes, spec) -> None:
    """cp alone, dp x cp and tp x cp (heads over tp): the ring's forward and gradients
    match torch, and it moves blocks only by permutes (nothing gathered or scattered)."""
    q, k, v, w = _inputs((2, 4, 16, 8), 4)
    mesh, layout = dist.mesh(axes), _spec(*spec)
    with schedule.options(context_parallel="ring"):
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
        kinds = {c.kind for c in g.lower(q, k, v, w).collectives()}
    assert kinds == {"collective_permute"}, kinds


def test_grouped_query_heads_and_user_offsets() -> None:
    """k and v with fewer heads, and user offsets (a block of a longer sequence) added
    to each rank's zig-zag positions: equal to the same program on one device."""
    q, k, v, w = _inputs((1, 4, 16, 8), 4, seed=3, kv_heads=2)

    def loss(q, k, v, w):
        return op.sum(op.attention(q, k, v, causal=True, q_offset=8, k_offset=4) * w)

    layout = _spec((2, "cp"))
    with schedule.options(context_parallel="ring"):
        g = ts.jit(
            ts.grad(loss, argnums=(0, 1, 2)),
            mesh=dist.mesh({"cp": 2}),
            in_shardings=(layout,) * 4,
            kernels="reference",
        )
        got = g(q, k, v, w)
    _close(got, ts.jit(ts.grad(loss, argnums=(0, 1, 2)), kernels="reference")(q, k, v, w))


def test_odd_blocks_ring_without_the_zigzag() -> None:
    """A local block of odd length cannot be halved: the causal ring runs contiguous
    (correct, unbalanced), with no relayout permutes."""
    q, k, v, w = _inputs((1, 2, 12, 8), 4, seed=4)  # cp = 4: local blocks of 3
    layout = _spec((2, "cp"))
    with schedule.options(context_parallel="ring"):
        g = ts.jit(
            ts.grad(_loss(True), argnums=(0, 1, 2)),
            mesh=dist.mesh({"cp": 4}),
            in_shardings=(layout,) * 4,
            kernels="reference",
        )
        _close(g(q, k, v, w), _torch_grads(q, k, v, w, True))
        collectives = g.lower(q, k, v, w).collectives()
    assert len(_ring_shifts(collectives, 4)) == len(collectives)


def test_generated_kernels_on_cp() -> None:
    """The same through the Triton kernels (float32; positions computed per rank)."""
    q, k, v, w = (t.float() for t in _inputs((1, 2, 32, 8), 4, seed=1))
    layout = _spec((2, "cp"))
    with schedule.options(context_parallel="ring"):
        g = ts.jit(
            ts.grad(_loss(True), argnums=(0, 1, 2)),
            mesh=dist.mesh({"cp": 2}),
            in_shardings=(layout,) * 4,
            kernels="triton",
        )
        got = g(q, k, v, w)
    _close(got, _torch_grads(q.double(), k.double(), v.double(), w.double(), True), tolerance=2e-5)


# --- what moves, what stays ------------------------------------------------------------------


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_ring_bytes_are_cp_minus_one_over_cp_of_k_and_v(causal: bool) -> None:
    """Per layer and rank, the forward's ring receives (cp-1)/cp of k and v (of its dp
    shard); the backward passes k and v the same way plus the dk, dv accumulators, which
    also take cp - 1 permutes (they start on the next rank and arrive home while the own
    block computes). (The causal zig-zag relayout is separate permutes.)"""
    batch, heads, seq, dim, dp, cp = 2, 2, 64, 8, 2, 4
    q, k, v, w = (t.float() for t in _inputs((batch, heads, seq, dim), 4))
    layout = _spec((0, "dp"), (2, "cp"))
    mesh = dist.mesh({"dp": dp, "cp": cp})
    kv_bytes = 2 * (batch // dp) * heads * seq * dim * 4  # k and v of this dp shard, f32
    with schedule.options(context_parallel="ring"):
        forward = ts.jit(
            lambda q, k, v: op.attention(q, k, v, causal=causal),
            mesh=mesh,
            in_shardings=(layout,) * 3,
        )
        shifts = _ring_shifts(forward.lower(q, k, v).collectives(), cp)
        assert sum(c.nbytes for c in shifts) == kv_bytes * (cp - 1) / cp
        grad = ts.jit(
            ts.grad(_loss(causal), argnums=(0, 1, 2)), mesh=mesh, in_shardings=(layout,) * 4
        )
        shifts = _ring_shifts(grad.lower(q, k, v, w).collectives(), cp)
    block = kv_bytes / cp
    assert sum(c.nbytes for c in shifts) == 3 * (cp - 1) * block


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_per_rank_activation_memory_falls_as_one_over_cp(causal: bool) -> None:
    """Per-rank activation bytes of a ring attention grad step (forward and backward,
    float32 ``[1, 2, 512, 16]``): the memory plan's arena peak (``memory().peak_bytes``)
    less the arguments (q, k, v and the cotangent w, caller-owned and live throughout).

    They fall as 1/cp: at most ``3.75/cp`` of cp = 1's and at most 0.6 of cp = 4's at cp
    = 8 (measured at cp = 2, 4, 8: 1.8, 2.7, 2.5 /cp full, 2.5, 3.4, 3.6 /cp causal; 0.47
    and 0.54 from cp = 4 to 8; the plan's live bytes alone are flat in cp·bytes from cp =
    4 to 8, the rest is first-fit fragmentation). The constant is the ring's working set
    of blocks: the block in use and the next one in flight (one step ahead,
    ``overlap-comm``), the dk/dv accumulators being sent and received, this step's
    partial results and the dq accumulator, where one rank holds o, dq, dk and dv whole;
    causal attention also keeps the zig-zag copies of k and v to the end of the backward
    (the own block computes last). Each step's merge is a kernel of its step
    (``lower-graph-to-schedule`` fuses nothing across an attention kernel), so the
    steps' partial results are never live at once. The all-gather holds whole k and v:
    from cp = 4 the ring is below it (at cp = 2 the gathered k and v are two blocks, as
    the ring's block in use and the next one: within 5 %)."""
    q, k, v, w = (t.float() for t in _inputs((1, 2, 512, 16), 4))
    layout = _spec((2, "cp"))
    arguments = sum(t.numel() * t.element_size() for t in (q, k, v, w))
    activation: dict[tuple[str, int], int] = {}
    for method in ("ring", "all_gather"):
        for cp in (1, 2, 4, 8):
            with schedule.options(context_parallel=method):
                step = ts.jit(
                    ts.grad(_loss(causal), argnums=(0, 1, 2)),
                    mesh=dist.mesh({"cp": cp}),
                    in_shardings=(layout,) * 4,
                )
                peak = step.lower(q, k, v, w).memory().peak_bytes
            activation[method, cp] = peak - arguments // cp
    alone = activation["ring", 1]
    for cp in (2, 4, 8):
        assert activation["ring", cp] * cp <= 3.75 * alone, (cp, activation)
        limit = 1.05 if cp == 2 else 1.0
        assert activation["ring", cp] < limit * activation["all_gather", cp], activation
    assert activation["ring", 8] <= 0.6 * activation["ring", 4], activation


# --- the choice ------------------------------------------------------------------------------


def test_cost_model_gathers_short_sequences_and_rings_long_ones() -> None:
    """With the default ``auto``: a short sequence all-gathers k and v (launches and
    merges would dominate the ring), a long one rings (each step's block hides the next
    block's transfer)."""
    mesh, layout = dist.mesh({"cp": 8}), _spec((2, "cp"))
    kinds = {}
    for seq in (256, 65536):
        q = torch.empty(1, 8, seq, 128, dtype=torch.bfloat16)
        f = ts.jit(
            lambda q, k, v: op.attention(q, k, v, causal=True),
            mesh=mesh,
            in_shardings=(layout,) * 3,
        )
        kinds[seq] = {c.kind for c in f.lower(q, q, q).collectives()}
    assert kinds[256] == {"all_gather"}
    assert kinds[65536] == {"collective_permute"}


def test_the_ring_schedule_overlaps_transfers_with_blocks() -> None:
    """In the schedule, each attention kernel but the first runs while a later block's
    permute is in flight (started before the kernel, waited for after it)."""
    q = torch.empty(1, 2, 64, 8)
    with schedule.options(context_parallel="ring"):
        f = ts.jit(
            lambda q, k, v: op.attention(q, k, v),
            mesh=dist.mesh({"cp": 4}),
            in_shardings=(_spec((2, "cp")),) * 3,
        )
        lines = [line.strip() for line in f.lower(q, q, q).as_text("schedule").splitlines()]
    in_flight = []  # (start line, wait line) of each permute
    for i, line in enumerate(lines):
        if "schedule.start collective_permute" in line:
            handle = line.split(" = ")[0]
            wait = next(j for j, other in enumerate(lines) if f"schedule.wait {handle} " in other)
            in_flight.append((i, wait))
    kernels = [
        i for i, line in enumerate(lines) if "schedule.kernel" in line and "attention" in line
    ]
    assert len(kernels) == 4 and len(in_flight) == 6
    overlapped = [k for k in kernels if any(s < k < w for s, w in in_flight)]
    assert len(overlapped) >= 3, (kernels, in_flight)


def test_unknown_method_is_named() -> None:
    with (
        pytest.raises(
            TesseraError,
            match="context_parallel must be one of auto, ring, all_gather, found 'rings'",
        ),
        schedule.options(context_parallel="rings"),
    ):
        pass
