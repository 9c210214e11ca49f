"""Layout ops: ``reshape``, ``broadcast_to``, ``transpose``, ``slice``, ``concat``, ``split``.

They move data without arithmetic, so each is linear in its operands and its tile code
maps the index it is asked for to its operand's index (transpose permutes it, slice
scales and shifts it, reshape goes through the flat offset, concat selects among its
operands). The graph dialect has no scatter or pad op, so the VJP of a slice scatters the
cotangent into zeros with concats of zero blocks (and, for strides > 1, an interleave of
the cotangent with zeros by concat and reshape).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from math import gcd
from typing import TYPE_CHECKING, Any

import torch
from xdsl.ir import SSAValue

from tessera.ir import graph
from tessera.ir.abstract import AbstractTensor, aval
from tessera.ir.grad_builder import GradBuilder
from tessera.ir.sharding_rules import (
    FactorKind,
    FactorWindows,
    Rule,
    RuleBuilder,
    ShardingRule,
    elementwise,
)
from tessera.opdefs.registry import (
    Cotangents,
    Fusion,
    IndexMap,
    PartialRule,
    Reference,
    VjpRule,
    bound,
    register,
)

if TYPE_CHECKING:
    from tessera.opdefs.registry import Index, TileEvaluator


def _register(
    op_type: type[graph.GraphOp],
    *,
    sharding: Rule,
    vjp: VjpRule,
    reference: Reference,
    tile: IndexMap,
    partial: PartialRule = (0,),
) -> None:
    """Registers a layout op: linear in its operand(s), an index map (read in place by the
    kernels that use it, or a layout kernel of its own)."""
    register(
        op_type,
        sharding=sharding,
        partial=partial,
        vjp=vjp,
        reference=reference,
        tile=tile,
        fusion=Fusion.LAYOUT,
    )


def _shape(value: SSAValue) -> tuple[int, ...]:
    return aval(value).shape


def _float(value: SSAValue) -> bool:
    return aval(value).dtype.is_float


# --- reshape ---------------------------------------------------------------------------------


def _reshape_sharding(
    operands: list[AbstractTensor], results: list[AbstractTensor], attrs: dict[str, Any]
) -> ShardingRule:
    """Dims are grouped into runs of equal product; within a run only the major dims of
    both sides share a factor, sized by their gcd (a split of s is the same contiguous
    block on both sides exactly when s divides it); the other dims must stay whole."""
    src, dst = operands[0].shape, results[0].shape
    b = RuleBuilder()
    if 0 in src or 0 in dst:  # no elements: nothing to split, every dim stays whole
        return b.rule(
            [tuple(b.new(s, FactorKind.REPLICATED) for s in src)],
            [tuple(b.new(d, FactorKind.REPLICATED) for d in dst)],
        )
    src_dims: list[int | None] = []
    dst_dims: list[int | None] = []
    i = j = 0
    while i < len(src) or j < len(dst):
        # skip size-1 dims: they carry no data to split
        if i < len(src) and src[i] == 1:
            src_dims.append(None)
            i += 1
            continue
        if j < len(dst) and dst[j] == 1:
            dst_dims.append(None)
            j += 1
            continue
        run_i, run_j = [i], [j]
        a, c = src[i], dst[j]
        i, j = i + 1, j + 1
        while a != c:
            if a < c:
                a *= src[i]
                run_i.append(i)
                i += 1
            else:
                c *= dst[j]
                run_j.append(j)
                j += 1
        shared = b.new(gcd(src[run_i[0]], dst[run_j[0]]))
        src_dims.append(shared)
        src_dims.extend(b.new(src[d], FactorKind.REPLICATED) for d in run_i[1:])
        dst_dims.append(shared)
        dst_dims.extend(b.new(dst[d], FactorKind.REPLICATED) for d in run_j[1:])
    return b.rule([tuple(src_dims)], [tuple(dst_dims)])


def _reshape_vjp(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
    x, ct = op.operands[0], cts[0]
    if ct is None or not _float(x):
        return [None]
    return [b.reshape(ct, _shape(x))]


def _reshape_runs(
    src: tuple[int, ...], dst: tuple[int, ...]
) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """The shortest runs of dims, ``(src[i0:i1], dst[j0:j1])``, of equal element counts
    that a row-major reshape maps onto each other (one run when none is shorter)."""
    runs = []
    i = j = 0
    while i < len(src) or j < len(dst):
        i0, j0, a, c = i, j, 1, 1
        if i < len(src):
            a, i = src[i], i + 1
        if j < len(dst):
            c, j = dst[j], j + 1
        while a != c:
            if a < c:
                a, i = a * src[i], i + 1
            else:
                c, j = c * dst[j], j + 1
        runs.append(((i0, i), (j0, j)))
    return runs


def _reshape_tile(ev: TileEvaluator, op: graph.ReshapeOp, value: SSAValue, index: Index) -> SSAValue:
    """Each run of dims (see :func:`_reshape_runs`) goes through its own flat offset: a
    dim the reshape keeps passes its index through, split or merged dims divide."""
    src, dst = _shape(op.input), _shape(value)
    runs = _reshape_runs(src, dst) if 0 not in src else []
    if len(runs) <= 1:
        flat = ev.offsets(dst, index)
        return ev.at(op.input, tuple(ev.b.unflatten(flat, src)))
    inner: list[SSAValue | None] = []
    for (i0, i1), (j0, j1) in runs:
        if i1 - i0 == 1 and j1 - j0 == 1:
            inner.append(index[j0])
        else:
            flat = ev.offsets(dst[j0:j1], index[j0:j1])
            inner.extend(ev.b.unflatten(flat, src[i0:i1]))
    return ev.at(op.input, tuple(inner))


_register(
    graph.ReshapeOp,
    sharding=_reshape_sharding,
    vjp=_reshape_vjp,
    reference=bound(lambda op: functools.partial(torch.reshape, shape=aval(op.result).shape)),
    tile=IndexMap(_reshape_tile),
)


# --- broadcast_to ----------------------------------------------------------------------------


def _broadcast_to_vjp(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
    x, ct = op.operands[0], cts[0]
    if ct is None or not _float(x):
        return [None]
    return [b.unbroadcast(ct, _shape(x))]


def _broadcast_to_tile(
    ev: TileEvaluator, op: graph.BroadcastToOp, value: SSAValue, index: Index
) -> SSAValue:
    return ev.at_broadcast(op.input, _shape(value), index)


_register(
    graph.BroadcastToOp,
    sharding=elementwise,
    vjp=_broadcast_to_vjp,
    reference=bound(lambda op: functools.partial(torch.broadcast_to, size=aval(op.result).shape)),
    tile=IndexMap(_broadcast_to_tile),
)


# --- transpose -------------------------------------------------------------------------------


def _transpose_sharding(
    operands: list[AbstractTensor], results: list[AbstractTensor], attrs: dict[str, Any]
) -> ShardingRule:
    (x,) = operands
    b = RuleBuilder()
    dims = tuple(b.new(s) for s in x.shape)
    return b.rule([dims], [tuple(dims[p] for p in attrs["perm"])])


def _transpose_vjp(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
    x, ct = op.operands[0], cts[0]
    if ct is None or not _float(x):
        return [None]
    perm = op.attrs()["perm"]
    inverse = [perm.index(d) for d in range(len(perm))]
    if inverse == list(range(len(perm))):
        return [ct]
    return [b.op(graph.TransposeOp, ct, perm=inverse)]


def _transpose_tile(
    ev: TileEvaluator, op: graph.TransposeOp, value: SSAValue, index: Index
) -> SSAValue:
    perm = op.attrs()["perm"]
    inner: list[SSAValue | None] = [None] * len(perm)
    for i, p in enumerate(perm):
        inner[p] = index[i]
    return ev.at(op.input, tuple(inner))


_register(
    graph.TransposeOp,
    sharding=_transpose_sharding,
    vjp=_transpose_vjp,
    reference=bound(lambda op: functools.partial(torch.permute, dims=op.attrs()["perm"])),
    tile=IndexMap(_transpose_tile),
)


# --- slice -----------------------------------------------------------------------------------


def _slice_sharding(
    operands: list[AbstractTensor], results: list[AbstractTensor], attrs: dict[str, Any]
) -> ShardingRule:
    """Untouched dims are parallel. One dim cut with stride 1 is a BLOCKS factor (the
    result is a window of the operand: split, each rank's result block is moved from
    the operand's blocks); dims cut otherwise, or beside another cut, must be whole."""
    (x,) = operands
    b = RuleBuilder()
    cut = [
        d
        for d, size in enumerate(x.shape)
        if (attrs["starts"][d], attrs["limits"][d], attrs["strides"][d]) != (0, size, 1)
    ]
    window = cut[0] if len(cut) == 1 and attrs["strides"][cut[0]] == 1 else None
    dims = []
    for d, size in enumerate(x.shape):
        kind = FactorKind.BLOCKS if d == window else FactorKind.REPLICATED
        dims.append(b.new(size, FactorKind.PARALLEL if d not in cut else kind))
    in_dims = tuple(dims)
    out_dims = tuple(
        f if d not in cut or d == window else b.new(results[0].shape[d])
        for d, f in enumerate(in_dims)
    )
    windows = []
    if window is not None:
        start, size = attrs["starts"][window], results[0].shape[window]
        windows.append(FactorWindows(in_dims[window], ((0, x.shape[window]),), ((start, size),)))
    return b.rule([in_dims], [out_dims], windows=windows)


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
        return b.zeros(ct, _with_dim(shape, dim, size))
    if stride > 1:  # interleave: [.., count, 1, ..] ++ zeros [.., count, stride - 1, ..]
        split = (*shape[:dim], count, 1, *shape[dim + 1 :])
        gaps = b.zeros(ct, _with_dim(split, dim + 1, stride - 1))
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
    before = b.zeros(ct, _with_dim(shape, dim, start))
    after = b.zeros(ct, _with_dim(shape, dim, size - start - count))
    return _concat(b, [before, ct, after], dim)


def _slice_vjp(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
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


@bound
def _slice_reference(op: graph.SliceOp) -> Callable[[torch.Tensor], torch.Tensor]:
    """Basic indexing with the op's starts, limits and strides (a view)."""
    a = op.attrs()
    index = tuple(
        slice(*bounds) for bounds in zip(a["starts"], a["limits"], a["strides"], strict=True)
    )
    return lambda x: x[index]


def _slice_tile(ev: TileEvaluator, op: graph.SliceOp, value: SSAValue, index: Index) -> SSAValue:
    attrs = op.attrs()
    inner = tuple(
        ev.b.affine(c, step, start)
        for c, start, step in zip(index, attrs["starts"], attrs["strides"], strict=True)
    )
    return ev.at(op.input, inner)


_register(
    graph.SliceOp,
    sharding=_slice_sharding,
    vjp=_slice_vjp,
    reference=_slice_reference,
    tile=IndexMap(_slice_tile),
)


# --- concat ----------------------------------------------------------------------------------


def _offsets(sizes: Sequence[int]) -> list[tuple[int, int]]:
    """``(offset, size)`` of consecutive pieces of the given sizes."""
    windows, offset = [], 0
    for size in sizes:
        windows.append((offset, size))
        offset += size
    return windows


def _concat_sharding(
    operands: list[AbstractTensor], results: list[AbstractTensor], attrs: dict[str, Any]
) -> ShardingRule:
    """All operands share every factor; along the axis each operand is a window of the
    result (a BLOCKS factor: split, each rank's result block is moved together from the
    operands' blocks)."""
    b = RuleBuilder()
    axis, out = attrs["axis"], results[0].shape
    dims = tuple(
        b.new(s, FactorKind.BLOCKS if d == axis else FactorKind.PARALLEL)
        for d, s in enumerate(out)
    )
    pieces = tuple(_offsets([x.shape[axis] for x in operands]))
    windows = FactorWindows(dims[axis], pieces, ((0, out[axis]),))
    return b.rule([dims] * len(operands), [dims], windows=[windows])


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


def _concat_tile(ev: TileEvaluator, op: graph.ConcatOp, value: SSAValue, index: Index) -> SSAValue:
    b = ev.b
    axis = op.attrs()["axis"]
    result: SSAValue | None = None
    start = 0
    pieces = []
    for operand in op.inputs:
        size = _shape(operand)[axis]
        if size == 0:  # contributes nothing (and has no element to read)
            continue
        inner = list(index)
        here = inner[axis] if inner[axis] is not None else b.index(0)
        inner[axis] = None if size == 1 else b.clamp(b.sub(here, b.index(start)), size)
        pieces.append((start, ev.at(operand, tuple(inner))))
        start += size
    here = index[axis] if index[axis] is not None else b.index(0)
    for begin, piece in pieces:  # later pieces win from their start on
        result = (
            piece if result is None else b.select(b.cmp("ge", here, b.index(begin)), piece, result)
        )
    assert result is not None
    return result


_register(
    graph.ConcatOp,
    sharding=_concat_sharding,
    partial="all",
    vjp=_concat_vjp,
    reference=bound(lambda op: lambda *xs: torch.cat(xs, dim=op.attrs()["axis"])),
    tile=IndexMap(_concat_tile),
)


# --- split -----------------------------------------------------------------------------------


def _split_sharding(
    operands: list[AbstractTensor], results: list[AbstractTensor], attrs: dict[str, Any]
) -> ShardingRule:
    """Pieces keep every dim; along the axis each piece is a window of the operand (a
    BLOCKS factor: split, each rank's block of each piece is moved from the operand's
    blocks)."""
    (x,) = operands
    b = RuleBuilder()
    axis = attrs["axis"]
    dims = tuple(
        b.new(s, FactorKind.BLOCKS if d == axis else FactorKind.PARALLEL)
        for d, s in enumerate(x.shape)
    )
    pieces = tuple(_offsets([r.shape[axis] for r in results]))
    windows = FactorWindows(dims[axis], ((0, x.shape[axis]),), pieces)
    return b.rule([dims], [dims] * len(results), windows=[windows])


def _split_vjp(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
    x = op.operands[0]
    if all(ct is None for ct in cts) or not _float(x):
        return [None]
    axis = op.attrs()["axis"]
    pieces = [
        ct if ct is not None else b.zeros(x, _shape(r))
        for ct, r in zip(cts, op.results, strict=True)
    ]
    return [_concat(b, pieces, axis)]


@bound
def _split_reference(op: graph.SplitOp) -> Callable[[torch.Tensor], tuple[torch.Tensor, ...]]:
    """``torch.split`` into the results' sizes along the axis."""
    axis = op.attrs()["axis"]
    sizes = [aval(r).shape[axis] for r in op.results]
    return lambda x: tuple(torch.split(x, sizes, dim=axis))


def _split_tile(ev: TileEvaluator, op: graph.SplitOp, value: SSAValue, index: Index) -> SSAValue:
    axis = op.attrs()["axis"]
    start = sum(_shape(r)[axis] for r in op.outputs[: list(op.outputs).index(value)])
    inner = list(index)
    inner[axis] = ev.b.affine(inner[axis], 1, start)
    return ev.at(op.input, tuple(inner))


_register(
    graph.SplitOp,
    sharding=_split_sharding,
    vjp=_split_vjp,
    reference=_split_reference,
    tile=IndexMap(_split_tile),
)
