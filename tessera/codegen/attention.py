"""Flash attention: one kernel for ``softmax(score(q kᵀ)) v`` (FlashAttention-2 forward).

Two sources make the same kernel (:func:`flash_forward`): the ``graph.attention`` op
(:func:`lower_attention_op`: scores ``scale · q kᵀ``, a causal mask shifted by the op's
position offsets ``q0 - k0``, evaluated in the kernel, and the per-row log-sum-exp stored
next to the output; its backward is ``codegen.attention_backward``), and the pattern
that hand-written attention forms.

The pattern (:func:`find_attention`, on a function's graph ops)::

    kt = graph.transpose k            (optional: k's last two dims swapped; else kt is an input)
    s0 = graph.matmul q, kt           [..., Tq, Tk]
    s1 = <elementwise score op> s0    (zero or more: a scale, graph.select(mask, s, fill),
    ...                                an additive bias; the other operand is any value that
    sn = ...                           broadcasts to the scores: a constant or a kernel input)
    p0 = graph.softmax sn             (over the last axis)
    p  = graph.cast p0                (optional)
    o  = graph.matmul p, v            [..., Tq, Dv]

where every intermediate has exactly one use. The grouping pass
(``lower-graph-to-schedule``) makes each match one ``attention`` kernel, and
:func:`lower_attention` lowers it without materialising the scores:

- one program per (block of ``block_m`` query rows, batch index); the q block stays in
  registers, and an ``scf.for`` walks the keys ``block_n`` at a time;
- each scores block is ``tile.dot(q, kᵀ)`` (operands in the input dtype, f32
  accumulation; all of it in f64 for f64 inputs); the score ops are evaluated on it by the :class:`Evaluator` (index:
  batch scalars, query rows ``[BM, 1]``, key columns ``[1, BN]``), so any scale, mask or
  bias works; keys beyond ``Tk`` become ``-inf``;
- the online softmax keeps a running row max ``m``, row sum ``l`` and an f32
  accumulator ``[BM, BLOCK_DV]``, rescaled by ``exp(m_old - m_new)``; the probabilities
  are converted to v's dtype for the second ``tile.dot``; a row whose max is still
  ``-inf`` (every key masked so far) uses 0 as its max, so nothing becomes NaN, and a
  row without any visible key stores 0 (as ``torch``'s scaled_dot_product_attention);
- *causal*: a mask constant equal to ``np.tril(ones((Tq, Tk)))`` (query i sees keys
  j <= i; as ``graph.select(mask, s, fill)`` or as an additive ``0 / fill`` constant) is
  not loaded but computed from the indices, and when the masked scores are so negative
  that ``exp`` of them is 0 (``fill`` <= -1e4 after the later score ops), the key loop
  stops at the diagonal block. With the op's offsets (query i sees key j iff
  ``i + q0 - k0 >= j``, known only at run time) the loop bounds are computed the same
  way from the shift: blocks every row sees, then the diagonal blocks, masked;
- the op's ``lse`` is ``max + log(sum)`` per row, ``-inf`` for a row that saw no key;
- the op's masks (:class:`Masks`): the soft cap on every block; segment ids (loaded per
  block) and a sliding window mask every block, and the loop walks only the key blocks
  inside the window of the program's rows.

Block sizes come from the ``BlockConfig``: ``block_m`` query rows and ``block_n`` keys
per step (each at least 16, as ``tile.dot`` needs); the head dims are padded to powers
of two (masked).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np
from xdsl.dialects import math as mathd
from xdsl.dialects.builtin import DenseIntOrFPElementsAttr, Float64Type, f32, f64
from xdsl.ir import Attribute, Operation, SSAValue

from tessera.codegen.evaluate import Evaluator, Space, dims_of
from tessera.codegen.frame import (
    DEFAULT,
    BlockConfig,
    Frame,
    batch_offset,
    cdiv,
    new_frame,
    next_pow2,
    yielded,
)
from tessera.errors import IRError
from tessera.ir import graph, schedule, tile
from tessera.ir.tile_builder import TileBuilder, Value, shape
from tessera.opdefs import Fusion, fusion_of

MAX_SCORE_OPS = 16  # elementwise ops between q kᵀ and the softmax
MAX_HEAD_DIM = 256  # q/k and v head dims one program holds in registers
NEGLIGIBLE = -1e4  # a score at most this (after the score ops) has exp(score - max) == 0


@dataclass(frozen=True)
class CausalMask:
    """A causal mask among the score ops, computed from indices instead of loaded."""

    value: SSAValue  # the mask constant (i1 for a select, float for an additive mask)
    additive: bool  # graph.add(s, mask) with 0 on and below the diagonal, ``fill`` above
    fill: float  # the additive mask's value above the diagonal
    skip: bool  # keys past the diagonal contribute exactly 0: stop the loop there


@dataclass(frozen=True)
class Attention:
    """A matched ``softmax(score(q kᵀ)) v``."""

    ops: tuple[Operation, ...]  # the pattern's ops in program order
    q: SSAValue  # [..., Tq, D]
    k: SSAValue  # [..., Tk, D], or kᵀ [..., D, Tk] when ``k_transposed``
    v: SSAValue  # [..., Tk, Dv]
    k_transposed: bool  # the kernel reads kᵀ as given (no graph.transpose in the pattern)
    scores: SSAValue  # q kᵀ
    score_ops: tuple[Operation, ...]  # elementwise ops from the scores to the softmax input
    softmax: graph.SoftmaxOp
    output: SSAValue  # softmax(...) @ v
    causal_mask: CausalMask | None = None

    @property
    def causal(self) -> bool:
        return self.causal_mask is not None


# --- pattern matching ------------------------------------------------------------------------


def _is_splat_constant(value: SSAValue) -> bool:
    owner = value.owner
    return isinstance(owner, graph.ConstantOp) and len(set(owner.value.get_values())) == 1


def _broadcasts_into(dims: Sequence[int], into: Sequence[int]) -> bool:
    if len(dims) > len(into):
        return False
    return all(s in (1, t) for s, t in zip(reversed(dims), reversed(into), strict=False))


def _chain_operands(op: Operation) -> Sequence[int]:
    """Operand positions through which the scores may flow into an elementwise op."""
    return (1, 2) if isinstance(op, graph.SelectOp) else range(len(op.operands))


def _trace_scores(value: SSAValue, depth: int) -> tuple[graph.MatmulOp, list[Operation]] | None:
    """The matmul producing ``value`` through single-use elementwise ops, and those ops."""
    if not value.has_one_use():
        return None
    owner = value.owner
    if isinstance(owner, graph.MatmulOp):
        return owner, []
    if depth == 0 or not isinstance(owner, Operation) or fusion_of(owner) is not Fusion.ELEMENTWISE:
        return None
    for position in _chain_operands(owner):
        found = _trace_scores(owner.operands[position], depth - 1)
        if found is not None:
            return found[0], [*found[1], owner]
    return None


def _chain_input(op: Operation, previous: SSAValue) -> int:
    return next(i for i, v in enumerate(op.operands) if v is previous)


def _match(softmax: graph.SoftmaxOp) -> Attention | None:
    """The attention pattern around ``softmax``, or None."""
    x = softmax.operands[0]
    rank = len(dims_of(x))
    if softmax.attrs()["axis"] % rank != rank - 1 or not softmax.results[0].has_one_use():
        return None
    p = softmax.results[0]
    user = p.get_user_of_unique_use()
    cast = None
    if isinstance(user, graph.CastOp):
        cast, p = user, user.results[0]
        if not p.has_one_use():
            return None
        user = p.get_user_of_unique_use()
    if not isinstance(user, graph.MatmulOp) or user.lhs is not p or user.rhs is p:
        return None
    pv, v = user, user.rhs
    traced = _trace_scores(x, MAX_SCORE_OPS)
    if traced is None:
        return None
    qk, score_ops = traced
    scores = qk.results[0]
    score_dims = dims_of(scores)
    previous = scores
    for op in score_ops:  # each keeps the scores' shape; the others broadcast into it
        if dims_of(op.results[0]) != score_dims:
            return None
        chain = _chain_input(op, previous)
        for i, operand in enumerate(op.operands):
            if i != chain and not _broadcasts_into(dims_of(operand), score_dims):
                return None
        previous = op.results[0]
    q, kt = qk.lhs, qk.rhs
    transpose = kt.owner
    perm = transpose.attrs()["perm"] if isinstance(transpose, graph.TransposeOp) else None
    rank_k = len(dims_of(kt))
    if (
        perm is not None
        and kt.has_one_use()
        and tuple(perm) == (*range(rank_k - 2), rank_k - 1, rank_k - 2)
    ):
        k, k_transposed = transpose.operands[0], False
    else:
        k, k_transposed, transpose = kt, True, None
    if any(_is_splat_constant(t) for t in (q, k, v)):
        return None
    if max(dims_of(q)[-1], dims_of(v)[-1]) > MAX_HEAD_DIM:
        return None
    ops = [op for op in (transpose, qk, *score_ops, softmax, cast, pv) if op is not None]
    return Attention(
        tuple(ops), q, k, v, k_transposed, scores, tuple(score_ops), softmax, pv.results[0]
    )


def _find(ops: Sequence[Operation]) -> list[Attention]:
    members = set(ops)
    out = []
    for op in ops:
        if isinstance(op, graph.SoftmaxOp):
            found = _match(op)
            if found is not None and all(o in members for o in found.ops):
                out.append(found)
    return out


def find_attention(ops: Sequence[Operation]) -> list[list[Operation]]:
    """Groups of graph ops forming softmax(q kᵀ) v, to become one kernel each.

    Only non-constant ops are returned (the grouping pass copies constants into each
    kernel that uses them); each group is in the program order of ``ops``.
    """
    index = {op: i for i, op in enumerate(ops)}
    return [sorted(found.ops, key=index.__getitem__) for found in _find(ops)]


def match_attention(kernel: schedule.KernelOp) -> Attention | None:
    """The attention pattern when it is the whole body of ``kernel`` (plus constants)."""
    ops = [o for o in kernel.body.block.ops if not isinstance(o, schedule.YieldOp)]
    if not any(isinstance(o, graph.SoftmaxOp) for o in ops):
        return None
    found = _find(ops)
    if len(found) != 1:
        return None
    pattern = found[0]
    if set(pattern.ops) != {o for o in ops if not isinstance(o, graph.ConstantOp)}:
        return None
    if yielded(kernel) != [pattern.output]:
        return None
    return replace(pattern, causal_mask=_causal_mask(pattern))


# --- causal masks ----------------------------------------------------------------------------


@functools.lru_cache(maxsize=16)
def _dense_values(attr: DenseIntOrFPElementsAttr) -> np.ndarray:
    """A constant's values (cached: a kernel is matched again for each lowering)."""
    values = attr.get_values()
    dtype = np.float64 if isinstance(values[0], float) else np.int64
    out = np.fromiter(values, dtype=dtype, count=len(values))
    out.flags.writeable = False
    return out


