"""A builder of tile IR that broadcasts like Triton: scalars splat, size-1 dims repeat.

Every method inserts ops at the builder's insertion point and returns the new value.
Operands of binary methods may be scalars or blocks of one rank whose sizes are equal
or 1; the builder inserts ``tile.splat`` / ``tile.broadcast`` to the common shape and
picks the integer or float ``arith`` op from the element type. Float operands of
different widths meet at the wider one: a *weak* constant (``constant(0.5)``, no element
type given: f32 unless it meets a wider float) is rebuilt at that width from its Python
value, so f64 kernels see f64 constants exactly; other values are converted.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from xdsl.builder import Builder
from xdsl.dialects import arith, scf
from xdsl.dialects import math as mathd
from xdsl.dialects.builtin import (
    DenseIntOrFPElementsAttr,
    FloatAttr,
    IntegerAttr,
    IntegerType,
    f32,
    i32,
)
from xdsl.ir import Attribute, Block, Operation, SSAValue
from xdsl.rewriter import InsertPoint

from tessera.dtypes import dtype_from_xdsl
from tessera.ir import tile
from tessera.ir.reduction_kinds import KINDS
from tessera.ir.tile import block_shape, block_type, element_type, is_float, strides

Value = SSAValue

i1 = IntegerType(1)

def shape(value: Value) -> tuple[int, ...]:
    return block_shape(value.type)


def broadcast_shape(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    """The common block shape of scalars (``()``) and blocks of one rank."""
    blocks = [s for s in shapes if s]
    if not blocks:
        return ()
    rank = len(blocks[0])
    if any(len(s) != rank for s in blocks):
        raise ValueError(f"blocks of different ranks: {shapes}")
    return tuple(max(s[i] for s in blocks) for i in range(rank))


class TileBuilder:
    """Inserts tile, arith, math and scf ops into one block (or a loop body inside it)."""

    def __init__(self, block: Block, weak: dict[SSAValue, float] | None = None):
        self._builder = Builder(InsertPoint.at_end(block))
        # weak float constants (shared with the builders of nested blocks): their values
        self._weak: dict[SSAValue, float] = {} if weak is None else weak

    def insert(self, op: Operation) -> Value:
        self._builder.insert(op)
        return op.results[0] if op.results else None  # type: ignore[return-value]

    def at_end(self, block: Block) -> TileBuilder:
        """A builder for another block (a loop body)."""
        return TileBuilder(block, self._weak)

    # --- constants ---------------------------------------------------------------------

    def constant(
        self, value: float | int, element: Attribute | None = None, block: Sequence[int] = ()
    ) -> Value:
        """A scalar or block constant; without ``element`` a weak f32 (see the module
        docstring)."""
        if block and not math.isfinite(value):  # xDSL re-reads a dense inf/nan as an integer
            return self.broadcast(self.constant(value, element), tuple(block))
        if block:
            block_element = f32 if element is None else element
            typed = int(value) if isinstance(block_element, IntegerType) else float(value)
            attr = DenseIntOrFPElementsAttr.from_list(block_type(block_element, block), [typed])
            return self.insert(arith.ConstantOp(attr))
        if isinstance(element, IntegerType):
            return self.insert(arith.ConstantOp(IntegerAttr(int(value), element)))
        result = self.insert(arith.ConstantOp(FloatAttr(float(value), element or f32)))
        if element is None:
            self._weak[result] = float(value)
        return result

    def index(self, value: int) -> Value:
        return self.constant(value, i32)

    # --- shapes ------------------------------------------------------------------------

    def broadcast(self, value: Value, to: tuple[int, ...]) -> Value:
        if shape(value) == to or not to:
            return value
        if not shape(value):
            return self.insert(tile.SplatOp(value, to))
        return self.insert(tile.BroadcastOp(value, to))

    def expand_dims(self, value: Value, axis: int) -> Value:
        return self.insert(tile.ExpandDimsOp(value, axis))

    def trans(self, value: Value) -> Value:
        """The transpose of a 2-D block."""
        return self.insert(tile.TransOp(value))

    # --- indices -------------------------------------------------------------------------

    def unflatten(self, flat: Value, dims: Sequence[int]) -> list[Value | None]:
        """The multi-index of the flat offset ``flat`` in row-major ``dims`` (None for
        size-1 dims)."""
        out: list[Value | None] = []
        total = math.prod(dims)
        for size, stride in zip(dims, strides(dims), strict=True):
            if size == 1:
                out.append(None)
                continue
            component = flat if stride == 1 else self.div(flat, self.index(stride))
            if stride * size < total:
                component = self.rem(component, self.index(size))
            out.append(component)
        return out

    def affine(self, component: Value | None, scale: int, shift: int) -> Value | None:
        """``component * scale + shift`` for an index component (None stands for 0)."""
        if component is None:
            return self.index(shift) if shift else None
        out = component if scale == 1 else self.mul(component, self.index(scale))
        return out if shift == 0 else self.add(out, self.index(shift))

    def clamp(self, component: Value, size: int) -> Value:
        """An index component clamped into ``[0, size)``."""
        return self.minimum(self.maximum(component, self.index(0)), self.index(size - 1))

    def masked(self, x: Value, mask: Value | None, kind: str) -> Value:
        """``x`` with the lanes outside ``mask`` set to the ``kind`` reduction's identity."""
        if mask is None:
            return x
        element = element_type(x.type)
        identity = KINDS[kind].identity(dtype_from_xdsl(element))
        return self.select(mask, x, self.constant(identity, element))

    def _common(self, *values: Value) -> list[Value]:
        values = self._widest_float(values)
        common = broadcast_shape(*(shape(v) for v in values))
        return [self.broadcast(v, common) for v in values]

    def _widest_float(self, values: Sequence[Value]) -> list[Value]:
        """``values`` with their floats at the widest float width among them."""
        floats = {element_type(v.type) for v in values if is_float(v)}
        if len(floats) < 2:
            return list(values)
        widest = max(floats, key=lambda t: t.bitwidth)  # type: ignore[attr-defined]
        return [
            v
            if not is_float(v) or element_type(v.type) == widest
            else self.constant(self._weak[v], widest)
            if v in self._weak and not shape(v)
            else self.convert(v, widest)
            for v in values
        ]

    # --- arithmetic ----------------------------------------------------------------------

    def _binary(
        self, float_op: type[Operation], int_op: type[Operation] | None, a: Value, b: Value
    ) -> Value:
        a, b = self._common(a, b)
        op = float_op if is_float(a) else int_op
        if op is None:
            raise TypeError(f"{float_op.name} has no integer form")
        return self.insert(op(a, b))  # type: ignore[call-arg]

    def add(self, a: Value, b: Value) -> Value:
        return self._binary(arith.AddfOp, arith.AddiOp, a, b)

    def sub(self, a: Value, b: Value) -> Value:
        return self._binary(arith.SubfOp, arith.SubiOp, a, b)

    def mul(self, a: Value, b: Value) -> Value:
        return self._binary(arith.MulfOp, arith.MuliOp, a, b)

    def div(self, a: Value, b: Value) -> Value:
        """Float division, or integer division rounding toward zero."""
        return self._binary(arith.DivfOp, arith.DivSIOp, a, b)

    def rem(self, a: Value, b: Value) -> Value:
        a, b = self._common(a, b)
        return self.insert(arith.RemSIOp(a, b))

    def maximum(self, a: Value, b: Value) -> Value:
        return self._binary(arith.MaximumfOp, arith.MaxSIOp, a, b)

    def minimum(self, a: Value, b: Value) -> Value:
        return self._binary(arith.MinimumfOp, arith.MinSIOp, a, b)

    def and_(self, a: Value | None, b: Value | None) -> Value | None:
        """Logical and of masks; ``None`` stands for all-true."""
        if a is None or b is None:
            return b if a is None else a
        a, b = self._common(a, b)
        return self.insert(arith.AndIOp(a, b))

    def or_(self, a: Value, b: Value) -> Value:
        a, b = self._common(a, b)
        return self.insert(arith.OrIOp(a, b))

    def neg(self, a: Value) -> Value:
        if is_float(a):
            return self.insert(arith.NegfOp(a))
        return self.sub(self.constant(0, element_type(a.type)), a)

    def cmp(self, predicate: str, a: Value, b: Value) -> Value:
        a, b = self._common(a, b)
        return self.insert(tile.CmpOp(predicate, a, b))

    def select(self, cond: Value, on_true: Value, on_false: Value) -> Value:
        cond, on_true, on_false = self._common(cond, on_true, on_false)
        return self.insert(tile.SelectOp(cond, on_true, on_false))

    def philox(self, key0: Value, key1: Value, counter0: Value, counter1: Value) -> Value:
        """Philox-4x32-10 bits of the counter ``(counter0, counter1, 0, 0)`` (i32 values)."""
        return self.insert(tile.PhiloxOp(*self._common(key0, key1, counter0, counter1)))

    def convert(self, value: Value, element: Attribute) -> Value:
        if element_type(value.type) == element:
            return value
        return self.insert(tile.ConvertOp(value, element))

    def math(self, op: type[Operation], value: Value) -> Value:
        return self.insert(op(value))  # type: ignore[call-arg]

    def exp(self, value: Value) -> Value:
        return self.math(mathd.ExpOp, value)

    def log(self, value: Value) -> Value:
        return self.math(mathd.LogOp, value)

    def rsqrt(self, value: Value) -> Value:
        return self.math(mathd.RsqrtOp, value)

    # --- Triton ops ----------------------------------------------------------------------

    def program_id(self, axis: int) -> Value:
        return self.insert(tile.ProgramIdOp(axis))

    def arange(self, size: int) -> Value:
        return self.insert(tile.ArangeOp(size))

    def load(self, ptr: Value, offsets: Value, mask: Value | None = None) -> Value:
        if mask is not None:
            offsets, mask = self._common(offsets, mask)
        return self.insert(tile.LoadOp(ptr, offsets, mask))

    def store(self, ptr: Value, offsets: Value, value: Value, mask: Value | None = None) -> None:
        parts = [offsets, value] + ([mask] if mask is not None else [])
        common = self._common(*parts)
        self.insert(
            tile.StoreOp(ptr, common[0], common[1], common[2] if mask is not None else None)
        )

    def dot(self, a: Value, b: Value, acc: Value) -> Value:
        return self.insert(tile.DotOp(a, b, acc))

    def reduce(self, value: Value, kind: str, axis: int, keep_rank: bool = True) -> Value:
        """Reduces along ``axis``; with ``keep_rank`` the axis stays as size 1 (like keepdims)."""
        result = self.insert(tile.ReduceOp(value, kind, axis))
        return self.expand_dims(result, axis) if keep_rank and shape(result) else result

    def for_loop(
        self, lower: Value, upper: Value, step: Value, carried: Sequence[Value]
    ) -> tuple[scf.ForOp, TileBuilder, Value, list[Value]]:
        """An ``scf.for``; returns it, a builder of its body, the induction variable and the carried values."""
        body = Block(arg_types=[lower.type, *(v.type for v in carried)])
        loop = scf.ForOp(lower, upper, step, list(carried), body)
        self._builder.insert(loop)
        return loop, TileBuilder(body, self._weak), body.args[0], list(body.args[1:])

    def yield_(self, values: Sequence[Value]) -> None:
        self.insert(scf.YieldOp(*values))

    def return_(self) -> None:
        self.insert(tile.ReturnOp())


__all__ = ["TileBuilder", "broadcast_shape", "f32", "i1", "i32", "shape"]
