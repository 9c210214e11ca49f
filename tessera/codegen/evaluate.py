"""Evaluates the graph ops of a kernel body at an index of a tile *space*.

A kernel iterates a :class:`Space`: a global shape, and for each of its dims the index a
program works on, as a tile value (a scalar, or a block along one of the space's block
axes). :meth:`Evaluator.at` computes a graph value at an index of its own shape by
walking back through the body (index passing, as Inductor's loop bodies do):

- an elementwise op evaluates its operands at the broadcast-adjusted index and applies
  the op's entry in :data:`ELEMENTWISE` (float math in f32, like Triton kernels do);
- a layout op maps the index (transpose permutes it, slice scales and shifts it, reshape
  goes through the flat offset, all_slice adds this rank's offset, gather loads the
  indices, concat selects among its operands);
- a kernel input or a non-splat constant is loaded from its pointer, masked to the
  space; a splat constant is a scalar constant;
- a value the kernel computed otherwise (a matmul accumulator, a row reduction) is
  taken from :attr:`Evaluator.bound`.

Results are memoised per (value, index), so a value used twice is computed once.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from xdsl.dialects import math as mathd
from xdsl.dialects.builtin import AnyFloat, IntegerType, TensorType, f32, i32
from xdsl.ir import Attribute, SSAValue

from tessera.codegen.builder import TileBuilder, Value, broadcast_shape, is_float, shape
from tessera.errors import IRError
from tessera.ir import graph
from tessera.ir.dense import first_value, is_splat
from tessera.ir.tile import element_type

Index = tuple[Value | None, ...]  # per dim: the index value, or None where the dim is 0


def strides(dims: Sequence[int]) -> list[int]:
    """Row-major (contiguous) strides in elements."""
    out, running = [], 1
    for size in reversed(dims):
        out.append(running)
        running *= size
    return out[::-1]


def dims_of(value: SSAValue) -> tuple[int, ...]:
    assert isinstance(value.type, TensorType)
    return tuple(value.type.get_shape())


def compute_element(element: Attribute) -> Attribute:
    """Kernels compute floats in f32 and keep integers and booleans as they are."""
    return f32 if isinstance(element, AnyFloat) else element


@dataclass
class Space:
    """What one program iterates: ``shape``'s index as tile values, and the lanes in range."""

    shape: tuple[int, ...]
    index: Index
    block: tuple[int, ...]
    axis_masks: list[Value | None]  # per block axis: lanes inside the space (None: all)
    linear: Value | None = None  # the flat offset of ``index`` in a contiguous ``shape``

    def mask_for(self, b: TileBuilder, block: tuple[int, ...]) -> Value | None:
        """The mask of the block axes a value of block shape ``block`` varies along."""
        mask = None
        for axis, axis_mask in enumerate(self.axis_masks):
            if axis_mask is not None and block and block[axis] > 1:
                mask = b.and_(mask, axis_mask)
        return mask


