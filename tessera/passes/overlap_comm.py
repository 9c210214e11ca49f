"""``overlap-comm``: start each collective as early and wait for it as late as its data allow.

Runs on the Schedule IR (after ``lower-graph-to-schedule``, before ``plan-memory``). A
rank issues its program in order; a ``schedule.start`` queues the collective on the
communication stream, and a ``schedule.wait`` makes the compute stream wait for it (as
``torch.distributed``'s ``work.wait()`` does). So the kernels between a start and its
wait are what the transfer can hide behind. The pass:

- moves every start up to just after the op that makes its operand (after the starts
  already there, keeping their order: the communication stream runs them in order); a
  recv, which has no operand, stays where it is;
- but a *relay* (a collective permute of a block another permute brought, as a ring
  passes blocks on) starts one step ahead only: just before the first op other than a
  start that reads the block, so the block moves on while that op computes with it and
  a ring holds two blocks at a time, not all of them (its wait goes along when the
  start moves past it);
- but an *all-gather* starts no earlier than the first reader of the all-gather read
  before it (ordering them by their first readers): one all-gather is prefetched while
  the previous one's reader computes, as FSDP prefetches the next layer's parameters and
  XLA's latency-hiding scheduler keeps one all-gather in flight. A gathered copy is
  whole from its start, so starting every gather at its operand (a ZeRO-3 parameter's,
  the function's start) would hold all of them at once (a gather only the return reads,
  a result, is not held back). The reader is looked for through *moves*, kernels that
  only slice, split, reshape or concatenate (``bucket-gradients``' unpacking of a bucket): a
  region call's parameters, gathered as one bucket, are prefetched while the previous
  call computes, not while the previous bucket unpacks. A gather that starts below
  that point because its operand is packed there (``bucket-gradients``' concat of the
  members' shards, whose inputs are ready earlier) moves up with its pack;
- moves every wait down to just before the first op that uses its result (the return,
  when only the return does; the end of the function for a send's wait), except a wait
  marked ``schedule.user_wait``: per-rank code called ``h.wait()`` there (a
  ``dist.*_async`` handle), and it stays;
- but a *reduce-scatter* is waited for at the latest where the next one starts: its
  operand, a whole gradient (ZeRO-2/3), is freed only when it is done, and holding every
  one until the optimizer reads the shards would hold the whole model's gradients. So
  one reduce-scatter is in flight while the next gradient is computed (XLA's
  latency-hiding scheduler's limit of one, too).

It changes no value, only the order, so results are bit-identical. Gradient all-reduces
of a backward pass, which the optimizer needs only at the end, then run while the
backward of earlier layers computes.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Block, Operation
from xdsl.passes import ModulePass

from tessera.ir import graph, schedule


@dataclass(frozen=True)
class OverlapCommPass(ModulePass):
    """Hoists collective starts to their operands and sinks waits to their first use."""

    name = "overlap-comm"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for function in op.ops:
            if isinstance(function, func.FuncOp) and function.body.blocks:
                block = function.body.block
                hoist_starts(block)
                one_gather_ahead(block)
                sink_waits(block)
                one_scatter_in_flight(block)


def hoist_starts(block: Block) -> None:
    """Every start just after its operand's producer (or the block's start), in order;
    a start without operand (a recv) stays; a relay starts before the block's first
    reader."""
    position = {op: i for i, op in enumerate(block.ops)}
    for start in [o for o in block.ops if isinstance(o, schedule.StartOp)]:
        if not start.operands:  # a recv: no operand to follow, it stays where it is
            continue
        if _is_relay(start):
            _place_relay(block, start, position)
            continue
        producer = start.operands[0].owner
        anchor: Operation | None = producer if isinstance(producer, Operation) else None
        # skip the starts already hoisted there, so their order is kept
        following = anchor.next_op if anchor is not None else block.first_op
        while isinstance(following, schedule.StartOp) and following is not start:
            anchor, following = following, following.next_op
        if following is start:
            continue
        start.detach()
        if anchor is None:
            block.insert_op_before(start, block.first_op)  # type: ignore[arg-type]
        else:
            block.insert_op_after(start, anchor)


def one_gather_ahead(block: Block) -> None:
    """Each all-gather's start (and its wait, when before) moved down to just before the
    first reader of the all-gather read before it (looked for through moves), when it is
    above that and its own result is not read before; or up there with the move that
    packs its operand (:func:`_raise_with_pack`), when it is below. One read only by the
    return (a result: ZeRO-1/2's updated parameters) is left alone: its buffer is the
    function's result, allocated anyway."""
    position: dict[Operation, float] = {op: i for i, op in enumerate(block.ops)}
    readers: list[tuple[float, schedule.StartOp, Operation]] = []
    for start in block.ops:
        if isinstance(start, schedule.StartOp) and start.collective_name == "all_gather":
            reader = _first_reader(block, start, position, through_moves=True)
            if reader is not None and not isinstance(reader, func.ReturnOp):
                readers.append((position[reader], start, reader))
    readers.sort(key=lambda found: found[0])
    for (_, _, previous), (_, start, _) in itertools.pairwise(readers):
        target = previous
        own = _first_reader(block, start, position, through_moves=False)
        if own is not None and position[own] < position[target]:
            target = own  # a move unpacks it there: the start and wait stay above it
        if position[start] >= position[target]:
            _raise_with_pack(block, start, target, position)
            continue
        waits = [block.find_ancestor_op_in_block(use.operation) for use in start.results[0].uses]
        _move_before(block, start, target, position)
        for wait in waits:  # it was before its reader, so before ``target`` too
            if wait is not None and position[wait] < position[target]:
                wait.detach()
                block.insert_op_after(wait, start)
                position[wait] = position[start] + 0.25


def _move_before(
    block: Block, op: Operation, target: Operation, position: dict[Operation, float]
) -> None:
    """``op`` moved to just before ``target``; its position (used for ordering only) in
    between."""
    op.detach()
    block.insert_op_before(op, target)
    position[op] = position[target] - 0.5


def one_scatter_in_flight(block: Block) -> None:
    """Each reduce-scatter's wait moved up to just before the next reduce-scatter's start,
    when it is below it."""
    starts = [
        op
        for op in block.ops
        if isinstance(op, schedule.StartOp) and op.collective_name == "reduce_scatter"
    ]
    position = {op: i for i, op in enumerate(block.ops)}
    for start, following in itertools.pairwise(starts):
        for use in list(start.results[0].uses):
            wait = block.find_ancestor_op_in_block(use.operation)
            if isinstance(wait, schedule.WaitOp) and position[wait] > position[following]:
                wait.detach()
                block.insert_op_before(wait, following)


def _first_reader(
    block: Block,
    start: schedule.StartOp,
    position: dict[Operation, float],
    through_moves: bool,
) -> Operation | None:
    """The first op (not a wait) that reads the result of ``start``'s collective; with
    ``through_moves``, not a move either (see :func:`_is_move`): the first that reads it
    through moves."""
    values = [result for use in start.results[0].uses for result in use.operation.results]
    readers: list[Operation] = []
    while values:
        for use in values.pop().uses:
            reader = block.find_ancestor_op_in_block(use.operation)
            if reader is None:
                continue
            if through_moves and _is_move(reader):
                values.extend(reader.results)
            else:
                readers.append(reader)
    return min(readers, key=position.__getitem__, default=None)


_MOVES = (graph.SliceOp, graph.ReshapeOp, graph.ConcatOp, graph.SplitOp)


def _is_move(op: Operation) -> bool:
    """A kernel that only slices, splits, reshapes or concatenates (a bucket's packing or
    unpacking): it computes nothing a transfer could hide behind."""
    return isinstance(op, schedule.KernelOp) and all(
        isinstance(inner, (*_MOVES, schedule.YieldOp)) for inner in op.body.block.ops
    )


def _raise_with_pack(
    block: Block, start: schedule.StartOp, target: Operation, position: dict[Operation, float]
) -> None:
    """``start`` (at or below ``target``) moved to just before ``target`` with the move
    kernel that packs its operand, when that kernel is read only by ``start`` and its
    inputs are made above ``target``."""
    pack = start.operands[0].owner
    if not isinstance(pack, Operation) or not _is_move(pack) or pack.parent_block() is not block:
        return
    if any(use.operation is not start for result in pack.results for use in result.uses):
        return
    for value in pack.operands:
        maker = value.owner
        if isinstance(maker, Operation) and position[maker] >= position[target]:
            return
    _move_before(block, pack, target, position)
    _move_before(block, start, target, position)
    position[pack] = position[start] - 0.25


def _is_permute(start: Operation | None) -> bool:
    return isinstance(start, schedule.StartOp) and start.collective_name == "collective_permute"


def _is_relay(start: schedule.StartOp) -> bool:
    """A permute of the result of another permute."""
    producer = start.operands[0].owner
    return (
        _is_permute(start)
        and isinstance(producer, schedule.WaitOp)
        and _is_permute(producer.operands[0].owner)  # type: ignore[arg-type]
    )


def _place_relay(block: Block, start: schedule.StartOp, position: dict[Operation, int]) -> None:
    """``start`` just before the first op that reads its operand and is not a start (none:
    it stays); its own wait follows it when it was before. ``position``: the ops' indices
    before the pass (it moves only starts and their waits, so the other ops keep their
    order, and a relay's wait moves only here)."""
    readers = [
        reader
        for use in start.operands[0].uses
        if (reader := block.find_ancestor_op_in_block(use.operation)) is not None
        and not isinstance(reader, schedule.StartOp)
    ]
    if not readers:
        return
    target = min(readers, key=position.__getitem__)
    waits = [block.find_ancestor_op_in_block(use.operation) for use in start.results[0].uses]
    start.detach()
    block.insert_op_before(start, target)
    for wait in waits:  # moved past its start: right after it (sink_waits sinks it,
        if wait is not None and position[wait] < position[target]:  # a user's wait too:
            wait.detach()  # its point is before the start now)
            block.insert_op_after(wait, start)
            wait.attributes.pop(schedule.USER_WAIT, None)


def sink_waits(block: Block) -> None:
    """Every wait just before the first op that uses its result; a wait where the user
    called ``h.wait()`` (marked ``schedule.user_wait``) stays."""
    for wait in [o for o in block.ops if isinstance(o, schedule.WaitOp)]:
        if schedule.USER_WAIT in wait.attributes:
            continue
        users = {
            block.find_ancestor_op_in_block(use.operation)
            for result in wait.results
            for use in result.uses
        }
        target = wait.next_op
        while target is not None and target not in users and target is not block.last_op:
            target = target.next_op
        if target is None or target is wait.next_op:
            continue
        wait.detach()
        block.insert_op_before(wait, target)
