"""Emits the graph ops of a backward pass, for VJP rules.

A VJP rule gets a :class:`GradBuilder` positioned after the forward program; it builds
ops with :meth:`GradBuilder.op` (result types from the op's shape rule) and the helpers
for what every rule needs: scalar constants, ``unbroadcast`` (sum a cotangent back to
an operand's broadcast shape) and the usual arithmetic.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from xdsl.ir import SSAValue
from xdsl.rewriter import InsertPoint, Rewriter

from tessera.dtypes import DType
from tessera.ir import graph
from tessera.ir.abstract import AbstractTensor, aval
from tessera.ir.dense import dense_from_numpy


class GradBuilder:
    """Inserts graph ops at one point (the end of the backward program so far)."""

    def __init__(self, point: InsertPoint):
        self.point = point

    def ops(
        self, op_type: type[graph.GraphOp], *operands: SSAValue, **attrs: Any
    ) -> list[SSAValue]:
        op = graph.build(op_type, list(operands), **attrs)
        Rewriter.insert_op(op, self.point)
        return list(op.results)

    def op(self, op_type: type[graph.GraphOp], *operands: SSAValue, **attrs: Any) -> SSAValue:
        return self.ops(op_type, *operands, **attrs)[0]

    def constant(self, value: float, like: SSAValue, shape: Sequence[int] = ()) -> SSAValue:
        """A constant of ``like``'s dtype (a scalar by default: binary ops broadcast it)."""
        return self.full(value, aval(like).dtype, shape)

    def full(self, value: float, dtype: DType, shape: Sequence[int] = ()) -> SSAValue:
        """A constant ``value`` of ``dtype`` and ``shape``."""
        target = AbstractTensor(tuple(shape), dtype)
        attr = dense_from_numpy(np.full(tuple(shape), value), target.to_xdsl())
        op = graph.ConstantOp.create(result_types=[target.to_xdsl()], properties={"value": attr})
        Rewriter.insert_op(op, self.point)
        return op.results[0]

    def zeros_like(self, value: SSAValue) -> SSAValue:
        return self.broadcast_to(self.constant(0.0, value), aval(value).shape)

    def zeros(self, like: SSAValue, shape: Sequence[int]) -> SSAValue:
        """Zeros of ``like``'s dtype and the given shape."""
        return self.broadcast_to(self.constant(0.0, like), tuple(shape))

    def iota(self, like: SSAValue, n: int, shape: Sequence[int]) -> SSAValue:
        """``arange(n)`` reshaped to ``shape`` (one dim of size ``n``, the others 1),
        with ``like``'s (integer) dtype: a ``graph.iota``."""
        target = aval(like).with_shape(tuple(shape))
        dimension = next(d for d, size in enumerate(shape) if size == n)
        op = graph.build(graph.IotaOp, [], dimension=dimension, shape=target.shape, dtype=target.dtype)
        Rewriter.insert_op(op, self.point)
        return op.results[0]

    # --- arithmetic ------------------------------------------------------------------------

    def add(self, a: SSAValue, b: SSAValue) -> SSAValue:
        return self.op(graph.AddOp, a, b)

    def sub(self, a: SSAValue, b: SSAValue) -> SSAValue:
        return self.op(graph.SubOp, a, b)

    def mul(self, a: SSAValue, b: SSAValue) -> SSAValue:
        return self.op(graph.MulOp, a, b)

    def div(self, a: SSAValue, b: SSAValue) -> SSAValue:
        return self.op(graph.DivOp, a, b)

    def neg(self, a: SSAValue) -> SSAValue:
        return self.op(graph.NegOp, a)

    def scale(self, a: SSAValue, factor: float) -> SSAValue:
        return self.mul(a, self.constant(factor, a))

    # --- shapes ----------------------------------------------------------------------------

    def broadcast_to(self, value: SSAValue, shape: Sequence[int]) -> SSAValue:
        if aval(value).shape == tuple(shape):
            return value
        return self.op(graph.BroadcastToOp, value, shape=tuple(shape))

    def reshape(self, value: SSAValue, shape: Sequence[int]) -> SSAValue:
        if aval(value).shape == tuple(shape):
            return value
        return self.op(graph.ReshapeOp, value, shape=tuple(shape))

    def sum(self, value: SSAValue, axes: Sequence[int], keepdims: bool = False) -> SSAValue:
        if not axes:
            return value
        return self.op(graph.SumOp, value, axes=list(axes), keepdims=keepdims)

    def unbroadcast(self, cotangent: SSAValue, shape: Sequence[int]) -> SSAValue:
        """Sums ``cotangent`` over the dims numpy broadcasting added or stretched to reach
        its shape from ``shape`` (the VJP of broadcasting)."""
        have = aval(cotangent).shape
        shape = tuple(shape)
        if have == shape:
            return cotangent
        lead = len(have) - len(shape)
        axes = list(range(lead)) + [
            lead + i for i, s in enumerate(shape) if s == 1 and have[lead + i] != 1
        ]
        return self.reshape(self.sum(cotangent, axes), shape)

    def cast(self, value: SSAValue, like: SSAValue) -> SSAValue:
        """``value`` converted to ``like``'s dtype (no op when it already has it)."""
        if aval(value).dtype == aval(like).dtype:
            return value
        return self.op(graph.CastOp, value, dtype=aval(like).dtype)
