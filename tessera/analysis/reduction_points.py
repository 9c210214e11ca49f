"""Where a partial sum is reduced: where it is made, or after the linear ops it feeds.

A value partial over a mesh axis (each rank holds a term of a sum) may stay partial
through ops linear in it, so that the all-reduce happens later, often on a smaller
tensor (GSPMD's lazy all-reduce). That pays only when the partial terms end in fewer
bytes than the value itself. A layer norm's backward shows when it does not: its
incoming gradient ``g`` [B, T, C] feeds three linear results, the input gradient
[B, T, C] and the weight and bias gradients [C]; carried partial, they need three
all-reduces where reducing ``g`` first needs one (Megatron-LM reduces ``g``).

:class:`ReductionPoints` decides per value, structurally (for any partial layout):
``value in points`` means that a partial ``value`` is reduced before its consumers use
it. That holds when some consumer needs it whole (an op not linear in it), so that
the reduction happens anyway and the other consumers share it; or when the values
where its partial terms would end ("sinks") hold more bytes than the value itself.
A cast tagged ``graph.reduce_widened`` (a mixed-precision step reducing its gradients
in f32) carries partial sums and counts at its operand's width, so its partial terms
are reduced after it, in the wider dtype.
"""

from __future__ import annotations

from collections.abc import Callable
from heapq import heappop, heappush
from itertools import count

from xdsl.ir import Block, Operation, SSAValue

from tessera.ir.abstract import aval
from tessera.opdefs import has_sharding_rule, lookup

# Values visited from one partial value before giving up and deferring (the behaviour
# without the analysis); the backward of a layer reaches its sinks in a few dozen.
MAX_CONE = 512
REDUCE_WIDENED = "graph.reduce_widened"  # on a cast: reduce its result, not its operand


class ReductionPoints:
    """Memoized ``value in points``: reduce a partial ``value`` before its uses."""

    def __init__(self) -> None:
        self._known: dict[SSAValue, bool] = {}
        self._positions: dict[Block, dict[Operation, int]] = {}

    def __contains__(self, value: object) -> bool:
        if not isinstance(value, SSAValue):
            return False
        if value not in self._known:
            self._known[value] = self._reduce_early(value)
        return self._known[value]

    def _reduce_early(self, value: SSAValue) -> bool:
        if needed_whole(value):
            return True
        cone = self._cone(value)
        if cone is None:
            return False
        sinks = {w for w in cone if not all(_carries(u.operation, u.index, cone) for u in w.uses)}
        return sum(_bytes(w) for w in sinks) > aval(value).nbytes

    def _cone(self, value: SSAValue) -> set[SSAValue] | None:
        """The values ``value``'s partial terms reach through ops linear in them, walked
        in program order so that an op's operands are settled before its results: an
        op carries the partial terms unless it merges them with a value outside the cone
        (an add) or multiplies two values of the cone (not linear)."""
        position = self._position_of(value)
        cone = {value}
        queued: set[SSAValue] = set()
        heap: list[tuple[int, int, SSAValue]] = []
        tie = count()

        def queue_consumers(of: SSAValue) -> None:
            if not all(_linear_in(u.operation, u.index) for u in of.uses):
                return  # reduced here anyway; its consumers read the whole value
            for use in of.uses:
                for result in use.operation.results:
                    if result not in queued:
                        queued.add(result)
                        heappush(heap, (position(result), next(tie), result))

        queue_consumers(value)
        while heap:
            _, _, result = heappop(heap)
            producer = result.owner
            assert isinstance(producer, Operation)
            carried = [
                _carries(producer, i, cone) for i, v in enumerate(producer.operands) if v in cone
            ]
            if carried and all(carried):
                cone.add(result)
                if len(cone) > MAX_CONE:
                    return None
                queue_consumers(result)
        return cone

    def _position_of(self, value: SSAValue) -> Callable[[SSAValue], int]:
        owner = value.owner
        block = owner if isinstance(owner, Block) else owner.parent_block()
        assert block is not None
        if block not in self._positions:
            self._positions[block] = {op: i for i, op in enumerate(block.ops)}
        positions = self._positions[block]
        return lambda v: positions.get(v.owner, -1)  # type: ignore[arg-type]


def _bytes(value: SSAValue) -> int:
    """A sink's bytes (a cast tagged ``graph.reduce_widened``: its operand's)."""
    owner = value.owner
    if isinstance(owner, Operation) and REDUCE_WIDENED in owner.attributes:
        return aval(owner.operands[0]).nbytes
    return aval(value).nbytes


def needed_whole(value: SSAValue) -> bool:
    """Whether a consumer of ``value`` is a graph op not linear in any operand."""
    return any(
        has_sharding_rule(use.operation) and _partial(use.operation) is None
        for use in value.uses
    )


def _partial(op: Operation) -> str | tuple[int, ...] | None:
    """Which operands ``op`` is linear in ("all" or indices); None when none."""
    if REDUCE_WIDENED in op.attributes:  # a widening cast chosen to carry the partial sums
        return "all"
    found = lookup(op)
    return found.partial if found is not None and found.linear else None  # type: ignore[return-value]


def _linear_in(op: Operation, index: int) -> bool:
    policy = _partial(op)
    return policy is not None and (policy == "all" or index in policy)


def _carries(op: Operation, index: int, cone: set[SSAValue]) -> bool:
    """Whether ``op`` keeps operand ``index`` partial, given the cone's values."""
    if not _linear_in(op, index):
        return False
    others = [v for i, v in enumerate(op.operands) if i != index]
    if _partial(op) == "all":
        return all(v in cone for v in others)
    return not any(v in cone for v in others)
