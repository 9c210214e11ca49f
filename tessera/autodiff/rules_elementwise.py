"""VJP rules of elementwise ops, matmul, casts and constants.

Binary ops broadcast like numpy, so each operand's cotangent is summed back to the
operand's shape (``unbroadcast``). Comparisons and integer results carry no gradient.
"""

from __future__ import annotations

import math

from xdsl.ir import SSAValue

from tessera.autodiff.builder import GradBuilder, aval
from tessera.autodiff.rules import Cotangents, vjp
from tessera.ir import graph


def _shape(value: SSAValue) -> tuple[int, ...]:
    return aval(value).shape


def _float(value: SSAValue) -> bool:
    return aval(value).dtype.is_float


def _unary(b: GradBuilder, op: graph.GraphOp, ct: SSAValue, local: SSAValue) -> Cotangents:
    """``ct * d(result)/d(input)`` for a unary op with local derivative ``local``."""
    return [b.mul(ct, local)]


@vjp(graph.NegOp)
def _neg(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
    return [b.neg(cts[0])] if cts[0] is not None else [None]


@vjp(graph.AbsOp)
def _abs(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
    x = op.operands[0]
    zero = b.constant(0.0, x)
    sign = b.op(
        graph.SelectOp,
        b.op(graph.CompareOp, x, zero, predicate="lt"),
        b.constant(-1.0, x),
        b.constant(1.0, x),
    )
    sign = b.op(graph.SelectOp, b.op(graph.CompareOp, x, zero, predicate="eq"), zero, sign)
    return _unary(b, op, cts[0], sign)  # type: ignore[arg-type]


@vjp(graph.ReluOp)
def _relu(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
    x = op.operands[0]
    positive = b.op(graph.CompareOp, x, b.constant(0.0, x), predicate="gt")
    return [b.op(graph.SelectOp, positive, cts[0], b.constant(0.0, x))]  # type: ignore[arg-type]


@vjp(graph.ExpOp)
def _exp(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
    return _unary(b, op, cts[0], op.results[0])  # type: ignore[arg-type]


@vjp(graph.LogOp)
def _log(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
    return [b.div(cts[0], op.operands[0])]  # type: ignore[arg-type]


@vjp(graph.TanhOp)
def _tanh(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
    y = op.results[0]
    return _unary(b, op, cts[0], b.sub(b.constant(1.0, y), b.mul(y, y)))  # type: ignore[arg-type]


@vjp(graph.SqrtOp)
def _sqrt(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
    y = op.results[0]
    return [b.div(cts[0], b.scale(y, 2.0))]  # type: ignore[arg-type]


@vjp(graph.RsqrtOp)
def _rsqrt(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
    x, y = op.operands[0], op.results[0]  # d/dx x^-1/2 = -1/2 y / x
    return _unary(b, op, cts[0], b.scale(b.div(y, x), -0.5))  # type: ignore[arg-type]


def _sigmoid_of(b: GradBuilder, x: SSAValue) -> SSAValue:
    return b.op(graph.SigmoidOp, x)


@vjp(graph.SigmoidOp)
def _sigmoid(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
    y = op.results[0]
    return _unary(b, op, cts[0], b.mul(y, b.sub(b.constant(1.0, y), y)))  # type: ignore[arg-type]


@vjp(graph.SiluOp)
def _silu(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
    x = op.operands[0]
    s = _sigmoid_of(b, x)  # d/dx x s(x) = s (1 + x (1 - s))
    one = b.constant(1.0, x)
    return _unary(b, op, cts[0], b.mul(s, b.add(one, b.mul(x, b.sub(one, s)))))  # type: ignore[arg-type]


@vjp(graph.GeluOp)
def _gelu(b: GradBuilder, op: graph.GeluOp, cts: Cotangents) -> Cotangents:
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
    else:  # Φ(x) + x φ(x); the graph has no erf, so Φ = gelu(x) / x (and Φ(0) = 1/2)
        phi = b.scale(b.op(graph.ExpOp, b.scale(b.mul(x, x), -0.5)), 1 / math.sqrt(2 * math.pi))
        at_zero = b.op(graph.CompareOp, x, b.constant(0.0, x), predicate="eq")
        safe_x = b.op(graph.SelectOp, at_zero, one, x)
        cdf = b.op(graph.SelectOp, at_zero, half, b.div(op.results[0], safe_x))
        local = b.add(cdf, b.mul(x, phi))
    return _unary(b, op, cts[0], local)  # type: ignore[arg-type]


def _binary(
    b: GradBuilder, op: graph.GraphOp, lhs_ct: SSAValue | None, rhs_ct: SSAValue | None
) -> Cotangents:
    lhs, rhs = op.operands
    out = [
        b.unbroadcast(lhs_ct, _shape(lhs)) if lhs_ct is not None and _float(lhs) else None,
        b.unbroadcast(rhs_ct, _shape(rhs)) if rhs_ct is not None and _float(rhs) else None,
    ]
    return out


@vjp(graph.AddOp)
def _add(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
    return _binary(b, op, cts[0], cts[0])


@vjp(graph.SubOp)
def _sub(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
    ct = cts[0]
    return _binary(b, op, ct, b.neg(ct) if ct is not None else None)


@vjp(graph.MulOp)
def _mul(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
    lhs, rhs = op.operands
    ct = cts[0]
    assert ct is not None
    return _binary(b, op, b.mul(ct, rhs), b.mul(ct, lhs))


@vjp(graph.DivOp)
def _div(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
    rhs = op.operands[1]
    ct = cts[0]
    assert ct is not None
    lhs_ct = b.div(ct, rhs)
    return _binary(b, op, lhs_ct, b.neg(b.mul(lhs_ct, op.results[0])))


@vjp(graph.PowOp)
def _pow(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
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


def _pick(b: GradBuilder, op: graph.GraphOp, cts: Cotangents, predicate: str) -> Cotangents:
    lhs, rhs = op.operands
    ct = cts[0]
    assert ct is not None
    zero = b.constant(0.0, ct)
    lhs_wins = b.op(graph.CompareOp, lhs, rhs, predicate=predicate)
    tie = b.op(graph.CompareOp, lhs, rhs, predicate="eq")  # torch splits ties evenly
    half = b.scale(ct, 0.5)
    lhs_ct = b.op(graph.SelectOp, tie, half, b.op(graph.SelectOp, lhs_wins, ct, zero))
    rhs_ct = b.op(graph.SelectOp, tie, half, b.op(graph.SelectOp, lhs_wins, zero, ct))
    return _binary(b, op, lhs_ct, rhs_ct)


@vjp(graph.MaximumOp)
def _maximum(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
    return _pick(b, op, cts, "gt")


@vjp(graph.MinimumOp)
def _minimum(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
    return _pick(b, op, cts, "lt")


@vjp(graph.CompareOp)
def _compare(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
    return [None, None]


@vjp(graph.SelectOp)
def _select(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
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


@vjp(graph.CastOp)
def _cast(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
    x = op.operands[0]
    if not _float(x) or cts[0] is None:
        return [None]
    return [b.cast(cts[0], x)]


@vjp(graph.ConstantOp)
def _constant(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
    return []


@vjp(graph.MatmulOp)
def _matmul(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
    """``[..., m, k] @ [..., k, n]``: dA = dC Bᵀ, dB = Aᵀ dC, summed over broadcast batch dims."""
    lhs, rhs = op.operands
    ct = cts[0]
    assert ct is not None

    def swap(value: SSAValue) -> SSAValue:
        rank = len(_shape(value))
        perm = [*range(rank - 2), rank - 1, rank - 2]
        return b.op(graph.TransposeOp, value, perm=perm)

    lhs_ct = b.op(graph.MatmulOp, ct, swap(rhs))
    rhs_ct = b.op(graph.MatmulOp, swap(lhs), ct)
    return [b.unbroadcast(lhs_ct, _shape(lhs)), b.unbroadcast(rhs_ct, _shape(rhs))]
