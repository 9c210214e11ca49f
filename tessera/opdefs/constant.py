"""``graph.constant``: a constant tensor (``full`` is a splat constant).

A constant can be materialised in any layout (each rank builds its slice), has no
operands to differentiate, and joins no kernel group: every kernel that uses it gets its
own copy, a splat as a scalar in the code, any other constant passed by pointer (the
evaluator loads it like a kernel input).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import torch
from xdsl.ir import SSAValue

from tessera.ir import graph
from tessera.ir.abstract import aval
from tessera.ir.dense import dense_to_numpy, first_value
from tessera.ir.grad_builder import GradBuilder
from tessera.ir.sharding_rules import elementwise
from tessera.ir.tile import compute_element
from tessera.opdefs.registry import NOT_LINEAR, Cotangents, Fusion, IndexMap, bound, register

if TYPE_CHECKING:
    from tessera.opdefs.registry import Index, TileEvaluator


def _constant_vjp(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
    return []


@bound
def _constant_reference(op: graph.ConstantOp) -> Callable[[], torch.Tensor]:
    """The op's value, converted from its dense attribute once (a new copy per call:
    results are new values, which callers may mutate)."""
    values = np.array(dense_to_numpy(op.value), order="C")  # a copy that keeps 0-d shapes
    value = torch.from_numpy(values).to(aval(op.result).dtype.to_torch())
    return value.clone


def _splat_tile(ev: TileEvaluator, op: graph.ConstantOp, value: SSAValue, index: Index) -> SSAValue:
    """A splat constant's value, as a scalar (other constants are loaded by pointer)."""
    element = compute_element(op.value.get_type().element_type)
    return ev.b.constant(first_value(op.value), element)


register(
    graph.ConstantOp,
    sharding=elementwise,
    partial=NOT_LINEAR,
    vjp=_constant_vjp,
    reference=_constant_reference,
    tile=IndexMap(_splat_tile),
    fusion=Fusion.CONSTANT,
)
