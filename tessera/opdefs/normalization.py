"""Row-wise ops: ``softmax``, ``log_softmax``, ``layer_norm``, ``rms_norm``, ``cross_entropy``.

Each reduces over an axis (or axes) internally: splitting it over a mesh needs per-row
statistics (a ``STATISTIC`` factor), and the row kernel (``codegen.kernels``) computes it
with a whole row in one block. Low-precision (f16/bf16) references compute in f32, then
round, as torch's CPU kernels do; so does an op over a split axis (its statistics and
their all-reduces in f32). Rules compute in the op's dtype; cross-entropy's label
pick goes through a one-hot matrix built by comparing the labels with an iota constant.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from math import prod
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from xdsl.dialects.builtin import i32
from xdsl.ir import SSAValue

from tessera.dtypes import DType
from tessera.errors import ExecutionError
from tessera.ir import graph
from tessera.ir.abstract import AbstractTensor, aval
from tessera.ir.grad_builder import GradBuilder
from tessera.ir.sharding import MeshLike, Sharding
from tessera.ir.sharding_rules import (
    FactorKind,
    Rule,
    RuleBuilder,
    ShardingRule,
    statistic_along_axes,
    statistic_along_axis,
)
from tessera.opdefs.registry import (
    NOT_LINEAR,
    Cotangents,
    Fusion,
    Partition,
    Reference,
    RowReduction,
    VjpRule,
    bound,
    register,
)

if TYPE_CHECKING:
    from tessera.ir.tile_builder import TileBuilder
    from tessera.opdefs.registry import TileEvaluator


Row = Callable[..., SSAValue]  # RowReduction.fn: (ev, op, x, mask, width) -> value


def _in_f32(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """Applies ``fn`` in f32 for f16/bf16 inputs and rounds back."""
    if x.dtype in (torch.float16, torch.bfloat16):
        return fn(x.float()).to(x.dtype)
    return fn(x)


def _f32(fn: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
    """``fn`` applied in f32 for f16/bf16 inputs (see :func:`_in_f32`)."""
    return lambda x: _in_f32(fn, x)


def _shifted_sum(
    b: TileBuilder, x: SSAValue, mask: SSAValue | None
) -> tuple[SSAValue, SSAValue, SSAValue]:
    """A row's max, ``x - max`` and ``sum(exp(x - max))`` (the stable softmax parts)."""
    top = b.reduce(b.masked(x, mask, "max"), "max", 1)
    shifted = b.sub(x, top)
    total = b.reduce(b.masked(b.exp(shifted), mask, "sum"), "sum", 1)
    return top, shifted, total


def _register_row(
    op_type: type[graph.GraphOp], *, sharding: Rule, vjp: VjpRule, reference: Reference, row: Row
) -> None:
    """Registers a row-wise op whose result keeps its operand's shape (not linear in it);
    over a split axis it is computed from all-reduced statistics (:func:`_split_rows`)."""
    register(
        op_type,
        sharding=sharding,
        partial=NOT_LINEAR,
        vjp=vjp,
        reference=reference,
        tile=RowReduction(row),
        fusion=Fusion.NORMALIZATION,
        partition=Partition(_split_rows),
    )


# --- over a split axis: local statistics and their all-reduce (shard-partition) ----------------


def _row_axes(op: graph.GraphOp) -> tuple[int, ...]:
    attrs = op.attrs()
    return tuple(attrs["axes"]) if "axes" in attrs else (attrs["axis"],)


def _statistic(
    b: GradBuilder,
    kind: type[graph.ReductionOp],
    value: SSAValue,
    axes: Sequence[int],
    mesh_axes: Sequence[str],
) -> SSAValue:
    """``kind`` (max, sum, mean) of ``value`` over ``axes`` (kept as size 1) on this rank,
    all-reduced by its kind over the ``mesh_axes`` that split them."""
    local = b.op(kind, value, axes=list(axes), keepdims=True)
    return b.op(graph.AllReduceOp, local, axes=tuple(mesh_axes), kind=kind.KIND)


