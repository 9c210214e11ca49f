"""``bucket-gradients``: fuse small all-reduces (and reduce-scatters) whose results wait
into one per bucket.

Runs on partitioned functions (``graph.partitioned``) before ``lower-graph-to-schedule``.
A data-parallel backward makes one gradient after another, in reverse layer order, and
all-reduces each; their results are used only by the optimizer at the end. Many small
all-reduces pay the collective's latency (α) many times over; DDP and Megatron fuse them
into buckets of about ``bucket_bytes``. Each all-reduce smaller than that first moves to
just after the op that makes its operand (``insert-collectives`` puts it at its first
use), so buckets fill in the order gradients are made. Then, in program order, an
all-reduce joins the open bucket of its (axes, kind, dtype) while:

- no op has used a result of the bucket yet (a use closes it: the bucket must be whole
  before anything reads its gradients),
- the bucket stays within ``bucket_bytes`` (an all-reduce that would overflow it closes it
  and opens the next one; one at least ``bucket_bytes`` alone stays as it is).

A closed bucket of two or more all-reduces becomes, where its last member was::

    flat_i = reshape(x_i, [n_i]); packed = concat(flat_0, …); reduced = all_reduce(packed)
    r_i = reshape(slice(reduced, [o_i : o_i + n_i]), shape_i)     (no reshape of 1-D values)

Each element is reduced exactly as before (an all-reduce is elementwise across ranks), so
results are unchanged; the bucket starts when its last gradient is made, and
``overlap-comm`` overlaps it with the rest of the backward. ``bucket_bytes=0`` turns the
pass off.

Reduce-scatters (ZeRO-2/3's gradients) are bucketed the same way, per (axes, kind,
dtype), as ZeRO's and FSDP's flat buckets are, and all-gathers per (axes, dtype) (XLA's
all-gather combiner; ZeRO's updated parameters), when every dimension before the split
one has size one (a split first dimension, say): then each member's blocks for the ``n``
ranks are contiguous, and packing them as one row per rank is a reshape::

    packed = concat(reshape(x_0, [n, m_0]), …, axis 1); r = reduce_scatter(packed, dim 0)
    r_i = reshape(slice(r, [0, o_i : 1, o_i + m_i]), local shape_i)

(an all-gather the inverse: local blocks flattened into one row, gathered along dim 0;
each member's columns of the ``n`` rows are strided, so one ``graph.split`` copies them
all out in one pass, as FSDP2's ``split_with_sizes_copy`` does, and each is reshaped).
A split inner dimension (a context-parallel attention's k and v along the sequence)
would need a transposed copy of each whole member: those stay apart (the copies would
cost more memory than the latency saved). An all-gather is never moved earlier (its
whole copy would live longer): each first moves down to just before its first use,
and then consecutive ones with no use of a result between them are combined where the
last of them was. So a ZeRO-3 step's parameters, all constrained at the function's
start, are gathered layer by layer, not in one bucket whole for the forward, and
ZeRO-1/2's updated parameters, read only by the return, in as few buckets as their
bytes allow.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Block, Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.rewriter import InsertPoint, Rewriter

from tessera.errors import TesseraError
from tessera.ir import graph
from tessera.ir.abstract import aval
from tessera.ir.graph_emitter import GraphEmitter
from tessera.ir.mesh import Mesh
from tessera.ir.mesh_symbol import module_mesh

DEFAULT_BUCKET_BYTES = 25 * 2**20  # DDP's bucket_cap_mb default


@dataclass(frozen=True)
class BucketGradientsPass(ModulePass):
    """Fuses all-reduces whose results are not used yet into buckets of ``bucket_bytes``."""

    name = "bucket-gradients"

    bucket_bytes: int = DEFAULT_BUCKET_BYTES

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        if self.bucket_bytes < 0:
            raise TesseraError(
                f"bucket-gradients: bucket_bytes must be >= 0, found {self.bucket_bytes}"
            )
        if self.bucket_bytes == 0:
            return
        found = module_mesh(op)
        if found is None:
            return
        for function in op.ops:
            if (
                isinstance(function, func.FuncOp)
                and function.body.blocks
                and graph.PARTITIONED in function.attributes
            ):
                _bucket_block(function.body.block, self.bucket_bytes, found[1])


Reduction = graph.AllReduceOp | graph.ReduceScatterOp
Bucketed = graph.AllReduceOp | graph.ReduceScatterOp | graph.AllGatherOp


@dataclass
class _Bucket:
    members: list[Bucketed] = field(default_factory=list)
    nbytes: int = 0


def _key(op: Bucketed) -> tuple[object, ...]:
    attrs = op.attrs()
    dtype = str(aval(op.operands[0]).dtype)
    return (type(op), tuple(attrs["axes"]), attrs.get("kind"), dtype)


def _group_size(op: Bucketed, mesh: Mesh) -> int:
    return math.prod(mesh.axis_size(a) for a in op.attrs()["axes"])


def _candidates(block: Block, bucket_bytes: int, mesh: Mesh) -> set[Bucketed]:
    """The collectives that may be bucketed: all-reduces, reduce-scatters and all-gathers
    over 2+ ranks, smaller than a bucket."""
    return {
        op
        for op in block.ops
        if isinstance(op, Bucketed)
        and _group_size(op, mesh) >= 2
        and _nbytes(op) < bucket_bytes
        and _blocks_contiguous(op)
    }


def _blocks_contiguous(op: Bucketed) -> bool:
    """Whether the ranks' blocks of ``op``'s split dim are contiguous (nothing before it):
    always for an all-reduce."""
    if isinstance(op, graph.AllReduceOp):
        return True
    return math.prod(aval(op.operands[0]).shape[: op.attrs()["dim"]]) == 1


def _nbytes(op: Bucketed) -> int:
    """The bytes ``op`` counts in a bucket: its whole (unscattered, gathered) value."""
    return max(aval(op.operands[0]).nbytes, aval(op.results[0]).nbytes)


def _sink_gathers(block: Block, candidates: set[Bucketed]) -> None:
    """Moves every candidate all-gather down to just before the first op that uses it."""
    position = {op: i for i, op in enumerate(block.ops)}
    for op in [o for o in block.ops if isinstance(o, graph.AllGatherOp) and o in candidates]:
        users = [
            user
            for use in op.results[0].uses
            if (user := block.find_ancestor_op_in_block(use.operation)) is not None
        ]
        if not users:
            continue
        first = min(users, key=position.__getitem__)
        if first is not op.next_op:
            op.detach()
            block.insert_op_before(op, first)


def _hoist(block: Block, candidates: set[Reduction]) -> None:
    """Moves every candidate all-reduce to just after its operand's producer (after the
    ones moved there before it): insert-collectives puts one where it is first used, but it
    can start as soon as its gradient exists, and buckets follow that order."""
    last_placed: dict[object, Operation] = {}
    for op in list(block.ops):
        if op not in candidates or isinstance(op, graph.AllGatherOp):
            continue
        producer = op.operands[0].owner
        after = last_placed.get(producer, producer)
        op.detach()
        if isinstance(after, Operation):
            block.insert_op_after(op, after)
        else:  # a block argument: the block's start
            first = block.first_op
            assert first is not None
            block.insert_op_before(op, first)
        last_placed[producer] = op


def _bucket_block(block: Block, bucket_bytes: int, mesh: Mesh) -> None:
    candidates = _candidates(block, bucket_bytes, mesh)
    _sink_gathers(block, candidates)
    _hoist(block, candidates)
    open_buckets: dict[tuple[object, ...], _Bucket] = {}
    member_of: dict[Operation, tuple[object, ...]] = {}  # open member -> its bucket's key

    def close(key: tuple[object, ...]) -> None:
        bucket = open_buckets.pop(key)
        for member in bucket.members:
            del member_of[member]
        if len(bucket.members) > 1:
            _emit(bucket.members, _group_size(bucket.members[0], mesh))

    for op in list(block.ops):
        used = {member_of[o.owner] for o in op.operands if o.owner in member_of}
        for key in used:  # someone reads a gradient: its bucket must be done first
            close(key)
        if isinstance(op, func.ReturnOp):
            for key in list(open_buckets):
                close(key)
            break
        if op not in candidates:
            continue
        assert isinstance(op, Bucketed)
        nbytes = _nbytes(op)
        key = _key(op)
        bucket = open_buckets.get(key)
        if bucket is not None and bucket.nbytes + nbytes > bucket_bytes:
            close(key)
            bucket = None
        if bucket is None:
            bucket = open_buckets[key] = _Bucket()
        bucket.members.append(op)
        bucket.nbytes += nbytes
        member_of[op] = key


def _emit(members: list[Bucketed], group_size: int) -> None:
    """Replaces ``members`` by one collective of their packed operands, placed where the
    last of them was."""
    if not isinstance(members[0], graph.AllReduceOp):
        _emit_rows(members, group_size)
        return
    last = members[-1]
    emit = GraphEmitter(last)
    flats = [
        x if aval(x).rank == 1 else emit(graph.ReshapeOp, [x], shape=(aval(x).size,))
        for x in (m.operands[0] for m in members)
    ]
    packed = emit(graph.ConcatOp, flats, axis=0)
    reduced = emit(graph.AllReduceOp, [packed], **last.attrs(), group_size=group_size)
    offset, results = 0, []
    for member in members:
        value = aval(member.operands[0])
        piece = emit(
            graph.SliceOp, [reduced], starts=[offset], limits=[offset + value.size], strides=[1]
        )
        results.append(
            piece if value.rank == 1 else emit(graph.ReshapeOp, [piece], shape=value.shape)
        )
        offset += value.size
    _replace(members, results)


def _emit_rows(members: list[Bucketed], n: int) -> None:
    """Replaces reduce-scatter or all-gather ``members`` by one of their operands packed as
    rows of ranks (see the module docstring: ``n`` rows in and one out for a
    reduce-scatter, one in and ``n`` out for an all-gather), placed where the last of
    them was; each result is its column range of the rows, reshaped."""
    last = members[-1]
    emit = GraphEmitter(last)
    rows_in, rows_out = (1, n) if isinstance(last, graph.AllGatherOp) else (n, 1)
    widths = [aval(m.operands[0]).size // rows_in for m in members]
    rows = [
        emit(graph.ReshapeOp, [m.operands[0]], shape=(rows_in, width))
        for m, width in zip(members, widths, strict=True)
    ]
    packed = emit(graph.ConcatOp, rows, axis=1)
    moved = emit(type(last), [packed], **{**last.attrs(), "dim": 0}, group_size=n)
    shapes = [aval(m.results[0]).shape for m in members]
    results: list[SSAValue] = []
    if rows_out == 1:  # one row: each member's columns are a contiguous slice (a view)
        offset = 0
        for width, shape in zip(widths, shapes, strict=True):
            piece = emit(
                graph.SliceOp, [moved], starts=[0, offset], limits=[1, offset + width],
                strides=[1, 1],
            )  # fmt: skip
            results.append(emit(graph.ReshapeOp, [piece], shape=shape))
            offset += width
    else:  # rows of ranks: each member's columns are strided, copied out in one pass
        split = graph.build(graph.SplitOp, [moved], axis=1, sizes=widths)
        Rewriter.insert_op(split, InsertPoint.before(last))
        for piece, shape in zip(split.results, shapes, strict=True):
            results.append(emit(graph.ReshapeOp, [piece], shape=shape))
    _replace(members, results)


def _replace(members: list[Bucketed], results: list[SSAValue]) -> None:
    """Each member's uses read its result (which keeps the member's attributes); the
    members are erased."""
    for member, result in zip(members, results, strict=True):
        result.owner.attributes.update(member.attributes)
        member.results[0].replace_all_uses_with(result)
    for member in members:
        Rewriter.erase_op(member)
