"""VJP rules of reductions, normalisations, layout ops, gathers and collectives.

Rules compute in the op's dtype. The graph dialect has no scatter or pad op, so the VJP
of a slice scatters the cotangent into zeros with concats of zero blocks (and, for
strides > 1, an interleave of the cotangent with zeros by concat and reshape), and the
VJP of a gather or of cross-entropy's label pick goes through a one-hot matrix built by
comparing the indices with an iota constant. Collectives and sharding constraints leave
the global value unchanged (before shard-partition), so their VJP is the identity.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import prod

import numpy as np
from xdsl.dialects.func import FuncOp
from xdsl.ir import SSAValue
from xdsl.rewriter import Rewriter

from tessera.autodiff.builder import GradBuilder, aval
from tessera.autodiff.rules import Cotangents, vjp
from tessera.errors import TesseraError
from tessera.ir import graph
from tessera.ir.dense import dense_from_numpy


def _shape(value: SSAValue) -> tuple[int, ...]:
    return aval(value).shape


def _float(value: SSAValue) -> bool:
    return aval(value).dtype.is_float


def _zeros(b: GradBuilder, like: SSAValue, shape: Sequence[int]) -> SSAValue:
    """Zeros of ``like``'s dtype and the given shape."""
    return b.broadcast_to(b.constant(0.0, like), tuple(shape))


def _keepdims(b: GradBuilder, ct: SSAValue, x: SSAValue, axes: Sequence[int]) -> SSAValue:
    """A reduction's cotangent reshaped to the keepdims shape (1 on the reduced axes)."""
    shape = tuple(1 if d in axes else s for d, s in enumerate(_shape(x)))
    return b.reshape(ct, shape)


def _iota(b: GradBuilder, like: SSAValue, n: int, shape: Sequence[int]) -> SSAValue:
    """``arange(n)`` reshaped to ``shape``, with ``like``'s (integer) dtype."""
    target = aval(like).with_shape(tuple(shape))
    attr = dense_from_numpy(np.arange(n).reshape(tuple(shape)), target.to_xdsl())
    op = graph.ConstantOp.create(result_types=[target.to_xdsl()], properties={"value": attr})
    Rewriter.insert_op(op, b.point)
    return op.results[0]


def _wrap_indices(b: GradBuilder, indices: SSAValue, size: int) -> SSAValue:
    """Negative indices mapped into ``[0, size)`` (as the reference's gather does)."""
    negative = b.op(graph.CompareOp, indices, b.constant(0.0, indices), predicate="lt")
    return b.op(graph.SelectOp, negative, b.add(indices, b.constant(size, indices)), indices)


# --- reductions ---------------------------------------------------------------------------


