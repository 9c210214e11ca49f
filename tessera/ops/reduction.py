"""Reductions over ``axes``: ``graph.sum``, ``graph.mean``, ``graph.max``, ``graph.min``.

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
from xdsl.dialects.builtin import IntegerType
from xdsl.ir import SSAValue

from tessera.ir import graph
from tessera.ir.abstract import aval
from tessera.ir.grad_builder import GradBuilder
from tessera.ir.sharding_rules import reduction
from tessera.ops.registry import (
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
    from tessera.codegen.evaluate import Evaluator


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


def _reference(fn: Callable[..., torch.Tensor]) -> Reference:
    def prepare(op: graph.ReductionOp) -> Callable[[torch.Tensor], torch.Tensor]:
        attrs = op.attrs()
        if not attrs["axes"]:  # torch reduces everything for dim=(); we reduce nothing
            return torch.clone
        axes, keepdims = attrs["axes"], attrs["keepdims"]
        return lambda x: fn(x, dim=axes, keepdim=keepdims).to(x.dtype)

    return bound(prepare)


def _int_identity(kind: str, element: IntegerType) -> int:
    """The identity of an integer sum, max or min (on bools: or's False, and's True)."""
    width = element.width.data
    if width == 1:
        return int(kind == "min")
    return {"sum": 0, "max": -(2 ** (width - 1)), "min": 2 ** (width - 1) - 1}[kind]


def _row(kind: str, mean: bool = False) -> RowReduction:
    """Tile code reducing a block of rows along its axis 1 by ``kind`` (then / width for a mean)."""

    def reduce(ev: Evaluator, op: graph.GraphOp, x: SSAValue, mask: SSAValue | None, width: int) -> SSAValue:
        b = ev.b
        element = op.results[0].type.element_type  # type: ignore[attr-defined]
        if isinstance(element, IntegerType):  # masked lanes hold the integer identity
            if mask is not None:
                x = b.select(mask, x, b.constant(_int_identity(kind, element), element))
            return b.reduce(x, kind, 1)
        total = b.reduce(b.masked(x, mask, kind), kind, 1)
        if kind != "sum":  # tl.max / tl.min skip NaN; torch's max and min propagate it
            nans = b.reduce(b.select(b.cmp("ne", x, x), b.constant(1.0), b.constant(0.0)), "sum", 1)
            total = b.select(b.cmp("gt", nans, b.constant(0.0)), b.constant(math.nan), total)
        return b.div(total, b.constant(float(width))) if mean else total

    return RowReduction(reduce)


def _register(
    op_type: type[graph.ReductionOp],
    kind: str,
    partial: PartialRule | NotApplicable,
    vjp: VjpRule,
    reference: Reference,
) -> None:
    register(
        op_type,
        sharding=reduction(kind),
        partial=partial,
        vjp=vjp,
        reference=reference,
        tile=_row("sum" if kind == "mean" else kind, mean=kind == "mean"),
        fusion=Fusion.REDUCTION,
    )


_register(graph.SumOp, "sum", (0,), _sum_mean_vjp, _reference(torch.sum))
_register(graph.MeanOp, "mean", (0,), _sum_mean_vjp, _reference(torch.mean))
_register(graph.MaxOp, "max", NOT_LINEAR, _max_min_vjp, _reference(torch.amax))
_register(graph.MinOp, "min", NOT_LINEAR, _max_min_vjp, _reference(torch.amin))
