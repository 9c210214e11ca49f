"""``canonicalize``: fold constants and remove redundant graph ops.

Each rewrite is a small named pattern; xDSL's greedy walker applies them until none
matches, then erases the pure ops left without uses:

- :class:`FoldConstants` evaluates a small op whose operands are all constants with the
  op's reference semantics and replaces it by ``graph.constant``;
- :class:`ComposeReshapes` and :class:`ComposeTransposes` merge chains of layout ops;
- :class:`RemoveIdentityLayout`, :class:`RemoveSingleConcat` and
  :class:`RemoveNeutralOperand` replace ops that return an operand unchanged by it;
- :class:`FoldCallResultSharding` moves a ``graph.shard`` of a region call's result into
  the call (``graph.result_shardings``), so a call constrains its results without one op
  per result.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from xdsl.context import Context
from xdsl.dialects.builtin import DenseIntOrFPElementsAttr, ModuleOp
from xdsl.ir import Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.pattern_rewriter import (
    GreedyRewritePatternApplier,
    PatternRewriter,
    PatternRewriteWalker,
    RewritePattern,
    op_type_rewrite_pattern,
)
from xdsl.transforms.dead_code_elimination import region_dce

from tessera.dtypes import DType
from tessera.ir import graph
from tessera.ir.abstract import AbstractTensor
from tessera.opdefs import op_def


def _replace(rewriter: PatternRewriter, op: Operation, new_op: Operation) -> None:
    """Replaces ``op`` by ``new_op``, which takes over its source location."""
    new_op.location = op.location
    rewriter.replace(op, new_op)


def _splat_value(value: SSAValue) -> int | float | None:
    """The element of a ``graph.constant`` whose elements are all equal, else None."""
    if not isinstance(constant := value.owner, graph.ConstantOp) or len(constant.value) == 0:
        return None
    data, count = constant.value.data.data, len(constant.value)
    size = len(data) // count
    if data != data[:size] * count:
        return None
    (element,) = constant.value.get_element_type().unpack(data[:size], 1)
    if AbstractTensor.from_xdsl(value.type).dtype == DType.i1:
        return int(element != 0)  # i1 true unpacks as -1
    return element


def dense_attr(tensor: torch.Tensor, aval: AbstractTensor) -> DenseIntOrFPElementsAttr:
    """A dense attribute of type ``aval`` holding ``tensor`` (printed as a splat if uniform)."""
    flat = tensor.detach().to(aval.dtype.to_torch()).reshape(-1)
    values = flat.float().tolist() if aval.dtype in (DType.f16, DType.bf16) else flat.tolist()
    return DenseIntOrFPElementsAttr.from_list(aval.to_xdsl(), values)


@dataclass
class FoldConstants(RewritePattern):
    """``op(constant, ...)`` -> ``constant``, computed by the reference semantics.

    Only compute ops (``graph.GRAPH_OPS``) fold: collectives and sharding constraints say
    how a value lies over the mesh, which a constant would forget. Only ops whose operands
    and results have at most ``max_elements`` elements fold, so that folding stays cheap
    and does not bloat the IR; ops that fail to evaluate (an index out of range) are left
    for run time to report.
    """

    max_elements: int

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: graph.GraphOp, rewriter: PatternRewriter) -> None:
        if type(op) not in graph.GRAPH_OPS or not op.operands:
            return
        if not all(isinstance(v.owner, graph.ConstantOp) for v in op.operands):
            return
        avals = [AbstractTensor.from_xdsl(v.type) for v in (*op.operands, *op.results)]
        if any(a.size > self.max_elements for a in avals):
            return
        operands = [op_def(v.owner).reference(v.owner) for v in op.operands]
        try:
            results = op_def(op).reference(op, *operands)
        except Exception:  # e.g. an index out of range: an error for run time to report
            return
        results = results if isinstance(results, tuple) else (results,)
        result_avals = avals[len(op.operands) :]
        if any(tuple(r.shape) != a.shape for r, a in zip(results, result_avals, strict=True)):
            return
        constants = [
            graph.build(graph.ConstantOp, [], value=dense_attr(r, a))
            for r, a in zip(results, result_avals, strict=True)
        ]
        for constant in constants:
            constant.location = op.location
        rewriter.replace(op, constants, [c.results[0] for c in constants])


class ComposeReshapes(RewritePattern):
    """``reshape(reshape(x))`` -> ``reshape(x)``."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: graph.ReshapeOp, rewriter: PatternRewriter) -> None:
        if isinstance(inner := op.input.owner, graph.ReshapeOp):
            shape = AbstractTensor.from_xdsl(op.result.type).shape
            _replace(rewriter, op, graph.build(graph.ReshapeOp, [inner.input], shape=shape))


