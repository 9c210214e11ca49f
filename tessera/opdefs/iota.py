"""``graph.iota``: indices along one dim, computed where they are read.

Its sharding rule is elementwise over the result's dims, and the optional start operand
is the *position* of the indexed dim's factor (``ShardingRule.positions``): when that dim
is split, ``shard-partition`` adds this rank's first global index, so each rank computes
its own slice. Its tile code is the element's index along the dim plus the start, read in
place by the kernels that use it (a layout op: no buffer, no copy of an ``arange``).
Integer indices carry no gradient.
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
from tessera.ir.sharding_rules import RuleBuilder, ShardingRule
from tessera.ir.tile import compute_element
from tessera.opdefs.registry import NOT_LINEAR, Cotangents, Fusion, IndexMap, bound, register

if TYPE_CHECKING:
    from tessera.opdefs.registry import Index, TileEvaluator


def _iota_sharding(
    operands: list[AbstractTensor], results: list[AbstractTensor], attrs: dict[str, Any]
) -> ShardingRule:
    """Result dims parallel; the start is the indexed dim's position operand."""
    b = RuleBuilder()
    dims = tuple(b.new(s) for s in results[0].shape)
    return b.rule([() for _ in operands], [dims], positions=[(dims[attrs["dimension"]], 0)])


def _no_gradient(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
    """Indices: nothing to differentiate."""
    return [None for _ in op.operands]


@bound
def _iota_reference(op: graph.IotaOp) -> Callable[..., torch.Tensor]:
    """``start + arange`` along the dim, broadcast and materialised (callers may write
    to results)."""
    result = aval(op.result)
    dimension = op.attrs()["dimension"]
    view = [1] * result.rank
    view[dimension] = result.shape[dimension]
    dtype = result.dtype.to_torch()

    def run(*start: torch.Tensor) -> torch.Tensor:
        first = int(start[0]) if start else 0
        indices = torch.arange(first, first + result.shape[dimension], dtype=torch.int64)
        return indices.reshape(view).expand(result.shape).to(dtype).contiguous()

    return run


def _iota_tile(ev: TileEvaluator, op: graph.IotaOp, value: SSAValue, index: Index) -> SSAValue:
    b = ev.b
    position = index[op.attrs()["dimension"]]
    indices = b.index(0) if position is None else b.convert(position, i32)
    if op.start:
        indices = b.add(indices, b.convert(ev.at(op.start[0], ()), i32))
    return b.convert(indices, compute_element(aval(op.result).dtype.to_xdsl()))


register(
    graph.IotaOp,
    sharding=_iota_sharding,
    partial=NOT_LINEAR,
    vjp=_no_gradient,
    reference=_iota_reference,
    tile=IndexMap(_iota_tile),
    fusion=Fusion.LAYOUT,
)