def _constant_array(value: SSAValue) -> np.ndarray | None:
    owner = value.owner
    if not isinstance(owner, graph.ConstantOp):
        return None
    values = _dense_values(owner.value)
    dims = dims_of(value)
    return np.broadcast_to(values.reshape(()), dims) if values.size == 1 else values.reshape(dims)


def _scalar(value: SSAValue) -> float | None:
    if not _is_splat_constant(value):
        return None
    return float(value.owner.value.get_values()[0])  # type: ignore[union-attr]


def _is_causal_layout(value: SSAValue, tq: int, tk: int) -> bool:
    dims = dims_of(value)
    return len(dims) >= 2 and dims[-2:] == (tq, tk) and math.prod(dims) == tq * tk


def _propagate(value: float, ops: Sequence[Operation], previous: SSAValue) -> float | None:
    """``value`` as a score through the later score ops (scalar ones only), else None."""
    with np.errstate(all="ignore"):
        x = np.float64(value)
        for op in ops:
            chain = _chain_input(op, previous)
            previous = op.results[0]
            if isinstance(op, graph.CastOp):
                continue
            if isinstance(op, graph.NegOp):
                x = -x
                continue
            if not isinstance(op, graph.AddOp | graph.SubOp | graph.MulOp | graph.DivOp):
                return None
            other = _scalar(op.operands[1 - chain])
            if other is None:
                return None
            a, b = (x, np.float64(other)) if chain == 0 else (np.float64(other), x)
            if isinstance(op, graph.AddOp):
                x = a + b
            elif isinstance(op, graph.SubOp):
                x = a - b
            elif isinstance(op, graph.MulOp):
                x = a * b
            else:
                x = a / b
    return float(x)