class ComposeTransposes(RewritePattern):
    """``transpose(transpose(x, p), q)`` -> ``transpose(x, [p[i] for i in q])``."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: graph.TransposeOp, rewriter: PatternRewriter) -> None:
        if isinstance(inner := op.input.owner, graph.TransposeOp):
            inner_perm, outer_perm = inner.attrs()["perm"], op.attrs()["perm"]
            perm = [inner_perm[i] for i in outer_perm]
            _replace(rewriter, op, graph.build(graph.TransposeOp, [inner.input], perm=perm))


LayoutOp = graph.ReshapeOp | graph.BroadcastToOp | graph.CastOp | graph.TransposeOp | graph.SliceOp


class RemoveIdentityLayout(RewritePattern):
    """A reshape, broadcast or cast to the operand's own type, a transpose by the identity
    permutation or a slice of the whole tensor with stride 1 is its operand."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: LayoutOp, rewriter: PatternRewriter) -> None:
        if op.input.type == op.result.type and _keeps_elements_in_place(op):
            rewriter.replace(op, [], [op.input])


def _keeps_elements_in_place(op: LayoutOp) -> bool:
    """For an op whose result type is its operand's: does every element stay where it is?"""
    if isinstance(op, graph.TransposeOp):
        return op.attrs()["perm"] == tuple(range(len(op.attrs()["perm"])))
    if isinstance(op, graph.SliceOp):
        return all(stride == 1 for stride in op.attrs()["strides"])
    return True


class RemoveSingleConcat(RewritePattern):
    """``concat(x)`` -> ``x``."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: graph.ConcatOp, rewriter: PatternRewriter) -> None:
        if len(op.inputs) == 1:
            rewriter.replace(op, [], [op.inputs[0]])


class RemoveNeutralOperand(RewritePattern):
    """``x + 0`` and ``x * 1`` (either side) -> ``x``, when the splat constant changes
    neither ``x``'s shape nor its dtype. (The one value this changes is ``-0.0 + 0.0``,
    which is ``0.0``; the two compare equal.)"""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: graph.AddOp | graph.MulOp, rewriter: PatternRewriter) -> None:
        neutral = 0 if isinstance(op, graph.AddOp) else 1
        for x, other in ((op.lhs, op.rhs), (op.rhs, op.lhs)):
            if x.type == op.result.type and _splat_value(other) == neutral:
                rewriter.replace(op, [], [x])
                return


class FoldCallResultSharding(RewritePattern):
    """``graph.shard(graph.call(...)#i)`` -> the call with result ``i`` constrained
    (``graph.result_shardings``), when the constraint is the result's only use and the
    callee is a region (a ``dist.shard_map`` body's results are closed to its
    ``out_specs``: a constraint after it is a move). ``shard-propagate`` honours the
    constraint as it would the ``graph.shard``: the call's result has that layout. A
    ``graph.scan``'s stacked result folds a constraint that keeps dim 0 whole (each step
    then returns its slice so laid out: a ZeRO gradient reduce-scattered in the step)."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: graph.ShardOp, rewriter: PatternRewriter) -> None:
        value = op.input
        call = value.owner
        if not isinstance(call, graph.CallOp | graph.ScanOp) or not value.has_one_use():
            return
        index = value.index  # type: ignore[attr-defined]
        if isinstance(call, graph.ScanOp) and not graph.scan_constrainable(
            call, index, op.sharding.sharding
        ):
            return
        attrs = call.result_constraint_attrs()
        if attrs[index] is not None:
            return
        callee = call.callee_function()
        if callee is None or graph.MANUAL in callee.attributes:
            return
        attrs[index] = op.sharding
        call.set_result_constraints(attrs)
        rewriter.replace(op, [], [value])


@dataclass(frozen=True)
class CanonicalizePass(ModulePass):
    """Folds small constant expressions and removes redundant layout and arithmetic ops."""

    name = "canonicalize"

    max_fold_elements: int = 1024
    """The largest operand or result (in elements) that constant folding computes."""

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        patterns: list[RewritePattern] = [
            FoldConstants(self.max_fold_elements),
            ComposeReshapes(),
            ComposeTransposes(),
            RemoveIdentityLayout(),
            RemoveSingleConcat(),
            RemoveNeutralOperand(),
            FoldCallResultSharding(),
        ]
        walker = PatternRewriteWalker(
            GreedyRewritePatternApplier(patterns), post_walk_func=region_dce
        )
        walker.rewrite_module(op)
