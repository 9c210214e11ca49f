"""Array functions built from Tessera's primitive ops at trace time.

Like the numpy functions JAX implements over ``lax`` primitives, each function here binds
only existing graph ops (matmul, sum, max, compare, select, reshape, transpose, concat,
constants...), so it gets shape checking, sharding propagation, gradients, reference
semantics and Triton kernels from its constituents. They are re-exported by
(import them from there: ``from tessera import op; op.einsum(...)``).

==================  =====================================================================
``einsum``          diagonal masks, sums, transposes, reshapes, batched ``matmul`` (or a
                    broadcast ``multiply`` when nothing is contracted), pairwise left to
                    right
``arange``          a constant
``tril``/``triu``   ``where`` with a constant mask on the last two dims
``logsumexp``       ``max``, ``subtract``, ``exp``, ``sum``, ``log``, ``add``
``one_hot``         ``equal`` of the indices with an iota constant, ``astype``
``var``/``std``     ``mean``, ``subtract``, ``multiply``, ``sum``, ``divide`` (``sqrt``)
``stack``           ``reshape`` (new axis) and ``concat``
``squeeze``,        ``reshape``
``expand_dims``
``take_along_axis`` ``equal`` with an iota, ``where`` and ``sum`` (a one-hot pick)
==================  =====================================================================
"""

from __future__ import annotations

import builtins
import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from tessera.dtypes import DType
from tessera.errors import ShapeError, TraceError
from tessera.frontend.tracer import Tensor, user_location
from tessera.op import einsum_equation as _einsum
from tessera.op.primitives import (
    Axis,
    Operand,
    _axes,
    _axis,
    _dtype_argument,
    _tensors,
    abs,
    add,
    astype,
    concat,
    constant,
    divide,
    equal,
    exp,
    full,
    less,
    log,
    matmul,
    max,
    mean,
    multiply,
    reshape,
    sqrt,
    stop_gradient,
    subtract,
    sum,
    transpose,
    where,
)

# --- helpers ---------------------------------------------------------------------------------


def _normalized(axes: Sequence[int], ndim: int, what: str, x: Tensor | None = None) -> list[int]:
    """Axes in ``range(ndim)``; a ShapeError naming the user's line if out of range."""
    result = []
    for axis in axes:
        if not -ndim <= int(axis) < ndim:
            of = f" of {x.aval}" if x is not None else ""
            raise ShapeError(
                f"{what}: axis {axis} is out of range for {ndim} dims{of}, at {user_location()}"
            )
        result.append(int(axis) % ndim)
    return result


# --- einsum ----------------------------------------------------------------------------------


class _Operand:
    """A tensor whose dims carry einsum labels."""

    def __init__(self, tensor: Tensor, labels: Sequence[_einsum.Label]):
        self.tensor, self.labels = tensor, tuple(labels)

    def sum_out(self, drop: set[_einsum.Label]) -> _Operand:
        axes = [d for d, label in enumerate(self.labels) if label in drop]
        if not axes:
            return self
        kept = [label for label in self.labels if label not in drop]
        return _Operand(sum(self.tensor, axis=axes, dtype=self.tensor.dtype), kept)

    def permuted(self, order: Sequence[_einsum.Label]) -> Tensor:
        return transpose(self.tensor, [self.labels.index(label) for label in order])


def _diagonal(operand: _Operand) -> _Operand:
    """Repeated labels within one operand (``ii->i``, a trace): masks off the
    off-diagonal entries with an identity constant and sums the repeat away."""
    labels = list(operand.labels)
    tensor = operand.tensor
    for label in dict.fromkeys(labels):
        while labels.count(label) > 1:
            first = labels.index(label)
            second = labels.index(label, first + 1)
            size = tensor.shape[first]
            shape = [1] * tensor.ndim
            shape[first] = shape[second] = size
            eye = constant(np.eye(size, dtype=bool).reshape(shape))
            tensor = sum(where(eye, tensor, 0), axis=second, dtype=tensor.dtype)
            del labels[second]
    return _Operand(tensor, labels)


