"""Shape and dtype rules of the graph ops: the one place that says what an op yields.

Each rule takes the operands' abstract values and the op's attributes as Python values
and returns the result's abstract value (a tuple for ops with several results). A rule
raises :class:`ShapeError` whose message says what was expected and what was found. The
graph dialect's verifiers and the tracer both call these rules.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from math import prod
from typing import Any

from tessera.dtypes import DType
from tessera.errors import ShapeError
from tessera.ir.abstract import AbstractTensor
from tessera.ir.reduction_kinds import KINDS, NAMES
from tessera.ir.zigzag import check_zigzag

LOSS_REDUCTIONS = ("mean", "sum", "none")  # how a loss reduces its per-example values
COMPARE_PREDICATES = ("eq", "ne", "lt", "le", "gt", "ge")
GELU_APPROXIMATIONS = ("none", "tanh")


def normalize_axis(axis: int, rank: int) -> int:
    """Maps a possibly negative axis into ``range(rank)``."""
    if not -rank <= axis < max(rank, 1):
        raise ShapeError(f"axis {axis} is out of range for a tensor of rank {rank}")
    return axis % max(rank, 1)


def _check_axes(x: AbstractTensor, axes: Sequence[int], what: str = "axes") -> None:
    for axis in axes:
        if not 0 <= axis < x.rank:
            raise ShapeError(f"{what} must be in [0, {x.rank}) for operand {x}, found {list(axes)}")
    if len(set(axes)) != len(axes):
        raise ShapeError(f"{what} must be distinct, found {list(axes)}")


def _require_float(x: AbstractTensor, role: str = "operand") -> None:
    if not x.dtype.is_float:
        raise ShapeError(f"expected a floating-point {role}, found {x}")


def _require_same_dtype(*xs: AbstractTensor) -> DType:
    dtypes = {x.dtype for x in xs}
    if len(dtypes) != 1:
        found = ", ".join(str(x) for x in xs)
        raise ShapeError(f"expected operands of one element type, found {found}")
    return xs[0].dtype


def broadcast_shapes(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    """Numpy broadcasting of shapes; raises ShapeError naming the clashing dims."""
    rank = max((len(s) for s in shapes), default=0)
    padded = [(1,) * (rank - len(s)) + tuple(s) for s in shapes]
    result = []
    for dim, sizes in enumerate(zip(*padded, strict=True)):
        non_one = {s for s in sizes if s != 1}
        if len(non_one) > 1:
            found = " and ".join(str(list(s)) for s in shapes)
            raise ShapeError(
                f"shapes {found} do not broadcast: dimension {dim} (aligned right) "
                f"has sizes {sorted(non_one)}"
            )
        result.append(non_one.pop() if non_one else 1)
    return tuple(result)


# --- elementwise -------------------------------------------------------------------


def unary(x: AbstractTensor) -> AbstractTensor:
    """Same shape and dtype as the operand (abs, relu)."""
    return x


def negate(x: AbstractTensor) -> AbstractTensor:
    """neg: same shape and dtype; not bool (numpy and torch reject ``-`` of bools)."""
    if x.dtype == DType.i1:
        raise ShapeError(
            f"negating a bool tensor is not supported (numpy and torch reject it too), found "
            f"{x}; op.equal(x, False) is the logical not, or cast to an integer first"
        )
    return x


def float_unary(x: AbstractTensor) -> AbstractTensor:
    """Same shape and dtype; floating point only (exp, tanh, sigmoid...)."""
    _require_float(x)
    return x


def gelu(x: AbstractTensor, approximate: str) -> AbstractTensor:
    if approximate not in GELU_APPROXIMATIONS:
        raise ShapeError(f"approximate must be one of {GELU_APPROXIMATIONS}, found {approximate!r}")
    return float_unary(x)


FP8_FORMATS = {"e4m3": 448.0, "e5m2": 57344.0}  # float8_e4m3fn / float8_e5m2: largest finite value


def fp8_grad(x: AbstractTensor, format: str) -> AbstractTensor:
    if format not in FP8_FORMATS:
        raise ShapeError(f"format must be one of {tuple(FP8_FORMATS)}, found {format!r}")
    return float_unary(x)


def fp8_grad_delayed(
    x: AbstractTensor, scale: AbstractTensor, probe: AbstractTensor, format: str
) -> AbstractTensor:
    if scale.shape != () or scale.dtype != x.dtype or probe.shape != () or probe.dtype != x.dtype:
        raise ShapeError(
            f"fp8_grad_delayed: the scale and the probe must be scalars of {x.dtype}, "
            f"found {scale} and {probe}"
        )
    return fp8_grad(x, format)


def fp8_quantize(x: AbstractTensor, scale: AbstractTensor, format: str) -> AbstractTensor:
    if scale.shape != () or scale.dtype != x.dtype:
        raise ShapeError(f"fp8_quantize: the scale must be a scalar of {x.dtype}, found {scale}")
    return fp8_grad(x, format)


def binary(lhs: AbstractTensor, rhs: AbstractTensor) -> AbstractTensor:
    """Broadcast shape of the operands; both have one dtype (add, mul, maximum...).

    On bools, add is the logical or and mul the logical and (numpy's and torch's
    ``True + True`` is ``True``); maximum and minimum are or and and too."""
    dtype = _require_same_dtype(lhs, rhs)
    return AbstractTensor(broadcast_shapes(lhs.shape, rhs.shape), dtype)


def subtract(lhs: AbstractTensor, rhs: AbstractTensor) -> AbstractTensor:
    """sub: like :func:`binary`; not bool (numpy and torch reject bool subtraction)."""
    result = binary(lhs, rhs)
    if result.dtype == DType.i1:
        raise ShapeError(
            f"bool subtraction is not supported (numpy and torch reject it too), found {lhs} "
            f"and {rhs}; op.not_equal(a, b) is the exclusive or, or cast to an integer first"
        )
    return result


def power(lhs: AbstractTensor, rhs: AbstractTensor) -> AbstractTensor:
    """pow: like :func:`binary`, floats or integers (an integer power is an integer, as in
    numpy); not bool (torch rejects it; numpy's int8 result has no Tessera dtype)."""
    result = binary(lhs, rhs)
    if result.dtype == DType.i1:
        raise ShapeError(
            f"bool ** bool is not supported (torch rejects it; numpy's result is int8, which "
            f"Tessera has no dtype for), found {lhs} and {rhs}; cast to an integer first"
        )
    return result


def float_binary(lhs: AbstractTensor, rhs: AbstractTensor) -> AbstractTensor:
    """Like :func:`binary`, floating point only (div: the tracer casts integers first)."""
    result = binary(lhs, rhs)
    _require_float(result, "operand pair")
    return result


def compare(lhs: AbstractTensor, rhs: AbstractTensor, predicate: str) -> AbstractTensor:
    if predicate not in COMPARE_PREDICATES:
        raise ShapeError(f"predicate must be one of {COMPARE_PREDICATES}, found {predicate!r}")
    return binary(lhs, rhs).with_dtype(DType.i1)


def select(
    cond: AbstractTensor, on_true: AbstractTensor, on_false: AbstractTensor
) -> AbstractTensor:
    if cond.dtype != DType.i1:
        raise ShapeError(f"expected an i1 condition, found {cond}")
    dtype = _require_same_dtype(on_true, on_false)
    return AbstractTensor(broadcast_shapes(cond.shape, on_true.shape, on_false.shape), dtype)


def cast(x: AbstractTensor, dtype: DType) -> AbstractTensor:
    return x.with_dtype(dtype)


def random_bits(
    key0: AbstractTensor, key1: AbstractTensor, counter: AbstractTensor, stream: int
) -> AbstractTensor:
    """Philox bits: i32 key words and counter, broadcast; a stream in [0, 2^32)."""
    for name, x in (("key0", key0), ("key1", key1), ("counter", counter)):
        if x.dtype != DType.i32:
            raise ShapeError(f"expected an i32 {name}, found {x}")
    if not 0 <= stream < 1 << 32:
        raise ShapeError(f"expected a stream in [0, 2^32), found {stream}")
    return AbstractTensor(broadcast_shapes(key0.shape, key1.shape, counter.shape), DType.i32)


# --- contractions --------------------------------------------------------------------


def matmul(lhs: AbstractTensor, rhs: AbstractTensor, fp8: str | None = None) -> AbstractTensor:
    """``[..., m, k] @ [..., k, n] -> [..., m, n]`` with broadcast batch dims; float or
    integer operands (a bool matmul is rejected, as torch rejects it); ``fp8``: float
    operands holding values of that fp8 format."""
    dtype = _require_same_dtype(lhs, rhs)
    if fp8 is not None and (fp8 not in FP8_FORMATS or not dtype.is_float):
        raise ShapeError(
            f"an fp8 matmul takes float operands and a format in {tuple(FP8_FORMATS)}, "
            f"found {lhs}, {rhs} and {fp8!r}"
        )
    if dtype == DType.i1:
        raise ShapeError(
            f"bool matmuls are not supported, found {lhs} and {rhs}; cast the operands "
            f"first: op.astype(x, 'int32') counts the true pairs, op.astype(x, 'float32') "
            f"computes in floats"
        )
    if lhs.rank < 2 or rhs.rank < 2:
        raise ShapeError(f"expected operands of rank >= 2, found {lhs} and {rhs}")
    if lhs.shape[-1] != rhs.shape[-2]:
        raise ShapeError(
            f"contraction dimension mismatch: lhs {lhs} has k = {lhs.shape[-1]}, "
            f"rhs {rhs} has k = {rhs.shape[-2]}"
        )
    batch = broadcast_shapes(lhs.shape[:-2], rhs.shape[:-2])
    return AbstractTensor((*batch, lhs.shape[-2], rhs.shape[-1]), dtype)


# --- reductions and normalisations -----------------------------------------------------


def reduce(x: AbstractTensor, axes: Sequence[int], keepdims: bool) -> AbstractTensor:
    """A reduction (sum, mean, max, min, prod) over ``axes``."""
    _check_axes(x, axes)
    if keepdims:
        shape = tuple(1 if d in axes else s for d, s in enumerate(x.shape))
    else:
        shape = tuple(s for d, s in enumerate(x.shape) if d not in axes)
    return x.with_shape(shape)


def sum_reduce(x: AbstractTensor, axes: Sequence[int], keepdims: bool) -> AbstractTensor:
    """sum: like :func:`reduce`, in the operand's dtype (an integer sum wraps in it); not
    bool (``op.sum`` counts bools, and sums int32, in int64 as numpy does)."""
    if x.dtype == DType.i1:
        raise ShapeError(
            f"a sum of bools is not supported, found {x}; cast to an integer first "
            f"(op.sum counts bools in int64)"
        )
    return reduce(x, axes, keepdims)


def extremum_reduce(x: AbstractTensor, axes: Sequence[int], keepdims: bool) -> AbstractTensor:
    """max / min: like :func:`reduce`, but an empty axis has no maximum (as in torch)."""
    result = reduce(x, axes, keepdims)
    empty = [a for a in axes if x.shape[a] == 0]
    if empty:
        raise ShapeError(
            f"the maximum or minimum over an empty axis is undefined: axis {empty[0]} of "
            f"{x} has size 0"
        )
    return result


def prod_reduce(x: AbstractTensor, axes: Sequence[int], keepdims: bool) -> AbstractTensor:
    """prod: like :func:`sum_reduce` (in the operand's dtype, not bool)."""
    if x.dtype == DType.i1:
        raise ShapeError(
            f"a product of bools is not supported, found {x}; cast to an integer first "
            f"(op.prod multiplies bools in int64)"
        )
    return reduce(x, axes, keepdims)


def float_reduce(x: AbstractTensor, axes: Sequence[int], keepdims: bool) -> AbstractTensor:
    """mean: a reduction that needs a floating-point operand."""
    _require_float(x)
    return reduce(x, axes, keepdims)


def softmax(x: AbstractTensor, axis: int) -> AbstractTensor:
    _require_float(x)
    _check_axes(x, [axis], "axis")
    return x


def normalization(x: AbstractTensor, axes: Sequence[int], eps: float) -> AbstractTensor:
    """layer_norm / rms_norm over ``axes``."""
    _require_float(x)
    _check_axes(x, axes)
    if not axes:
        raise ShapeError("expected at least one axis to normalize over, found none")
    if eps < 0:
        raise ShapeError(f"expected eps >= 0, found {eps}")
    return x


def cross_entropy(logits: AbstractTensor, labels: AbstractTensor, reduction: str) -> AbstractTensor:
    """Logits ``[..., C]`` (classes last) and integer labels ``[...]``."""
    _require_float(logits, "logits tensor")
    if not labels.dtype.is_int:
        raise ShapeError(f"expected integer labels, found {labels}")
    if logits.rank < 1:
        raise ShapeError(f"expected logits of rank >= 1 (classes last), found {logits}")
    if labels.shape != logits.shape[:-1]:
        raise ShapeError(
            f"expected labels of shape {list(logits.shape[:-1])} for logits {logits}, "
            f"found {labels}"
        )
    if reduction not in LOSS_REDUCTIONS:
        raise ShapeError(f"reduction must be one of {LOSS_REDUCTIONS}, found {reduction!r}")
    return labels.with_dtype(logits.dtype) if reduction == "none" else logits.with_shape(())


# --- attention -----------------------------------------------------------------------------


def attention_statistics_dtype(x: AbstractTensor) -> DType:
    """The dtype of attention's per-row log-sum-exp (and of the backward's row sums):
    f32, or f64 for f64 inputs (it is computed in the kernel's accumulator type)."""
    return DType.f64 if x.dtype == DType.f64 else DType.f32


def _check_positions(positions: Sequence[AbstractTensor]) -> None:
    """Causal position offsets: none, or the query's and the key's, each an i32 scalar."""
    if len(positions) not in (0, 2):
        raise ShapeError(
            f"expected no position offsets or two (the queries' and the keys'), "
            f"found {len(positions)}"
        )
    for role, p in zip(("query", "key"), positions, strict=False):
        if p.shape != () or p.dtype != DType.i32:
            raise ShapeError(f"expected the {role} position offset to be an i32 scalar, found {p}")


def _check_zigzag(zigzag: int) -> None:
    """A zig-zag order is over a positive number of ranks (0: none). Whether the
    sequences cut into its chunks is checked where the global lengths are known (the
    tracer) and by the passes that cut them (a partitioned op holds a part)."""
    if zigzag:
        check_zigzag(0, zigzag)


def _check_attention_operands(
    q: AbstractTensor, k: AbstractTensor, v: AbstractTensor, scale: float
) -> None:
    """``q [..., Tq, D]``, ``k [..., Tk, D]``, ``v [..., Tk, Dv]`` of one float dtype; k
    and v share their batch dims, q's match them but for the last (the heads), which may
    be a multiple of theirs (grouped-query attention)."""
    dtype = _require_same_dtype(q, k, v)
    if not dtype.is_float:
        raise ShapeError(f"expected floating-point q, k and v, found {q}, {k} and {v}")
    if q.rank < 2 or not q.rank == k.rank == v.rank:
        raise ShapeError(
            f"expected q [..., Tq, D], k [..., Tk, D] and v [..., Tk, Dv] of one rank >= 2, "
            f"found {q}, {k} and {v}"
        )
    if q.shape[-1] != k.shape[-1]:
        raise ShapeError(f"q and k must have one head dim (D), found {q} and {k}")
    if k.shape[:-1] != v.shape[:-1]:
        raise ShapeError(
            f"k and v must agree on every dim but the last (batch dims and Tk), found {k} and {v}"
        )
    if q.shape[:-3] != k.shape[:-3]:
        raise ShapeError(f"q and k must have the same batch dims, found {q} and {k}")
    if q.rank > 2:
        heads, kv_heads = q.shape[-3], k.shape[-3]
        grouped = heads % kv_heads == 0 if kv_heads else heads == 0
        if not grouped:
            raise ShapeError(
                f"the query heads (dim {q.rank - 3}: {heads}) must be a multiple of the key "
                f"and value heads ({kv_heads}), found q {q} and k {k}"
            )
    if not math.isfinite(scale):
        raise ShapeError(f"expected a finite scale, found {scale}")


def _check_masking(
    q: AbstractTensor,
    k: AbstractTensor,
    extra: Sequence[AbstractTensor],
    window: int,
    softcap: float,
    segments: bool,
) -> Sequence[AbstractTensor]:
    """Checks the segment ids (``segments``: the first two of ``extra``), the window and
    the soft cap; returns the position operands (the rest)."""
    if window < 0:
        raise ShapeError(f"expected a positive window, found {window}")
    if softcap < 0 or not math.isfinite(softcap):
        raise ShapeError(f"expected a positive finite softcap, found {softcap}")
    if not segments:
        return extra
    if len(extra) < 2:
        raise ShapeError("expected the query and key segment ids after q, k and v")
    batch = q.shape[:-3]
    for role, ids, length in (("query", extra[0], q.shape[-2]), ("key", extra[1], k.shape[-2])):
        want = AbstractTensor((*batch, length), DType.i32)
        if ids != want:
            raise ShapeError(f"expected the {role} segment ids to be {want}, found {ids}")
    return extra[2:]


def attention(
    q: AbstractTensor,
    k: AbstractTensor,
    v: AbstractTensor,
    *extra: AbstractTensor,
    causal: bool,
    scale: float,
    zigzag: int = 0,
    window: int = 0,
    softcap: float = 0.0,
    segments: bool = False,
) -> tuple[AbstractTensor, AbstractTensor]:
    """``softmax(scale · q kᵀ [masked]) v`` and its per-row log-sum-exp ``[..., Tq]``.

    ``extra``: with ``segments`` the segment ids ``[batch, Tq]`` and ``[batch, Tk]`` (i32,
    ``batch`` q's dims before the heads), then the optional offsets ``q0, k0`` (i32
    scalars): query ``i`` sees key ``j`` iff ``q0 + i >= k0 + j`` (causal) and ``|q0 + i -
    k0 - j| < window``; ``zigzag = n``: q, k and v are stored in zig-zag order over ``n``
    ranks (``i`` and ``j`` are their true positions)."""
    _check_attention_operands(q, k, v, scale)
    positions = _check_masking(q, k, extra, window, softcap, segments)
    _check_positions(positions)
    _check_zigzag(zigzag)
    out = q.with_shape((*q.shape[:-1], v.shape[-1]))
    return out, AbstractTensor(q.shape[:-1], attention_statistics_dtype(q))


def attention_backward(
    q: AbstractTensor,
    k: AbstractTensor,
    v: AbstractTensor,
    do: AbstractTensor,
    lse: AbstractTensor,
    delta: AbstractTensor,
    *extra: AbstractTensor,
    causal: bool,
    scale: float,
    zigzag: int = 0,
    window: int = 0,
    softcap: float = 0.0,
    segments: bool = False,
) -> tuple[AbstractTensor, AbstractTensor, AbstractTensor]:
    """``dq, dk, dv`` of :func:`attention` from the output's cotangent ``do``, the
    forward's ``lse`` and ``delta = rowsum(do * o)`` (both ``[..., Tq]``)."""
    _check_attention_operands(q, k, v, scale)
    _check_positions(_check_masking(q, k, extra, window, softcap, segments))
    _check_zigzag(zigzag)
    want = q.with_shape((*q.shape[:-1], v.shape[-1]))
    if do != want:
        raise ShapeError(f"expected the output cotangent to be {want}, found {do}")
    rows = AbstractTensor(q.shape[:-1], attention_statistics_dtype(q))
    for role, x in (("lse", lse), ("delta", delta)):
        if x != rows:
            raise ShapeError(f"expected {role} to be {rows}, found {x}")
    return q, k, v


# --- layout ------------------------------------------------------------------------------


def reshape(x: AbstractTensor, shape: Sequence[int]) -> AbstractTensor:
    if any(s < 0 for s in shape) or prod(shape) != x.size:
        raise ShapeError(
            f"cannot reshape {x} ({x.size} elements) to shape {list(shape)} "
            f"({prod(shape)} elements)"
        )
    return x.with_shape(tuple(shape))


def transpose(x: AbstractTensor, perm: Sequence[int]) -> AbstractTensor:
    if sorted(perm) != list(range(x.rank)):
        raise ShapeError(
            f"expected a permutation of {list(range(x.rank))} for {x}, found {list(perm)}"
        )
    return x.with_shape(tuple(x.shape[p] for p in perm))


def broadcast_to(x: AbstractTensor, shape: Sequence[int]) -> AbstractTensor:
    shape = tuple(shape)
    if len(shape) < x.rank or broadcast_shapes(x.shape, shape) != shape:
        raise ShapeError(f"cannot broadcast {x} to shape {list(shape)}")
    return x.with_shape(shape)


def concat(*xs: AbstractTensor, axis: int) -> AbstractTensor:
    if not xs:
        raise ShapeError("expected at least one operand to concatenate, found none")
    dtype = _require_same_dtype(*xs)
    first = xs[0]
    _check_axes(first, [axis], "axis")
    for x in xs[1:]:
        other = x.shape[:axis] + x.shape[axis + 1 :]
        if x.rank != first.rank or other != first.shape[:axis] + first.shape[axis + 1 :]:
            raise ShapeError(
                f"expected operands that agree on every dimension but {axis}, found {first} and {x}"
            )
    size = sum(x.shape[axis] for x in xs)
    return AbstractTensor((*first.shape[:axis], size, *first.shape[axis + 1 :]), dtype)


def split(x: AbstractTensor, axis: int, sizes: Sequence[int]) -> tuple[AbstractTensor, ...]:
    _check_axes(x, [axis], "axis")
    if any(s < 0 for s in sizes) or sum(sizes) != x.shape[axis]:
        raise ShapeError(
            f"split sizes {list(sizes)} must be non-negative and sum to dimension "
            f"{axis} of {x} ({x.shape[axis]})"
        )
    return tuple(x.with_shape((*x.shape[:axis], s, *x.shape[axis + 1 :])) for s in sizes)


def slice_(
    x: AbstractTensor, starts: Sequence[int], limits: Sequence[int], strides: Sequence[int]
) -> AbstractTensor:
    """``x[starts:limits:strides]`` per dimension (static, positive strides)."""
    if not len(starts) == len(limits) == len(strides) == x.rank:
        raise ShapeError(
            f"expected {x.rank} starts, limits and strides for {x}, found "
            f"{len(starts)}, {len(limits)} and {len(strides)}"
        )
    shape = []
    for dim, (start, limit, stride, size) in enumerate(
        zip(starts, limits, strides, x.shape, strict=True)
    ):
        if stride < 1 or not 0 <= start <= limit <= size:
            raise ShapeError(
                f"dimension {dim} of {x}: expected 0 <= start <= limit <= {size} and "
                f"stride >= 1, found start {start}, limit {limit}, stride {stride}"
            )
        shape.append(-(-(limit - start) // stride))
    return x.with_shape(tuple(shape))


def gather(x: AbstractTensor, indices: AbstractTensor, axis: int) -> AbstractTensor:
    """``take(x, indices, axis)``: embedding lookup is ``gather(table, ids, 0)``."""
    if not indices.dtype.is_int:
        raise ShapeError(f"expected integer indices, found {indices}")
    _check_axes(x, [axis], "axis")
    return x.with_shape(x.shape[:axis] + indices.shape + x.shape[axis + 1 :])


def dynamic_update_slice(
    x: AbstractTensor, update: AbstractTensor, start: AbstractTensor, axis: int
) -> AbstractTensor:
    """``x`` with ``update`` written along ``axis`` from ``start`` (an i32 scalar): the
    update has ``x``'s dtype and rank, its dims ``x``'s but along ``axis`` (at most)."""
    _check_axes(x, [axis], "axis")
    if start.shape != () or start.dtype != DType.i32:
        raise ShapeError(f"expected the start to be an i32 scalar, found {start}")
    if update.dtype != x.dtype or update.rank != x.rank:
        raise ShapeError(f"expected an update of the dtype and rank of {x}, found {update}")
    others = [d for d in range(x.rank) if d != axis]
    if any(update.shape[d] != x.shape[d] for d in others) or update.shape[axis] > x.shape[axis]:
        raise ShapeError(
            f"expected an update with the dims of {x} but along axis {axis} (at most "
            f"{x.shape[axis]} there), found {update}"
        )
    return x


# --- mixture of experts ----------------------------------------------------------------------


def top_k(x: AbstractTensor, k: int) -> tuple[AbstractTensor, AbstractTensor]:
    """The ``k`` largest entries of the last dim, in decreasing order, and their i32 indices."""
    if x.rank < 1:
        raise ShapeError(f"expected an operand of rank >= 1, found {x}")
    if not 1 <= k <= x.shape[-1]:
        raise ShapeError(f"k must be in [1, {x.shape[-1]}] (the last dim of {x}), found {k}")
    shape = (*x.shape[:-1], k)
    return x.with_shape(shape), AbstractTensor(shape, DType.i32)


def _check_experts(experts: int, capacity: int) -> None:
    if experts < 1 or capacity < 1:
        raise ShapeError(f"experts and capacity must be >= 1, found {experts} and {capacity}")


def moe_route(
    choices: AbstractTensor, experts: int, capacity: int
) -> tuple[AbstractTensor, AbstractTensor]:
    """``choices [G, T, K]`` (each token's experts) -> ``slots [G, T, K]`` (each choice's
    ``expert * capacity + position``, -1 if dropped) and ``sources [G, E, C]`` (the
    choice ``t * K + j`` in each slot, -1 if empty), both i32."""
    _check_experts(experts, capacity)
    if choices.rank != 3 or not choices.dtype.is_int:
        raise ShapeError(f"expected integer choices [G, T, K], found {choices}")
    g = choices.shape[0]
    return choices.with_dtype(DType.i32), AbstractTensor((g, experts, capacity), DType.i32)


def _check_routing(slots: AbstractTensor, sources: AbstractTensor) -> None:
    if slots.rank != 3 or slots.dtype != DType.i32:
        raise ShapeError(f"expected i32 slots [G, T, K], found {slots}")
    if sources.rank != 3 or sources.dtype != DType.i32 or sources.shape[0] != slots.shape[0]:
        raise ShapeError(f"expected i32 sources [G, E, C] with the slots' G, found {sources} and {slots}")


def moe_dispatch(
    x: AbstractTensor, slots: AbstractTensor, sources: AbstractTensor
) -> AbstractTensor:
    """``x [G, T, H]`` (or one row per choice, ``[G, T, K, H]``) -> ``[G, E, C, H]``."""
    _check_routing(slots, sources)
    g, t, k = slots.shape
    if x.shape not in ((g, t, x.shape[-1]), (g, t, k, x.shape[-1])):
        raise ShapeError(
            f"expected tokens [{g}, {t}, H] or [{g}, {t}, {k}, H] like the slots {slots}, found {x}"
        )
    return x.with_shape((*sources.shape, x.shape[-1]))


def moe_combine(
    y: AbstractTensor, slots: AbstractTensor, sources: AbstractTensor
) -> AbstractTensor:
    """``y [G, E, C, H]`` (the experts' outputs) -> ``[G, T, K, H]``, one row per choice."""
    _check_routing(slots, sources)
    if y.rank != 4 or y.shape[:3] != sources.shape:
        raise ShapeError(f"expected expert outputs [G, E, C, H] like the sources {sources}, found {y}")
    return y.with_shape((*slots.shape, y.shape[-1]))


# --- collectives ---------------------------------------------------------------------------
# Before shard-partition (global view) a collective is a layout transition and its type
# is its operand's; in a partitioned function (local view) types are per rank and a
# gather or slice changes the local size by the rank group's size.


def _check_mesh_axes(axes: Sequence[str]) -> None:
    if not axes:
        raise ShapeError("expected at least one mesh axis, found none")
    if len(set(axes)) != len(axes):
        raise ShapeError(f"mesh axes must be distinct, found {list(axes)}")


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ShapeError(f"reduction kind must be one of {NAMES}, found {kind!r}")


def _resize(x: AbstractTensor, dim: int, group_size: int | None, grow: bool) -> AbstractTensor:
    """Global view (``group_size`` None): the type is unchanged. Local view (after
    shard-partition): ``dim`` grows or shrinks by the size of the rank group."""
    if group_size is None:
        return x
    size = x.shape[dim]
    if not grow and size % group_size:
        raise ShapeError(
            f"dim {dim} of {x} (size {size}) is not divisible by the group of {group_size} ranks"
        )
    new = size * group_size if grow else size // group_size
    return x.with_shape((*x.shape[:dim], new, *x.shape[dim + 1 :]))


def all_reduce(
    x: AbstractTensor, axes: Sequence[str], kind: str, group_size: int | None = None
) -> AbstractTensor:
    """Resolves a value partial over ``axes``."""
    _check_mesh_axes(axes)
    _check_kind(kind)
    return x


def all_gather(
    x: AbstractTensor, axes: Sequence[str], dim: int, group_size: int | None = None
) -> AbstractTensor:
    """Makes ``dim`` whole again (it was split over ``axes``)."""
    _check_mesh_axes(axes)
    _check_axes(x, [dim], "dim")
    return _resize(x, dim, group_size, grow=True)


def all_slice(
    x: AbstractTensor, axes: Sequence[str], dim: int, group_size: int | None = None
) -> AbstractTensor:
    """Splits ``dim`` over ``axes`` by a local slice (no communication)."""
    _check_mesh_axes(axes)
    _check_axes(x, [dim], "dim")
    return _resize(x, dim, group_size, grow=False)


def reduce_scatter(
    x: AbstractTensor, axes: Sequence[str], dim: int, kind: str, group_size: int | None = None
) -> AbstractTensor:
    """Resolves a value partial over ``axes`` into a split of ``dim`` over them."""
    _check_kind(kind)
    return all_slice(x, axes, dim, group_size)


def all_to_all(
    x: AbstractTensor,
    axes: Sequence[str],
    split_dim: int,
    concat_dim: int,
    group_size: int | None = None,
) -> AbstractTensor:
    """Moves the split over ``axes`` from ``concat_dim`` to ``split_dim``."""
    _check_mesh_axes(axes)
    _check_axes(x, [split_dim, concat_dim], "split_dim and concat_dim")
    if split_dim == concat_dim:
        raise ShapeError(f"expected split_dim and concat_dim to differ, found {split_dim} for both")
    return _resize(_resize(x, split_dim, group_size, grow=False), concat_dim, group_size, grow=True)


def broadcast(
    x: AbstractTensor, axes: Sequence[str], src: int, group_size: int | None = None
) -> AbstractTensor:
    """Every rank along ``axes`` takes the value of the rank at index ``src``."""
    _check_mesh_axes(axes)
    if src < 0:
        raise ShapeError(f"expected a non-negative source index, found {src}")
    return x


def iota(*start: AbstractTensor, dimension: int, shape: Sequence[int], dtype: DType) -> AbstractTensor:
    """Indices along ``dimension`` of an integer or float tensor of ``shape``, after an
    optional i32 scalar start."""
    if len(start) > 1 or any(s != AbstractTensor((), DType.i32) for s in start):
        found = ", ".join(str(s) for s in start)
        raise ShapeError(f"expected at most one start, an i32 scalar, found {found}")
    if not 0 <= dimension < len(shape):
        raise ShapeError(f"dimension {dimension} is out of range for shape {list(shape)}")
    if dtype == DType.i1:
        raise ShapeError("expected an integer or float result, found i1")
    return AbstractTensor(tuple(shape), dtype)


def axis_index(axes: Sequence[str], group_size: int | None = None) -> AbstractTensor:
    """This rank's linear position along mesh ``axes`` (major first): an i32 scalar."""
    _check_mesh_axes(axes)
    return AbstractTensor((), DType.i32)


def collective_permute(
    x: AbstractTensor,
    axes: Sequence[str],
    pairs: Sequence[Sequence[int]],
    group_size: int | None = None,
) -> AbstractTensor:
    """Each ``[source, target]`` pair (positions in a group over ``axes``) sends the
    source's value to the target; ranks that are no target receive zeros. No rank is a
    source twice or a target twice; with ``group_size`` known, positions are below it."""
    _check_mesh_axes(axes)
    sources: set[int] = set()
    targets: set[int] = set()
    for pair in pairs:
        if not isinstance(pair, Sequence) or len(pair) != 2:
            raise ShapeError(f"expected [source, target] pairs, found {pairs_text(pairs)}")
        source, target = pair
        for role, position in (("source", source), ("target", target)):
            if position < 0 or (group_size is not None and position >= group_size):
                bound = f" (the group over {list(axes)} has {group_size} ranks)" if group_size else ""
                raise ShapeError(
                    f"{role} position {position} of pair [{source}, {target}] is out of range{bound}"
                )
        if source in sources:
            raise ShapeError(f"rank position {source} is the source of more than one pair")
        if target in targets:
            raise ShapeError(f"rank position {target} is the target of more than one pair")
        sources.add(source)
        targets.add(target)
    return x


def pairs_text(pairs: Any) -> str:
    """Pairs as written in the IR (``[[0, 1], [1, 0]]``)."""
    if isinstance(pairs, Sequence):
        return "[" + ", ".join(pairs_text(p) for p in pairs) + "]"
    return str(pairs)