def _split_rows(
    b: GradBuilder, op: graph.GraphOp, layouts: Sequence[Sharding], mesh: MeshLike
) -> SSAValue | None:
    """softmax, log_softmax, layer_norm, rms_norm over split axes:

    - softmax: ``m = all_reduce_max(max(x))``, ``s = all_reduce_sum(sum(exp(x - m)))``,
      ``exp(x - m) / s`` (log_softmax: ``x - m - log(s)``);
    - layer_norm: ``mean = all_reduce_mean(mean(x))``, ``var = all_reduce_mean(mean(d*d))``
      with ``d = x - mean``, then ``d * rsqrt(var + eps)``;
    - rms_norm: ``x * rsqrt(all_reduce_mean(mean(x*x)) + eps)``.
    """
    axes = _row_axes(op)
    mesh_axes = tuple(a for d in axes for a in layouts[0].dims[d])
    x = op.operands[0]
    if not mesh_axes or not aval(x).size:  # nothing split, or no statistics to take
        return None
    dtype = aval(x).dtype
    if dtype in (DType.f16, DType.bf16):  # in f32, rounded once, as the reference computes
        result = _split_rows_of(b, op, b.op(graph.CastOp, x, dtype=DType.f32), axes, mesh_axes)
        return b.op(graph.CastOp, result, dtype=dtype)
    return _split_rows_of(b, op, x, axes, mesh_axes)


def _split_rows_of(
    b: GradBuilder, op: graph.GraphOp, x: SSAValue, axes: Sequence[int], mesh_axes: Sequence[str]
) -> SSAValue:
    """:func:`_split_rows` of ``x`` (the operand, or its f32 cast)."""

    def stat(kind: type[graph.ReductionOp], value: SSAValue) -> SSAValue:
        return _statistic(b, kind, value, axes, mesh_axes)

    if isinstance(op, (graph.SoftmaxOp, graph.LogSoftmaxOp)):
        shifted = b.sub(x, stat(graph.MaxOp, x))
        exps = b.op(graph.ExpOp, shifted)
        total = stat(graph.SumOp, exps)
        if isinstance(op, graph.SoftmaxOp):
            return b.div(exps, total)
        return b.sub(shifted, b.op(graph.LogOp, total))
    eps = b.constant(op.attrs()["eps"], x)
    if isinstance(op, graph.LayerNormOp):
        centered = b.sub(x, stat(graph.MeanOp, x))
        variance = stat(graph.MeanOp, b.mul(centered, centered))
        return b.mul(centered, b.op(graph.RsqrtOp, b.add(variance, eps)))
    square_mean = stat(graph.MeanOp, b.mul(x, x))
    return b.mul(x, b.op(graph.RsqrtOp, b.add(square_mean, eps)))


# --- softmax and log_softmax ------------------------------------------------------------------


