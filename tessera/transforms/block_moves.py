"""Block moves: re-cutting a dim that is split over a rank group, without gathering it.

``split``, ``concat`` and ``slice`` take *windows* of one index space: a split's results
are windows ``[offset, offset + size)`` of its operand's dim, a concat's operands windows
of its result's, a slice's result a window of its operand's. When the dim stays split
over a group of ``n`` ranks in every tensor (each window cut into ``n`` equal blocks,
the rank at group position ``p`` holding block ``p``), the block a rank needs of a
*target* window covers a global range that lies on one or more blocks of the *source*
windows, on this rank or others. :func:`plan_block_moves` says how every target block is
assembled, the same way on every rank (SPMD), as GSPMD does it:

- the target block is cut into *segments* at every offset where, on some rank, the data
  switches to another source block;
- on rank ``p`` a segment comes from one source block ``q`` at one local offset ``a``:
  the ranks whose segment starts at the same ``(source window, a)`` form one *move*,
  a ``collective_permute`` of every rank's local slice ``[a, a + length)`` with pairs
  ``q -> p`` (a rank sends its slice to at most one rank, as no two targets need the
  same data);
- a segment is the sum of its moves (each rank is the target of exactly one of them,
  the others give it zeros), and a target block the concatenation of its segments.

A move whose pairs all keep a rank's own data moves nothing; one that does so on every
rank is a plain local slice. ``shard-partition`` emits a plan
(:mod:`tessera.passes.shard_partition`), and the sharding decision prices it
(:func:`received_elements`, in elements per unit of the other dims).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import pairwise

from tessera.errors import ShardingError


@dataclass(frozen=True)
class Window:
    """A tensor's dim as the range ``[offset, offset + size)`` of the index space."""

    offset: int
    size: int


@dataclass(frozen=True)
class Move:
    """One ``collective_permute``: every rank's slice ``[start, start + length)`` of its
    block of source window ``source`` goes from group position ``s`` to ``t`` for each
    ``(s, t)`` in ``pairs``."""

    source: int
    start: int
    pairs: tuple[tuple[int, int], ...]

    @property
    def keeps_own_data(self) -> bool:
        """Whether every pair keeps a rank's own data (nothing is sent)."""
        return all(s == t for s, t in self.pairs)


@dataclass(frozen=True)
class Segment:
    """``length`` elements of a target block: the sum of its moves (every rank is the
    target of exactly one)."""

    length: int
    moves: tuple[Move, ...]

    def is_local_slice(self, ranks: int) -> bool:
        """Whether every rank keeps its own data from one offset: a plain local slice."""
        return len(self.moves) == 1 and self.moves[0].pairs == tuple(
            (p, p) for p in range(ranks)
        )


Plan = tuple[tuple[Segment, ...], ...]  # per target window, its segments in order


def plan_block_moves(sources: Sequence[Window], targets: Sequence[Window], ranks: int) -> Plan:
    """How each target window's blocks are built from the source windows' blocks when
    every window is split into ``ranks`` equal blocks (see the module docstring)."""
    return _plan(tuple(sources), tuple(targets), ranks)


@lru_cache(maxsize=4096)
def _plan(sources: tuple[Window, ...], targets: tuple[Window, ...], ranks: int) -> Plan:
    for window in (*sources, *targets):
        if window.size % ranks:
            raise ShardingError(
                f"a window of size {window.size} cannot be split into {ranks} equal blocks"
            )
    return tuple(_plan_target(sources, target, ranks) for target in targets)


def _plan_target(sources: tuple[Window, ...], target: Window, ranks: int) -> tuple[Segment, ...]:
    block = target.size // ranks
    # per rank: the pieces of its block, (start in the block, source window, source rank,
    # start in the source block), in order
    pieces = [_pieces(sources, target.offset + p * block, block, ranks) for p in range(ranks)]
    cuts = sorted({start for rank_pieces in pieces for start, *_ in rank_pieces} | {block})
    segments = []
    for begin, end in pairwise(cuts):
        moves: dict[tuple[int, int], list[tuple[int, int]]] = {}
        for p, rank_pieces in enumerate(pieces):
            start, source, q, local = next(p for p in reversed(rank_pieces) if p[0] <= begin)
            moves.setdefault((source, local + begin - start), []).append((q, p))
        segments.append(
            Segment(end - begin, tuple(Move(s, a, tuple(ps)) for (s, a), ps in moves.items()))
        )
    return tuple(segments)


def _pieces(
    sources: tuple[Window, ...], begin: int, length: int, ranks: int
) -> list[tuple[int, int, int, int]]:
    """The source blocks covering the global range ``[begin, begin + length)``, in
    order: ``(start in the range, source window, source rank, start in its block)``."""
    found = []  # (start in the range, length, source window, source rank, start in block)
    end = begin + length
    for index, source in enumerate(sources):
        block = source.size // ranks
        position = max(begin, source.offset)
        high = min(end, source.offset + source.size)
        while position < high:
            q = (position - source.offset) // block
            stop = min(high, source.offset + (q + 1) * block)
            local = position - source.offset - q * block
            found.append((position - begin, stop - position, index, q, local))
            position = stop
    found.sort()
    reached = 0
    for start, size, *_ in found:
        if start != reached:
            break
        reached += size
    if reached != length:
        raise ShardingError(f"the source windows do not cover [{begin}, {end}) exactly")
    return [(start, index, q, local) for start, _, index, q, local in found]


def received_elements(plan: Plan, ranks: int) -> tuple[tuple[int, ...], ...]:
    """Per target window, per group position: the elements along the dim that the rank
    receives from other ranks (times the other dims' local size, the bytes it receives)."""
    received = []
    for segments in plan:
        counts = [0] * ranks
        for segment in segments:
            for move in segment.moves:
                for s, t in move.pairs:
                    if s != t:
                        counts[t] += segment.length
        received.append(tuple(counts))
    return tuple(received)


def communicating_moves(plan: Plan) -> int:
    """How many collective permutes of the plan send anything."""
    return sum(not move.keeps_own_data for segments in plan for s in segments for move in s.moves)
