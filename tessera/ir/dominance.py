"""SSA dominance: every operand is defined before its use, in a region enclosing it.

xDSL's parser accepts forward references (as MLIR's does, for graph regions) and its
verifier does not check dominance, so ``%1 = graph.neg %0`` above ``%0 = ...``, an op
using its own result, or a use of a value defined inside another op's region all verify
— and later crash a pass. :func:`check_dominance` rejects them in one walk of the module:
it keeps the set of values visible at the current point (block arguments and the results
of earlier ops in the enclosing blocks; only the op's own regions' values below an
``IsolatedFromAbove`` op), so its cost is linear in the number of ops and operands.

In a region of several blocks, a block also sees the values of the blocks that dominate
it (xDSL's :class:`~xdsl.irdl.dominance.DominanceInfo`, computed once per such region;
quadratic in its blocks, but Tessera's regions have one block).
"""

from __future__ import annotations

from collections.abc import Sequence

from xdsl.dialects.builtin import FileLineColLoc
from xdsl.ir import Block, BlockArgument, Operation, OpResult, Region, SSAValue
from xdsl.irdl.dominance import DominanceInfo
from xdsl.traits import IsolatedFromAbove

from tessera.ir.located_error import LocatedVerifyException


def check_dominance(root: Operation) -> None:
    """Raises :class:`LocatedVerifyException` at the first operand of an op under
    ``root`` that is not visible there (see the module docstring)."""
    _check_regions(root, set())


def _check_regions(op: Operation, visible: set[SSAValue]) -> None:
    if op.has_trait(IsolatedFromAbove):
        visible = set()
    for region in op.regions:
        if region.first_block is not None and region.first_block is region.last_block:
            _check_block(region.first_block, visible, ())
        else:
            _check_blocks(region, visible)


def _check_blocks(region: Region, visible: set[SSAValue]) -> None:
    """A region of several blocks: each sees the values of its dominators."""
    dominance = DominanceInfo(region)
    blocks = list(region.blocks)
    for block in blocks:
        dominators = [b for b in blocks if dominance.strictly_dominates(b, block)]
        _check_block(block, visible, dominators)


def _check_block(block: Block, visible: set[SSAValue], dominators: Sequence[Block]) -> None:
    added: list[SSAValue] = [v for b in dominators for v in _values_of(b) if v not in visible]
    added += block.args
    visible.update(added)
    try:
        for op in block.ops:
            for index, operand in enumerate(op.operands):
                if operand not in visible:
                    raise LocatedVerifyException(op, _message(op, index, operand))
            if op.regions:
                _check_regions(op, visible)
            visible.update(op.results)
            added += op.results
    finally:
        visible.difference_update(added)


def _values_of(block: Block) -> list[SSAValue]:
    return [*block.args, *(r for op in block.ops for r in op.results)]


# --- messages (only when a check fails) --------------------------------------------------


def _message(op: Operation, index: int, operand: SSAValue) -> str:
    what = f"{op.name}: operand #{index}{_name(operand)}"
    if isinstance(operand, OpResult) and operand.op is op:
        return f"{what} is the op's own result"
    if not isinstance(operand, OpResult | BlockArgument):  # the parser's forward reference
        return f"{what} is never defined"
    block = operand.block if isinstance(operand, BlockArgument) else operand.op.parent_block()
    ancestor = block.find_ancestor_op_in_block(op) if block is not None else None
    if ancestor is None:
        region = block.parent if block is not None else None
        if region is not None and region.find_ancestor_block_in_region(op.parent_block()) is not None:
            return f"{what} is defined in a block that does not dominate this use{_line(operand)}"
        return f"{what} is defined in a region that does not enclose this use{_line(operand)}"
    if isinstance(operand, OpResult) and operand.op is ancestor:
        return f"{what} is a result of {ancestor.name}, which encloses this use"
    isolating = _isolating_ancestor(op, ancestor)
    if isolating is not None:
        return (
            f"{what} is defined outside {isolating.name}, which is isolated from above"
            f"{_line(operand)}; pass it in as an argument"
        )
    return f"{what} is used before its definition{_line(operand)}"


def _name(value: SSAValue) -> str:
    return f" (%{value.name_hint})" if value.name_hint else ""


def _line(value: SSAValue) -> str:
    """`` (defined at line N)`` when the defining op (or block's op) has a location."""
    op = value.op if isinstance(value, OpResult) else value.block.parent_op()
    if op is not None and isinstance(loc := op.location, FileLineColLoc):
        return f" (defined at line {loc.line.data})"
    return ""


def _isolating_ancestor(op: Operation, ancestor: Operation) -> Operation | None:
    """The outermost op isolated from above among the ancestors of ``op`` up to
    ``ancestor`` (included), if any."""
    found = None
    current = op
    while current is not ancestor and (parent := current.parent_op()) is not None:
        current = parent
        if current.has_trait(IsolatedFromAbove):
            found = current
    return found
