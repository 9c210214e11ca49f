"""Elementwise ops: unary math, gelu, binary arithmetic, compare, select, cast and the fp8
quantisers.

Every op here is sharded elementwise (result dims are parallel factors; operands
broadcast into them) and fuses as an elementwise op; its tile code gets its operands
already evaluated at the index, in their compute types (floats in f32, as Triton
kernels compute). Binary ops broadcast like numpy, so each operand's cotangent is
summed back to the operand's shape (``unbroadcast``); comparisons and integer results
carry no gradient.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from xdsl.dialects import math as mathd
from xdsl.dialects.builtin import AnyFloat, IntegerType, f32, f64, i1, i32
from xdsl.ir import SSAValue

from tessera.ir import graph
from tessera.ir.abstract import AbstractTensor, aval
from tessera.ir.dense import first_value, is_splat
from tessera.ir.grad_builder import GradBuilder
from tessera.ir.shape_rules import FP8_FORMATS
from tessera.ir.sharding_rules import elementwise
from tessera.ir.tile import compute_element, element_type, is_float
from tessera.opdefs.registry import (
    NOT_LINEAR,
    Cotangents,
    Fusion,
    NotApplicable,
    PartialRule,
    Pointwise,
    Reference,
    VjpRule,
    bound,
    on_operands,
    register,
)

if TYPE_CHECKING:
    from tessera.ir.tile_builder import TileBuilder

Value = SSAValue
Operands = Sequence[Value]


def _register(
    op_type: type[graph.GraphOp],
    *,
    vjp: VjpRule,
    reference: Reference,
    tile: Pointwise,
    partial: PartialRule | NotApplicable = NOT_LINEAR,
) -> None:
    """Registers an elementwise op: elementwise sharding and fusion."""
    register(
        op_type,
        sharding=elementwise,
        partial=partial,
        vjp=vjp,
        reference=reference,
        tile=tile,
        fusion=Fusion.ELEMENTWISE,
    )


def _shape(value: SSAValue) -> tuple[int, ...]:
    return aval(value).shape


def _float(value: SSAValue) -> bool:
    return aval(value).dtype.is_float


def _local(b: GradBuilder, ct: SSAValue | None, derivative: SSAValue) -> Cotangents:
    """``ct * d(result)/d(input)`` for a unary op with local derivative ``derivative``."""
    return [b.mul(ct, derivative)]  # type: ignore[arg-type]


def _zero(b: TileBuilder, like: Value) -> Value:
    return b.constant(0, element_type(like.type))


def _sigmoid(b: TileBuilder, x: Value) -> Value:
    one = b.constant(1.0)
    return b.div(one, b.add(one, b.exp(b.neg(x))))


# --- unary math ---------------------------------------------------------------------------


def _neg_vjp(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
    return [b.neg(cts[0])] if cts[0] is not None else [None]


_register(
    graph.NegOp,
    partial=(0,),
    vjp=_neg_vjp,
    reference=on_operands(torch.neg),
    tile=Pointwise(lambda b, op, a: b.neg(a[0])),
)


def _no_gradient(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
    return [None]


_register(
    graph.StopGradientOp,
    partial="all",
    vjp=_no_gradient,
    reference=on_operands(lambda x: x),
    tile=Pointwise(lambda b, op, a: a[0]),
)


def _abs_vjp(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
    x = op.operands[0]
    zero = b.constant(0.0, x)
    sign = b.op(
        graph.SelectOp,
        b.op(graph.CompareOp, x, zero, predicate="lt"),
        b.constant(-1.0, x),
        b.constant(1.0, x),
    )
    sign = b.op(graph.SelectOp, b.op(graph.CompareOp, x, zero, predicate="eq"), zero, sign)
    return _local(b, cts[0], sign)


def _abs_tile(b: TileBuilder, op: graph.GraphOp, a: Operands) -> Value:
    if is_float(a[0]):
        return b.math(mathd.AbsFOp, a[0])
    return b.select(b.cmp("lt", a[0], _zero(b, a[0])), b.neg(a[0]), a[0])


def _bool_identity(
    fn: Callable[[torch.Tensor], torch.Tensor],
) -> Callable[[torch.Tensor], torch.Tensor]:
    """``fn``, but the identity on bools (abs and relu of a bool is the bool, as numpy's
    abs and maximum with False; torch rejects abs of bools, relu gives int64)."""
    return lambda x: x if x.dtype == torch.bool else fn(x)


_register(
    graph.AbsOp,
    vjp=_abs_vjp,
    reference=on_operands(_bool_identity(torch.abs)),
    tile=Pointwise(_abs_tile),
)


def _relu_vjp(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
    x = op.operands[0]
    positive = b.op(graph.CompareOp, x, b.constant(0.0, x), predicate="gt")
    return [b.op(graph.SelectOp, positive, cts[0], b.constant(0.0, x))]  # type: ignore[arg-type]


_register(
    graph.ReluOp,
    vjp=_relu_vjp,
    reference=on_operands(_bool_identity(lambda x: torch.clamp_min(x, 0))),
    tile=Pointwise(lambda b, op, a: b.maximum(a[0], _zero(b, a[0]))),
)


def _exp_vjp(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
    return _local(b, cts[0], op.results[0])


_register(
    graph.ExpOp,
    vjp=_exp_vjp,
    reference=on_operands(torch.exp),
    tile=Pointwise(lambda b, op, a: b.exp(a[0])),
)


def _log_vjp(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
    return [b.div(cts[0], op.operands[0])]  # type: ignore[arg-type]


_register(
    graph.LogOp,
    vjp=_log_vjp,
    reference=on_operands(torch.log),
    tile=Pointwise(lambda b, op, a: b.log(a[0])),
)


def _tanh_vjp(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
    y = op.results[0]
    return _local(b, cts[0], b.sub(b.constant(1.0, y), b.mul(y, y)))


_register(
    graph.TanhOp,
    vjp=_tanh_vjp,
    reference=on_operands(torch.tanh),
    tile=Pointwise(lambda b, op, a: b.math(mathd.TanhOp, a[0])),
)


def _sqrt_vjp(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
    return [b.div(cts[0], b.scale(op.results[0], 2.0))]  # type: ignore[arg-type]


_register(
    graph.SqrtOp,
    vjp=_sqrt_vjp,
    reference=on_operands(torch.sqrt),
    tile=Pointwise(lambda b, op, a: b.math(mathd.SqrtOp, a[0])),
)


def _rsqrt_vjp(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
    x, y = op.operands[0], op.results[0]  # d/dx x^-1/2 = -1/2 y / x
    return _local(b, cts[0], b.scale(b.div(y, x), -0.5))


_register(
    graph.RsqrtOp,
    vjp=_rsqrt_vjp,
    reference=on_operands(torch.rsqrt),
    tile=Pointwise(lambda b, op, a: b.rsqrt(a[0])),
)


def _sigmoid_vjp(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
    y = op.results[0]
    return _local(b, cts[0], b.mul(y, b.sub(b.constant(1.0, y), y)))


_register(
    graph.SigmoidOp,
    vjp=_sigmoid_vjp,
    reference=on_operands(torch.sigmoid),
    tile=Pointwise(lambda b, op, a: _sigmoid(b, a[0])),
)


def _silu_vjp(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
    x = op.operands[0]
    s = b.op(graph.SigmoidOp, x)  # d/dx x s(x) = s (1 + x (1 - s))
    one = b.constant(1.0, x)
    return _local(b, cts[0], b.mul(s, b.add(one, b.mul(x, b.sub(one, s)))))


_register(
    graph.SiluOp,
    vjp=_silu_vjp,
    reference=on_operands(F.silu),
    tile=Pointwise(lambda b, op, a: b.mul(a[0], _sigmoid(b, a[0]))),
)


def _erf_vjp(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
    x = op.operands[0]  # d/dx erf(x) = 2 / sqrt(pi) e^(-x^2)
    return _local(b, cts[0], b.scale(b.op(graph.ExpOp, b.neg(b.mul(x, x))), 2 / math.sqrt(math.pi)))


_register(
    graph.ErfOp,
    vjp=_erf_vjp,
    reference=on_operands(torch.erf),
    tile=Pointwise(lambda b, op, a: b.math(mathd.ErfOp, a[0])),
)


def _cos_vjp(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
    return _local(b, cts[0], b.neg(b.op(graph.SinOp, op.operands[0])))  # d/dx cos = -sin


_register(
    graph.CosOp,
    vjp=_cos_vjp,
    reference=on_operands(torch.cos),
    tile=Pointwise(lambda b, op, a: b.math(mathd.CosOp, a[0])),
)


def _sin_vjp(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
    return _local(b, cts[0], b.op(graph.CosOp, op.operands[0]))  # d/dx sin = cos


_register(
    graph.SinOp,
    vjp=_sin_vjp,
    reference=on_operands(torch.sin),
    tile=Pointwise(lambda b, op, a: b.math(mathd.SinOp, a[0])),
)


def _gelu_vjp(b: GradBuilder, op: graph.GeluOp, cts: Cotangents) -> Cotangents:
    x = op.operands[0]
    one, half = b.constant(1.0, x), b.constant(0.5, x)
    if op.attrs()["approximate"] == "tanh":
        c, k = math.sqrt(2 / math.pi), 0.044715
        x2 = b.mul(x, x)
        inner = b.mul(b.constant(c, x), b.add(x, b.mul(b.constant(k, x), b.mul(x2, x))))
        t = b.op(graph.TanhOp, inner)
        d_inner = b.mul(b.constant(c, x), b.add(one, b.mul(b.constant(3 * k, x), x2)))
        local = b.add(
            b.mul(half, b.add(one, t)),
            b.mul(b.mul(half, x), b.mul(b.sub(one, b.mul(t, t)), d_inner)),
        )
    else:  # Φ(x) + x φ(x), with Φ = gelu(x) / x (and Φ(0) = 1/2)
        phi = b.scale(b.op(graph.ExpOp, b.scale(b.mul(x, x), -0.5)), 1 / math.sqrt(2 * math.pi))
        at_zero = b.op(graph.CompareOp, x, b.constant(0.0, x), predicate="eq")
        safe_x = b.op(graph.SelectOp, at_zero, one, x)
        cdf = b.op(graph.SelectOp, at_zero, half, b.div(op.results[0], safe_x))
        local = b.add(cdf, b.mul(x, phi))
    return _local(b, cts[0], local)


@bound
def _gelu_reference(op: graph.GeluOp) -> Callable[[torch.Tensor], torch.Tensor]:
    """``F.gelu`` with the op's approximation."""
    return functools.partial(F.gelu, approximate=op.attrs()["approximate"])


