"""``graph.dynamic_update_slice``: ``x`` with ``update`` written along ``axis`` from a
runtime ``start`` (an i32 scalar), as ``jax.lax.dynamic_update_slice``: a KV cache's
write, so that one compiled decode step serves every position.

The start is clamped into ``[0, size - n]`` (``n`` the update's length along the axis),
as JAX does, so the write always fits. Sharding: the other dims are parallel (a cache
split over heads under tensor parallelism stays split); the written axis is needed
whole (``REPLICATED``) on ``x`` and on the update, since the start is known only at run
time. The tile code reads the update inside the window and ``x`` outside it, so the op
fuses like a layout op (a concat with a moving seam). The VJP: ``x`` gets the cotangent
with the window zeroed (the op itself, writing zeros), the update the window of the
cotangent (a gather of ``start + arange(n)``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from xdsl.dialects.builtin import i32
from xdsl.ir import SSAValue

from tessera.ir import graph
from tessera.ir.abstract import AbstractTensor, aval
from tessera.ir.grad_builder import GradBuilder
from tessera.ir.sharding_rules import FactorKind, RuleBuilder, ShardingRule
from tessera.opdefs.registry import NOT_LINEAR, Cotangents, Fusion, IndexMap, bound, register

if TYPE_CHECKING:
    from tessera.opdefs.registry import Index, TileEvaluator


def _sharding(
    operands: list[AbstractTensor], results: list[AbstractTensor], attrs: dict[str, Any]
) -> ShardingRule:
    """Dims other than ``axis`` parallel (shared by ``x``, the update and the result);
    ``axis`` whole on all three; the start has no dims."""
    x, update, _ = operands
    axis = attrs["axis"]
    b = RuleBuilder()
    dims = [b.new(s, FactorKind.REPLICATED if d == axis else FactorKind.PARALLEL)
            for d, s in enumerate(x.shape)]  # fmt: skip
    written = list(dims)
    written[axis] = b.new(update.shape[axis], FactorKind.REPLICATED)
    return b.rule([tuple(dims), tuple(written), ()], [tuple(dims)])


@bound
def _reference(op: graph.DynamicUpdateSliceOp) -> Callable[..., torch.Tensor]:
    """A copy of ``x`` with ``update`` copied in at the clamped start."""
    axis = op.attrs()["axis"]

    def run(x: torch.Tensor, update: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        n = update.shape[axis]
        begin = min(max(int(start), 0), x.shape[axis] - n)
        out = x.clone()
        out.narrow(axis, begin, n).copy_(update)
        return out

    return run


def _clamped_start(b: GradBuilder, start: SSAValue, room: int) -> SSAValue:
    """``start`` clamped into ``[0, room]``."""
    low = b.op(graph.MaximumOp, start, b.constant(0, start))
    return b.op(graph.MinimumOp, low, b.constant(room, start))


def _vjp(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
    x, update, start = op.operands
    ct = cts[0]
    if ct is None or not aval(x).dtype.is_float:
        return [None, None, None]
    axis = op.attrs()["axis"]
    n, size = aval(update).shape[axis], aval(x).shape[axis]
    dx = b.op(graph.DynamicUpdateSliceOp, ct, b.zeros(update, aval(update).shape), start, axis=axis)
    rows = b.add(b.iota(start, n, (n,)), _clamped_start(b, start, size - n))
    return [dx, b.op(graph.GatherOp, ct, rows, axis=axis), None]


def _tile(
    ev: TileEvaluator, op: graph.DynamicUpdateSliceOp, value: SSAValue, index: Index
) -> SSAValue:
    """The update's element inside the window ``[start, start + n)``, ``x``'s outside."""
    b = ev.b
    axis = op.attrs()["axis"]
    n, size = aval(op.update).shape[axis], aval(op.input).shape[axis]
    start = b.convert(ev.at(op.start, ()), i32)
    start = b.minimum(b.maximum(start, b.index(0)), b.index(size - n))
    here = index[axis] if index[axis] is not None else b.index(0)
    offset = b.sub(here, start)
    inside = b.and_(b.cmp("ge", offset, b.index(0)), b.cmp("lt", offset, b.index(n)))
    inner = list(index)
    inner[axis] = None if n == 1 else b.clamp(offset, n)
    if n == 0:
        return ev.at(op.input, index)
    assert inside is not None
    return b.select(inside, ev.at(op.update, tuple(inner)), ev.at(op.input, index))


register(
    graph.DynamicUpdateSliceOp,
    sharding=_sharding,
    partial=NOT_LINEAR,
    vjp=_vjp,
    reference=_reference,
    tile=IndexMap(_tile),
    fusion=Fusion.LAYOUT,
)
