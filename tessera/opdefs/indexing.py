"""``graph.gather``: ``take(input, indices, axis)`` (an embedding lookup gathers axis 0).

Negative indices count from the end (as the reference wraps them); indices out of
``[-size, size)`` are an error (checked by the reference, and before a generated kernel
runs, see ``backends.reference.index_check``). The VJP is a scatter-add through a
one-hot matrix built by comparing the indices with an iota constant. The tile code loads
the index and reads the operand there, so gather fuses like a layout op.

The gathered axis may stay split (a vocabulary-parallel embedding, Megatron's
``VocabParallelEmbedding``): it is a sum-reduction factor. Each rank looks up the indices
that fall in its slice of the axis and gives zero rows for the others, so the result is
a partial sum that one all-reduce (or a reduce-scatter into its consumer's layout)
resolves: the table is never gathered. Indices outside the whole axis then give zero
rows instead of an error (no rank holds them), as in Megatron.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from math import prod
from typing import TYPE_CHECKING, Any

import torch
from xdsl.dialects.builtin import i32
from xdsl.ir import SSAValue

from tessera.dtypes import DType
from tessera.errors import ExecutionError
from tessera.ir import graph
from tessera.ir.abstract import AbstractTensor, aval
from tessera.ir.grad_builder import GradBuilder
from tessera.ir.sharding import MeshLike, Sharding
from tessera.ir.sharding_rules import FactorKind, RuleBuilder, ShardingRule
from tessera.opdefs.registry import Cotangents, Fusion, IndexMap, Partition, bound, register

if TYPE_CHECKING:
    from tessera.opdefs.registry import Index, TileEvaluator


def _gather_sharding(
    operands: list[AbstractTensor], results: list[AbstractTensor], attrs: dict[str, Any]
) -> ShardingRule:
    """``take(x, idx, axis)``: idx dims and x's other dims pass; x's axis is a sum
    reduction (a split axis gives a partial sum, see :func:`_gather_partition`)."""
    x, idx = operands
    axis = attrs["axis"]
    b = RuleBuilder()
    before = tuple(b.new(s) for s in x.shape[:axis])
    gathered = b.new(x.shape[axis], FactorKind.REDUCTION)
    index_dims = tuple(b.new(s) for s in idx.shape)
    after = tuple(b.new(s) for s in x.shape[axis + 1 :])
    return b.rule(
        [(*before, gathered, *after), index_dims], [(*before, *index_dims, *after)], "sum"
    )


def _gather_partition(
    b: GradBuilder, op: graph.GatherOp, layouts: Sequence[Sharding], mesh: MeshLike
) -> SSAValue | None:
    """The lookup on a rank holding a slice of the gathered axis (over mesh axes ``A``):
    ``offset = axis_index(A) * n`` with ``n`` the local size, ``local = wrap(idx) -
    offset``; rows where ``0 <= local < n`` are looked up, the others are zero."""
    axis = op.attrs()["axis"]
    mesh_axes = layouts[0].dims[axis]
    x, indices = op.operands
    local_size = aval(x).shape[axis]
    if not mesh_axes or local_size == 0:
        return None
    size = local_size * prod(mesh.axis_size(a) for a in mesh_axes)
    position = b.cast(b.op(graph.AxisIndexOp, axes=tuple(mesh_axes)), indices)
    offset = b.mul(position, b.constant(local_size, indices))
    local = b.sub(_wrap_indices(b, indices, size), offset)
    inside = b.op(
        graph.MinimumOp,
        b.op(graph.MaximumOp, local, b.constant(0, indices)),
        b.constant(local_size - 1, indices),
    )
    held = b.op(graph.CompareOp, inside, local, predicate="eq")  # this rank holds the row
    rows = b.op(graph.GatherOp, x, inside, axis=axis)
    rank, index_shape = aval(x).rank, aval(indices).shape
    held = b.reshape(held, (1,) * axis + index_shape + (1,) * (rank - axis - 1))
    return b.op(graph.SelectOp, held, rows, b.constant(0, rows))


def _wrap_indices(b: GradBuilder, indices: SSAValue, size: int) -> SSAValue:
    """Negative indices mapped into ``[0, size)`` (as the reference's gather does)."""
    negative = b.op(graph.CompareOp, indices, b.constant(0.0, indices), predicate="lt")
    return b.op(graph.SelectOp, negative, b.add(indices, b.constant(size, indices)), indices)


def _gather_vjp(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
    """Scatter-add of the cotangent into the gathered rows, as a matmul with a one-hot
    matrix: ``grad[a, n, c] = sum_k (indices[k] == n) * ct[a, k, c]``. The one-hot
    matrix is tied to ``x``'s layout of the axis (:func:`_tied_to_rows`), so that a rank
    holding a slice of the axis computes the gradient of its rows only."""
    x, indices, ct = op.operands[0], op.operands[1], cts[0]
    if ct is None or not aval(x).dtype.is_float:
        return [None, None]
    axis = op.attrs()["axis"]
    shape = aval(x).shape
    size = shape[axis]
    before, after = prod(shape[:axis]), prod(shape[axis + 1 :])
    count = prod(aval(indices).shape)
    if count == 0 or before * after == 0:
        return [b.zeros(x, shape), None]
    flat = b.reshape(_wrap_indices(b, indices, size), (1, count))
    one_hot_t = b.op(  # [size, count]: row n marks the picks of index n
        graph.CastOp,
        b.op(graph.CompareOp, b.iota(indices, size, (size, 1)), flat, predicate="eq"),
        dtype=aval(x).dtype,
    )
    rows = b.reshape(ct, (before, count, after))
    product = b.op(graph.MatmulOp, _tied_to_rows(b, one_hot_t, x, axis), rows)
    return [b.reshape(product, shape), None]


def _tied_to_rows(b: GradBuilder, value: SSAValue, x: SSAValue, axis: int) -> SSAValue:
    """``value`` (``[size, n]``, one row per position along ``x``'s ``axis``) unchanged,
    but laid out like ``x`` along the axis: ``select(false, column, value)`` with
    ``column`` ``x``'s first entry of every other dim (``[size, 1]``, looked up by
    ``gather``, which keeps the axis's split and gathers nothing). The select never
    reads ``column``; it is there for the sharding passes, which would otherwise lay
    out ``value`` as its constant iota (replicated) and compute the whole gradient on
    every rank of the axis."""
    column = x
    first = b.full(0, DType.i64, (1,))
    for dim in reversed([d for d in range(aval(x).rank) if d != axis]):
        column = b.op(graph.GatherOp, column, first, axis=dim)
    column = b.reshape(column, (aval(x).shape[axis], 1))
    return b.op(graph.SelectOp, b.full(False, DType.i1, (1, 1)), column, value)


def check_indices(op: graph.GatherOp, shape: list[int], indices: torch.Tensor) -> None:
    """Raises ExecutionError unless every index is in range for ``op``'s axis of ``shape``."""
    axis = op.attrs()["axis"]
    size = shape[axis]
    if indices.numel() and (int(indices.min()) < -size or int(indices.max()) >= size):
        raise ExecutionError(
            f"graph.gather: indices must be in [-{size}, {size}) for axis {axis} of a tensor "
            f"of shape {shape}, found values in [{int(indices.min())}, {int(indices.max())}]"
        )


@bound
def _gather_reference(op: graph.GatherOp) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """``index_select`` along the axis, after checking the indices' range."""
    axis, shape = op.attrs()["axis"], aval(op.result).shape

    def gather(x: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        size = x.shape[axis]
        check_indices(op, list(x.shape), indices)
        return x.index_select(axis, indices.reshape(-1).long() % size).reshape(shape)

    return gather


def _gather_tile(ev: TileEvaluator, op: graph.GatherOp, value: SSAValue, index: Index) -> SSAValue:
    b = ev.b
    axis = op.attrs()["axis"]
    rank = aval(op.indices).rank
    size = aval(op.input).shape[axis]
    chosen = b.convert(ev.at(op.indices, index[axis : axis + rank]), i32)
    chosen = b.select(b.cmp("lt", chosen, b.index(0)), b.add(chosen, b.index(size)), chosen)
    inner = (*index[:axis], None if size == 1 else b.clamp(chosen, size), *index[axis + rank :])
    return ev.at(op.input, inner)


register(
    graph.GatherOp,
    sharding=_gather_sharding,
    partial=(0,),
    vjp=_gather_vjp,
    reference=_gather_reference,
    tile=IndexMap(_gather_tile),
    fusion=Fusion.LAYOUT,
    partition=Partition(_gather_partition),
)