def _contract(
    a: _Operand, b: _Operand, keep: set[_einsum.Label], rank: dict[_einsum.Label, int]
) -> _Operand:
    """``a`` and ``b`` contracted over their shared labels not in ``keep``: one batched
    matmul (or a broadcast multiply when no label is contracted)."""
    a = a.sum_out({label for label in a.labels if label not in b.labels and label not in keep})
    b = b.sum_out({label for label in b.labels if label not in a.labels and label not in keep})

    def order(labels: Iterable[_einsum.Label]) -> list[_einsum.Label]:  # as in the output
        return sorted(labels, key=lambda label: rank[label])

    batch = order(label for label in a.labels if label in b.labels and label in keep)
    contracted = [label for label in a.labels if label in b.labels and label not in keep]
    a_only = order(label for label in a.labels if label not in b.labels)
    b_only = order(label for label in b.labels if label not in a.labels)
    sizes = {
        label: size
        for operand in (a, b)
        for label, size in zip(operand.labels, operand.tensor.shape, strict=True)
    }

    def dims(labels: Sequence[_einsum.Label]) -> list[int]:
        return [sizes[label] for label in labels]

    if not contracted:  # an outer or elementwise product: broadcast multiply
        lhs = reshape(a.permuted(batch + a_only), dims(batch + a_only) + [1] * len(b_only))
        rhs = reshape(b.permuted(batch + b_only), dims(batch) + [1] * len(a_only) + dims(b_only))
        return _Operand(multiply(lhs, rhs), batch + a_only + b_only)
    m, k, n = (math.prod(dims(labels)) for labels in (a_only, contracted, b_only))
    lhs = reshape(a.permuted(batch + a_only + contracted), [*dims(batch), m, k])
    rhs = reshape(b.permuted(batch + contracted + b_only), [*dims(batch), k, n])
    product = reshape(matmul(lhs, rhs), dims(batch + a_only + b_only))
    return _Operand(product, batch + a_only + b_only)


def einsum(subscripts: str, *operands: Operand) -> Tensor:
    """numpy ``einsum``: ``einsum("bij,bjk->bik", a, b)`` is a batched matmul.

    The equation names each operand's dims with letters; indices shared by operands and
    absent from the output are summed (contracted), indices in one operand only and not
    in the output are summed over, a repeated index within one operand takes the
    diagonal (``"ii->i"``, ``"ii"`` the trace). ``...`` stands for broadcast batch dims
    (aligned right). Without ``->`` the output is the ``...`` dims then the indices that
    appear once, in alphabetical order (numpy's rule). Sizes of one index must agree
    (size-1 broadcasting applies to ``...`` dims only).

    Lowers to transposes, reshapes, sums and batched matmuls (a broadcast multiply when
    nothing is contracted), contracting the operands pairwise from left to right. A bad
    equation raises a TraceError (syntax, output indices) or a ShapeError (operand count,
    ranks, sizes) whose message shows the equation with a caret under the culprit.
    """
    try:
        parsed = _einsum.parse(subscripts)
        tensors = _tensors(*operands) if operands else []
        resolved = _einsum.resolve(parsed, [t.shape for t in tensors])
    except (ShapeError, TraceError) as error:
        raise type(error)(f"{error}\n  at {user_location()}") from None
    output = resolved.output
    rank = {label: position for position, label in enumerate(output)}
    for labels in resolved.inputs:  # labels not in the output: after it, by first use
        for label in labels:
            rank.setdefault(label, len(rank))
    pending: list[_Operand] = []
    for tensor, labels in zip(tensors, resolved.inputs, strict=True):
        # an ellipsis dim of size 1 broadcasts: dropping it is the same as broadcasting
        drop = [
            d
            for d, label in enumerate(labels)
            if isinstance(label, tuple) and tensor.shape[d] == 1 and resolved.sizes[label] != 1
        ]
        if drop:
            tensor = reshape(tensor, [s for d, s in enumerate(tensor.shape) if d not in drop])
            labels = tuple(label for d, label in enumerate(labels) if d not in drop)
        pending.append(_diagonal(_Operand(tensor, labels)))
    result = pending[0]
    for index in range(1, len(pending)):
        keep = set(output).union(*(p.labels for p in pending[index + 1 :]))
        result = _contract(result, pending[index], keep, rank)
    result = result.sum_out({label for label in result.labels if label not in output})
    return result.permuted(output)


# --- constants and masks ----------------------------------------------------------------------


def arange(
    start: int | float, stop: int | float | None = None, step: int | float = 1, dtype: Any = None
) -> Tensor:
    """numpy ``arange``: ``[start, stop)`` in steps of ``step`` (``arange(n)`` is
    ``0..n-1``), a constant. Without ``dtype``: i64 when every argument is an int,
    else f32."""
    if stop is None:
        start, stop = 0, start
    if step == 0:
        raise ShapeError(f"arange: step must not be zero, at {user_location()}")
    integral = all(
        isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in (start, stop, step)
    )
    target = _dtype_argument(dtype) if dtype is not None else (DType.i64 if integral else DType.f32)
    values = np.arange(start, stop, step, dtype=np.int64 if integral else np.float64)
    return constant(values, target)


def _triangle(x: Operand, k: int, lower: bool, name: str) -> Tensor:
    (tensor,) = _tensors(x)
    if tensor.ndim < 2:
        raise ShapeError(
            f"{name}: expected a tensor of rank >= 2 (it masks the last two dims), found "
            f"{tensor.aval} at {user_location()}"
        )
    rows, cols = tensor.shape[-2:]
    ones = np.ones((rows, cols), dtype=bool)
    mask = np.tril(ones, int(k)) if lower else np.triu(ones, int(k))
    return where(constant(mask), tensor, 0)