def _causal_mask(pattern: Attention) -> CausalMask | None:
    """The first score op masking with ``np.tril(ones((Tq, Tk)))``, if any."""
    tq, tk = dims_of(pattern.scores)[-2:]
    tril = np.tril(np.ones((tq, tk), dtype=bool))
    previous = pattern.scores
    for i, op in enumerate(pattern.score_ops):
        chain = _chain_input(op, previous)
        previous = op.results[0]
        mask: SSAValue | None = None
        fill: float | None = None
        additive = False
        if isinstance(op, graph.SelectOp) and chain == 1:
            cond = op.operands[0]
            array = _constant_array(cond)
            if (
                array is not None
                and _is_causal_layout(cond, tq, tk)
                and np.array_equal(array.reshape(tq, tk) != 0, tril)
            ):
                mask, fill = cond, _scalar(op.operands[2])
        elif isinstance(op, graph.AddOp):
            other = op.operands[1 - chain]
            array = _constant_array(other)
            if array is not None and _is_causal_layout(other, tq, tk):
                array = array.reshape(tq, tk).astype(np.float64)
                above = np.unique(array[~tril])
                if np.all(array[tril] == 0) and above.size == 1:
                    mask, fill, additive = other, float(above[0]), True
        if mask is None:
            continue
        later = (
            None if fill is None else _propagate(fill, pattern.score_ops[i + 1 :], op.results[0])
        )
        skip = later is not None and later <= NEGLIGIBLE
        return CausalMask(mask, additive, fill if fill is not None else 0.0, skip)
    return None