def _softmax_vjp(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
    """``y * (g - sum(g * y))`` along the axis."""
    ct, y = cts[0], op.results[0]
    if ct is None:
        return [None]
    dot = b.sum(b.mul(ct, y), [op.attrs()["axis"]], keepdims=True)
    return [b.mul(y, b.sub(ct, dot))]


def _softmax_row(
    ev: TileEvaluator, op: graph.GraphOp, x: SSAValue, mask: SSAValue | None, width: int
) -> SSAValue:
    _, shifted, total = _shifted_sum(ev.b, x, mask)
    return ev.b.div(ev.b.exp(shifted), total)


_register_row(
    graph.SoftmaxOp,
    sharding=statistic_along_axis,
    vjp=_softmax_vjp,
    reference=bound(lambda op: _f32(functools.partial(torch.softmax, dim=op.attrs()["axis"]))),
    row=_softmax_row,
)


def _log_softmax_vjp(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
    """``g - exp(y) * sum(g)`` along the axis."""
    ct, y = cts[0], op.results[0]
    if ct is None:
        return [None]
    total = b.sum(ct, [op.attrs()["axis"]], keepdims=True)
    return [b.sub(ct, b.mul(b.op(graph.ExpOp, y), total))]


def _log_softmax_row(
    ev: TileEvaluator, op: graph.GraphOp, x: SSAValue, mask: SSAValue | None, width: int
) -> SSAValue:
    _, shifted, total = _shifted_sum(ev.b, x, mask)
    return ev.b.sub(shifted, ev.b.log(total))


_register_row(
    graph.LogSoftmaxOp,
    sharding=statistic_along_axis,
    vjp=_log_softmax_vjp,
    reference=bound(lambda op: _f32(functools.partial(torch.log_softmax, dim=op.attrs()["axis"]))),
    row=_log_softmax_row,
)


# --- layer_norm and rms_norm --------------------------------------------------------------------


def _mean_keep(b: GradBuilder, value: SSAValue, axes: Sequence[int]) -> SSAValue:
    return b.op(graph.MeanOp, value, axes=list(axes), keepdims=True)


def _layer_norm_vjp(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
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


@bound
def _layer_norm_reference(op: graph.LayerNormOp) -> Callable[[torch.Tensor], torch.Tensor]:
    """``(x - mean) * rsqrt(var + eps)`` over the axes (``F.layer_norm`` over trailing axes)."""
    axes, eps = op.attrs()["axes"], op.attrs()["eps"]
    rank = aval(op.operands[0]).rank
    if sorted(a % rank for a in axes) == list(range(rank - len(axes), rank)) and axes:
        trailing = aval(op.operands[0]).shape[rank - len(axes) :]
        return _f32(functools.partial(F.layer_norm, normalized_shape=trailing, eps=eps))

    def normalize(v: torch.Tensor) -> torch.Tensor:
        mean = v.mean(dim=axes, keepdim=True)
        var = (v - mean).square().mean(dim=axes, keepdim=True)
        return (v - mean) * torch.rsqrt(var + eps)

    return _f32(normalize)


def _layer_norm_row(
    ev: TileEvaluator, op: graph.GraphOp, x: SSAValue, mask: SSAValue | None, width: int
) -> SSAValue:
    b = ev.b
    eps = b.constant(op.attrs()["eps"])
    mean = b.div(b.reduce(b.masked(x, mask, "sum"), "sum", 1), b.constant(float(width)))
    centred = b.sub(x, mean)
    square = b.masked(b.mul(centred, centred), mask, "sum")
    var = b.div(b.reduce(square, "sum", 1), b.constant(float(width)))
    return b.mul(centred, b.rsqrt(b.add(var, eps)))


_register_row(
    graph.LayerNormOp,
    sharding=statistic_along_axes,
    vjp=_layer_norm_vjp,
    reference=_layer_norm_reference,
    row=_layer_norm_row,
)


def _rms_norm_vjp(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
    """With ``r = rsqrt(mean(x^2) + eps)`` and ``y`` the result:
    ``r * (g - y * mean(g * y))`` over the axes."""
    x, y, ct = op.operands[0], op.results[0], cts[0]
    if ct is None:
        return [None]
    axes, eps = op.attrs()["axes"], op.attrs()["eps"]
    r = b.op(graph.RsqrtOp, b.add(_mean_keep(b, b.mul(x, x), axes), b.constant(eps, x)))
    return [b.mul(r, b.sub(ct, b.mul(y, _mean_keep(b, b.mul(ct, y), axes))))]


@bound
def _rms_norm_reference(op: graph.RmsNormOp) -> Callable[[torch.Tensor], torch.Tensor]:
    """``x * rsqrt(mean(x^2) + eps)`` over the axes."""
    axes, eps = op.attrs()["axes"], op.attrs()["eps"]
    return _f32(lambda v: v * torch.rsqrt(v.square().mean(dim=axes, keepdim=True) + eps))


def _rms_norm_row(
    ev: TileEvaluator, op: graph.GraphOp, x: SSAValue, mask: SSAValue | None, width: int
) -> SSAValue:
    b = ev.b
    eps = b.constant(op.attrs()["eps"])
    square = b.masked(b.mul(x, x), mask, "sum")
    mean_square = b.div(b.reduce(square, "sum", 1), b.constant(float(width)))
    return b.mul(x, b.rsqrt(b.add(mean_square, eps)))


_register_row(
    graph.RmsNormOp,
    sharding=statistic_along_axes,
    vjp=_rms_norm_vjp,
    reference=_rms_norm_reference,
    row=_rms_norm_row,
)


# --- cross_entropy ------------------------------------------------------------------------------


def _cross_entropy_sharding(
    operands: list[AbstractTensor], results: list[AbstractTensor], attrs: dict[str, Any]
) -> ShardingRule:
    """Batch dims are parallel (a partial mean / sum for those reductions); classes are
    a statistic (split: see :func:`_cross_entropy_partition`)."""
    logits, _ = operands
    b = RuleBuilder()
    reduction = attrs["reduction"]
    batch_kind = FactorKind.PARALLEL if reduction == "none" else FactorKind.REDUCTION
    batch = tuple(b.new(s, batch_kind) for s in logits.shape[:-1])
    classes = b.new(logits.shape[-1], FactorKind.STATISTIC)
    out = batch if reduction == "none" else ()
    return b.rule([(*batch, classes), batch], [out], "mean" if reduction == "mean" else "sum")


def _cross_entropy_vjp(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
    """``(softmax(logits) - one_hot(labels)) * g``; the labels get no gradient."""
    logits, labels, ct = op.operands[0], op.operands[1], cts[0]
    if ct is None:
        return [None, None]
    shape = aval(logits).shape
    classes = shape[-1]
    reduction = op.attrs()["reduction"]
    probs = b.op(graph.SoftmaxOp, logits, axis=len(shape) - 1)
    iota = b.iota(labels, classes, (1,) * (len(shape) - 1) + (classes,))
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


def _cross_entropy_partition(
    b: GradBuilder, op: graph.CrossEntropyOp, layouts: Sequence[Sharding], mesh: MeshLike
) -> SSAValue | None:
    """Over classes split on mesh axes ``A`` (Megatron's vocab-parallel cross-entropy),
    per row: ``m = all_reduce_max(max(x))``, ``s = all_reduce_sum(sum(exp(x - m)))`` and
    the label's logit ``p = all_reduce_sum(sum(x where iota == label - offset))``, with
    ``offset = axis_index(A) * n`` (``n`` local classes; only the rank holding the label
    picks it; a label outside ``[0, V)`` picks nothing, as in Megatron, where the unsplit
    op reports it); the loss is ``m + log(s) - p``, then the op's mean or sum over this
    rank's rows. f16/bf16 logits are computed in f32, as the reference does."""
    logits, labels = op.operands
    mesh_axes = layouts[0].dims[-1]
    if not mesh_axes or not aval(logits).size:
        return None
    dtype = aval(logits).dtype
    if dtype in (DType.f16, DType.bf16):
        logits = b.op(graph.CastOp, logits, dtype=DType.f32)
    shape = aval(logits).shape
    last, classes = len(shape) - 1, shape[-1]

    def stat(kind: type[graph.ReductionOp], value: SSAValue) -> SSAValue:
        return _statistic(b, kind, value, [last], mesh_axes)

    peak = stat(graph.MaxOp, logits)
    total = stat(graph.SumOp, b.op(graph.ExpOp, b.sub(logits, peak)))
    position = b.cast(b.op(graph.AxisIndexOp, axes=tuple(mesh_axes)), labels)
    local = b.sub(labels, b.mul(position, b.constant(classes, labels)))
    iota = b.iota(labels, classes, (1,) * last + (classes,))
    hit = b.op(graph.CompareOp, b.reshape(local, (*shape[:-1], 1)), iota, predicate="eq")
    picked = stat(graph.SumOp, b.op(graph.SelectOp, hit, logits, b.constant(0, logits)))
    loss = b.reshape(b.sub(b.add(peak, b.op(graph.LogOp, total)), picked), shape[:-1])
    reduction = op.attrs()["reduction"]
    if reduction != "none":
        kind = graph.MeanOp if reduction == "mean" else graph.SumOp
        loss = b.op(kind, loss, axes=list(range(last)), keepdims=False)
    return loss if aval(loss).dtype == dtype else b.op(graph.CastOp, loss, dtype=dtype)


def check_labels(op: graph.CrossEntropyOp, shape: list[int], labels: torch.Tensor) -> None:
    """Raises ExecutionError unless every label is a class index of logits of ``shape``."""
    classes = shape[-1]
    if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= classes):
        raise ExecutionError(
            f"graph.cross_entropy: labels must be in [0, {classes}) for logits of shape "
            f"{shape}, found values in [{int(labels.min())}, {int(labels.max())}]"
        )


def _cross_entropy_reference(
    op: graph.CrossEntropyOp, logits: torch.Tensor, labels: torch.Tensor
) -> torch.Tensor:
    classes = logits.shape[-1]
    check_labels(op, list(logits.shape), labels)
    loss = _in_f32(
        lambda scores: F.cross_entropy(
            scores, labels.reshape(-1).long(), reduction=op.attrs()["reduction"]
        ),
        logits.reshape(-1, classes),
    )
    return loss.reshape(aval(op.result).shape).to(logits.dtype)


def _cross_entropy_row(
    ev: TileEvaluator, op: graph.GraphOp, x: SSAValue, mask: SSAValue | None, width: int
) -> SSAValue:
    """``max + log(sum(exp(x - max))) - x[label]`` per row."""
    b = ev.b
    top, _, total = _shifted_sum(b, x, mask)
    label = b.convert(ev.at(op.operands[1], ev.space.index[:-1]), i32)
    r = ev.space.index[-1]
    assert r is not None
    hit = b.cmp("eq", r, label)
    picked = b.reduce(b.select(hit, x, b.constant(0.0)), "sum", 1)
    return b.sub(b.add(top, b.log(total)), picked)


register(
    graph.CrossEntropyOp,
    sharding=_cross_entropy_sharding,
    partial=NOT_LINEAR,
    vjp=_cross_entropy_vjp,
    reference=_cross_entropy_reference,
    tile=RowReduction(_cross_entropy_row),
    fusion=Fusion.LOSS,
    partition=Partition(_cross_entropy_partition),
)
