"""Lowers one ``schedule.kernel`` to a ``tile.kernel``, by kernel class.

- *pointwise* (elementwise ops and layout ops): a 1-D grid over the flat output, one
  ``block`` of elements per program; each output element's index is recovered from its
  flat offset and every value is evaluated there (``codegen.evaluate``).
- *row reduction* (the ops whose tile code is a :class:`~tessera.opdefs.RowReduction`: sum,
  mean, max, min, prod, softmax, log_softmax, layer_norm, rms_norm, cross_entropy, with
  elementwise prologue and epilogue): a program takes ``rows`` rows and a whole reduced
  row as one block (``rows x next_pow2(R)``); the op's tile code reduces it, masked
  lanes holding the reduction's identity. A kernel may hold several reductions over the
  same rows; they are computed in body order (one may use another's result).
- *matmul* (batched, with elementwise epilogue): ``block_m x block_n`` output tiles with a
  K loop of ``tile.dot`` into an f32 accumulator (f64 for f64 operands, exact for
  integers), programs grouped along M for L2 reuse; a matmul whose ``fp8`` property says
  its operands hold fp8 values converts their tiles to that type (exactly) and dots them in
  fp8 (tensor cores on compute capability 8.9 and later), accumulating in f32;
  the epilogue is evaluated on the accumulator tile and stored once. An operand that is
  a kernel input is loaded directly; one the body computes (a prologue: layout ops read
  in place, such as a transposed weight or split heads, or elementwise ops) is evaluated
  per ``block_m x block_k`` or ``block_k x block_n`` tile, lanes past its edges being 0.
- *attention* (``codegen.attention``): flash attention for softmax(Q Kᵀ) V, the pattern
  or ``graph.attention``; *attention_backward* (``codegen.attention_backward``): its
  FlashAttention-2 backward.

Every kernel computes all its outputs before it stores the first (an output may take the
place of an input it reads, see ``plan-memory``). The tile kernel's signature, its
block sizes and the frame it is built in are :mod:`tessera.codegen.frame`'s.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from xdsl.dialects.builtin import Float8E4M3FNType, Float8E5M2Type, TensorType
from xdsl.ir import Attribute, SSAValue

from tessera.codegen.attention import lower_attention, match_attention
from tessera.codegen.attention_backward import lower_attention_backward
from tessera.codegen.evaluate import Evaluator, Index, Space, dims_of
from tessera.codegen.frame import (
    DEFAULT,
    BlockConfig,
    Frame,
    batch_offset,
    cdiv,
    new_frame,
    next_pow2,
    pointer_constants,  # noqa: F401  (the Triton runtime imports it from here)
    position_axes,  # noqa: F401  (the Triton runtime imports it from here)
    yielded,
)
from tessera.errors import IRError
from tessera.ir import graph, schedule, tile
from tessera.ir.tile import compute_element, element_type
from tessera.ir.tile_builder import TileBuilder, Value, shape
from tessera.opdefs import Fusion, Kernel, RowReduction, lookup, op_def

MAX_ROW_BLOCK = 65536  # elements of one reduced row held in one block
# a matmul's ``fp8`` format -> the element type its kernel dots its operands in
FP8_ELEMENTS: dict[str, Attribute] = {"e4m3": Float8E4M3FNType(), "e5m2": Float8E5M2Type()}


def kernel_class(kernel: schedule.KernelOp) -> str:
    """``attention``, a dedicated kernel's name (an op whose tile code is a
    :class:`~tessera.opdefs.Kernel`: ``matmul``), ``reduction`` or ``pointwise``."""
    if match_attention(kernel) is not None:
        return "attention"
    tiles = [found.tile for op in kernel.body.block.ops if (found := lookup(op)) is not None]
    dedicated = next((t.name for t in tiles if isinstance(t, Kernel)), None)
    if dedicated is not None:
        return dedicated
    if any(isinstance(t, RowReduction) for t in tiles):
        return "reduction"
    return "pointwise"


def row_reductions(kernel: schedule.KernelOp) -> list[graph.GraphOp]:
    """The ops of a row-reduction kernel that its row kernel reduces (all over the same
    rows), in body order."""
    return [
        o  # type: ignore[misc]
        for o in kernel.body.block.ops
        if (found := lookup(o)) is not None and isinstance(found.tile, RowReduction)
    ]


def row_reduction(kernel: schedule.KernelOp) -> graph.GraphOp:
    """The first op of a row-reduction kernel that its row kernel reduces."""
    return row_reductions(kernel)[0]


# --- pointwise -----------------------------------------------------------------------------------


def lower_pointwise(kernel: schedule.KernelOp, config: BlockConfig = DEFAULT) -> tile.KernelOp:
    frame = new_frame(kernel)
    b = frame.b
    outputs = yielded(kernel)
    split = outputs[0].owner if isinstance(outputs[0].owner, graph.SplitOp) else None
    if split is not None and all(v.owner is split for v in outputs):
        space_dims = dims_of(split.input)
    else:
        split = None
        space_dims = _broadcast_all([dims_of(v) for v in outputs], kernel)
    numel = math.prod(space_dims)  # 0 for an empty tensor: a grid of no programs
    if numel == 0 and any(math.prod(dims_of(v)) for v in outputs):
        raise IRError(
            f"@{kernel.kernel_name}: an empty output shares its kernel with a non-empty one "
            f"({[dims_of(v) for v in outputs]}); they need separate kernels"
        )
    block = min(next_pow2(config.block), next_pow2(max(1, numel)))
    pid = b.program_id(0)
    offsets = b.add(b.mul(pid, b.index(block)), b.arange(block))
    mask = None if numel % block == 0 else b.cmp("lt", offsets, b.index(numel))
    space = Space(
        tuple(space_dims), tuple(b.unflatten(offsets, space_dims)), (block,), [mask], offsets
    )
    ev = frame.evaluator(space)
    if split is not None:
        _store_split(ev, split, frame.outputs, outputs)
    else:
        computed = [ev.at(value, ev.full_index(value)) for value in outputs]
        for ptr, value, out in zip(frame.outputs, outputs, computed, strict=True):
            ev.store(ptr, value, out)
    return frame.finish([cdiv(numel, block), 1, 1], config)


def _broadcast_all(all_dims: list[tuple[int, ...]], kernel: schedule.KernelOp) -> tuple[int, ...]:
    rank = max(len(d) for d in all_dims)
    out = [1] * rank
    for dims in all_dims:
        for i, size in enumerate(dims):
            j = rank - len(dims) + i
            if size != 1 and out[j] not in (1, size):
                raise IRError(
                    f"@{kernel.kernel_name}: outputs of shapes {all_dims} do not share one iteration space"
                )
            out[j] = max(out[j], size)
    return tuple(out)


def _store_split(
    ev: Evaluator, split: graph.SplitOp, pointers: list[Value], outputs: list[SSAValue]
) -> None:
    """A split's outputs, stored from one pass over its input."""
    b = ev.b
    axis = split.attrs()["axis"]
    source = ev.at(split.input, ev.space.index)
    start = 0
    for ptr, value in zip(pointers, outputs, strict=True):
        size = dims_of(value)[axis]
        here = ev.space.index[axis] if ev.space.index[axis] is not None else b.index(0)
        index = list(ev.space.index)
        index[axis] = None if size == 1 else b.sub(here, b.index(start))
        inside = b.and_(b.cmp("ge", here, b.index(start)), b.cmp("lt", here, b.index(start + size)))
        offsets = ev.offsets(dims_of(value), tuple(index))
        mask = b.and_(ev.space.mask_for(b, shape(offsets)), b.broadcast(inside, shape(offsets)))
        out = b.convert(source, value.type.element_type)  # type: ignore[attr-defined]
        b.store(ptr, offsets, out, mask)
        start += size