def tril(x: Operand, k: int = 0) -> Tensor:
    """numpy ``tril``: ``x`` with the entries above the ``k``-th diagonal of the last two
    dims zeroed (``k > 0`` keeps diagonals above the main one)."""
    return _triangle(x, k, True, "tril")


def triu(x: Operand, k: int = 0) -> Tensor:
    """numpy ``triu``: ``x`` with the entries below the ``k``-th diagonal of the last two
    dims zeroed."""
    return _triangle(x, k, False, "triu")


def one_hot(indices: Operand, num_classes: int, dtype: Any = "f32") -> Tensor:
    """``result[..., c] = (indices[...] == c)`` for ``c`` in ``range(num_classes)``, in
    ``dtype`` (jax.nn.one_hot; indices outside ``[0, num_classes)`` give zero rows)."""
    (ids,) = _tensors(indices)
    if not ids.dtype.is_int:
        raise ShapeError(
            f"one_hot: expected integer indices, found {ids.aval} at {user_location()}"
        )
    if (
        isinstance(num_classes, bool)
        or not isinstance(num_classes, (int, np.integer))
        or num_classes < 1
    ):
        raise ShapeError(
            f"one_hot: num_classes must be a positive int, found {num_classes!r} at {user_location()}"
        )
    iota = constant(np.arange(int(num_classes)), ids.dtype)
    return astype(equal(reshape(ids, (*ids.shape, 1)), iota), dtype)


# --- reductions ---------------------------------------------------------------------------------


def logsumexp(x: Operand, axis: Axis = None, keepdims: bool = False) -> Tensor:
    """``log(sum(exp(x), axis))``, computed stably as ``m + log(sum(exp(x - m)))`` with
    ``m`` the maximum over ``axis`` (scipy / torch ``logsumexp``; all ``-inf`` gives
    ``-inf``, an ``inf`` gives ``inf``). Its gradient is ``softmax(x)`` over ``axis``."""
    (tensor,) = _tensors(x)
    if not tensor.dtype.is_float:
        tensor = astype(tensor, DType.f32)
    axes = _axes(tensor, axis)
    if any(tensor.shape[d] == 0 for d in axes):  # the log of an empty sum, as in torch
        kept = [1 if d in axes else s for d, s in enumerate(tensor.shape)]
        return full(kept if keepdims else _reduced_shape(tensor, axes), -math.inf, tensor.dtype)
    peak = max(tensor, axis=axes, keepdims=True)
    # an infinite max shifts by 0; the shift cancels in the value, so no gradient flows
    # through it (as in JAX): none of a max's tie-splitting, nor its all-reduces when the
    # axis is split over a mesh
    shift = stop_gradient(where(less(abs(peak), math.inf), peak, 0))
    total = log(sum(exp(subtract(tensor, shift)), axis=axes, keepdims=True))
    result = add(total, shift)
    return result if keepdims else reshape(result, _reduced_shape(tensor, axes))


def _reduced_shape(x: Tensor, axes: Sequence[int]) -> list[int]:
    return [s for d, s in enumerate(x.shape) if d not in axes]


def var(x: Operand, axis: Axis = None, ddof: int = 0, keepdims: bool = False) -> Tensor:
    """numpy ``var``: ``sum((x - mean(x))**2) / (n - ddof)`` over ``axis`` (``ddof=1`` for
    the unbiased estimate; ``n - ddof <= 0`` gives inf or nan, as in numpy)."""
    (tensor,) = _tensors(x)
    if not tensor.dtype.is_float:
        tensor = astype(tensor, DType.f32)
    axes = _axes(tensor, axis)
    centered = subtract(tensor, mean(tensor, axis=axes, keepdims=True))
    count = math.prod(tensor.shape[d] for d in axes)
    squares = sum(multiply(centered, centered), axis=axes, keepdims=keepdims)
    return divide(squares, float(builtins.max(count - ddof, 0)))


def std(x: Operand, axis: Axis = None, ddof: int = 0, keepdims: bool = False) -> Tensor:
    """numpy ``std``: ``sqrt(var(x, axis, ddof, keepdims))``."""
    return sqrt(var(x, axis=axis, ddof=ddof, keepdims=keepdims))


# --- layout ----------------------------------------------------------------------------------------