def _gelu_tile(b: TileBuilder, op: graph.GeluOp, a: Operands) -> Value:
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


_register(graph.GeluOp, vjp=_gelu_vjp, reference=_gelu_reference, tile=Pointwise(_gelu_tile))


# --- binary arithmetic ----------------------------------------------------------------------


def _binary(
    b: GradBuilder, op: graph.GraphOp, lhs_ct: SSAValue | None, rhs_ct: SSAValue | None
) -> Cotangents:
    lhs, rhs = op.operands
    return [
        b.unbroadcast(lhs_ct, _shape(lhs)) if lhs_ct is not None and _float(lhs) else None,
        b.unbroadcast(rhs_ct, _shape(rhs)) if rhs_ct is not None and _float(rhs) else None,
    ]


def _operands_tile(method: str) -> Pointwise:
    """Tile code calling the builder's ``method`` on the operands."""
    return Pointwise(lambda b, op, a: getattr(b, method)(*a))


def _add_vjp(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
    return _binary(b, op, cts[0], cts[0])


def _add_tile(b: TileBuilder, op: graph.GraphOp, a: Operands) -> Value:
    """``a + b``; on bools the logical or (an i1 ``addi`` would be the exclusive or)."""
    if element_type(a[0].type) == i1:
        return b.or_(a[0], a[1])
    return b.add(a[0], a[1])


_register(
    graph.AddOp,
    partial="all",
    vjp=_add_vjp,
    reference=on_operands(torch.add),
    tile=Pointwise(_add_tile),
)


def _sub_vjp(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
    ct = cts[0]
    return _binary(b, op, ct, b.neg(ct) if ct is not None else None)


_register(
    graph.SubOp,
    partial="all",
    vjp=_sub_vjp,
    reference=on_operands(torch.sub),
    tile=_operands_tile("sub"),
)


def _mul_vjp(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
    lhs, rhs = op.operands
    ct = cts[0]
    assert ct is not None
    return _binary(b, op, b.mul(ct, rhs), b.mul(ct, lhs))


_register(
    graph.MulOp,
    partial=(0, 1),
    vjp=_mul_vjp,
    reference=on_operands(torch.mul),
    tile=_operands_tile("mul"),
)


def _div_vjp(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
    rhs = op.operands[1]
    ct = cts[0]
    assert ct is not None
    lhs_ct = b.div(ct, rhs)
    return _binary(b, op, lhs_ct, b.neg(b.mul(lhs_ct, op.results[0])))


def _div_tile(b: TileBuilder, op: graph.DivOp, a: Operands) -> Value:
    """``x / c`` for a constant ``c`` is ``x * (1/c)``: a multiply per element instead of a
    correctly rounded division (within 1 ulp; exact when ``c`` is a power of two)."""
    divisor = op.rhs.owner
    if isinstance(divisor, graph.ConstantOp) and is_splat(divisor.value):
        value = float(first_value(divisor.value))
        if value != 0 and math.isfinite(value) and math.isfinite(1 / value):
            return b.mul(a[0], b.constant(1 / value))
    return b.div(a[0], a[1])


_register(
    graph.DivOp,
    partial=(0,),
    vjp=_div_vjp,
    reference=on_operands(torch.div),
    tile=Pointwise(_div_tile),
)


def _pow_vjp(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
    x, y = op.operands
    out, ct = op.results[0], cts[0]
    assert ct is not None
    # d/dx = y x^(y-1) = y out / x (x != 0); d/dy = out log x (x > 0, else 0)
    zero = b.constant(0.0, x)
    x_is_zero = b.op(graph.CompareOp, x, zero, predicate="eq")
    safe_x = b.op(graph.SelectOp, x_is_zero, b.constant(1.0, x), x)
    dx = b.op(
        graph.SelectOp,
        x_is_zero,
        b.mul(y, b.op(graph.PowOp, x, b.sub(y, b.constant(1.0, y)))),
        b.div(b.mul(y, out), safe_x),
    )
    positive = b.op(graph.CompareOp, x, zero, predicate="gt")
    dy = b.op(graph.SelectOp, positive, b.mul(out, b.op(graph.LogOp, safe_x)), zero)
    return _binary(b, op, b.mul(ct, dx), b.mul(ct, dy))


def _int_pow(b: TileBuilder, x: Value, y: Value) -> Value:
    """torch.pow for integers: ``x**y`` by squaring over every bit of ``y`` (wrapping on
    overflow, as numpy and torch do); a negative ``y`` gives torch's ``1 // x**-y``: 1 for
    x = 1, 1 or -1 (by the parity of y) for x = -1, else 0."""
    element = element_type(x.type)
    zero, one, two = (b.constant(v, element) for v in (0, 1, 2))
    odd_y = b.cmp("ne", b.rem(y, two), zero)
    exponent, base, result = b.maximum(y, zero), x, one
    bits = element.bitwidth - 1  # type: ignore[attr-defined]
    for bit in range(bits):
        odd = b.cmp("ne", b.rem(exponent, two), zero)
        result = b.select(odd, b.mul(result, base), result)
        if bit + 1 < bits:
            exponent, base = b.div(exponent, two), b.mul(base, base)
    minus_one = b.constant(-1, element)
    reciprocal = b.select(
        b.cmp("eq", x, one),
        one,
        b.select(b.cmp("eq", x, minus_one), b.select(odd_y, minus_one, one), zero),
    )
    return b.select(b.cmp("lt", y, zero), reciprocal, result)


def _pow_tile(b: TileBuilder, op: graph.GraphOp, a: Operands) -> Value:
    """torch.pow for floats: |x|^y with the sign of x for odd integer y, nan for other y < 0
    bases; integers: :func:`_int_pow`."""
    x, y = a
    if not is_float(x):
        return _int_pow(b, x, y)
    magnitude = b.exp(b.mul(y, b.log(b.math(mathd.AbsFOp, x))))
    y_int = b.convert(b.convert(y, i32), element_type(y.type))
    integral = b.cmp("eq", y_int, y)
    odd = b.cmp("ne", b.rem(b.convert(y, i32), b.constant(2, i32)), b.constant(0, i32))
    negative = b.cmp("lt", x, b.constant(0.0))
    signed = b.select(odd, b.neg(magnitude), magnitude)
    result = b.select(negative, b.select(integral, signed, b.constant(float("nan"))), magnitude)
    return b.select(b.cmp("eq", y, b.constant(0.0)), b.constant(1.0), result)


_register(graph.PowOp, vjp=_pow_vjp, reference=on_operands(torch.pow), tile=Pointwise(_pow_tile))


def _pick_vjp(predicate: str) -> VjpRule:
    """The VJP of maximum (``gt``) or minimum (``lt``): the cotangent goes to the operand
    that wins, split evenly on ties (as torch does)."""

    def rule(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
        lhs, rhs = op.operands
        ct = cts[0]
        assert ct is not None
        zero = b.constant(0.0, ct)
        lhs_wins = b.op(graph.CompareOp, lhs, rhs, predicate=predicate)
        tie = b.op(graph.CompareOp, lhs, rhs, predicate="eq")
        half = b.scale(ct, 0.5)
        lhs_ct = b.op(graph.SelectOp, tie, half, b.op(graph.SelectOp, lhs_wins, ct, zero))
        rhs_ct = b.op(graph.SelectOp, tie, half, b.op(graph.SelectOp, lhs_wins, zero, ct))
        return _binary(b, op, lhs_ct, rhs_ct)

    return rule


_register(
    graph.MaximumOp,
    vjp=_pick_vjp("gt"),
    reference=on_operands(torch.maximum),
    tile=_operands_tile("maximum"),
)
_register(
    graph.MinimumOp,
    vjp=_pick_vjp("lt"),
    reference=on_operands(torch.minimum),
    tile=_operands_tile("minimum"),
)


# --- compare, select, cast --------------------------------------------------------------------


_COMPARE = {
    "eq": torch.eq,
    "ne": torch.ne,
    "lt": torch.lt,
    "le": torch.le,
    "gt": torch.gt,
    "ge": torch.ge,
}


def _compare_vjp(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
    return [None, None]


@bound
def _compare_reference(op: graph.CompareOp) -> Callable[..., torch.Tensor]:
    """The torch comparison of the op's predicate."""
    return _COMPARE[op.attrs()["predicate"]]


def _compare_tile(b: TileBuilder, op: graph.CompareOp, a: Operands) -> Value:
    x, y = a
    if is_float(x) != is_float(y):  # mixed (a weak scalar): compare as floats
        element = element_type((x if is_float(x) else y).type)
        x, y = b.convert(x, element), b.convert(y, element)
    return b.cmp(op.predicate.data, x, y)


_register(
    graph.CompareOp, vjp=_compare_vjp, reference=_compare_reference, tile=Pointwise(_compare_tile)
)


def _select_vjp(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
    cond, on_true, on_false = op.operands
    ct = cts[0]
    assert ct is not None
    zero = b.constant(0.0, ct)
    true_ct = b.op(graph.SelectOp, cond, ct, zero)
    false_ct = b.op(graph.SelectOp, cond, zero, ct)
    return [
        None,
        b.unbroadcast(true_ct, _shape(on_true)) if _float(on_true) else None,
        b.unbroadcast(false_ct, _shape(on_false)) if _float(on_false) else None,
    ]


_register(
    graph.SelectOp,
    vjp=_select_vjp,
    reference=on_operands(torch.where),
    tile=_operands_tile("select"),
)


def _cast_vjp(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
    x = op.operands[0]
    if not _float(x) or cts[0] is None:
        return [None]
    return [b.cast(cts[0], x)]


@bound
def _cast_reference(op: graph.CastOp) -> Callable[[torch.Tensor], torch.Tensor]:
    """``x.to`` the result's dtype."""
    dtype = AbstractTensor.from_xdsl(op.result.type).dtype.to_torch()
    return lambda x: x.to(dtype)


def _cast_tile(b: TileBuilder, op: graph.CastOp, a: Operands) -> Value:
    target = op.result.type.element_type  # type: ignore[attr-defined]
    x = a[0]
    if target == IntegerType(1):
        return b.cmp("ne", x, _zero(b, x))
    if isinstance(target, AnyFloat):
        compute = compute_element(target)  # f64, else f32
        if target != compute:  # f16 / bf16: round to the narrow format, compute in f32 again
            wide = x if element_type(x.type) == f64 else b.convert(x, f32)
            return b.convert(b.convert(wide, target), compute)
        return b.convert(x, compute)
    return b.convert(x, target)


_register(graph.CastOp, vjp=_cast_vjp, reference=_cast_reference, tile=Pointwise(_cast_tile))


# --- fp8 quantisation ------------------------------------------------------------------------

FP8_TORCH = {"e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}
# (mantissa bits, least normal exponent) of each format
_FP8_BITS = {"e4m3": (3, -6), "e5m2": (2, -14)}


def _fp8_quantize_vjp(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
    return [cts[0], None]  # straight through


@bound
def _fp8_quantize_reference(op: graph.GraphOp) -> Callable[..., torch.Tensor]:
    """``fp8(clamp(x / s, ±max)) * s`` with torch's float8 casts (round to nearest even)."""
    fmt = op.attrs()["format"]
    fp8, largest = getattr(torch, FP8_TORCH[fmt]), FP8_FORMATS[fmt]
    return lambda x, s: (x / s).clamp(-largest, largest).to(fp8).to(x.dtype) * s


def fp8_round_tile(b: TileBuilder, x: Value, fmt: str) -> Value:
    """``x`` (f32 or f64, within ±max) rounded to the nearest fp8 value, ties to even, in
    its own arithmetic (no fp8 type needed): the spacing of the values at ``|x|`` is picked
    by comparisons with the powers of two, and ``(y + 2^p) - 2^p`` rounds ``y`` to an
    integer (ties to even) for ``0 <= y < 2^p``, ``p`` the significand's bits less one."""
    mantissa, least = _FP8_BITS[fmt]
    largest = int(math.log2(FP8_FORMATS[fmt]))
    magnitude = b.math(mathd.AbsFOp, x)
    spacing = b.constant(2.0 ** (least - mantissa))  # subnormals and the least binade
    for e in range(least + 1, largest + 1):
        above = b.cmp("ge", magnitude, b.constant(2.0**e))
        spacing = b.select(above, b.constant(2.0 ** (e - mantissa)), spacing)
    magic = b.constant(2.0 ** (52 if element_type(x.type) == f64 else 23))
    steps = b.sub(b.add(b.div(magnitude, spacing), magic), magic)
    rounded = b.mul(steps, spacing)
    return b.select(b.cmp("lt", x, b.constant(0.0)), b.neg(rounded), rounded)


def _fp8_quantize_tile(b: TileBuilder, op: graph.GraphOp, a: Operands) -> Value:
    fmt = op.attrs()["format"]
    largest = FP8_FORMATS[fmt]
    y = b.div(a[0], a[1])
    y = b.minimum(b.maximum(y, b.constant(-largest)), b.constant(largest))
    return b.mul(fp8_round_tile(b, y, fmt), a[1])


_register(
    graph.Fp8QuantizeOp,
    vjp=_fp8_quantize_vjp,
    reference=_fp8_quantize_reference,
    tile=Pointwise(_fp8_quantize_tile),
)


def fp8_scale(b: GradBuilder, x: SSAValue, fmt: str) -> SSAValue:
    """The per-tensor current scale of ``x``: ``amax(|x|) / max``, 1 where ``x`` is all zero."""
    magnitude = b.op(graph.AbsOp, x)
    rank = len(_shape(x))
    amax = (
        b.op(graph.MaxOp, magnitude, axes=list(range(rank)), keepdims=False) if rank else magnitude
    )
    positive = b.op(graph.CompareOp, amax, b.constant(0.0, amax), predicate="gt")
    scaled = b.div(amax, b.constant(FP8_FORMATS[fmt], amax))
    return b.op(graph.SelectOp, positive, scaled, b.constant(1.0, amax))


def _fp8_grad_vjp(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
    ct = cts[0]
    if ct is None:
        return [None]
    fmt = op.attrs()["format"]
    return [b.op(graph.Fp8QuantizeOp, ct, fp8_scale(b, ct, fmt), format=fmt)]


def _fp8_grad_delayed_vjp(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
    """The cotangent quantised with the given scale; its amax is the probe's cotangent."""
    ct = cts[0]
    if ct is None:
        return [None, None, None]
    rank = len(_shape(ct))
    magnitude = b.op(graph.AbsOp, ct)
    amax = (
        b.op(graph.MaxOp, magnitude, axes=list(range(rank)), keepdims=False) if rank else magnitude
    )
    quantized = b.op(graph.Fp8QuantizeOp, ct, op.operands[1], format=op.attrs()["format"])
    return [quantized, None, amax]


_register(
    graph.Fp8GradDelayedOp,
    partial=(0,),
    vjp=_fp8_grad_delayed_vjp,
    reference=on_operands(lambda x, scale, probe: x),
    tile=Pointwise(lambda b, op, a: a[0]),
)


_register(
    graph.Fp8GradOp,
    partial=(0,),
    vjp=_fp8_grad_vjp,
    reference=on_operands(lambda x: x),
    tile=Pointwise(lambda b, op, a: a[0]),
)
