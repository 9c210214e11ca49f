"""``hoist-all-gathers``: gather the smaller values an all-gather's operand is made from,
and redo the cheap ops between them on the gathered values.

Runs on partitioned functions (``graph.partitioned``), after ``collective-matmul`` and
before ``bucket-gradients``. ``insert-collectives`` gathers a value where it is read whole,
whatever made it. When that value is a transpose, or an elementwise op (a cast, a compare,
a select, arithmetic) of operands that are split the same way or are the same on every
rank of the gather (broadcast along the gathered dim), the gather commutes with the op::

    all_gather(transpose(x), dim d)        == transpose(all_gather(x, dim perm[d]))
    all_gather(f(a, b), dim d)             == f(all_gather(a, dim d), b)   (b broadcast)

A chain of such ops (each read only by the next) is walked up to the values whose
gathers move the fewest bytes, and the gather moves there only if that is strictly fewer
bytes than gathering the value itself. The case it is for: a one-hot matrix
``cast(ids == iota)`` (an embedding's or a cross-entropy's backward) is gathered as its
integer ids, not as [vocabulary, tokens] floats.

At equal bytes the gather stays: ``overlap-comm`` starts a gather as soon as its operand
is made, so gathering an earlier value (a saved activation under a transpose, which would
make its ranks' blocks contiguous for ``bucket-gradients``) would keep the gathered copy
alive from the forward on, the memory sequence parallelism saves.

The gathers of the chosen values go where the old gather was; the redone ops just before
the first op reading the old gather's result, so consecutive gathers stay consecutive.
Ops that are not pure functions of their operands' elements (random bits, waits) are not
crossed. Each element is computed by the same op on the same inputs, so results are
bit-identical.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp, TensorType
from xdsl.ir import Block, BlockArgument, Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.rewriter import InsertPoint, Rewriter

from tessera.ir import graph
from tessera.ir.abstract import aval
from tessera.ir.mesh import Mesh
from tessera.ir.mesh_symbol import module_mesh
from tessera.ir.sharding import Sharding, annotated_sharding, op_shardings, set_op_shardings
from tessera.opdefs.registry import Fusion, lookup

_NOT_PURE = (graph.RandomBitsOp, graph.WaitOp)  # elementwise, but not functions of elements


@dataclass(frozen=True)
class HoistAllGathersPass(ModulePass):
    """Gathers the smallest values a gathered value is made from by transposes and
    elementwise ops, and redoes those ops on the gathered values."""

    name = "hoist-all-gathers"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        found = module_mesh(op)
        if found is None:
            return
        mesh_name, mesh = found
        for function in op.ops:
            if (
                isinstance(function, func.FuncOp)
                and function.body.blocks
                and graph.PARTITIONED in function.attributes
            ):
                block = function.body.block
                for gather in [o for o in block.ops if isinstance(o, graph.AllGatherOp)]:
                    _hoist(function, block, gather, mesh_name, mesh)


@dataclass(frozen=True)
class _Leaf:
    """A value to gather along ``dim``."""

    value: SSAValue
    dim: int


@dataclass
class _Plan:
    """The values to gather, and the ops to redo on them (producers first), each with the
    dim of its result that is gathered; the bytes the gathers make."""

    leaves: list[_Leaf]
    ops: list[tuple[Operation, int]]
    nbytes: int


def _leaf_plan(value: SSAValue, dim: int, group: int) -> _Plan:
    return _Plan([_Leaf(value, dim)], [], aval(value).nbytes * group)


def _plan(
    function: func.FuncOp, value: SSAValue, dim: int, split: tuple[str, ...], group: int
) -> _Plan:
    """The cheapest way to make ``value`` gathered along ``dim`` (split over ``split``
    there): gather it, or gather what its op reads and redo the op."""
    best = _leaf_plan(value, dim, group)
    op = value.owner
    if (
        not isinstance(op, Operation)
        or isinstance(value, BlockArgument)
        or len(op.results) != 1
        or value.uses.get_length() != 1
        or op.regions
        or isinstance(op, _NOT_PURE)
    ):
        return best
    definition = lookup(op)
    if isinstance(op, graph.TransposeOp):
        inputs = [(op.operands[0], op.attrs()["perm"][dim])]
    elif definition is not None and definition.fusion is Fusion.ELEMENTWISE:
        rank = len(aval(value).shape)
        inputs = []
        for operand in op.operands:
            shape = aval(operand).shape
            at = dim - (rank - len(shape))  # numpy broadcasting aligns trailing dims
            sharding = annotated_sharding(function, operand)
            if sharding is None or sharding.partial:
                return best
            if at >= 0 and shape[at] == aval(value).shape[dim]:
                inputs.append((operand, at))
            elif not set(split) & set(sharding.split_axes):  # the same on every rank
                inputs.append((operand, None))
            else:
                return best
    else:
        return best
    leaves: list[_Leaf] = []
    ops: list[tuple[Operation, int]] = []
    nbytes = 0
    for operand, at in inputs:
        if at is None:
            continue
        sharding = annotated_sharding(function, operand)
        if sharding is None or sharding.partial or sharding.dims[at] != split:
            return best
        below = _plan(function, operand, at, split, group)
        leaves += below.leaves
        ops += below.ops
        nbytes += below.nbytes
    candidate = _Plan(leaves, [*ops, (op, dim)], nbytes)
    return candidate if candidate.nbytes < best.nbytes else best


def _hoist(
    function: func.FuncOp, block: Block, gather: graph.AllGatherOp, mesh_name: str, mesh: Mesh
) -> None:
    source = gather.operands[0]
    split = annotated_sharding(function, source)
    gathered = op_shardings(gather)
    users = [u.operation for u in gather.results[0].uses]
    if (
        split is None
        or gathered is None
        or not users
        or any(u.parent_block() is not block for u in users)
    ):
        return
    attrs = gather.attrs()
    dim = attrs["dim"]
    group = math.prod(mesh.axis_size(a) for a in attrs["axes"])
    plan = _plan(function, source, dim, split.dims[dim], group)
    if not plan.ops:
        return
    after = gathered[0].dims[dim]
    values: dict[SSAValue, SSAValue] = {}
    for leaf in plan.leaves:
        if leaf.value in values:  # read twice (``x * x``): gathered once
            continue
        moved = graph.build(
            graph.AllGatherOp, [leaf.value], **{**attrs, "dim": leaf.dim}, group_size=group
        )
        Rewriter.insert_op(moved, InsertPoint.before(gather))
        leaf_sharding = annotated_sharding(function, leaf.value)
        assert leaf_sharding is not None
        dims = list(leaf_sharding.dims)
        dims[leaf.dim] = after
        set_op_shardings(moved, mesh_name, [Sharding(tuple(dims))])
        values[leaf.value] = moved.results[0]
    first_user = gather.next_op  # the first op after the gather that reads it
    while first_user is not None and first_user not in users:
        first_user = first_user.next_op
    assert first_user is not None
    for op, at in plan.ops:  # producers first: each op's gathered operands are made
        result = op.results[0]
        old = aval(result)
        shape = list(old.shape)
        shape[at] *= group
        redone = type(op).create(
            operands=[values.get(o, o) for o in op.operands],
            result_types=[TensorType(result.type.element_type, shape)],  # type: ignore[attr-defined]
            properties=dict(op.properties),
            attributes=dict(op.attributes),
        )
        Rewriter.insert_op(redone, InsertPoint.before(first_user))
        sharding = op_shardings(op)
        if sharding:
            dims = list(sharding[0].dims)
            dims[at] = after
            set_op_shardings(redone, mesh_name, [Sharding(tuple(dims))])
        values[result] = redone.results[0]
    gather.results[0].replace_all_uses_with(values[source])
    Rewriter.erase_op(gather)
    for op, _ in reversed(plan.ops):
        Rewriter.erase_op(op)

