"""``ShardingClock``: the sharding decisions price collectives with the alpha-beta model of
``collective_cost`` (algorithm choice and latency included) and break ties by bytes, then
memory per rank."""

from __future__ import annotations

import random
import sys
from math import prod
from pathlib import Path

import pytest
import torch
from machines import BANDWIDTH_BOUND

import tessera as ts
from tessera import dist, op, schedule
from tessera.analysis import op_sharding
from tessera.analysis.reduction_points import ReductionPoints
from tessera.analysis.sharding_clock import ShardingClock
from tessera.ir import graph
from tessera.ir.sharding import Sharding
from tessera.opdefs import sharding_rule
from tessera.perf.collective_cost import algorithms_for, collective_time
from tessera.topology import load_topology

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")


@pytest.mark.parametrize(
    ("axes", "shape"),
    [(("dp", "tp"), (2, 4)), (("dp", "tp"), (4, 4)), (("tp", "dp"), (8, 2))],
)
def test_collective_time_is_collective_costs(axes: tuple[str, ...], shape: tuple[int, ...]) -> None:
    """On random sizes, every kind over every axis set: the fastest algorithm that applies
    to all groups, the slowest group deciding, in units of the fastest link's bytes."""
    nodes = -(-(shape[0] * shape[1]) // 8)
    topology = "dgx_h100" if nodes == 1 else f"dgx_h100x{nodes}"
    mesh = dist.Mesh(axes=list(axes), shape=shape, topology=topology)
    clock = ShardingClock(mesh)
    machine = mesh.machine()
    rng = random.Random(0)
    for _ in range(40):
        kind = rng.choice(KINDS)
        over = rng.choice([(axes[0],), (axes[1],), axes])
        nbytes = rng.choice([rng.randrange(1, 4096), rng.randrange(1, 1 << 30)])
        groups = mesh.groups(list(over))
        times = [algorithms_for(machine, kind, nbytes, g) for g in groups]
        common = [a for a in times[0] if all(a in t for t in times)]
        seconds = min(max(t[a] for t in times) for a in common)
        assert clock.collective(kind, over, nbytes) == round(seconds * clock.unit)
        if len(groups) == 1 or mesh.size <= 8:  # one node: every group alike
            assert seconds == collective_time(machine, kind, nbytes, groups[0]).time_s


def test_latency_counts_and_ties_stay_exact() -> None:
    """A tiny collective costs its latency steps; times are whole units, so sums of equal
    moves compare equal in any order."""
    mesh = dist.Mesh(axes=["dp", "tp"], shape=[2, 4], topology="dgx_h100")
    clock = ShardingClock(mesh)
    alpha = mesh.machine().levels[0].latency_s * clock.unit
    assert clock.collective("all_gather", ("tp",), 0) == round(3 * alpha)  # (n-1) steps
    assert clock.collective("all_reduce", ("tp",), 0) == round(4 * alpha)  # tree: 2 log2 n
    a, b, c = (clock.collective(k, ("tp",), 1000 + i) for i, k in enumerate(KINDS[:3]))
    assert (a + b) + c == a + (b + c) == (c + b) + a


def _sum_over_split_rows(mesh: dist.Mesh) -> set[str]:
    compiled = ts.jit(
        lambda x: op.sum(x, axis=0),
        mesh=mesh,
        in_shardings=(dist.ShardSpec(partition=(0,), mesh_axes=("tp",)),),
        out_shardings=dist.ShardSpec(replicate=True),
    )
    x = torch.randn(8, 16)
    torch.testing.assert_close(compiled(x), x.sum(0), rtol=1e-5, atol=1e-5)
    return {c.kind for c in compiled.lower(x).collectives()}


def test_the_pick_by_time_differs_from_the_pick_by_bytes() -> None:
    """A sum over rows split over tp = 4, of a tiny tensor: the partial sums' all-reduce
    moves fewer bytes (96 received per rank against 384 for gathering the rows) but takes
    a tree's 4 latency steps against the gather's 3: on a named DGX H100 the rows are
    gathered. Where latency is negligible (large tensors, ``BANDWIDTH_BOUND``, or a mesh
    naming no topology), bytes decide."""
    assert _sum_over_split_rows(dist.mesh({"tp": 4}, topology="dgx_h100")) == {"all_gather"}
    assert _sum_over_split_rows(dist.mesh({"tp": 4}, topology=BANDWIDTH_BOUND)) == {"all_reduce"}
    assert _sum_over_split_rows(dist.mesh({"tp": 4})) == {"all_reduce"}
    with schedule.options(topology="dgx_h100"):  # names the machine of a mesh naming none
        assert _sum_over_split_rows(dist.mesh({"tp": 4})) == {"all_gather"}


def test_a_sum_of_partial_terms_is_reduced_once() -> None:
    """A tied embedding's gradient on dp 2 × tp 4 (DGX H100): the head's ``x.T @ g`` and
    the embedding's one-hot product each contract over the tokens split over dp. Alone,
    each would gather its two operands over dp (two 3 us gathers against one 6 us
    all-reduce); their sum takes both terms partial and all-reduces once over dp, as
    GSPMD does (two gathers per term before, four in all). The sizes of
    ``benchmarks/sharding_vs_jax.py``'s row; at a quarter of them the terms' operands are
    too small to gather anyway."""
    vocab, width, tokens = 1024, 128, 64
    mesh = dist.mesh({"dp": 2, "tp": 4}, topology="dgx_h100")

    def tied_head_grad(wte, ids, labels):
        def loss(w):
            x = op.layer_norm(op.embedding(ids, w))
            return op.cross_entropy(x @ op.transpose(w, (1, 0)), labels)

        return ts.grad(loss)(wte)

    rows, tokens_split = dist.ShardSpec((0,), ("tp",)), dist.ShardSpec((0,), ("dp",))
    compiled = ts.jit(
        tied_head_grad, mesh=mesh, in_shardings=(rows, tokens_split, tokens_split), out_shardings=rows
    )
    generator = torch.Generator().manual_seed(0)
    wte = torch.randn(vocab, width, generator=generator, dtype=torch.float64)
    ids, labels = (torch.randint(0, vocab, (tokens,), generator=generator) for _ in range(2))
    want = wte.clone().requires_grad_()
    x = torch.nn.functional.layer_norm(want[ids], (width,))
    torch.nn.functional.cross_entropy(x @ want.T, labels).backward()
    got = compiled(wte.float(), ids.int(), labels.int())
    torch.testing.assert_close(got.double(), want.grad, rtol=1e-4, atol=1e-5)
    over_dp = [c.kind for c in compiled.lower(wte.float(), ids.int(), labels.int()).collectives()
               if c.mesh_axes == ("dp",)]  # fmt: skip
    assert over_dp == ["all_reduce"], over_dp


@pytest.mark.parametrize(("axes", "shape"), [(("tp",), (4,)), (("dp", "tp"), (4, 4))])
def test_a_mesh_naming_no_topology_prices_bytes_without_latency(
    axes: tuple[str, ...], shape: tuple[int, ...]
) -> None:
    """Unnamed, the clock is the default DGX H100s' with zero latency: an empty collective
    is free, and a large one costs what it costs on the named machine less its latency
    steps (the bandwidth term alone, so smaller by at most a few microseconds' units)."""
    unnamed = ShardingClock(dist.Mesh(axes=list(axes), shape=shape))
    nodes = -(-prod(shape) // 8)
    topology = "dgx_h100" if nodes == 1 else f"dgx_h100x{nodes}"
    named = ShardingClock(dist.Mesh(axes=list(axes), shape=shape, topology=topology))
    assert unnamed.machine.levels[0].latency_s == 0.0
    assert unnamed.machine.levels[0].bandwidth == named.machine.levels[0].bandwidth
    assert unnamed.key != named.key
    rng = random.Random(1)
    for _ in range(20):
        kind, over = rng.choice(KINDS), rng.choice([axes[:1], axes])
        assert unnamed.collective(kind, over, 0) == 0.0
        nbytes = rng.randrange(1 << 20, 1 << 30)
        slow, fast = named.collective(kind, over, nbytes), unnamed.collective(kind, over, nbytes)
        assert 0 < fast < slow
        assert slow - fast < 64 * 6e-6 * named.unit  # at most 64 latency steps of <= 6 us


def test_equal_time_and_bytes_go_to_less_memory_per_rank() -> None:
    """exp of a replicated tensor whose user wants it split over (dp, tp) by (rows, cols):
    either split alone is free (a slice), so the first greedy round takes the one that
    leaves less of the result per rank: the columns over tp = 4, before the rows over dp."""
    mesh = dist.Mesh(axes=["dp", "tp"], shape=[2, 4])
    lowered = ts.jit(op.exp).lower(torch.randn(64, 32))
    function = next(iter(lowered.module_at("graph").ops))
    (exp,) = [o for o in function.body.block.ops if isinstance(o, graph.ExpOp)]
    rule, points = sharding_rule(exp), ReductionPoints()
    replicated, wanted = Sharding(((), ())), Sharding((("dp",), ("tp",)))
    pricing = op_sharding._own(exp, rule, [replicated], mesh, points, [wanted])
    rows, cols = {0: ("dp",)}, {1: ("tp",)}
    assert pricing.cost(rows) == pricing.cost(cols) == (0.0, 0.0)
    assert pricing.memory(cols) < pricing.memory(rows)
    assignment = op_sharding.choose(exp, rule, [replicated], mesh, points, [wanted])
    assert list(assignment.items()) == [(1, ("tp",)), (0, ("dp",))]


def test_a_reduction_the_backward_hides_is_credited() -> None:
    """At 1024 tokens over dp = 2, gathering a weight gradient's operands (the tokens'
    activations and their gradients, 10.5 MB received) is priced below all-reducing the
    [4096, 1024] gradient (16.8 MB) plus half the matmul. But w2's all-reduce runs while
    w1's backward matmuls compute (its first reader is the return), so the choice credits
    that compute: w2's gradient is reduced, w1's (nothing after it to hide behind) still
    gathered. The simulated step on a DGX H100 is faster so than with every move priced
    exposed (the clock without the credit: the four gathers): 152.5 against 153.8 µs
    (``benchmarks/overlap_credit.py``, which builds the program; the margin was 7.7%
    before ``overlap-comm`` kept one all-gather ahead, which took the exposed choice's
    four gathers from 165.2 µs: they no longer queue ahead of the one needed first)."""
    from overlap_credit import exposed_moves, weight_gradients

    machine = load_topology("dgx_h100")
    credited = weight_gradients(1024)
    moves = [(c.kind, c.shape) for c in credited.collectives()]
    assert moves == [
        ("all_gather", (1024, 512)),
        ("all_gather", (512, 4096)),
        ("all_reduce", (4096, 1024)),
    ]
    credited_s = credited.simulate(machine).step_time_s
    with exposed_moves():  # stages compile lazily: read them inside
        exposed = weight_gradients(1024)
        assert [c.kind for c in exposed.collectives()] == ["all_gather"] * 4
        exposed_s = exposed.simulate(machine).step_time_s
    assert credited_s < exposed_s