@vjp(graph.SumOp, graph.MeanOp)
def _sum_mean(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
    x, ct = op.operands[0], cts[0]
    if ct is None or not _float(x):
        return [None]
    axes = op.attrs()["axes"]
    grad = b.broadcast_to(_keepdims(b, ct, x, axes), _shape(x))
    if isinstance(op, graph.MeanOp) and axes:
        grad = b.div(grad, b.constant(prod(_shape(x)[a] for a in axes), grad))
    return [grad]


@vjp(graph.MaxOp, graph.MinOp)
def _max_min(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
    """The cotangent goes to the positions equal to the extremum, split evenly among
    ties (like the gradient of ``torch.amax``)."""
    x, ct = op.operands[0], cts[0]
    if ct is None or not _float(x):
        return [None]
    axes = op.attrs()["axes"]
    if not axes:
        return [ct]
    y = b.broadcast_to(_keepdims(b, op.results[0], x, axes), _shape(x))
    mask = b.op(graph.CastOp, b.op(graph.CompareOp, x, y, predicate="eq"), dtype=aval(x).dtype)
    count = b.sum(mask, axes, keepdims=True)
    share = b.div(_keepdims(b, ct, x, axes), count)
    return [b.mul(mask, b.broadcast_to(share, _shape(x)))]


# --- softmax and normalisations -------------------------------------------------------------


@vjp(graph.SoftmaxOp)
def _softmax(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
    """``y * (g - sum(g * y))`` along the axis."""
    ct, y = cts[0], op.results[0]
    if ct is None:
        return [None]
    axis = op.attrs()["axis"]
    dot = b.sum(b.mul(ct, y), [axis], keepdims=True)
    return [b.mul(y, b.sub(ct, dot))]


@vjp(graph.LogSoftmaxOp)
def _log_softmax(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
    """``g - exp(y) * sum(g)`` along the axis."""
    ct, y = cts[0], op.results[0]
    if ct is None:
        return [None]
    axis = op.attrs()["axis"]
    total = b.sum(ct, [axis], keepdims=True)
    return [b.sub(ct, b.mul(b.op(graph.ExpOp, y), total))]


def _mean_keep(b: GradBuilder, value: SSAValue, axes: Sequence[int]) -> SSAValue:
    return b.op(graph.MeanOp, value, axes=list(axes), keepdims=True)


@vjp(graph.LayerNormOp)
def _layer_norm(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
    """With ``r = rsqrt(var + eps)`` and ``y`` the result:
    ``r * (g - mean(g) - y * mean(g * y))`` over the axes."""
    x, y, ct = op.operands[0], op.results[0], cts[0]
    if ct is None:
        return [None]
    axes, eps = op.attrs()["axes"], op.attrs()["eps"]
    centered = b.sub(x, _mean_keep(b, x, axes))
    var = _mean_keep(b, b.mul(centered, centered), axes)
    r = b.op(graph.RsqrtOp, b.add(var, b.constant(eps, x)))
    inner = b.sub(b.sub(ct, _mean_keep(b, ct, axes)), b.mul(y, _mean_keep(b, b.mul(ct, y), axes)))
    return [b.mul(r, inner)]


@vjp(graph.RmsNormOp)
def _rms_norm(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
    """With ``r = rsqrt(mean(x^2) + eps)`` and ``y`` the result:
    ``r * (g - y * mean(g * y))`` over the axes."""
    x, y, ct = op.operands[0], op.results[0], cts[0]
    if ct is None:
        return [None]
    axes, eps = op.attrs()["axes"], op.attrs()["eps"]
    r = b.op(graph.RsqrtOp, b.add(_mean_keep(b, b.mul(x, x), axes), b.constant(eps, x)))
    return [b.mul(r, b.sub(ct, b.mul(y, _mean_keep(b, b.mul(ct, y), axes))))]


@vjp(graph.CrossEntropyOp)
def _cross_entropy(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
    """``(softmax(logits) - one_hot(labels)) * g``; the labels get no gradient."""
    logits, labels, ct = op.operands[0], op.operands[1], cts[0]
    if ct is None:
        return [None, None]
    shape = _shape(logits)
    classes = shape[-1]
    reduction = op.attrs()["reduction"]
    probs = b.op(graph.SoftmaxOp, logits, axis=len(shape) - 1)
    iota = _iota(b, labels, classes, (1,) * (len(shape) - 1) + (classes,))
    picked = b.reshape(labels, (*shape[:-1], 1))
    one_hot = b.op(
        graph.CastOp,
        b.op(graph.CompareOp, picked, iota, predicate="eq"),
        dtype=aval(logits).dtype,
    )
    if reduction == "none":
        scale = b.reshape(ct, (*shape[:-1], 1))
    elif reduction == "mean":
        scale = b.div(ct, b.constant(max(prod(shape[:-1]), 1), ct))
    else:
        scale = ct
    return [b.mul(b.sub(probs, one_hot), scale), None]


# --- layout -----------------------------------------------------------------------------------


@vjp(graph.ReshapeOp)
def _reshape(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
    x, ct = op.operands[0], cts[0]
    if ct is None or not _float(x):
        return [None]
    return [b.reshape(ct, _shape(x))]


@vjp(graph.BroadcastToOp)
def _broadcast_to(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
    x, ct = op.operands[0], cts[0]
    if ct is None or not _float(x):
        return [None]
    return [b.unbroadcast(ct, _shape(x))]


@vjp(graph.TransposeOp)
def _transpose(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
    x, ct = op.operands[0], cts[0]
    if ct is None or not _float(x):
        return [None]
    perm = op.attrs()["perm"]
    inverse = [perm.index(d) for d in range(len(perm))]
    if inverse == list(range(len(perm))):
        return [ct]
    return [b.op(graph.TransposeOp, ct, perm=inverse)]


def _with_dim(shape: Sequence[int], dim: int, size: int) -> tuple[int, ...]:
    return (*shape[:dim], size, *shape[dim + 1 :])


def _concat(b: GradBuilder, pieces: Sequence[SSAValue], axis: int) -> SSAValue:
    """Concat that skips empty pieces (and the op itself for a single piece)."""
    kept = [p for p in pieces if _shape(p)[axis] > 0] or [pieces[0]]
    if len(kept) == 1:
        return kept[0]
    return b.op(graph.ConcatOp, *kept, axis=axis)


def _scatter_dim(
    b: GradBuilder, ct: SSAValue, dim: int, size: int, start: int, limit: int, stride: int
) -> SSAValue:
    """The VJP of ``x[start:limit:stride]`` along one dimension of size ``size``: ``ct``
    placed at positions ``start, start + stride, ...`` of zeros."""
    shape = _shape(ct)
    count = shape[dim]
    if count == 0:
        return _zeros(b, ct, _with_dim(shape, dim, size))
    if stride > 1:  # interleave: [.., count, 1, ..] ++ zeros [.., count, stride - 1, ..]
        split = (*shape[:dim], count, 1, *shape[dim + 1 :])
        gaps = _zeros(b, ct, _with_dim(split, dim + 1, stride - 1))
        woven = b.op(graph.ConcatOp, b.reshape(ct, split), gaps, axis=dim + 1)
        woven = b.reshape(woven, _with_dim(shape, dim, count * stride))
        span = (count - 1) * stride + 1  # up to and including the last picked position
        if span < count * stride:
            full = _shape(woven)
            woven = b.op(
                graph.SliceOp,
                woven,
                starts=[0] * len(full),
                limits=list(_with_dim(full, dim, span)),
                strides=[1] * len(full),
            )
        ct, count = woven, span
    before = _zeros(b, ct, _with_dim(shape, dim, start))
    after = _zeros(b, ct, _with_dim(shape, dim, size - start - count))
    return _concat(b, [before, ct, after], dim)


@vjp(graph.SliceOp)
def _slice(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
    x, ct = op.operands[0], cts[0]
    if ct is None or not _float(x):
        return [None]
    a = op.attrs()
    grad = ct
    for dim, (size, start, limit, stride) in enumerate(
        zip(_shape(x), a["starts"], a["limits"], a["strides"], strict=True)
    ):
        if (start, limit, stride) == (0, size, 1):
            continue
        grad = _scatter_dim(b, grad, dim, size, start, limit, stride)
    return [grad]


@vjp(graph.ConcatOp)
def _concat_vjp(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
    ct = cts[0]
    inputs = list(op.operands)
    if ct is None or not _float(inputs[0]):
        return [None] * len(inputs)
    axis = op.attrs()["axis"]
    if len(inputs) == 1:
        return [ct]
    sizes = [_shape(x)[axis] for x in inputs]
    return list(b.ops(graph.SplitOp, ct, axis=axis, sizes=sizes))


@vjp(graph.SplitOp)
def _split(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
    x = op.operands[0]
    if all(ct is None for ct in cts) or not _float(x):
        return [None]
    axis = op.attrs()["axis"]
    pieces = [
        ct if ct is not None else _zeros(b, x, _shape(r))
        for ct, r in zip(cts, op.results, strict=True)
    ]
    return [_concat(b, pieces, axis)]


@vjp(graph.GatherOp)
def _gather(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
    """Scatter-add of the cotangent into the gathered rows, as a matmul with a one-hot
    matrix: ``grad[a, n, c] = sum_k (indices[k] == n) * ct[a, k, c]``."""
    x, indices, ct = op.operands[0], op.operands[1], cts[0]
    if ct is None or not _float(x):
        return [None, None]
    axis = op.attrs()["axis"]
    shape = _shape(x)
    size = shape[axis]
    before, after = prod(shape[:axis]), prod(shape[axis + 1 :])
    count = prod(_shape(indices))
    if count == 0:
        return [_zeros(b, x, shape), None]
    flat = b.reshape(_wrap_indices(b, indices, size), (1, count))
    one_hot_t = b.op(  # [size, count]: row n marks the picks of index n
        graph.CastOp,
        b.op(graph.CompareOp, _iota(b, indices, size, (size, 1)), flat, predicate="eq"),
        dtype=aval(x).dtype,
    )
    rows = b.reshape(ct, (before, count, after))
    return [b.reshape(b.op(graph.MatmulOp, one_hot_t, rows), shape), None]


# --- collectives and sharding constraints -------------------------------------------------


@vjp(*graph.COLLECTIVE_OPS, graph.ShardOp)
def _layout_transition(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
    """In the global view a collective or a sharding constraint leaves the value as is,
    so the cotangent passes through unchanged (the sharding passes add the collectives
    the backward program needs when it is partitioned)."""
    function = op.parent_op()
    while function is not None and not isinstance(function, FuncOp):
        function = function.parent_op()
    if function is not None and graph.PARTITIONED in function.attributes:
        raise TesseraError(
            f"{op.name} in a partitioned (per-rank) function is not differentiable; "
            "differentiate the program before shard-partition"
        )
    ct = cts[0]
    if ct is None or not _float(op.operands[0]):
        return [None]
    return [ct]
