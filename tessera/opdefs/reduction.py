"""Reductions over ``axes``: ``graph.sum``, ``graph.mean``, ``graph.max``, ``graph.min``,
``graph.prod``, one per entry of :data:`~tessera.ir.reduction_kinds.KINDS` (the op's
``KIND``).

Reduced axes are reduction factors of the op's kind (a split one makes the result
partial; sum and mean are linear in their operand). The row kernel reduces a whole row
in one block; masked lanes hold the reduction's identity, and max and min propagate NaN
as torch does (``tl.max`` and ``tl.min`` skip it).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch
from xdsl.ir import SSAValue

from tessera.ir import graph
from tessera.ir.abstract import aval
from tessera.ir.grad_builder import GradBuilder
from tessera.ir.reduction_kinds import KINDS, ReductionKind
from tessera.ir.sharding_rules import reduction
from tessera.opdefs.registry import (
    NOT_LINEAR,
    Cotangents,
    Fusion,
    NotApplicable,
    PartialRule,
    Reference,
    RowReduction,
    VjpRule,
    bound,
    register,
)

if TYPE_CHECKING:
    from tessera.opdefs.registry import TileEvaluator


def _keepdims(b: GradBuilder, ct: SSAValue, x: SSAValue, axes: Sequence[int]) -> SSAValue:
    """A reduction's cotangent reshaped to the keepdims shape (1 on the reduced axes)."""
    return b.reshape(ct, tuple(1 if d in axes else s for d, s in enumerate(aval(x).shape)))


def _sum_mean_vjp(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
    x, ct = op.operands[0], cts[0]
    if ct is None or not aval(x).dtype.is_float:
        return [None]
    axes = op.attrs()["axes"]
    shape = aval(x).shape
    grad = b.broadcast_to(_keepdims(b, ct, x, axes), shape)
    if isinstance(op, graph.MeanOp) and axes:
        grad = b.div(grad, b.constant(math.prod(shape[a] for a in axes), grad))
    return [grad]


def _max_min_vjp(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
    """The cotangent goes to the positions equal to the extremum, split evenly among
    ties (like the gradient of ``torch.amax``)."""
    x, ct = op.operands[0], cts[0]
    if ct is None or not aval(x).dtype.is_float:
        return [None]
    axes = op.attrs()["axes"]
    if not axes:
        return [ct]
    shape = aval(x).shape
    y = b.broadcast_to(_keepdims(b, op.results[0], x, axes), shape)
    mask = b.op(graph.CastOp, b.op(graph.CompareOp, x, y, predicate="eq"), dtype=aval(x).dtype)
    count = b.sum(mask, axes, keepdims=True)
    share = b.div(_keepdims(b, ct, x, axes), count)
    return [b.mul(mask, b.broadcast_to(share, shape))]


def _prod_vjp(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
    """``ct * prod(others)``, as ``torch.prod``'s gradient: ``ct * y / x`` where the
    reduced slice holds no zero; at its one zero, the product of the rest; none where
    it holds two or more."""
    x, ct = op.operands[0], cts[0]
    if ct is None or not aval(x).dtype.is_float:
        return [None]
    axes = op.attrs()["axes"]
    if not axes:
        return [ct]
    shape = aval(x).shape
    zero = b.op(graph.CompareOp, x, b.constant(0, x), predicate="eq")
    zeros = b.broadcast_to(b.sum(b.cast(zero, x), axes, keepdims=True), shape)
    y = b.broadcast_to(_keepdims(b, op.results[0], x, axes), shape)
    nonzero = b.op(graph.SelectOp, zero, b.constant(1, x), x)
    rest = b.broadcast_to(b.op(graph.ProdOp, nonzero, axes=list(axes), keepdims=True), shape)
    alone = b.op(graph.CompareOp, zeros, b.constant(1, x), predicate="eq")
    at_zero = b.op(graph.SelectOp, alone, rest, b.constant(0, x))
    others = b.op(graph.SelectOp, zero, at_zero, b.div(y, nonzero))
    return [b.mul(others, b.broadcast_to(_keepdims(b, ct, x, axes), shape))]


_VJPS: dict[type[graph.ReductionOp], VjpRule] = {
    graph.SumOp: _sum_mean_vjp,
    graph.MeanOp: _sum_mean_vjp,
    graph.MaxOp: _max_min_vjp,
    graph.MinOp: _max_min_vjp,
    graph.ProdOp: _prod_vjp,
}


def _reference(kind: ReductionKind) -> Reference:
    def prepare(op: graph.ReductionOp) -> Callable[[torch.Tensor], torch.Tensor]:
        attrs = op.attrs()
        if not attrs["axes"]:  # torch reduces everything for dim=(); we reduce nothing
            return torch.clone
        axes, keepdims = attrs["axes"], attrs["keepdims"]
        return lambda x: kind.torch_reduce(x, axes, keepdims).to(x.dtype)

    return bound(prepare)


def _row(kind: ReductionKind) -> RowReduction:
    """Tile code reducing a block of rows along its axis 1 by ``kind`` (a mean sums, then
    divides by the width)."""
    combine = KINDS[kind.combine]

    def reduce(ev: TileEvaluator, op: graph.GraphOp, x: SSAValue, mask: SSAValue | None, width: int) -> SSAValue:
        b = ev.b
        total = b.reduce(b.masked(x, mask, combine.name), combine.name, 1)
        if kind.selects and aval(op.results[0]).dtype.is_float:
            # tl.max / tl.min skip NaN; torch's max and min propagate it
            nans = b.reduce(b.select(b.cmp("ne", x, x), b.constant(1.0), b.constant(0.0)), "sum", 1)
            total = b.select(b.cmp("gt", nans, b.constant(0.0)), b.constant(math.nan), total)
        return b.div(total, b.constant(float(width))) if kind.averages else total

    return RowReduction(reduce)


def _register(op_type: type[graph.ReductionOp], vjp: VjpRule) -> None:
    kind = KINDS[op_type.KIND]
    partial: PartialRule | NotApplicable = (0,) if kind.linear else NOT_LINEAR
    register(
        op_type,
        sharding=reduction(kind.name),
        partial=partial,
        vjp=vjp,
        reference=_reference(kind),
        tile=_row(kind),
        fusion=Fusion.REDUCTION,
    )


for _op_type, _vjp in _VJPS.items():
    _register(_op_type, _vjp)