# --- lowering --------------------------------------------------------------------------------


def _plus(b: TileBuilder, base: Value | None, offsets: Value) -> Value:
    return offsets if base is None else b.add(base, offsets)


@dataclass(frozen=True)
class KeyBlock:
    """One step of the key loop, as a score function sees it."""

    body: TileBuilder
    qk: Value  # q kᵀ for this block: [bm, bn] in the compute type
    rows: Value  # query indices [bm, 1]
    cols: Value  # key indices [1, bn]
    row_mask: Value | None  # rows < Tq (None: all)
    col_mask: Value | None  # cols < Tk (None: all)
    batch_index: Sequence[Value | None]  # this program's batch index (q's batch dims)
    diagonal: bool  # a block a causal mask cuts (else every key of it is visible)


ScoreFn = Callable[[KeyBlock], Value]
"""The scores of one key block (``[bm, bn]``, compute type) from ``q kᵀ``; on a
diagonal block of a causal kernel the masked scores are ``-inf`` (or so negative that
``exp`` of them is 0)."""


@dataclass(frozen=True)
class FlashForward:
    """A FlashAttention-2 forward kernel, from the pattern or from ``graph.attention``."""

    q: SSAValue  # [..., Tq, D], a kernel input
    k: SSAValue  # [..., Tk, D], or kᵀ [..., D, Tk] when ``k_transposed``
    v: SSAValue  # [..., Tk, Dv]
    k_transposed: bool
    out_dims: tuple[int, ...]  # [..., Tq, Dv]: the grid is its query blocks x batch
    groups: int  # query heads per k/v head (grouped-query attention; else 1)
    scores: ScoreFn
    causal: bool  # keys past the diagonal contribute nothing: the key loop stops there
    shift: Value | None  # q0 - k0 of the causal mask (i32; None: 0, known when compiling)
    output: Value  # pointer of the output
    lse: Value | None  # pointer of the per-row log-sum-exp, if the kernel stores it
    window: int = 0  # a sliding window (|i + shift - j| < window): keys before it are skipped
    everywhere: bool = False  # every key block takes the mask (window, segment ids)


def grouped_index(
    b: TileBuilder, batch_index: Sequence[Value | None], groups: int
) -> list[Value | None]:
    """The batch index of k and v for a program at q's ``batch_index``: the heads (the
    last batch dim) divided by the group size of grouped-query attention."""
    index = list(batch_index)
    if groups > 1 and index and index[-1] is not None:
        index[-1] = b.div(index[-1], b.index(groups))
    return index