@dataclass
class Evaluator:
    """Computes graph values of one kernel body at indices of a space."""

    b: TileBuilder
    space: Space
    pointers: dict[SSAValue, Value]  # kernel inputs and non-splat constants -> pointer args
    positions: dict[tuple[str, ...], Value] = field(
        default_factory=dict
    )  # all_slice axes -> rank index
    bound: dict[SSAValue, Value] = field(default_factory=dict)
    _memo: dict[tuple[SSAValue, tuple[int, ...]], Value] = field(default_factory=dict)

    def full_index(self, value: SSAValue) -> Index:
        """The space's index as an index of ``value``, whose dims align right with the space's."""
        dims = dims_of(value)
        offset = len(self.space.shape) - len(dims)
        if offset < 0:
            raise IRError(
                f"a value of shape {dims} does not fit the kernel's space {self.space.shape}"
            )
        return tuple(
            None if size == 1 else self.space.index[offset + d] for d, size in enumerate(dims)
        )

    def offsets(self, dims: Sequence[int], index: Index) -> Value:
        """Element offsets of ``index`` in a contiguous tensor of shape ``dims``."""
        if (
            tuple(dims) == self.space.shape
            and index == self.space.index
            and self.space.linear is not None
        ):
            return self.space.linear
        total: Value | None = None
        for component, stride, size in zip(index, strides(dims), dims, strict=True):
            if component is None or size == 1:
                continue
            term = component if stride == 1 else self.b.mul(component, self.b.index(stride))
            total = term if total is None else self.b.add(total, term)
        return total if total is not None else self.b.index(0)

    def load(self, value: SSAValue, index: Index) -> Value:
        """Loads a kernel input (or constant) at ``index`` and converts it to its compute type."""
        offsets = self.offsets(dims_of(value), index)
        loaded = self.b.load(
            self.pointers[value], offsets, self.space.mask_for(self.b, shape(offsets))
        )
        assert isinstance(value.type, TensorType)
        return self.b.convert(loaded, compute_element(value.type.element_type))

    def store(
        self, ptr: Value, value: SSAValue, computed: Value, index: Index | None = None
    ) -> None:
        """Stores ``computed`` (``value`` at ``index``, the space's by default) to ``ptr``."""
        index = self.full_index(value) if index is None else index
        offsets = self.offsets(dims_of(value), index)
        assert isinstance(value.type, TensorType)
        out = self.b.convert(computed, value.type.element_type)
        target = broadcast_shape(shape(offsets), shape(out))
        offsets = self.b.broadcast(offsets, target)
        self.b.store(ptr, offsets, out, self.space.mask_for(self.b, target))

    # --- evaluation ------------------------------------------------------------------------

    def at(self, value: SSAValue, index: Index) -> Value:
        """``value`` at ``index`` (one entry per dim of ``value``), in its compute type."""
        if value in self.bound:
            return self.bound[value]
        key = (value, tuple(id(c) for c in index))
        if key not in self._memo:
            self._memo[key] = self._compute(value, index)
        return self._memo[key]

    def _compute(self, value: SSAValue, index: Index) -> Value:
        if value in self.pointers:
            return self.load(value, index)
        op = value.owner
        if isinstance(op, graph.ConstantOp):
            element = compute_element(op.value.get_type().element_type)
            return self.b.constant(first_value(op.value), element)
        if isinstance(op, graph.GraphOp) and type(op) in ELEMENTWISE:
            out_dims = dims_of(value)
            args = [self.at(v, operand_index(out_dims, dims_of(v), index)) for v in op.operands]
            return ELEMENTWISE[type(op)](self.b, op, args)
        layout = LAYOUT.get(type(op))  # type: ignore[arg-type]
        if layout is not None:
            return layout(self, op, value, index)
        raise IRError(f"cannot generate code for {getattr(op, 'name', value)} here")


def operand_index(out_dims: Sequence[int], operand_dims: Sequence[int], index: Index) -> Index:
    """The index of a broadcast operand (numpy rules: dims align right; size 1 repeats)."""
    offset = len(out_dims) - len(operand_dims)
    return tuple(None if size == 1 else index[offset + d] for d, size in enumerate(operand_dims))


# --- elementwise ops: graph op -> tile ops on operands already in compute types -------------


def _result_element(op: graph.GraphOp) -> Attribute:
    return compute_element(op.results[0].type.element_type)  # type: ignore[attr-defined]


def _sigmoid(b: TileBuilder, x: Value) -> Value:
    one = b.constant(1.0)
    return b.div(one, b.add(one, b.exp(b.neg(x))))


def _gelu(b: TileBuilder, op: graph.GeluOp, a: Sequence[Value]) -> Value:
    x = a[0]
    half = b.mul(b.constant(0.5), x)
    if op.approximate.data == "tanh":
        inner = b.mul(
            b.constant(math.sqrt(2 / math.pi)),
            b.add(x, b.mul(b.constant(0.044715), b.mul(x, b.mul(x, x)))),
        )
        return b.mul(half, b.add(b.constant(1.0), b.math(mathd.TanhOp, inner)))
    return b.mul(
        half, b.add(b.constant(1.0), b.math(mathd.ErfOp, b.mul(x, b.constant(1 / math.sqrt(2)))))
    )


def _zero(b: TileBuilder, like: Value) -> Value:
    return b.constant(0, element_type(like.type))


def _abs(b: TileBuilder, op: graph.GraphOp, a: Sequence[Value]) -> Value:
    if is_float(a[0]):
        return b.math(mathd.AbsFOp, a[0])
    return b.select(b.cmp("lt", a[0], _zero(b, a[0])), b.neg(a[0]), a[0])


def _relu(b: TileBuilder, op: graph.GraphOp, a: Sequence[Value]) -> Value:
    return b.maximum(a[0], _zero(b, a[0]))


