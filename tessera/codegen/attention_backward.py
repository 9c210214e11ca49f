"""The FlashAttention-2 backward kernel of ``graph.attention_backward``: one launch, no atomics.

Program ``(p, b)`` of the grid ``max(query blocks, key blocks) x (k's batch)`` computes

- dk and dv of key block ``p``: its k and v blocks stay in registers while a loop walks
  the query blocks (causal: from the first one that sees the key block), recomputing
  ``pᵀ = exp(scale · k qᵀ - lse)`` and accumulating ``dv += pᵀ do`` and
  ``dk += dsᵀ q`` with ``dsᵀ = pᵀ (v doᵀ - delta)``;
- dq of query block ``p``: a loop over the key blocks (causal: up to the last one its
  rows see) accumulating ``dq += ds k``.

Nothing of size ``[Tq, Tk]`` is stored: the probabilities are recomputed from the
forward's ``lse``, and ``delta = rowsum(do * o)`` comes precomputed (the VJP's row
reduction). With a causal mask the two loops of a program take ``n + 1`` blocks
together whatever ``p`` is, so programs are balanced. With grouped-query attention a
program loops over the query heads of its k/v head (dk and dv sum over them).
The op's masks (segment ids, a sliding window: the loops then walk only the blocks
inside it, the soft cap whose slope scales ``ds``) are those of the forward
(``codegen.attention.Masks``). Accumulators are f32 (f64 for f64 inputs); ``p`` and ``ds`` enter the dots in the input
dtype (tensor cores for bf16/f16), as in FlashAttention-2. Rows past ``Tq`` and keys past
``Tk`` are masked; a query row that sees no key (``lse = -inf``) contributes nothing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from xdsl.dialects.builtin import Float64Type, f32, f64
from xdsl.ir import SSAValue

from tessera.codegen.attention import MAX_HEAD_DIM, grouped_index, head_groups, op_masks
from tessera.codegen.evaluate import dims_of
from tessera.codegen.frame import (
    DEFAULT,
    BlockConfig,
    batch_offset,
    cdiv,
    new_frame,
    next_pow2,
    yielded,
)
from tessera.errors import IRError
from tessera.ir import graph, schedule, tile
from tessera.ir.tile_builder import TileBuilder, Value


def _plus(b: TileBuilder, base: Value | None, offsets: Value) -> Value:
    return offsets if base is None else b.add(base, offsets)


def lower_attention_backward(
    kernel: schedule.KernelOp, config: BlockConfig = DEFAULT
) -> tile.KernelOp:
    """The backward kernel of the ``graph.attention_backward`` in ``kernel`` (see the
    module docstring); ``config.block_m`` query rows and ``config.block_n`` keys per block."""
    op = next(o for o in kernel.body.block.ops if isinstance(o, graph.AttentionBackwardOp))
    frame = new_frame(kernel)
    b = frame.b
    tensors = (op.q, op.k, op.v, op.do, op.lse, op.delta)
    if any(t not in frame.pointers for t in tensors):
        raise IRError(f"@{kernel.kernel_name}: the attention backward's tensors must be kernel inputs")
    q_dims, k_dims, v_dims = dims_of(op.q), dims_of(op.k), dims_of(op.v)
    tq, d = q_dims[-2:]
    tk, dv = k_dims[-2], v_dims[-1]
    if max(d, dv) > MAX_HEAD_DIM:
        raise IRError(
            f"@{kernel.kernel_name}: head dims above {MAX_HEAD_DIM} are not supported by "
            f"the attention kernel, found {d} and {dv}"
        )
    attrs = op.attrs()
    causal, scale = attrs["causal"], attrs["scale"]
    masks = op_masks(kernel, frame, op)
    shift, window = masks.shift, masks.window
    pointers = {t: frame.pointers[t] for t in tensors}
    outputs = dict(zip(yielded(kernel), frame.outputs, strict=True))
    element = op.q.type.element_type  # type: ignore[attr-defined]
    compute = f64 if isinstance(element, Float64Type) else f32
    dot_element = element if compute == f32 else f64

    bm = max(16, min(next_pow2(config.block_m), next_pow2(tq)))
    bn = max(16, min(next_pow2(config.block_n), next_pow2(tk)))
    bd, bdv = max(16, next_pow2(d)), max(16, next_pow2(dv))
    query_blocks, key_blocks = cdiv(tq, bm), cdiv(tk, bn)
    programs = max(query_blocks, key_blocks)
    groups = head_groups(op.q, op.k)

    pid = b.program_id(0)
    kv_batch = k_dims[:-2]
    kv_index = b.unflatten(b.program_id(1), kv_batch) if kv_batch else []
    d_cols = b.expand_dims(b.arange(bd), 0)  # [1, bd]
    d_mask = None if d == bd else b.cmp("lt", d_cols, b.index(d))
    dv_cols = b.expand_dims(b.arange(bdv), 0)  # [1, bdv]
    dv_mask = None if dv == bdv else b.cmp("lt", dv_cols, b.index(dv))
    m_range, n_range = b.arange(bm), b.arange(bn)

    def q_batch(body: TileBuilder, head: Value | None) -> list[Value | None]:
        """q's batch index for query head ``head`` of this program's k/v head."""
        if head is None:
            return grouped_index(body, kv_index, 1)
        index = list(kv_index)
        first = body.mul(index[-1], body.index(groups)) if index[-1] is not None else None
        index[-1] = head if first is None else body.add(first, head)
        return index

    def rows_block(
        body: TileBuilder,
        tensor: SSAValue,
        index: Sequence[Value | None],
        rows: Value,
        row_mask: Value | None,
    ) -> tuple[Value | None, Value, Value | None]:
        """The batch base, element offsets and mask of ``tensor``'s ``rows`` ([n, 1],
        whole padded last dim)."""
        dims = dims_of(tensor)
        width = dims[-1]
        cols, col_mask = (d_cols, d_mask) if width == d else (dv_cols, dv_mask)
        base = batch_offset(body, dims, index)
        offsets = _plus(body, base, body.add(body.mul(rows, body.index(width)), cols))
        return base, offsets, body.and_(row_mask, col_mask)

    def load_rows(
        body: TileBuilder,
        tensor: SSAValue,
        index: Sequence[Value | None],
        rows: Value,
        row_mask: Value | None,
    ) -> Value:
        _, offsets, mask = rows_block(body, tensor, index, rows, row_mask)
        return body.convert(body.load(pointers[tensor], offsets, mask), dot_element)

    def load_statistic(
        body: TileBuilder, tensor: SSAValue, index: Sequence[Value | None], queries: Value, mask: Value | None
    ) -> Value:
        """``lse`` or ``delta`` ([..., Tq]) at ``queries`` ([n, 1] or [1, n])."""
        base = batch_offset(body, (*dims_of(tensor), 1), index)
        return body.load(pointers[tensor], _plus(body, base, queries), mask)

    def visible(
        body: TileBuilder,
        keys: Value,
        queries: Value,
        index: Sequence[Value | None],
        key_mask: Value | None,
        query_mask: Value | None,
    ) -> Value | None:
        """Whether key j is visible to query i (causal: j <= i + q0 - k0; the window; the
        segment ids at ``index``, q's batch index), or None: all are."""
        ids = None
        if masks.segments:
            ids = (
                masks.ids(body, 0, index, queries, query_mask),
                masks.ids(body, 1, index, keys, key_mask),
            )
        return masks.visible(body, queries, keys, ids)

    def shifted(body: TileBuilder, value: Value, plus: int) -> Value:
        """``value - (q0 - k0) + plus``: a key position as a query position."""
        value = value if shift is None else body.sub(value, shift)
        return body.add(value, body.index(plus)) if plus else value

    def clamp(body: TileBuilder, value: Value, upper: int) -> Value:
        return body.minimum(body.maximum(value, body.index(0)), body.index(upper))

    def masked(body: TileBuilder, x: Value, mask: Value | None) -> Value:
        return x if mask is None else body.select(mask, x, body.constant(0.0, compute))

    # --- dk, dv of key block ``pid`` ---------------------------------------------------------
    key_start = b.mul(pid, b.index(bn))
    key_rows = b.add(key_start, b.expand_dims(n_range, 1))  # [bn, 1]
    key_mask = None if programs * bn == tk else b.cmp("lt", key_rows, b.index(tk))
    k_block = load_rows(b, op.k, kv_index, key_rows, key_mask)  # [bn, bd]
    v_block = load_rows(b, op.v, kv_index, key_rows, key_mask)  # [bn, bdv]
    first_query = b.index(0)
    if causal or window:  # the first query that sees key key_start, aligned down to a block
        seen_from = shifted(b, key_start, 0 if causal else 1 - window)
        first_query = b.mul(b.div(clamp(b, seen_from, tq), b.index(bm)), b.index(bm))
    last_query = b.index(tq)
    if window:  # queries past the window of the block's last key see none of it
        last_query = clamp(b, shifted(b, key_start, bn - 1 + window), tq)
    if programs > key_blocks:  # programs past the last key block: no query loop
        last_query = b.select(b.cmp("lt", pid, b.index(key_blocks)), last_query, first_query)

    def query_step(
        body: TileBuilder, start: Value, index: Sequence[Value | None], dk: Value, dv_acc: Value
    ) -> list[Value]:
        """One query block's contribution to dk and dv (transposed: keys along rows)."""
        queries = body.add(start, m_range)
        q_rows, q_cols = body.expand_dims(queries, 1), body.expand_dims(queries, 0)
        row_mask = None if tq % bm == 0 else body.cmp("lt", q_rows, body.index(tq))
        col_mask = None if tq % bm == 0 else body.cmp("lt", q_cols, body.index(tq))
        q = load_rows(body, op.q, index, q_rows, row_mask)  # [bm, bd]
        do = load_rows(body, op.do, index, q_rows, row_mask)  # [bm, bdv]
        lse = load_statistic(body, op.lse, index, q_cols, col_mask)  # [1, bm]
        delta = load_statistic(body, op.delta, index, q_cols, col_mask)
        zero = body.constant(0.0, compute, (bn, bm))
        s_t = body.mul(body.dot(k_block, body.trans(q), zero), body.constant(scale))
        s_t, slope_t = masks.cap(body, s_t)
        valid = body.and_(key_mask, col_mask)
        valid = body.and_(valid, visible(body, key_rows, q_cols, index, key_mask, col_mask))
        p_t = masked(body, body.exp(body.sub(s_t, lse)), valid)  # [bn, bm]
        dv_new = body.dot(body.convert(p_t, dot_element), do, dv_acc)
        dp_t = body.dot(v_block, body.trans(do), zero)  # v doᵀ: [bn, bm]
        ds_t = body.mul(p_t, body.sub(dp_t, delta))
        if slope_t is not None:
            ds_t = body.mul(ds_t, slope_t)
        dk_new = body.dot(body.convert(ds_t, dot_element), q, dk)
        return [dk_new, dv_new]

    def query_loop(body: TileBuilder, head: Value | None, carried: list[Value]) -> list[Value]:
        index = q_batch(body, head)
        loop, inner, start, (dk, dv_acc) = body.for_loop(
            first_query, last_query, body.index(bm), carried
        )
        inner.yield_(query_step(inner, start, index, dk, dv_acc))
        return list(loop.results)

    carried = [b.constant(0.0, compute, (bn, bd)), b.constant(0.0, compute, (bn, bdv))]
    if groups == 1:
        dk_final, dv_final = query_loop(b, None, carried)
    else:  # grouped-query attention: every query head of this k/v head
        heads, body, head, inner_carried = b.for_loop(
            b.index(0), b.index(groups), b.index(1), carried
        )
        body.yield_(query_loop(body, head, inner_carried))
        dk_final, dv_final = heads.results

    dk_out = b.convert(b.mul(dk_final, b.constant(scale)), op.dk.type.element_type)  # type: ignore[attr-defined]
    dv_out = b.convert(dv_final, op.dv.type.element_type)  # type: ignore[attr-defined]
    for tensor, result, value in ((op.k, op.dk, dk_out), (op.v, op.dv, dv_out)):
        _, offsets, mask = rows_block(b, tensor, kv_index, key_rows, key_mask)
        b.store(outputs[result], offsets, value, mask)

    # --- dq of query block ``pid`` ------------------------------------------------------------
    query_start = b.mul(pid, b.index(bm))
    rows = b.add(query_start, b.expand_dims(m_range, 1))  # [bm, 1]
    row_mask = None if programs * bm == tq else b.cmp("lt", rows, b.index(tq))
    last_key, first_key = b.index(tk), b.index(0)
    seen = query_start if shift is None else b.add(query_start, shift)
    if causal:  # keys past the block's last row's last visible key are all masked
        last_key = clamp(b, b.add(seen, b.index(bm)), tk)
    elif window:
        last_key = clamp(b, b.add(seen, b.index(bm - 1 + window)), tk)
    if window:  # keys before the first row's window, aligned down to a block
        first_key = b.add(seen, b.index(1 - window))
        first_key = b.mul(b.div(clamp(b, first_key, tk), b.index(bn)), b.index(bn))
    if programs > query_blocks:
        last_key = b.select(b.cmp("lt", pid, b.index(query_blocks)), last_key, b.index(0))

    def dq_for(body: TileBuilder, head: Value | None) -> None:
        """dq of this query block for one query head, stored."""
        index = q_batch(body, head)
        q = load_rows(body, op.q, index, rows, row_mask)  # [bm, bd]
        do = load_rows(body, op.do, index, rows, row_mask)  # [bm, bdv]
        lse = load_statistic(body, op.lse, index, rows, row_mask)  # [bm, 1]
        delta = load_statistic(body, op.delta, index, rows, row_mask)
        zero = body.constant(0.0, compute, (bm, bn))
        loop, inner, start, (dq,) = body.for_loop(
            first_key, last_key, body.index(bn), [body.constant(0.0, compute, (bm, bd))]
        )
        keys = inner.add(start, n_range)
        k_rows, k_cols = inner.expand_dims(keys, 1), inner.expand_dims(keys, 0)
        k_row_mask = None if tk % bn == 0 else inner.cmp("lt", k_rows, inner.index(tk))
        k_col_mask = None if tk % bn == 0 else inner.cmp("lt", k_cols, inner.index(tk))
        k = load_rows(inner, op.k, kv_index, k_rows, k_row_mask)  # [bn, bd]
        v = load_rows(inner, op.v, kv_index, k_rows, k_row_mask)  # [bn, bdv]
        s = inner.mul(inner.dot(q, inner.trans(k), zero), inner.constant(scale))
        s, slope = masks.cap(inner, s)
        valid = inner.and_(row_mask, k_col_mask)
        valid = inner.and_(valid, visible(inner, k_cols, rows, index, k_col_mask, row_mask))
        p = masked(inner, inner.exp(inner.sub(s, lse)), valid)  # [bm, bn]
        dp = inner.dot(do, inner.trans(v), zero)  # do vᵀ
        ds = inner.mul(p, inner.sub(dp, delta))
        if slope is not None:
            ds = inner.mul(ds, slope)
        inner.yield_([inner.dot(inner.convert(ds, dot_element), k, dq)])
        dq_final = body.mul(loop.results[0], body.constant(scale))
        _, offsets, mask = rows_block(body, op.q, index, rows, row_mask)
        body.store(outputs[op.dq], offsets, body.convert(dq_final, element), mask)

    if groups == 1:
        dq_for(b, None)
    else:
        _, body, head, _ = b.for_loop(b.index(0), b.index(groups), b.index(1), [])
        dq_for(body, head)
        body.yield_([])
    grid = [programs, math.prod(kv_batch), 1]  # no programs when empty
    return frame.finish(grid, config)