def lower_attention(kernel: schedule.KernelOp, config: BlockConfig = DEFAULT) -> tile.KernelOp:
    """The FlashAttention-2 forward kernel of an attention ``kernel``: the matched
    pattern (see the module docstring) or a ``graph.attention`` op (see
    :func:`lower_attention_op`)."""
    if any(isinstance(o, graph.AttentionOp) for o in kernel.body.block.ops):
        return lower_attention_op(kernel, config)
    att = match_attention(kernel)
    if att is None:
        raise IRError(f"@{kernel.kernel_name}: not an attention kernel")
    frame = new_frame(kernel)
    for operand in (att.q, att.k, att.v):
        if operand not in frame.pointers:
            raise IRError(f"@{kernel.kernel_name}: q, k and v must be kernel inputs")
    causal = att.causal_mask
    score_dims = dims_of(att.scores)
    logits = att.softmax.operands[0]

    def scores(block: KeyBlock) -> Value:
        """The score ops on this block, evaluated at (batch, rows, cols). Off the
        diagonal of a causal mask every key is visible, so no mask is computed there."""
        body = block.body
        score_batch = block.batch_index[len(block.batch_index) - (len(score_dims) - 2) :]
        space = Space(
            score_dims,
            (*score_batch, block.rows, block.cols),
            shape(block.qk),
            [block.row_mask, block.col_mask],
        )
        ev = Evaluator(body, space, dict(frame.pointers), dict(frame.positions))
        ev.bound[att.scores] = block.qk
        if causal is not None:
            if block.diagonal:
                visible = body.cmp("le", block.cols, block.rows)  # [bm, bn]
                ev.bound[causal.value] = (
                    body.select(visible, body.constant(0.0), body.constant(causal.fill))
                    if causal.additive
                    else visible
                )
            else:  # the masking op passes the scores through
                masking = next(u.operation for u in causal.value.uses if u.operation in att.ops)
                kept = (
                    masking.operands[1]
                    if isinstance(masking, graph.SelectOp)
                    else next(o for o in masking.operands if o is not causal.value)
                )
                ev.bound[masking.results[0]] = ev.at(kept, ev.full_index(kept))
        return ev.at(logits, ev.full_index(logits))

    spec = FlashForward(
        att.q, att.k, att.v, att.k_transposed, dims_of(att.output), 1, scores,
        causal=causal is not None and causal.skip, shift=None,
        output=frame.outputs[0], lse=None,
    )  # fmt: skip
    return flash_forward(frame, spec, config)


def lower_attention_op(kernel: schedule.KernelOp, config: BlockConfig = DEFAULT) -> tile.KernelOp:
    """The forward kernel of ``graph.attention``: scores ``scale · q kᵀ``, the causal
    mask computed from the indices and the position offsets (``q0 + i >= k0 + j``), the
    key loop stopping at the diagonal, and the log-sum-exp stored next to the output.
    The offsets are evaluated in the kernel (a kernel input, or the rank's offset that
    ``shard-partition`` computes from its position in the mesh)."""
    op = next(o for o in kernel.body.block.ops if isinstance(o, graph.AttentionOp))
    frame = new_frame(kernel)
    for operand in (op.q, op.k, op.v):
        if operand not in frame.pointers:
            raise IRError(f"@{kernel.kernel_name}: q, k and v must be kernel inputs")
    if max(dims_of(op.q)[-1], dims_of(op.v)[-1]) > MAX_HEAD_DIM:
        raise IRError(
            f"@{kernel.kernel_name}: head dims above {MAX_HEAD_DIM} are not supported by "
            f"the attention kernel, found {dims_of(op.q)[-1]} and {dims_of(op.v)[-1]}"
        )
    attrs = op.attrs()
    causal, scale = attrs["causal"], attrs["scale"]
    masks = op_masks(kernel, frame, op)
    outputs = dict(zip(yielded(kernel), frame.outputs, strict=True))

    def scores(block: KeyBlock) -> Value:
        body, index = block.body, block.batch_index
        s, _ = masks.cap(body, body.mul(block.qk, body.constant(scale)))
        if block.diagonal or masks.everywhere:
            ids = None
            if masks.segments:
                ids = (
                    masks.ids(body, 0, index, block.rows, block.row_mask),
                    masks.ids(body, 1, index, block.cols, block.col_mask),
                )
            seen = masks.visible(body, block.rows, block.cols, ids)
            if seen is not None:
                s = body.select(seen, s, body.constant(float("-inf")))
        return s

    spec = FlashForward(
        op.q, op.k, op.v, False, dims_of(op.output), head_groups(op.q, op.k), scores,
        causal=causal, shift=masks.shift, output=outputs[op.output], lse=outputs.get(op.lse),
        window=masks.window, everywhere=masks.everywhere,
    )  # fmt: skip
    return flash_forward(frame, spec, config)