def _pow(b: TileBuilder, op: graph.GraphOp, a: Sequence[Value]) -> Value:
    """torch.pow for floats: |x|^y with the sign of x for odd integer y, nan for other y < 0 bases."""
    x, y = a
    magnitude = b.exp(b.mul(y, b.log(b.math(mathd.AbsFOp, x))))
    y_int = b.convert(b.convert(y, i32), f32)
    integral = b.cmp("eq", y_int, y)
    odd = b.cmp("ne", b.rem(b.convert(y, i32), b.constant(2, i32)), b.constant(0, i32))
    negative = b.cmp("lt", x, b.constant(0.0))
    signed = b.select(odd, b.neg(magnitude), magnitude)
    result = b.select(negative, b.select(integral, signed, b.constant(float("nan"))), magnitude)
    return b.select(b.cmp("eq", y, b.constant(0.0)), b.constant(1.0), result)


def _div(b: TileBuilder, op: graph.DivOp, a: Sequence[Value]) -> Value:
    """``x / c`` for a constant ``c`` is ``x * (1/c)``: a multiply per element instead of a
    correctly rounded division (within 1 ulp; exact when ``c`` is a power of two)."""
    divisor = op.rhs.owner
    if isinstance(divisor, graph.ConstantOp) and is_splat(divisor.value):
        value = float(first_value(divisor.value))
        if value != 0 and math.isfinite(value) and math.isfinite(1 / value):
            return b.mul(a[0], b.constant(1 / value))
    return b.div(a[0], a[1])


def _compare(b: TileBuilder, op: graph.CompareOp, a: Sequence[Value]) -> Value:
    x, y = a
    if is_float(x) != is_float(y):  # mixed (a weak scalar): compare in f32
        x, y = b.convert(x, f32), b.convert(y, f32)
    return b.cmp(op.predicate.data, x, y)


def _cast(b: TileBuilder, op: graph.CastOp, a: Sequence[Value]) -> Value:
    target = op.result.type.element_type  # type: ignore[attr-defined]
    x = a[0]
    if target == IntegerType(1):
        return b.cmp("ne", x, _zero(b, x))
    if isinstance(target, AnyFloat):
        if target != f32:  # round to the narrower format, then compute in f32 again
            return b.convert(b.convert(b.convert(x, f32), target), f32)
        return b.convert(x, f32)
    return b.convert(x, target)


def _float_args(f: Callable[[TileBuilder, Value, Value], Value]) -> Callable[..., Value]:
    return lambda b, op, a: f(b, *a)


ELEMENTWISE: dict[type[graph.GraphOp], Callable[..., Value]] = {
    graph.NegOp: lambda b, op, a: b.neg(a[0]),
    graph.AbsOp: _abs,
    graph.ReluOp: _relu,
    graph.ExpOp: lambda b, op, a: b.exp(a[0]),
    graph.LogOp: lambda b, op, a: b.log(a[0]),
    graph.TanhOp: lambda b, op, a: b.math(mathd.TanhOp, a[0]),
    graph.SqrtOp: lambda b, op, a: b.math(mathd.SqrtOp, a[0]),
    graph.RsqrtOp: lambda b, op, a: b.rsqrt(a[0]),
    graph.SigmoidOp: lambda b, op, a: _sigmoid(b, a[0]),
    graph.SiluOp: lambda b, op, a: b.mul(a[0], _sigmoid(b, a[0])),
    graph.GeluOp: _gelu,
    graph.AddOp: _float_args(TileBuilder.add),
    graph.SubOp: _float_args(TileBuilder.sub),
    graph.MulOp: _float_args(TileBuilder.mul),
    graph.DivOp: lambda b, op, a: _div(b, op, a),
    graph.PowOp: _pow,
    graph.MaximumOp: _float_args(TileBuilder.maximum),
    graph.MinimumOp: _float_args(TileBuilder.minimum),
    graph.CompareOp: _compare,
    graph.SelectOp: lambda b, op, a: b.select(*a),
    graph.CastOp: _cast,
}


# --- layout ops: map the index to the operand's ---------------------------------------------


def _transpose(ev: Evaluator, op: graph.TransposeOp, value: SSAValue, index: Index) -> Value:
    perm = op.attrs()["perm"]
    inner: list[Value | None] = [None] * len(perm)
    for i, p in enumerate(perm):
        inner[p] = index[i]
    return ev.at(op.input, tuple(inner))


def _broadcast_to(ev: Evaluator, op: graph.BroadcastToOp, value: SSAValue, index: Index) -> Value:
    return ev.at(op.input, operand_index(dims_of(value), dims_of(op.input), index))


def _affine(ev: Evaluator, component: Value | None, scale: int, shift: int) -> Value | None:
    b = ev.b
    if component is None:
        return b.index(shift) if shift else None
    out = component if scale == 1 else b.mul(component, b.index(scale))
    return out if shift == 0 else b.add(out, b.index(shift))


