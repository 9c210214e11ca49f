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
``repeat``,         ``expand_dims``, ``broadcast_to``, ``reshape`` (per-entry counts: a
``repeat_interleave`` ``take`` with constant indices)
``tile``            ``reshape``, ``broadcast_to``, ``reshape``
``cumsum``          ``matmul`` with a constant triangle of ones (``O(n²)`` on the axis)
``rope``            ``multiply`` of the positions by constant frequencies, ``cos``,
                    ``sin``, ``split``, ``multiply``, ``add``/``subtract``, ``concat``
==================  =====================================================================
"""

from __future__ import annotations

import builtins
import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import torch

from tessera.dtypes import DType
from tessera.errors import ArgumentError, ShapeError, TraceError
from tessera.frontend.tracer import Tensor, user_location
from tessera.op import einsum_equation as _einsum
from tessera.op.primitives import (
    Axis,
    Operand,
    _axes,
    _axis,
    _dtype_argument,
    _integer,
    _integers,
    _tensors,
    abs,
    add,
    astype,
    broadcast_to,
    concat,
    constant,
    cos,
    divide,
    equal,
    exp,
    fp8_matmuls,
    full,
    iota,
    less,
    log,
    matmul,
    max,
    mean,
    multiply,
    not_equal,
    reshape,
    sin,
    split,
    sqrt,
    stop_gradient,
    subtract,
    sum,
    swapaxes,
    take,
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
    classes = iota((int(num_classes),), 0, ids.dtype)
    return astype(equal(reshape(ids, (*ids.shape, 1)), classes), dtype)


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
    picks = equal(expand_dims(ids, ax + 1), iota(iota_shape, ax + 1, ids.dtype))  # [..., m, n, ...]
    try:
        chosen = where(picks, expand_dims(tensor, ax), 0)
    except ShapeError:
        raise ShapeError(
            f"take_along_axis: indices {ids.aval} do not broadcast with x {tensor.aval} "
            f"outside axis {ax}, at {user_location()}"
        ) from None
    return sum(chosen, axis=ax + 1, dtype=tensor.dtype)  # x's dtype, as in numpy


def _repeat_counts(repeats: Any, size: int, what: str) -> int | tuple[int, ...]:
    """``repeats`` as one int or one int per entry of an axis of ``size`` (a ShapeError
    naming the user's line when negative, traced or of the wrong length)."""
    if isinstance(repeats, Tensor):
        raise ShapeError(
            f"{what}: repeats must be Python or numpy integers (the result's shape depends "
            f"on them), found the traced {repeats.aval}, at {user_location()}"
        )
    if isinstance(repeats, torch.Tensor):
        repeats = repeats.tolist()
    if isinstance(repeats, np.ndarray) and repeats.ndim == 0:
        repeats = repeats.item()
    counts = _integers(repeats, f"{what}: repeats")
    if any(c < 0 for c in counts):
        raise ShapeError(f"{what}: repeats must be >= 0, found {repeats!r}, at {user_location()}")
    scalar = isinstance(repeats, (int, np.integer)) or len(counts) == 1
    if scalar:
        return counts[0]
    if len(counts) != size:
        raise ShapeError(
            f"{what}: expected one repeat count per entry of the axis ({size}), found "
            f"{len(counts)} in {repeats!r}, at {user_location()}"
        )
    return counts


def repeat(x: Operand, repeats: Any, axis: int | None = None) -> Tensor:
    """numpy / ``jnp.repeat`` (torch ``repeat_interleave``): each entry of ``x`` along
    ``axis`` repeated ``repeats`` times in place (``[a, b] -> [a, a, b, b]``).
    ``repeats`` is an int or one static int per entry of the axis; ``axis=None``
    repeats the flattened ``x``. One count: ``expand_dims``, ``broadcast_to``,
    ``reshape``; per-entry counts: a ``take`` with constant indices."""
    (tensor,) = _tensors(x)
    if axis is None:
        tensor, axis = reshape(tensor, (-1,)), 0
    ax = _axis(tensor, axis)
    size = tensor.shape[ax]
    counts = _repeat_counts(repeats, size, "repeat")
    if isinstance(counts, tuple):
        indices = np.repeat(np.arange(size, dtype=np.int64), counts)
        return take(tensor, constant(indices, DType.i64), axis=ax)
    if counts == 1:
        return tensor
    wide = list(tensor.shape)
    wide.insert(ax + 1, counts)
    spread = broadcast_to(expand_dims(tensor, ax + 1), wide)
    return reshape(spread, [*tensor.shape[:ax], size * counts, *tensor.shape[ax + 1 :]])


def repeat_interleave(input: Operand, repeats: Any, dim: int | None = None) -> Tensor:
    """torch ``repeat_interleave``: :func:`repeat` under torch's names (static
    ``repeats``: an int or one int per entry of ``dim``)."""
    return repeat(input, repeats, axis=dim)


def tile(x: Operand, reps: int | Sequence[int]) -> Tensor:
    """numpy / torch ``tile``: ``x`` repeated as a whole ``reps[d]`` times along each dim
    (``[a, b] -> [a, b, a, b]``). Shorter ``reps`` are padded with 1s on the left; a
    longer one gives ``x`` leading size-1 dims first. A ``reshape`` inserting a dim
    before each tiled one, ``broadcast_to`` and a ``reshape``."""
    (tensor,) = _tensors(x)
    counts = list(_integers(reps, "tile: reps"))
    if any(c < 0 for c in counts):
        raise ShapeError(f"tile: reps must be >= 0, found {reps!r}, at {user_location()}")
    ndim = builtins.max(len(counts), tensor.ndim)
    counts = [1] * (ndim - len(counts)) + counts
    shape = [1] * (ndim - tensor.ndim) + list(tensor.shape)
    if all(c == 1 for c in counts):
        return reshape(tensor, shape)
    narrow, wide = [], []
    for count, size in zip(counts, shape, strict=True):
        if count != 1:
            narrow.append(1)
            wide.append(count)
        narrow.append(size)
        wide.append(size)
    spread = broadcast_to(reshape(tensor, narrow), wide)
    return reshape(spread, [c * s for c, s in zip(counts, shape, strict=True)])


def cumsum(x: Operand, axis: int | None = None, dtype: Any = None) -> Tensor:
    """numpy ``cumsum`` (torch ``cumsum``): running sums along ``axis`` (the flattened
    ``x`` when None). Bools and integers narrower than 64 bits are summed in i64, as
    numpy and torch do; ``dtype`` sums (and returns) in that dtype instead.

    A matmul with a constant triangle of ones, ``[n, n]`` for an axis of size ``n``:
    ``O(n²)`` work per row (fine for moderate ``n``: sequence lengths of a few thousand),
    one batched matmul on tensor cores, sharded and differentiated as a matmul (its
    gradient is the reversed running sum)."""
    (tensor,) = _tensors(x)
    target = _dtype_argument(dtype) if dtype is not None else None
    if target == DType.i1:  # numpy: a running logical or
        return not_equal(cumsum(astype(tensor, DType.i1), axis), 0)
    if target is None:
        target = DType.i64 if tensor.dtype in (DType.i1, DType.i32) else tensor.dtype
    tensor = astype(tensor, target)
    if axis is None:
        tensor, axis = reshape(tensor, (-1,)), 0
    ax = _axis(tensor, axis)
    n = tensor.shape[ax]
    if n <= 1:
        return tensor
    upper = np.triu(np.ones((n, n), dtype=np.int64))  # upper[i, j] = i <= j
    with fp8_matmuls(False):  # exact sums, in an fp8 step too
        if ax == tensor.ndim - 1:
            return matmul(tensor, constant(upper, tensor.dtype))
        if ax == tensor.ndim - 2:
            return matmul(constant(upper.T, tensor.dtype), tensor)
        moved = swapaxes(tensor, ax, -1)
        return swapaxes(matmul(moved, constant(upper, tensor.dtype)), ax, -1)


# --- rotary position embeddings ----------------------------------------------------------------

_ROPE_TYPES = ("default", "linear", "llama3")
_LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


def _scaling_value(scaling: dict[str, Any], key: str, kind: str) -> float:
    if key not in scaling:
        raise ArgumentError(
            f"rope: scaling of rope_type {kind!r} needs {key!r} (Hugging Face's "
            f"rope_scaling), found the keys {sorted(scaling)}, at {user_location()}"
        )
    return float(scaling[key])


def rope_frequencies(
    head_dim: int, theta: float = 10000.0, scaling: dict[str, Any] | None = None
) -> np.ndarray:
    """The ``head_dim // 2`` inverse frequencies ``theta ** (-2j / head_dim)`` of rotary
    embeddings, in float64, rescaled as ``scaling`` (Hugging Face's ``rope_scaling``)
    says: ``None`` or ``{"rope_type": "default"}``; ``"linear"`` (all divided by
    ``factor``); ``"llama3"`` (Llama 3.1: transformers' ``_compute_llama3_parameters``:
    wavelengths above ``original_max_position_embeddings / low_freq_factor`` divided by
    ``factor``, below ``... / high_freq_factor`` kept, smoothly interpolated between)."""
    inv_freq = 1.0 / float(theta) ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    if scaling is None:
        return inv_freq
    if not isinstance(scaling, dict):
        raise ArgumentError(
            f"rope: scaling must be a dict like Hugging Face's rope_scaling or None, found "
            f"{scaling!r}, at {user_location()}"
        )
    kind = scaling.get("rope_type", scaling.get("type", "default"))  # "type": older configs
    if kind not in _ROPE_TYPES:
        raise ArgumentError(
            f"rope: unsupported rope_type {kind!r} in scaling; supported: "
            f"{', '.join(_ROPE_TYPES)}, at {user_location()}"
        )
    if kind == "default":
        return inv_freq
    if kind == "linear":
        return inv_freq / _scaling_value(scaling, "factor", kind)
    factor, low, high, context = (_scaling_value(scaling, key, kind) for key in _LLAMA3_KEYS)
    low_freq_wavelen, high_freq_wavelen = context / low, context / high
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (context / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
    return np.where(medium, smoothed, scaled)


def rope(
    x: Operand,
    positions: Any,
    theta: float = 10000.0,
    scaling: dict[str, Any] | None = None,
    interleaved: bool = False,
    *,
    seq_axis: int = -2,
) -> Tensor:
    """Rotary position embeddings (RoPE) of ``x``: each pair of features of the last
    dim (``head_dim``, even) rotated by ``position * f_j`` for the frequencies ``f_j``
    of :func:`rope_frequencies` (``theta``, ``scaling``: Hugging Face's
    ``rope_scaling``, e.g. Llama 3.1's ``{"rope_type": "llama3", "factor": 8.0,
    "low_freq_factor": 1.0, "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192}``).

    Layout: ``x`` is ``[..., seq, head_dim]`` with the sequence at ``seq_axis``: by
    default transformers' ``[batch, heads, seq, head_dim]``; ``seq_axis=-3`` for
    ``[batch, seq, heads, head_dim]``. ``positions`` (ints or floats: a traced tensor,
    a ``range``, a list, a numpy array) is ``[seq]``, or ``[batch, seq]`` with ``batch``
    ``x``'s dim 0.

    Pairs: the rotate-half convention by default (transformers / Llama / GPT-NeoX:
    feature ``j`` pairs with ``j + head_dim/2``); ``interleaved=True`` for GPT-J's and
    Meta's original Llama (features ``2j`` and ``2j+1``). As in transformers, the
    angles, cos and sin are computed in the program in f32 (f64 for an f64 ``x``; the
    frequencies are computed in float64 and rounded), then cast to ``x``'s dtype."""
    (tensor,) = _tensors(x)
    if not tensor.dtype.is_float or tensor.ndim < 2:
        raise ShapeError(
            f"rope: expected a floating tensor [..., seq, head_dim] (rank >= 2), found "
            f"{tensor.aval} at {user_location()}"
        )
    head_dim = tensor.shape[-1]
    if head_dim % 2:
        raise ShapeError(
            f"rope: head_dim (the last dim of x) must be even, found {head_dim} in "
            f"{tensor.aval} (features rotate in pairs), at {user_location()}"
        )
    (seq,) = _normalized([_integer(seq_axis, "rope: seq_axis")], tensor.ndim, "rope", tensor)
    if seq == tensor.ndim - 1:
        raise ShapeError(
            f"rope: seq_axis {seq_axis} is the head_dim axis of {tensor.aval}; the sequence "
            f"must be another dim, at {user_location()}"
        )
    compute = DType.f64 if tensor.dtype == DType.f64 else DType.f32
    if isinstance(positions, Tensor):
        where_from = positions.aval
        pos = astype(positions, compute)
    else:
        if isinstance(positions, torch.Tensor):
            values = positions.detach().cpu().numpy()
        else:
            values = np.asarray(list(positions) if isinstance(positions, range) else positions)
        if values.dtype.kind not in "iuf":
            raise ShapeError(
                f"rope: positions must be numbers, found {positions!r}, at {user_location()}"
            )
        where_from = f"positions of shape {list(values.shape)}"
        pos = constant(values, compute)
    length = tensor.shape[seq]
    batch_ok = pos.ndim == 2 and seq != 0 and pos.shape[0] in (1, tensor.shape[0])
    if pos.shape[-1:] != (length,) or not (pos.ndim == 1 or batch_ok):
        raise ShapeError(
            f"rope: expected positions [seq] or [batch, seq] with seq = {length} (dim "
            f"{seq} of x) and batch = {tensor.shape[0]}, found {where_from} for x "
            f"{tensor.aval}, at {user_location()}"
        )
    half = head_dim // 2
    frequencies = constant(rope_frequencies(head_dim, theta, scaling), compute)
    angles = multiply(expand_dims(pos, -1), frequencies)  # [(batch,) seq, half]
    table = [1] * tensor.ndim
    table[seq], table[-1] = length, half
    if pos.ndim == 2:
        table[0] = pos.shape[0]
    pairs = tensor  # rotate-half: feature j pairs with j + half
    if interleaved:  # [..., half, 2]: the pairs are (2j, 2j + 1)
        table.append(1)
        pairs = reshape(tensor, [*tensor.shape[:-1], half, 2])
    cos_, sin_ = (reshape(astype(f(angles), tensor.dtype), table) for f in (cos, sin))
    first, second = split(pairs, 2, axis=-1)
    rotated = concat(
        [subtract(first * cos_, second * sin_), add(second * cos_, first * sin_)], axis=-1
    )
    return reshape(rotated, tensor.shape) if interleaved else rotated


__all__ = [
    "arange",
    "cumsum",
    "einsum",
    "expand_dims",
    "logsumexp",
    "one_hot",
    "repeat",
    "repeat_interleave",
    "rope",
    "rope_frequencies",
    "squeeze",
    "stack",
    "std",
    "take_along_axis",
    "tile",
    "tril",
    "triu",
    "var",
]
