"""``graph.axis_index``: a rank's position along mesh axes, a value per rank.

It has no value in the global view: ``shard-partition`` makes it, in the per-rank program,
for the offset of this rank's slice of a split axis (a vocabulary-parallel lookup). Its
reference is a :class:`~tessera.opdefs.RankReference` (the virtual mesh and the reference
kernels give it each rank's position); in a kernel it is one more ``i32`` argument, this
rank's index along its axes (a :class:`~tessera.opdefs.RankIndexMap`, like ``all_slice``'s
offset). Like a constant, it joins no kernel group: each kernel using it gets a copy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from xdsl.dialects.builtin import i32
from xdsl.ir import SSAValue

from tessera.ir import graph
from tessera.ir.abstract import AbstractTensor
from tessera.ir.grad_builder import GradBuilder
from tessera.ir.sharding_rules import RuleBuilder, ShardingRule
from tessera.opdefs.registry import (
    Cotangents,
    Fusion,
    NotApplicable,
    Position,
    RankIndexMap,
    RankReference,
    register,
)

if TYPE_CHECKING:
    from tessera.opdefs.registry import Index, TileEvaluator


def _no_factors(
    operands: list[AbstractTensor], results: list[AbstractTensor], attrs: dict[str, Any]
) -> ShardingRule:
    """A scalar without operands: nothing to split."""
    return RuleBuilder().rule([], [()])


def _no_gradient(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
    """No operands, an integer result: nothing to differentiate."""
    return []


def _axis_index_at(op: graph.AxisIndexOp, position: Position) -> Callable[[], torch.Tensor]:
    """This rank's index along the op's axes, as an int32 scalar."""
    index = position(op.attrs()["axes"])
    return lambda: torch.tensor(index, dtype=torch.int32)


def _axis_index_tile(ev: TileEvaluator, op: graph.AxisIndexOp, value: SSAValue, index: Index) -> SSAValue:
    """The kernel's ``i32`` argument holding this rank's index along the axes."""
    return ev.b.convert(ev.positions[tuple(op.attrs()["axes"])], i32)


register(
    graph.AxisIndexOp,
    sharding=_no_factors,
    partial=NotApplicable("no operands"),
    vjp=_no_gradient,
    reference=RankReference(_axis_index_at),
    tile=RankIndexMap(_axis_index_tile),
    fusion=Fusion.CONSTANT,
)