# --- row reductions ----------------------------------------------------------------------------


def reduced_axes(op: graph.GraphOp) -> tuple[int, ...]:
    """The axes of its (first) operand that a reduction op reduces."""
    rank = len(dims_of(op.operands[0]))
    attrs = op.attrs()
    if op_def(op).fusion is Fusion.LOSS:
        return (rank - 1,)
    if "axis" in attrs:
        return (attrs["axis"] % rank,)
    return tuple(sorted(a % rank for a in attrs["axes"]))


def lower_reduction(kernel: schedule.KernelOp, config: BlockConfig = DEFAULT) -> tile.KernelOp:
    frame = new_frame(kernel)
    b = frame.b
    ops = row_reductions(kernel)
    op = ops[0]
    full = dims_of(op.operands[0])
    axes = reduced_axes(op)
    for other in ops:
        if isinstance(other, graph.CrossEntropyOp) and other.attrs()["reduction"] != "none":
            raise IRError(
                f"@{kernel.kernel_name}: cross_entropy with reduction must be split first"
            )
        if (dims_of(other.operands[0]), reduced_axes(other)) != (full, axes):
            raise IRError(f"@{kernel.kernel_name}: its reductions do not reduce the same rows")
    kept = [d for d in range(len(full)) if d not in axes]
    rows = math.prod(full[d] for d in kept)
    width = math.prod(full[d] for d in axes)
    block_r = next_pow2(width)
    if block_r > MAX_ROW_BLOCK:
        raise IRError(
            f"@{kernel.kernel_name}: a reduced row of {width} elements exceeds one block "
            f"({MAX_ROW_BLOCK}); looped reductions are not implemented yet"
        )
    block_rows = max(1, min(next_pow2(rows), next_pow2(config.row_elements) // block_r))
    pid = b.program_id(0)
    if block_rows == 1:
        row: Value = pid
        row_mask = None
    else:
        row = b.add(b.mul(pid, b.index(block_rows)), b.expand_dims(b.arange(block_rows), 1))
        row_mask = None if rows % block_rows == 0 else b.cmp("lt", row, b.index(rows))
    r = b.expand_dims(b.arange(block_r), 0)
    r_mask = None if width == block_r else b.cmp("lt", r, b.index(width))
    index: list[Value | None] = [None] * len(full)
    for d, c in zip(kept, b.unflatten(row, [full[d] for d in kept]), strict=True):
        index[d] = c
    for d, c in zip(axes, b.unflatten(r, [full[d] for d in axes]), strict=True):
        index[d] = c
    trailing = list(axes) == list(range(len(full) - len(axes), len(full)))
    linear = b.add(b.mul(row, b.index(width)), r) if trailing else None
    space = Space(full, tuple(index), (block_rows, block_r), [row_mask, r_mask], linear)
    ev = frame.evaluator(space)
    for op in ops:  # in body order: a reduction may use an earlier one's result
        x = ev.at(op.operands[0], space.index)
        x = b.broadcast(x, (block_rows, block_r)) if shape(x) != (block_rows, block_r) else x
        reduce = op_def(op).tile
        assert isinstance(reduce, RowReduction)
        ev.bound[op.results[0]] = reduce.fn(ev, op, x, r_mask, width)
    keep_dims = tuple(1 if d in axes else s for d, s in enumerate(full))
    squeezed = tuple(full[d] for d in kept)
    stores = []
    for ptr, value in zip(frame.outputs, yielded(kernel), strict=True):
        dims = dims_of(value)
        if dims == keep_dims and dims != full:
            at: Index = tuple(None if d in axes else index[d] for d in range(len(full)))
        elif dims == squeezed and dims != full:
            at = tuple(index[d] for d in kept)
        else:
            at = ev.full_index(value)
        stores.append((ptr, value, ev.at(value, at), at))
    for ptr, value, out, at in stores:  # every load before the first store
        ev.store(ptr, value, out, at)
    return frame.finish([cdiv(rows, block_rows), 1, 1], config)


# --- matmul --------------------------------------------------------------------------------------


def lower_matmul(kernel: schedule.KernelOp, config: BlockConfig = DEFAULT) -> tile.KernelOp:
    frame = new_frame(kernel)
    b = frame.b
    op = next(o for o in kernel.body.block.ops if isinstance(o, graph.MatmulOp))
    lhs, rhs = op.operands
    out_dims = dims_of(op.result)
    batch, (m, n), k = out_dims[:-2], out_dims[-2:], dims_of(lhs)[-1]
    bm, bn = max(16, min(config.block_m, next_pow2(m))), max(16, min(config.block_n, next_pow2(n)))
    fp8 = FP8_ELEMENTS.get(op.attrs().get("fp8", ""))  # operands holding fp8 values
    bk = max(32 if fp8 else 16, min(config.block_k, next_pow2(k)))  # an fp8 MMA's k is 32
    pid = b.program_id(0)
    pid_m, pid_n = _grouped(b, pid, cdiv(m, bm), cdiv(n, bn), config.group_m)
    rows = b.add(b.mul(pid_m, b.index(bm)), b.expand_dims(b.arange(bm), 1))  # [bm, 1]
    cols = b.add(b.mul(pid_n, b.index(bn)), b.expand_dims(b.arange(bn), 0))  # [1, bn]
    row_mask = None if m % bm == 0 else b.cmp("lt", rows, b.index(m))
    col_mask = None if n % bn == 0 else b.cmp("lt", cols, b.index(n))
    batch_index = b.unflatten(b.program_id(1), batch) if batch else []
    space = Space(out_dims, (*batch_index, rows, cols), (bm, bn), [row_mask, col_mask])
    ev = frame.evaluator(space)

    def base(operand: SSAValue) -> Value:  # the offset of this program's batch in ``operand``
        return batch_offset(b, dims_of(operand), batch_index) or b.index(0)

    lhs_rows = b.add(base(lhs), b.mul(rows, b.index(k))) if lhs in frame.pointers else None
    rhs_cols = b.add(base(rhs), cols) if rhs in frame.pointers else None
    zero = b.constant(0, compute_element(element_type(lhs.type)), (bm, bn))  # f32, f64 or int
    loop, body, k0, (acc,) = b.for_loop(b.index(0), b.index(k), b.index(bk), [zero])
    kk = body.add(body.arange(bk), k0)
    k_mask = None if k % bk == 0 else body.cmp("lt", kk, body.index(k))
    a_cols = body.expand_dims(kk, 0)  # [1, bk]
    b_rows = body.expand_dims(kk, 1)  # [bk, 1]
    a_k_mask = None if k_mask is None else body.expand_dims(k_mask, 0)
    a_mask = body.and_(row_mask, a_k_mask) if lhs_rows is not None else None
    b_k_mask = None if k_mask is None else body.expand_dims(k_mask, 1)
    b_mask = body.and_(b_k_mask, col_mask) if rhs_cols is not None else None
    if lhs_rows is not None:
        a = body.load(frame.pointers[lhs], body.add(lhs_rows, a_cols), a_mask)
    else:
        a = _prologue(frame, body, lhs, batch_index, (rows, a_cols), [row_mask, a_k_mask])
    if rhs_cols is not None:
        offsets = body.add(body.mul(b_rows, body.index(n)), rhs_cols)
        b_tile = body.load(frame.pointers[rhs], offsets, b_mask)
    else:
        b_tile = _prologue(frame, body, rhs, batch_index, (b_rows, cols), [b_k_mask, col_mask])
    if fp8 is not None:  # exact: the operands hold fp8 values; the lanes past K are 0
        a, b_tile = body.convert(a, fp8), body.convert(b_tile, fp8)
    body.yield_([body.dot(a, b_tile, acc)])
    ev.bound[op.result] = loop.results[0]
    outputs = yielded(kernel)
    computed = [ev.at(value, ev.full_index(value)) for value in outputs]
    for ptr, value, out in zip(frame.outputs, outputs, computed, strict=True):
        ev.store(ptr, value, out)
    grid = [cdiv(m, bm) * cdiv(n, bn), math.prod(batch), 1]  # no programs when empty
    return frame.finish(grid, replace(config, num_stages=max(config.num_stages, 1)))


def _prologue(
    frame: Frame,
    body: TileBuilder,
    operand: SSAValue,
    batch_index: Sequence[Value | None],
    tile_index: tuple[Value, Value],
    masks: list[Value | None],
) -> Value:
    """A matmul operand's tile that the kernel computes from its inputs (layout ops read
    in place: a transposed or reshaped input is loaded with the index arithmetic)."""
    dims = dims_of(operand)
    batch = dims[:-2]
    offset = len(batch_index) - len(batch)
    index = tuple(None if size == 1 else batch_index[offset + d] for d, size in enumerate(batch))
    block = (shape(tile_index[0])[0], shape(tile_index[1])[1])
    space = Space(dims, (*index, *tile_index), block, masks)
    ev = Evaluator(body, space, dict(frame.pointers), dict(frame.positions))
    value = body.broadcast(ev.at(operand, space.index), block)
    mask = space.mask_for(body, block)
    if mask is not None:  # lanes past the operand's edge are 0 (a splat is not)
        zero = body.constant(0.0, element_type(value.type), block)
        value = body.select(mask, value, zero)
    assert isinstance(operand.type, TensorType)
    return body.convert(value, operand.type.element_type)


def _grouped(
    b: TileBuilder, pid: Value, tiles_m: int, tiles_n: int, group_m: int
) -> tuple[Value, Value]:
    """Program -> (tile row, tile column), ``group_m`` rows at a time (L2 reuse of the rhs)."""
    if tiles_m <= 1 or tiles_n <= 1 or group_m <= 1:
        return b.div(pid, b.index(tiles_n)), b.rem(pid, b.index(tiles_n))
    per_group = group_m * tiles_n
    group = b.div(pid, b.index(per_group))
    first = b.mul(group, b.index(group_m))
    size = b.minimum(b.sub(b.index(tiles_m), first), b.index(group_m))
    within = b.rem(pid, b.index(per_group))
    return b.add(first, b.rem(within, size)), b.div(within, size)


LOWERINGS = {
    "pointwise": lower_pointwise,
    "reduction": lower_reduction,
    "matmul": lower_matmul,
    "attention": lower_attention,
    "attention_backward": lower_attention_backward,
}


def lower_kernel(kernel: schedule.KernelOp, config: BlockConfig = DEFAULT) -> tile.KernelOp:
    """The tile kernel of ``kernel`` with ``config``'s block sizes."""
    return LOWERINGS[kernel_class(kernel)](kernel, config)