def _slice(ev: Evaluator, op: graph.SliceOp, value: SSAValue, index: Index) -> Value:
    attrs = op.attrs()
    inner = tuple(
        _affine(ev, c, step, start)
        for c, start, step in zip(index, attrs["starts"], attrs["strides"], strict=True)
    )
    return ev.at(op.input, inner)


def unflatten(b: TileBuilder, flat: Value, dims: Sequence[int]) -> list[Value | None]:
    """The multi-index of the flat offset ``flat`` in row-major ``dims`` (None for size-1 dims)."""
    out: list[Value | None] = []
    total = math.prod(dims)
    for size, stride in zip(dims, strides(dims), strict=True):
        if size == 1:
            out.append(None)
            continue
        component = flat if stride == 1 else b.div(flat, b.index(stride))
        if stride * size < total:
            component = b.rem(component, b.index(size))
        out.append(component)
    return out


def _reshape(ev: Evaluator, op: graph.ReshapeOp, value: SSAValue, index: Index) -> Value:
    flat = ev.offsets(dims_of(value), index)
    return ev.at(op.input, tuple(unflatten(ev.b, flat, dims_of(op.input))))


def _all_slice(ev: Evaluator, op: graph.AllSliceOp, value: SSAValue, index: Index) -> Value:
    attrs = op.attrs()
    dim, chunk = attrs["dim"], dims_of(value)[attrs["dim"]]
    start = ev.b.mul(ev.positions[tuple(attrs["axes"])], ev.b.index(chunk))
    inner = list(index)
    inner[dim] = start if inner[dim] is None else ev.b.add(inner[dim], start)
    return ev.at(op.input, tuple(inner))


def _clamp(b: TileBuilder, component: Value, size: int) -> Value:
    return b.minimum(b.maximum(component, b.index(0)), b.index(size - 1))


def _concat(ev: Evaluator, op: graph.ConcatOp, value: SSAValue, index: Index) -> Value:
    b = ev.b
    axis = op.attrs()["axis"]
    result: Value | None = None
    start = 0
    pieces = []
    for operand in op.inputs:
        size = dims_of(operand)[axis]
        inner = list(index)
        here = inner[axis] if inner[axis] is not None else b.index(0)
        inner[axis] = None if size == 1 else _clamp(b, b.sub(here, b.index(start)), size)
        pieces.append((start, ev.at(operand, tuple(inner))))
        start += size
    here = index[axis] if index[axis] is not None else b.index(0)
    for begin, piece in pieces:  # later pieces win from their start on
        result = (
            piece if result is None else b.select(b.cmp("ge", here, b.index(begin)), piece, result)
        )
    assert result is not None
    return result


def _split(ev: Evaluator, op: graph.SplitOp, value: SSAValue, index: Index) -> Value:
    axis = op.attrs()["axis"]
    start = sum(dims_of(r)[axis] for r in op.outputs[: list(op.outputs).index(value)])
    inner = list(index)
    inner[axis] = _affine(ev, inner[axis], 1, start)
    return ev.at(op.input, tuple(inner))


def _gather(ev: Evaluator, op: graph.GatherOp, value: SSAValue, index: Index) -> Value:
    b = ev.b
    axis = op.attrs()["axis"]
    rank = len(dims_of(op.indices))
    size = dims_of(op.input)[axis]
    chosen = b.convert(ev.at(op.indices, index[axis : axis + rank]), i32)
    chosen = b.select(b.cmp("lt", chosen, b.index(0)), b.add(chosen, b.index(size)), chosen)
    inner = (*index[:axis], None if size == 1 else _clamp(b, chosen, size), *index[axis + rank :])
    return ev.at(op.input, inner)


LAYOUT: dict[type[graph.GraphOp], Callable[[Evaluator, graph.GraphOp, SSAValue, Index], Value]] = {
    graph.TransposeOp: _transpose,  # type: ignore[dict-item]
    graph.BroadcastToOp: _broadcast_to,  # type: ignore[dict-item]
    graph.SliceOp: _slice,  # type: ignore[dict-item]
    graph.ReshapeOp: _reshape,  # type: ignore[dict-item]
    graph.AllSliceOp: _all_slice,  # type: ignore[dict-item]
    graph.ConcatOp: _concat,  # type: ignore[dict-item]
    graph.SplitOp: _split,  # type: ignore[dict-item]
    graph.GatherOp: _gather,  # type: ignore[dict-item]
}