def expand_dims(x: Operand, axis: int | Sequence[int]) -> Tensor:
    """numpy ``expand_dims``: size-1 dims inserted at ``axis`` (an int or a tuple; axes
    index the result, negative ones count from its end)."""
    (tensor,) = _tensors(x)
    axes = [axis] if isinstance(axis, (int, np.integer)) else list(axis)
    ndim = tensor.ndim + len(axes)
    positions = _normalized(axes, ndim, "expand_dims", tensor)
    if len(set(positions)) != len(positions):
        raise ShapeError(
            f"expand_dims: repeated axis in {tuple(axes)} for {tensor.aval}, at {user_location()}"
        )
    dims = iter(tensor.shape)
    return reshape(tensor, [1 if d in positions else next(dims) for d in range(ndim)])


def squeeze(x: Operand, axis: int | Sequence[int] | None = None) -> Tensor:
    """numpy ``squeeze``: removes size-1 dims (all of them, or those at ``axis``; a
    ShapeError if a named axis has another size)."""
    (tensor,) = _tensors(x)
    if axis is None:
        axes = [d for d, s in enumerate(tensor.shape) if s == 1]
    else:
        named = [axis] if isinstance(axis, (int, np.integer)) else list(axis)
        axes = _normalized(named, tensor.ndim, "squeeze", tensor)
        for d in axes:
            if tensor.shape[d] != 1:
                raise ShapeError(
                    f"squeeze: cannot remove axis {d} of {tensor.aval}: its size is "
                    f"{tensor.shape[d]}, not 1, at {user_location()}"
                )
    return reshape(tensor, [s for d, s in enumerate(tensor.shape) if d not in axes])


def stack(xs: Sequence[Operand], axis: int = 0) -> Tensor:
    """numpy ``stack``: tensors of one shape joined along a new ``axis``."""
    if isinstance(xs, Tensor) or not len(xs):
        raise ShapeError(
            f"stack: expected a non-empty sequence of tensors, found {xs!r} at {user_location()}"
        )
    tensors = _tensors(*xs)
    shapes = {t.shape for t in tensors}
    if len(shapes) > 1:
        found = ", ".join(str(t.aval) for t in tensors)
        raise ShapeError(
            f"stack: expected tensors of one shape, found {found} at {user_location()}"
        )
    (position,) = _normalized([axis], tensors[0].ndim + 1, "stack", tensors[0])
    return concat([expand_dims(t, position) for t in tensors], axis=position)


def take_along_axis(x: Operand, indices: Operand, axis: int | None) -> Tensor:
    """numpy ``take_along_axis``: ``result[..., j, ...] = x[..., indices[..., j, ...], ...]``
    along ``axis`` (``x`` and ``indices`` of one rank, other dims broadcast; ``axis=None``
    takes from the flattened ``x`` with 1-d ``indices``). Negative indices count from
    the end; indices out of range give 0 (they are not checked).

    A one-hot pick: ``sum(where(indices[..., j, 1, ...] == iota[n], x[..., 1, n, ...], 0))``
    over ``n``: ``O(size(result) * x.shape[axis])`` work (``size(x)`` when picking one
    entry per row, as a loss does), elementwise and shardable on every other dim, with
    a gradient of the same cost.
    """
    (tensor,) = _tensors(x)
    ids = indices if isinstance(indices, Tensor) else constant(indices)
    if not ids.dtype.is_int:
        raise ShapeError(
            f"take_along_axis: expected integer indices, found {ids.aval} at {user_location()}"
        )
    if axis is None:
        if ids.ndim != 1:
            raise ShapeError(
                f"take_along_axis: with axis=None the indices must be 1-d, found {ids.aval} "
                f"at {user_location()}"
            )
        tensor, axis = reshape(tensor, (-1,)), 0
    if ids.ndim != tensor.ndim:
        raise ShapeError(
            f"take_along_axis: expected indices of the rank of x ({tensor.ndim}), found "
            f"{ids.aval} for x {tensor.aval} at {user_location()}"
        )
    ax = _axis(tensor, axis)
    size = tensor.shape[ax]
    ids = where(less(ids, 0), add(ids, size), ids)
    iota_shape = [1] * (tensor.ndim + 1)
    iota_shape[ax + 1] = size
    iota = constant(np.arange(size).reshape(iota_shape), ids.dtype)
    picks = equal(expand_dims(ids, ax + 1), iota)  # [..., m, n, ...]
    try:
        chosen = where(picks, expand_dims(tensor, ax), 0)
    except ShapeError:
        raise ShapeError(
            f"take_along_axis: indices {ids.aval} do not broadcast with x {tensor.aval} "
            f"outside axis {ax}, at {user_location()}"
        ) from None
    return sum(chosen, axis=ax + 1, dtype=tensor.dtype)  # x's dtype, as in numpy


__all__ = [
    "arange",
    "einsum",
    "expand_dims",
    "logsumexp",
    "one_hot",
    "squeeze",
    "stack",
    "std",
    "take_along_axis",
    "tril",
    "triu",
    "var",
]
