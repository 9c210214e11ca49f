"""Alpha-beta cost model of collectives on a :class:`~tessera.topology.Topology`.

A group of ``n`` ranks talks over the smallest level holding it all (``Topology.level_of``),
with latency α and per-device, per-direction bandwidth B. ``S`` is: for all_reduce the
operand (= result) size; all_gather the gathered result; reduce_scatter the operand before
scattering; all_to_all the operand; broadcast, send, recv and collective_permute the
message (a collective_permute's ranks are those of its pairs that move data: every target
receives its message at once). A group of one
rank costs nothing (``"direct"``). The closed forms (Thakur, Rabenseifner & Gropp,
"Optimization of Collective Communication Operations in MPICH", IJHPCA 19(1), 2005; NCCL's
"bus bandwidth" factors, https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md)::

    all_reduce  ring          2(n-1)α + 2(n-1)/n · S/B
                tree          2⌈log2 n⌉α + 2·S/B              (NCCL double binary tree)
                nvls          2α_sharp + S/B_sharp            (SHARP: group within sharp.level,
                                                               min_bytes <= S <= max_bytes)
                hierarchical  RS(n1, S, inner) + min(ring, tree)(n2, S/n1, outer) + AG(n1, S, inner)
    all_gather, reduce_scatter
                ring          (n-1)α + (n-1)/n · S/B
                hierarchical  AG: AG(n2, S/n1, outer) + AG(n1, S, inner);
                              RS: RS(n1, S, inner) + RS(n2, S/n1, outer)
    all_to_all  direct        (n-1)α + (n-1)/n · S/B          (pairwise exchange)
                hierarchical  A2A(n1, S, inner) + A2A(n2, S, outer)
                                                              (within domains, then across)
    broadcast   tree          ⌈log2 n⌉α + S/B
    send, recv  direct        α + S/B                         (ranks: the two peers)
    collective_permute
                direct        α + S/B                         (ranks: sources and targets)

Hierarchical applies when the group spans level ``L > 0`` as ``n2 > 1`` inner groups of
``n1 > 1`` members each (``Topology.group_counts``); its inner phases use ``levels[L-1]`` and
its outer phase ``levels[L]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tessera.errors import TesseraError
from tessera.ir.schedule import ALGORITHMS
from tessera.topology import Link, Topology

COLLECTIVE_OPERATIONS = (
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "broadcast",
    "collective_permute",
    "send",
    "recv",
)


@dataclass(frozen=True)
class CollectiveCost:
    """Modelled time of one collective and the algorithm that achieves it."""

    time_s: float
    algorithm: str  # "ring" | "tree" | "hierarchical" | "nvls" | "direct"


def _steps(n: int) -> int:
    """⌈log2 n⌉ for n >= 1."""
    return (n - 1).bit_length()


def _ring_all_reduce(n: int, nbytes: float, link: Link) -> float:
    return 2 * (n - 1) * link.latency_s + 2 * (n - 1) / n * nbytes / link.bandwidth


def _tree_all_reduce(n: int, nbytes: float, link: Link) -> float:
    return 2 * _steps(n) * link.latency_s + 2 * nbytes / link.bandwidth


def _ring_gather(n: int, nbytes: float, link: Link) -> float:
    """Ring all_gather / reduce_scatter of S bytes (also the all_to_all form)."""
    return (n - 1) * link.latency_s + (n - 1) / n * nbytes / link.bandwidth


def algorithms_for(
    topology: Topology, kind: str, nbytes: int, ranks: Sequence[int]
) -> dict[str, float]:
    """Time of every algorithm that applies to this collective, by algorithm name."""
    if kind not in COLLECTIVE_OPERATIONS:
        raise TesseraError(f"unknown collective {kind!r}; valid: {', '.join(COLLECTIVE_OPERATIONS)}")
    if nbytes < 0:
        raise TesseraError(f"{kind}: nbytes must be >= 0, got {nbytes!r}")
    ranks = topology.check_ranks(ranks)
    if len(set(ranks)) != len(ranks):
        raise TesseraError(f"{kind}: ranks {ranks} repeat a rank")
    n = len(ranks)
    if kind in ("send", "recv") and n != 2:
        raise TesseraError(f"{kind}: ranks must be the two peers, got {ranks}")
    if n == 1:
        return {"direct": 0.0}
    level = topology.level_of(ranks)
    link = topology.levels[level]
    if kind in ("send", "recv", "collective_permute"):
        return {"direct": link.latency_s + nbytes / link.bandwidth}
    if kind == "broadcast":
        return {"tree": _steps(n) * link.latency_s + nbytes / link.bandwidth}

    counts = topology.group_counts(ranks)
    two_level = len(counts) > 1 and counts[0] > 1 and len(set(counts)) == 1
    n1, n2 = counts[0], len(counts)
    inner = topology.levels[level - 1]
    if kind == "all_to_all":
        # hierarchical: each member first exchanges with its domain the pieces bound for
        # every domain's member at each position (all S bytes, inner links), then with
        # the members at its position in the other domains (S bytes, n2 - 1 messages)
        times = {"direct": _ring_gather(n, nbytes, link)}
        if two_level:
            times["hierarchical"] = _ring_gather(n1, nbytes, inner) + _ring_gather(
                n2, nbytes, link
            )
        return times
    if kind == "all_reduce":
        times = {
            "ring": _ring_all_reduce(n, nbytes, link),
            "tree": _tree_all_reduce(n, nbytes, link),
        }
        if two_level:
            outer = min(
                _ring_all_reduce(n2, nbytes / n1, link), _tree_all_reduce(n2, nbytes / n1, link)
            )
            times["hierarchical"] = 2 * _ring_gather(n1, nbytes, inner) + outer
        sharp = topology.sharp
        if sharp and level <= sharp.level and sharp.min_bytes <= nbytes <= sharp.max_bytes:
            times["nvls"] = 2 * sharp.latency_s + nbytes / sharp.bandwidth
        return times
    # all_gather and reduce_scatter: the two-level forms cost the same, phases reversed
    times = {"ring": _ring_gather(n, nbytes, link)}
    if two_level:
        times["hierarchical"] = _ring_gather(n1, nbytes, inner) + _ring_gather(
            n2, nbytes / n1, link
        )
    return times


def collective_time(
    topology: Topology,
    kind: str,
    nbytes: int,
    ranks: Sequence[int],
    algorithm: str | None = None,
) -> CollectiveCost:
    """Modelled time of ``kind`` over ``ranks`` moving ``nbytes``: with ``algorithm`` ``None``
    the fastest applicable algorithm, else the one named."""
    times = algorithms_for(topology, kind, nbytes, ranks)
    if algorithm is None:
        algorithm = min(times, key=times.__getitem__)
    elif algorithm not in times:
        problem = "does not apply" if algorithm in (*ALGORITHMS, "direct") else "is unknown"
        raise TesseraError(
            f"algorithm {algorithm!r} {problem} for {kind} of {nbytes} bytes over {len(ranks)} "
            f"ranks on {topology.name!r}; applicable: {', '.join(times)}"
        )
    return CollectiveCost(times[algorithm], algorithm)


def groups_time(
    topology: Topology, kind: str, nbytes: int, groups: Sequence[Sequence[int]]
) -> CollectiveCost:
    """Modelled time of ``kind`` run at once over every group of ``groups`` (the process
    groups of one collective over some mesh axes): the fastest algorithm that applies to
    every group, the slowest group's time deciding (as ``choose-collective-algorithms``
    picks, in the cost model's order)."""
    times = [algorithms_for(topology, kind, nbytes, group) for group in groups]
    candidates = [a for a in times[0] if all(a in t for t in times)]
    algorithm = min(candidates, key=lambda a: max(t[a] for t in times))
    return CollectiveCost(max(t[algorithm] for t in times), algorithm)