@dataclass(frozen=True)
class Masks:
    """The masks of a ``graph.attention(_backward)`` op in its kernel: causal and the
    sliding window by position (``shift = q0 - k0``), segment ids loaded per block, and the
    soft cap."""

    causal: bool
    window: int  # 0: none
    softcap: float  # 0: none
    shift: Value | None  # q0 - k0 (i32; None: 0)
    segments: tuple[SSAValue, ...]  # the query and key segment ids, or ()
    frame: Frame
    heads: bool  # q has a head dim (the ids' batch index drops it)

    @property
    def everywhere(self) -> bool:
        """Whether every key block needs the mask (not only those a causal mask cuts)."""
        return bool(self.window or self.segments)

    def cap(self, b: TileBuilder, s: Value) -> tuple[Value, Value | None]:
        """``softcap · tanh(s / softcap)`` and its derivative by ``s`` (None: no cap)."""
        if not self.softcap:
            return s, None
        t = b.math(mathd.TanhOp, b.div(s, b.constant(self.softcap)))
        slope = b.sub(b.constant(1.0), b.mul(t, t))
        return b.mul(t, b.constant(self.softcap)), slope

    def ids(
        self,
        b: TileBuilder,
        which: int,
        batch_index: Sequence[Value | None],
        positions: Value,
        mask: Value | None,
    ) -> Value:
        """Segment ids (0: the queries', 1: the keys') at ``positions`` ([n, 1] or [1, n])
        for a program at q's ``batch_index``."""
        value = self.segments[which]
        dims = dims_of(value)
        index = list(batch_index)[:-1] if self.heads else list(batch_index)
        block = shape(positions)
        space = Space(
            dims,
            (*index[len(index) - len(dims) + 1 :], positions),
            block,
            [mask if size > 1 else None for size in block],
        )
        ev = Evaluator(b, space, dict(self.frame.pointers), dict(self.frame.positions))
        return ev.at(value, ev.full_index(value))

    def visible(
        self, b: TileBuilder, rows: Value, cols: Value, ids: tuple[Value, Value] | None
    ) -> Value | None:
        """Whether query ``rows`` sees key ``cols`` (broadcast), or None: all."""
        seen = rows if self.shift is None else b.add(rows, self.shift)
        out = b.cmp("le", cols, seen) if self.causal else None
        if self.window:
            out = b.and_(out, b.cmp("lt", b.sub(seen, cols), b.index(self.window)))
            if not self.causal:
                out = b.and_(out, b.cmp("lt", b.sub(cols, seen), b.index(self.window)))
        if ids is not None:
            out = b.and_(out, b.cmp("eq", ids[0], ids[1]))
        return out


def op_masks(
    kernel: schedule.KernelOp, frame: Frame, op: graph.AttentionOp | graph.AttentionBackwardOp
) -> Masks:
    """The :class:`Masks` of ``op`` in ``kernel``."""
    attrs = op.attrs()
    causal, window = attrs["causal"], attrs.get("window", 0)
    shift = causal_shift(kernel, frame, op) if causal or window else None
    return Masks(
        causal, window, attrs.get("softcap", 0.0), shift, op.segment_ids, frame,
        len(dims_of(op.q)) > 2,
    )  # fmt: skip


def head_groups(q: SSAValue, k: SSAValue) -> int:
    """Query heads per k/v head: 1, or more for grouped-query attention."""
    q_dims, k_dims = dims_of(q), dims_of(k)
    if len(q_dims) < 3 or not k_dims[-3]:
        return 1
    return q_dims[-3] // k_dims[-3]


def causal_shift(
    kernel: schedule.KernelOp, frame: Frame, op: graph.AttentionOp | graph.AttentionBackwardOp
) -> Value | None:
    """``q0 - k0`` (an i32 scalar) of a causal attention op from its position operands;
    None without them. The kernels mask in natural order: an op still stored in zig-zag
    order (``unzigzag-attention`` not run) is an error."""
    if op.attrs().get("zigzag"):
        raise IRError(
            f"@{kernel.kernel_name}: the kernel masks in natural order; run "
            f"unzigzag-attention on attention stored in zig-zag order first"
        )
    if not op.positions:
        return None
    ev = frame.evaluator(Space((), (), (), []))
    q0, k0 = (ev.at(p, ()) for p in op.positions)
    return frame.b.sub(q0, k0)


def flash_forward(frame: Frame, spec: FlashForward, config: BlockConfig) -> tile.KernelOp:
    """Builds the forward kernel of ``spec`` in ``frame`` (see the module docstring)."""
    b = frame.b
    q_dims, k_dims, v_dims = dims_of(spec.q), dims_of(spec.k), dims_of(spec.v)
    out_dims = spec.out_dims
    batch = out_dims[:-2]
    tq, d = q_dims[-2:]
    tk = k_dims[-1] if spec.k_transposed else k_dims[-2]
    dv = v_dims[-1]
    bm = max(16, min(next_pow2(config.block_m), next_pow2(tq)))
    bn = max(16, min(next_pow2(config.block_n), next_pow2(tk)))
    bd, bdv = max(16, next_pow2(d)), max(16, next_pow2(dv))
    element = {v: v.type.element_type for v in (spec.q, spec.k, spec.v)}  # type: ignore[attr-defined]
    # scores, softmax statistics and the output accumulate in f32, or f64 for f64 inputs
    compute = f64 if any(isinstance(e, Float64Type) for e in element.values()) else f32
    dot_element = element[spec.q] if element[spec.q] == element[spec.k] else compute
    pv_element = element[spec.v] if compute == f32 else f64

    pid_m = b.program_id(0)
    batch_index = b.unflatten(b.program_id(1), batch) if batch else []
    kv_index = grouped_index(b, batch_index, spec.groups)
    rows = b.add(b.mul(pid_m, b.index(bm)), b.expand_dims(b.arange(bm), 1))  # [bm, 1]
    row_mask = None if tq % bm == 0 else b.cmp("lt", rows, b.index(tq))
    d_cols = b.expand_dims(b.arange(bd), 0)  # [1, bd]
    d_mask = None if d == bd else b.cmp("lt", d_cols, b.index(d))
    d_rows = b.expand_dims(b.arange(bd), 1)  # [bd, 1]
    d_row_mask = None if d == bd else b.cmp("lt", d_rows, b.index(d))
    dv_cols = b.expand_dims(b.arange(bdv), 0)  # [1, bdv]
    dv_mask = None if dv == bdv else b.cmp("lt", dv_cols, b.index(dv))
    key_range = b.arange(bn)

    bases: dict[tuple[tuple[int, ...], bool], Value | None] = {}

    def base(dims: tuple[int, ...], kv: bool = False) -> Value | None:
        """This program's batch offset in a tensor of ``dims`` (once per shape)."""
        if (dims, kv) not in bases:
            bases[dims, kv] = batch_offset(b, dims, kv_index if kv else batch_index)
        return bases[dims, kv]

    q_offsets = _plus(b, base(q_dims), b.add(b.mul(rows, b.index(d)), d_cols))
    q_block = b.convert(
        b.load(frame.pointers[spec.q], q_offsets, b.and_(row_mask, d_mask)), dot_element
    )
    k_base, v_base = base(k_dims, True), base(v_dims, True)
    # kᵀ [bd, bn]: head dim along rows (kᵀ given: stride tk; k given: stride 1)
    k_rows = _plus(b, k_base, d_rows if not spec.k_transposed else b.mul(d_rows, b.index(tk)))

    # a splat of a scalar -inf: xDSL re-parses a dense<0xff800000> block constant wrongly
    m0 = b.broadcast(b.constant(float("-inf"), compute), (bm, 1))
    l0 = b.constant(0.0, compute, (bm, 1))
    acc0 = b.constant(0.0, compute, (bm, bdv))

    def key_block(
        body: TileBuilder, start: Value, m_i: Value, l_i: Value, acc: Value, diagonal: bool
    ) -> list[Value]:
        """One block of ``bn`` keys: scores, online-softmax update, ``p @ v``."""
        keys = body.add(key_range, start)  # [bn]
        cols = body.expand_dims(keys, 0)  # [1, bn]
        col_mask = None if tk % bn == 0 else body.cmp("lt", cols, body.index(tk))
        k_cols = cols if spec.k_transposed else body.mul(cols, body.index(d))
        kt_block = body.load(
            frame.pointers[spec.k], body.add(k_rows, k_cols), body.and_(d_row_mask, col_mask)
        )
        qk = body.dot(
            q_block, body.convert(kt_block, dot_element), body.constant(0.0, compute, (bm, bn))
        )
        block = KeyBlock(body, qk, rows, cols, row_mask, col_mask, batch_index, diagonal)
        s = body.convert(spec.scores(block), compute)
        s = body.broadcast(s, (bm, bn)) if shape(s) != (bm, bn) else s
        neg_inf = body.constant(float("-inf"))
        if col_mask is not None:
            s = body.select(col_mask, s, neg_inf)
        # online softmax
        m_new = body.maximum(m_i, body.reduce(s, "max", 1))  # [bm, 1]
        m_safe = body.select(body.cmp("eq", m_new, neg_inf), body.constant(0.0), m_new)
        alpha = body.exp(body.sub(m_i, m_safe))
        p = body.exp(body.sub(s, m_safe))  # [bm, bn]
        l_new = body.add(body.mul(l_i, alpha), body.reduce(p, "sum", 1))
        key_rows = body.expand_dims(keys, 1)  # [bn, 1]
        key_row_mask = None if tk % bn == 0 else body.cmp("lt", key_rows, body.index(tk))
        v_offsets = _plus(body, v_base, body.add(body.mul(key_rows, body.index(dv)), dv_cols))
        v_block = body.load(frame.pointers[spec.v], v_offsets, body.and_(key_row_mask, dv_mask))
        p_block, v_block = body.convert(p, pv_element), body.convert(v_block, pv_element)
        acc_new = body.dot(p_block, v_block, body.mul(acc, alpha))
        return [m_new, l_new, acc_new]

    def key_loop(lower: Value, upper: Value, carried: list[Value], diagonal: bool) -> list[Value]:
        loop, body, start, (m_i, l_i, acc) = b.for_loop(lower, upper, b.index(bn), carried)
        body.yield_(key_block(body, start, m_i, l_i, acc, diagonal))
        return list(loop.results)

    carried = [m0, l0, acc0]
    first_row = b.mul(pid_m, b.index(bm))
    if spec.everywhere:  # every block masked; a window skips the blocks outside it
        seen = first_row if spec.shift is None else b.add(first_row, spec.shift)
        lower, upper = b.index(0), b.index(tk)
        if spec.window:  # the first row sees keys above seen - window
            lower = b.add(seen, b.index(1 - spec.window))
            lower = b.mul(b.div(_clamp(b, lower, tk), b.index(bn)), b.index(bn))
        last_seen = b.add(seen, b.index(bm - 1))
        if spec.causal:
            upper = _clamp(b, b.add(last_seen, b.index(1)), tk)
        elif spec.window:
            upper = _clamp(b, b.add(last_seen, b.index(spec.window)), tk)
        loop_results = key_loop(lower, upper, carried, diagonal=True)
    elif spec.causal and spec.shift is not None:
        # row r sees keys j <= r + shift: those below the block's first row's last key
        # (aligned down to a block) are visible to every row, blocks up to the last
        # row's last key take the mask, later ones are all masked
        seen = b.add(first_row, spec.shift)
        below = b.mul(
            b.div(_clamp(b, b.add(seen, b.index(1)), tk), b.index(bn)), b.index(bn)
        )
        carried = key_loop(b.index(0), below, carried, diagonal=False)
        diagonal_end = _clamp(b, b.add(seen, b.index(bm)), tk)
        loop_results = key_loop(below, diagonal_end, carried, diagonal=True)
    elif spec.causal and bm % bn == 0:
        # keys below this row block's first row are visible to all of its rows; the
        # diagonal blocks take the mask; blocks past the last row are all masked
        below = b.minimum(first_row, b.index(tk))
        carried = key_loop(b.index(0), below, carried, diagonal=False)
        diagonal_end = b.minimum(b.index(tk), b.add(first_row, b.index(bm)))
        loop_results = key_loop(below, diagonal_end, carried, diagonal=True)
    else:
        upper = b.index(tk)
        if spec.causal:
            upper = b.minimum(upper, b.mul(b.add(pid_m, b.index(1)), b.index(bm)))
        loop_results = key_loop(b.index(0), upper, carried, diagonal=True)

    m_final, l_final, acc_final = loop_results
    zero = b.cmp("eq", l_final, b.constant(0.0))
    l_safe = b.select(zero, b.constant(1.0), l_final)
    out = b.convert(b.div(acc_final, l_safe), out_element(spec))
    out_offsets = _plus(b, base(out_dims), b.add(b.mul(rows, b.index(dv)), dv_cols))
    stores = [(spec.output, out_offsets, out, b.and_(row_mask, dv_mask))]
    if spec.lse is not None:  # -inf for a row that saw no key
        neg_inf = b.constant(float("-inf"))
        m_safe = b.select(b.cmp("eq", m_final, neg_inf), b.constant(0.0), m_final)
        lse = b.select(zero, neg_inf, b.add(m_safe, b.log(l_safe)))
        flat_batch = b.program_id(1) if batch else None
        lse_offsets = rows if flat_batch is None else b.add(b.mul(flat_batch, b.index(tq)), rows)
        stores.append((spec.lse, lse_offsets, lse, row_mask))
    for pointer, offsets, value, mask in stores:
        b.store(pointer, offsets, value, mask)
    grid = [cdiv(tq, bm), math.prod(batch), 1]  # no programs when empty
    return frame.finish(grid, config)


def out_element(spec: FlashForward) -> Attribute:
    """The output's element type (the output pointer's)."""
    return spec.output.type.element_type  # type: ignore[attr-defined]


def _clamp(b: TileBuilder, value: Value, upper: int) -> Value:
    """``value`` clamped into ``[0, upper]``."""
    return b.minimum(b.maximum(value, b.index(0)), b.index(upper))
