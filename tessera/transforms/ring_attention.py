"""Ring attention: ``graph.attention`` and ``graph.attention_backward`` with the sequence
split over ``n`` ranks, expanded into per-rank blocks passed round a ring (Liu et al.,
"Ring Attention with Blockwise Transformers", 2023; Brandon et al., "Striped
Attention", 2023, for the load balance).

Forward, on each rank: its queries stay; the k and v blocks go round the ring by
``graph.collective_permute`` (rank i sends to i + 1), one step per block. At each step
the permute of the next block is issued *before* the current block's attention, so the
schedule overlaps them (``overlap-comm`` waits where the block is first used). Each
step's ``(o, lse)`` is merged into the running pair by the online softmax:
``lse = logaddexp(lse₁, lse₂)``, ``o = o₁·e^(lse₁-lse) + o₂·e^(lse₂-lse)`` (a row that
saw no key has lse -inf and contributes nothing). The k/v bytes each rank receives are
``(n - 1)`` blocks: ``(n-1)/n`` of k and v.

Backward: the same ring over k and v recomputes each block's ``attention_backward``
from the forward's global ``lse`` and ``delta``; dq accumulates in place and the dk, dv
accumulators travel with their block, so every rank ends with the gradients of its own
k and v block. A rank computes with its own block last: a block's accumulators start on
the next rank, pass ``n - 2`` times and arrive home (``n - 1`` permutes each, not ``n``)
while the own block computes, whose share is added at home.

Causal attention is load-balanced by the zig-zag split: a rank's block is two half
chunks, and rank ``r`` computes with chunks ``r`` and ``2n - 1 - r`` of the ``2n``
chunks of the sequence, so every rank has the same work at every step. When the op says
its sequence is stored in that order (``zigzag = n``, a data loader's choice, see
:mod:`tessera.ir.zigzag`) the contiguous split already gives each rank its pair and only
k and v move. Otherwise the inputs arrive as chunks ``2r, 2r + 1``, so q, k and v (and
the backward's do, lse, delta) are moved to zig-zag once by collective permutes of half
blocks, and the results moved back (the *relayout*). The pair (chunk ``r`` of queries,
chunk ``2n - 1 - j`` of keys) is always masked (without user offsets) and is not
computed; each rank's causal positions (``q0``, ``k0``) are i32 scalars computed from
``graph.axis_index``.

Masks: the query segment ids stay with q, the key ids travel with k and v (one more
permute per step, relaid out to zig-zag like them); a sliding window takes the blocks'
positions as causal does. A (query piece, key piece) pair masked on every rank at a
step (:func:`block_pairs`: causal or outside the window, from the static positions) is
not computed; a step left with none is skipped, the blocks hopping past it (a permute
of several hops) and the backward's dk, dv accumulators with them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from xdsl.dialects.builtin import DenseIntOrFPElementsAttr
from xdsl.ir import Operation, SSAValue
from xdsl.rewriter import InsertPoint, Rewriter

from tessera.dtypes import DType
from tessera.ir import graph
from tessera.ir.abstract import AbstractTensor, aval
from tessera.ir.sharding import Sharding, set_op_shardings

_SCALAR = Sharding(())


@dataclass
class Ring:
    """Emits one op's ring before ``anchor``: the sequence split over mesh ``axes``
    (``size`` ranks); ``cache`` keeps values moved to zig-zag (shared by a forward and
    its backward)."""

    anchor: Operation
    mesh_name: str
    axes: tuple[str, ...]
    size: int
    cache: dict[SSAValue, SSAValue] = field(default_factory=dict)
    _rank: SSAValue | None = None

    # --- emission --------------------------------------------------------------------------

    def op(
        self,
        op_type: type[graph.GraphOp],
        operands: Sequence[SSAValue],
        layouts: Sequence[Sharding],
        **attrs: object,
    ) -> tuple[SSAValue, ...]:
        built = graph.build(op_type, operands, **attrs)
        Rewriter.insert_op(built, InsertPoint.before(self.anchor))
        set_op_shardings(built, self.mesh_name, list(layouts))
        return tuple(built.results)

    def one(
        self,
        op_type: type[graph.GraphOp],
        operands: Sequence[SSAValue],
        layout: Sharding,
        **attrs: object,
    ) -> SSAValue:
        return self.op(op_type, operands, [layout], **attrs)[0]

    def constant(self, value: float, dtype: DType) -> SSAValue:
        dense = DenseIntOrFPElementsAttr.from_list(AbstractTensor((), dtype).to_xdsl(), [value])
        return self.one(graph.ConstantOp, [], _SCALAR, value=dense)

    def zeros(self, like: SSAValue, layout: Sharding) -> SSAValue:
        """Zeros of ``like``'s type."""
        x = aval(like)
        zero = self.constant(0.0, x.dtype)
        return self.one(graph.BroadcastToOp, [zero], layout, shape=list(x.shape))

    @property
    def rank(self) -> SSAValue:
        """This rank's position along the ring (an i32 scalar, once per op)."""
        if self._rank is None:
            self._rank = self.one(graph.AxisIndexOp, [], _SCALAR, axes=list(self.axes))
        return self._rank

    def shift(self, value: SSAValue, layout: Sharding, hops: int = 1) -> SSAValue:
        """``value`` of rank i, received by rank i + ``hops`` (mod n)."""
        pairs = [[i, (i + hops) % self.size] for i in range(self.size)]
        return self.one(
            graph.CollectivePermuteOp, [value], layout, axes=list(self.axes), pairs=pairs
        )

    def cut(self, value: SSAValue, dim: int, start: int, length: int, layout: Sharding) -> SSAValue:
        shape = aval(value).shape
        if (start, length) == (0, shape[dim]):
            return value
        starts, limits = [0] * len(shape), list(shape)
        starts[dim], limits[dim] = start, start + length
        return self.one(
            graph.SliceOp, [value], layout, starts=starts, limits=limits, strides=[1] * len(shape)
        )

    def join(self, values: Sequence[SSAValue], dim: int, layout: Sharding) -> SSAValue:
        if len(values) == 1:
            return values[0]
        return self.one(graph.ConcatOp, list(values), layout, axis=dim)

    def add(self, a: SSAValue | None, b: SSAValue, layout: Sharding) -> SSAValue:
        return b if a is None else self.one(graph.AddOp, [a, b], layout)

    # --- positions -------------------------------------------------------------------------

    def scaled(self, index: SSAValue, times: int, plus: int = 0, negate: bool = False) -> SSAValue:
        """``plus ± index · times`` as an i32 scalar."""
        value = self.one(graph.MulOp, [index, self.constant(times, DType.i32)], _SCALAR)
        if negate:
            value = self.one(graph.SubOp, [self.constant(plus, DType.i32), value], _SCALAR)
        elif plus:
            value = self.one(graph.AddOp, [value, self.constant(plus, DType.i32)], _SCALAR)
        return value

    def source(self, step: int) -> SSAValue:
        """The rank whose k/v block this rank holds at ``step``: ``(rank - step) mod n``,
        as ``rank - step + n · min(max(step - rank, 0), 1)``."""
        if step == 0:
            return self.rank
        i32 = DType.i32
        behind = self.one(graph.SubOp, [self.constant(step, i32), self.rank], _SCALAR)
        wraps = self.one(graph.MaximumOp, [behind, self.constant(0, i32)], _SCALAR)
        wraps = self.one(graph.MinimumOp, [wraps, self.constant(1, i32)], _SCALAR)
        back = self.one(graph.SubOp, [self.rank, self.constant(step, i32)], _SCALAR)
        return self.one(graph.AddOp, [back, self.scaled(wraps, self.size)], _SCALAR)

    # --- zig-zag relayout --------------------------------------------------------------------

    def zigzag(self, value: SSAValue, dim: int, layout: Sharding) -> SSAValue:
        """``value`` (rank r: chunks 2r, 2r + 1 along ``dim``) with rank r holding chunks
        r and 2n - 1 - r (once per value)."""
        if value not in self.cache:
            moved = self._relayout(value, dim, layout, _contiguous_chunk, _zigzag_home)
            self.cache[value] = moved
        return self.cache[value]

    def unzigzag(self, value: SSAValue, dim: int, layout: Sharding) -> SSAValue:
        """The inverse of :meth:`zigzag` (the result remembers ``value`` as its zig-zag form)."""
        moved = self._relayout(value, dim, layout, self._zigzag_chunk, _contiguous_home)
        self.cache[moved] = value
        return moved

    def _zigzag_chunk(self, rank: int, slot: int) -> int:
        return rank if slot == 0 else 2 * self.size - 1 - rank

    def _relayout(
        self,
        value: SSAValue,
        dim: int,
        layout: Sharding,
        chunk_at: Callable[..., int],
        home: Callable[..., tuple[int, int]],
    ) -> SSAValue:
        """Each half of ``value`` sent where ``home`` puts its chunk: one permute per
        (source half, target half), summed into the target half (a rank that is no
        target of a permute receives zeros)."""
        half = aval(value).shape[dim] // 2
        slots: list[SSAValue | None] = [None, None]
        for source_slot in (0, 1):
            piece = self.cut(value, dim, source_slot * half, half, layout)
            by_target: dict[int, list[list[int]]] = {0: [], 1: []}
            for rank in range(self.size):
                chunk = chunk_at(rank, source_slot)
                target, target_slot = home(chunk, self.size)
                by_target[target_slot].append([rank, target])
            for target_slot, pairs in by_target.items():
                if pairs:
                    moved = self.one(
                        graph.CollectivePermuteOp,
                        [piece],
                        layout,
                        axes=list(self.axes),
                        pairs=pairs,
                    )
                    slots[target_slot] = self.add(slots[target_slot], moved, layout)
        assert slots[0] is not None and slots[1] is not None
        return self.join([slots[0], slots[1]], dim, layout)


def _contiguous_chunk(rank: int, slot: int) -> int:
    return 2 * rank + slot


def _contiguous_home(chunk: int, size: int) -> tuple[int, int]:
    return chunk // 2, chunk % 2


def _zigzag_home(chunk: int, size: int) -> tuple[int, int]:
    return (chunk, 0) if chunk < size else (2 * size - 1 - chunk, 1)


# --- the expansion ------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Piece:
    """A slice ``[start, start + length)`` of a block along the sequence, and its global
    position as a function of the block's owner (an i32 scalar)."""

    start: int
    length: int
    position: Callable[[SSAValue], SSAValue]


def _pieces(ring: Ring, length: int, zigzag: bool) -> list[_Piece]:
    """A block's pieces: the whole block at ``owner · length``, or its two zig-zag halves
    at chunks ``owner`` and ``2n - 1 - owner``."""
    if not zigzag:
        return [_Piece(0, length, lambda owner: ring.scaled(owner, length))]
    half, last = length // 2, 2 * ring.size - 1
    return [
        _Piece(0, half, lambda owner: ring.scaled(owner, half)),
        _Piece(half, half, lambda owner: ring.scaled(owner, half, plus=last * half, negate=True)),
    ]


def block_pairs(
    size: int, length: int, zigzag: bool, causal: bool, window: int | None, shift: int = 0
) -> list[list[tuple[int, int]]]:
    """Per ring step, the (query piece, key piece) pairs some rank computes (``length``
    tokens per rank, ``shift`` = q0 - k0 of the user's offsets): a pair masked on every
    rank by ``causal`` or the ``window`` (``|i - j| < window``) is left out, so a step
    may compute nothing."""
    half = length // 2 if zigzag else length
    if zigzag:
        starts = [lambda o: o * half, lambda o: (2 * size - 1 - o) * half]
    else:
        starts = [lambda o: o * length]
    low = 0 if causal else (1 - window if window else None)  # allowed i - j
    high = window - 1 if window else None

    def seen(step: int, qi: int, ki: int) -> bool:
        for rank in range(size):
            q0, k0 = starts[qi](rank), starts[ki]((rank - step) % size)
            lo, hi = q0 - (k0 + half - 1) + shift, q0 + half - 1 - k0 + shift  # i - j
            if (low is None or hi >= low) and (high is None or lo <= high):
                return True
        return False

    pieces = range(len(starts))
    positional = causal or window is not None
    return [
        [(qi, ki) for ki in pieces for qi in pieces if not positional or seen(step, qi, ki)]
        for step in range(size)
    ]


@dataclass(frozen=True)
class RingLayouts:
    """The (local) layouts of an attention op's operands and results: the sequence split
    over the ring's axes in each."""

    operands: tuple[Sharding, ...]
    results: tuple[Sharding, ...]


@dataclass(frozen=True)
class _Masks:
    """An op's masks as the ring sees them: the segment ids (query ids stay, key ids
    travel with k and v), the user's offsets and whether the mask needs positions."""

    q_ids: SSAValue | None
    kv_ids: SSAValue | None
    id_layouts: tuple[Sharding, ...]
    user: list[SSAValue]
    positional: bool
    causal: bool
    window: int | None

    @staticmethod
    def of(op: graph.GraphOp, first: int, layouts: RingLayouts) -> _Masks:
        attrs = op.attrs()
        extra = list(op.operands[first:])
        ids = extra[:2] if attrs.get("segments") else []
        user = extra[len(ids) :]
        if all(_static(u) == 0 for u in user):
            user = []  # no offsets
        return _Masks(
            ids[0] if ids else None,
            ids[1] if ids else None,
            tuple(layouts.operands[first : first + len(ids)]),
            user,
            bool(attrs["causal"] or attrs.get("window")),
            bool(attrs["causal"]),
            attrs.get("window"),
        )

    def pairs(self, ring: Ring, length: int, zigzag: bool) -> list[list[tuple[int, int]]]:
        """:func:`block_pairs` (every pair with traced user offsets: they move the mask)."""
        return _op_pairs(ring.size, length, zigzag, self.causal, self.window, self.user)

    def ids_dim(self) -> int:
        assert self.q_ids is not None
        return aval(self.q_ids).rank - 1


def _op_pairs(
    size: int,
    length: int,
    zigzag: bool,
    causal: bool,
    window: int | None,
    user: Sequence[SSAValue],
) -> list[list[tuple[int, int]]]:
    offsets = [_static(u) for u in user]
    if (causal or window) and None in offsets:
        count = 2 if zigzag else 1
        every = [(qi, ki) for ki in range(count) for qi in range(count)]
        return [list(every) for _ in range(size)]
    shift = offsets[0] - offsets[1] if offsets else 0  # type: ignore[operator]
    return block_pairs(size, length, zigzag, causal, window, shift)


def ring_calls(op: graph.GraphOp, size: int, zigzag: bool) -> list[int]:
    """The attention calls of each step of ``op``'s ring over ``size`` ranks (local
    operand types; 0: the step is skipped)."""
    attrs = op.attrs()
    first = 6 if isinstance(op, graph.AttentionBackwardOp) else 3
    user = list(op.operands[first + (2 if attrs.get("segments") else 0) :])
    length = aval(op.operands[0]).shape[-2]
    causal, window = bool(attrs["causal"]), attrs.get("window")
    return [len(p) for p in _op_pairs(size, length, zigzag, causal, window, user)]


def _static(value: SSAValue) -> int | None:
    """The value of an i32 scalar constant, else None."""
    owner = value.owner
    if isinstance(owner, graph.ConstantOp):
        values = owner.value.get_values()
        if len(values) == 1:
            return int(values[0])
    return None


def _offsets(
    ring: Ring, user: Sequence[SSAValue], q_position: SSAValue, k_position: SSAValue
) -> list[SSAValue]:
    """The positions of a call: the pieces' positions plus the user's offsets."""
    if not user:
        return [q_position, k_position]
    return [
        ring.one(graph.AddOp, [u, p], _SCALAR)
        for u, p in zip(user, (q_position, k_position), strict=True)
    ]


def _block_attributes(op: graph.GraphOp) -> dict[str, object]:
    """The attributes of a ring's per-block calls: the op's, in natural order (the
    blocks' true positions are explicit operands)."""
    return {name: value for name, value in op.attrs().items() if name != "zigzag"}


def _whole(length: int) -> list[_Piece]:
    return [_Piece(0, length, lambda owner: owner)]


def _shift_block(
    ring: Ring, block: Sequence[SSAValue], layouts: Sequence[Sharding], hops: int
) -> tuple[SSAValue, ...]:
    return tuple(ring.shift(x, lay, hops) for x, lay in zip(block, layouts, strict=True))


def _rows(
    ring: Ring,
    values: Sequence[SSAValue],
    layouts: Sequence[Sharding],
    dims: Sequence[int],
    piece: _Piece,
) -> list[SSAValue]:
    """``piece``'s rows of ``values`` (their sequence dims ``dims``)."""
    return [
        ring.cut(x, dim, piece.start, piece.length, lay)
        for x, lay, dim in zip(values, layouts, dims, strict=True)
    ]


def ring_forward(
    ring: Ring, op: graph.AttentionOp, layouts: RingLayouts, zigzag: bool, relayout: bool
) -> list[SSAValue]:
    """``(o, lse)`` of ``op`` (local operands), computed round the ring; ``zigzag``: the
    blocks hold zig-zag chunk pairs, ``relayout``: moved there from a contiguous split.
    The key segment ids travel with k and v; steps whose pairs are all masked are not
    computed, and their blocks skip the ranks by a longer permute."""
    attrs = _block_attributes(op)
    masks = _Masks.of(op, 3, layouts)
    q, k, v = op.operands[:3]
    q_ids, kv_ids = masks.q_ids, masks.kv_ids
    q_layout, k_layout, v_layout = layouts.operands[:3]
    o_layout, lse_layout = layouts.results
    rows = aval(q).rank - 2
    if relayout:
        q, k, v = (
            ring.zigzag(x, rows, lay) for x, lay in ((q, q_layout), (k, k_layout), (v, v_layout))
        )
        if q_ids is not None and kv_ids is not None:
            q_ids = ring.zigzag(q_ids, masks.ids_dim(), masks.id_layouts[0])
            kv_ids = ring.zigzag(kv_ids, masks.ids_dim(), masks.id_layouts[1])
    length = aval(q).shape[rows]
    pieces = _pieces(ring, length, zigzag) if masks.positional else _whole(length)
    k_pieces = (
        _pieces(ring, aval(k).shape[rows], zigzag)
        if masks.positional
        else _whole(aval(k).shape[rows])
    )
    queries = [ring.cut(q, rows, p.start, p.length, q_layout) for p in pieces]
    query_ids = [
        None
        if q_ids is None
        else ring.cut(q_ids, masks.ids_dim(), p.start, p.length, masks.id_layouts[0])
        for p in pieces
    ]
    q_positions = [p.position(ring.rank) for p in pieces] if masks.positional else []
    merged: list[tuple[SSAValue, SSAValue] | None] = [None] * len(pieces)
    pairs = masks.pairs(ring, length, zigzag)
    steps = [s for s in range(ring.size) if pairs[s]]
    block_layouts = [k_layout, v_layout, *masks.id_layouts[1:]]
    block_dims = [rows, rows, *([masks.ids_dim()] if kv_ids is not None else [])]
    block: tuple[SSAValue, ...] = (k, v) if kv_ids is None else (k, v, kv_ids)
    for index, step in enumerate(steps):
        if step and not index:
            block = _shift_block(ring, block, block_layouts, step)
        following = (
            _shift_block(ring, block, block_layouts, steps[index + 1] - step)
            if index + 1 < len(steps)
            else None
        )
        owner = ring.source(step) if masks.positional else ring.rank
        for ki, kp in enumerate(k_pieces):
            key, value, *key_ids = _rows(ring, block, block_layouts, block_dims, kp)
            k_position = kp.position(owner) if masks.positional else None
            for qi, query in enumerate(queries):
                if (qi, ki) not in pairs[step]:
                    continue
                ids = [query_ids[qi], *key_ids] if key_ids else []
                positions = (
                    _offsets(ring, masks.user, q_positions[qi], k_position)  # type: ignore[arg-type]
                    if masks.positional
                    else masks.user
                )
                part = ring.op(
                    graph.AttentionOp,
                    [query, key, value, *ids, *positions],
                    [o_layout, lse_layout],
                    **attrs,
                )
                merged[qi] = (
                    part
                    if merged[qi] is None
                    else _merge(ring, merged[qi], part, o_layout, lse_layout)
                )  # type: ignore[arg-type]
        if following is not None:
            block = following
    outs = [m[0] for m in merged if m is not None]
    lses = [m[1] for m in merged if m is not None]
    o, lse = ring.join(outs, rows, o_layout), ring.join(lses, rows, lse_layout)
    if relayout:
        o, lse = ring.unzigzag(o, rows, o_layout), ring.unzigzag(lse, rows, lse_layout)
    return [o, lse]


def _merge(
    ring: Ring,
    a: tuple[SSAValue, SSAValue],
    b: tuple[SSAValue, SSAValue],
    o_layout: Sharding,
    lse_layout: Sharding,
) -> tuple[SSAValue, SSAValue]:
    """The online-softmax merge of two partial ``(o, lse)`` pairs over disjoint keys."""
    (o1, l1), (o2, l2) = a, b
    dtype = aval(l1).dtype
    top = ring.one(graph.MaximumOp, [l1, l2], lse_layout)
    empty = ring.one(
        graph.CompareOp, [top, ring.constant(float("-inf"), dtype)], lse_layout, predicate="eq"
    )
    top = ring.one(graph.SelectOp, [empty, ring.constant(0.0, dtype), top], lse_layout)
    w1 = ring.one(graph.ExpOp, [ring.one(graph.SubOp, [l1, top], lse_layout)], lse_layout)
    w2 = ring.one(graph.ExpOp, [ring.one(graph.SubOp, [l2, top], lse_layout)], lse_layout)
    total = ring.one(graph.AddOp, [w1, w2], lse_layout)
    lse = ring.one(graph.AddOp, [top, ring.one(graph.LogOp, [total], lse_layout)], lse_layout)
    nothing = ring.one(
        graph.CompareOp, [total, ring.constant(0.0, dtype)], lse_layout, predicate="eq"
    )
    total = ring.one(graph.SelectOp, [nothing, ring.constant(1.0, dtype), total], lse_layout)
    o = None
    for out, weight in ((o1, w1), (o2, w2)):
        scale = ring.one(graph.DivOp, [weight, total], lse_layout)
        shape = aval(scale).shape
        scale = ring.one(graph.ReshapeOp, [scale], o_layout, shape=[*shape, 1])
        if aval(out).dtype != dtype:
            scale = ring.one(graph.CastOp, [scale], o_layout, dtype=aval(out).dtype)
        o = ring.add(o, ring.one(graph.MulOp, [out, scale], o_layout), o_layout)
    assert o is not None
    return o, lse


def ring_backward(
    ring: Ring, op: graph.AttentionBackwardOp, layouts: RingLayouts, zigzag: bool, relayout: bool
) -> list[SSAValue]:
    """``(dq, dk, dv)`` of ``op`` (local operands), computed round the ring; the dk and
    dv accumulators of a block travel round the ring (skipping the ranks whose steps
    compute nothing) and arrive home. ``zigzag`` and ``relayout`` as :func:`ring_forward`'s."""
    attrs = _block_attributes(op)
    masks = _Masks.of(op, 6, layouts)
    values = list(op.operands[:6])
    in_layouts = layouts.operands[:6]
    dq_layout, dk_layout, dv_layout = layouts.results
    rows = aval(values[0]).rank - 2
    q_ids, kv_ids = masks.q_ids, masks.kv_ids
    if relayout:  # the sequence is dim -2 of q, k, v, do and dim -1 (the same) of lse, delta
        values = [ring.zigzag(x, rows, lay) for x, lay in zip(values, in_layouts, strict=True)]
        if q_ids is not None and kv_ids is not None:
            q_ids = ring.zigzag(q_ids, masks.ids_dim(), masks.id_layouts[0])
            kv_ids = ring.zigzag(kv_ids, masks.ids_dim(), masks.id_layouts[1])
    q, k, v, do, lse, delta = values
    length = aval(q).shape[rows]
    q_pieces = _pieces(ring, length, zigzag) if masks.positional else _whole(length)
    k_length = aval(k).shape[rows]
    k_pieces = _pieces(ring, k_length, zigzag) if masks.positional else _whole(k_length)
    q_layout, k_layout, v_layout, do_layout, lse_layout, delta_layout = in_layouts
    query_values = [q, do, lse, delta]
    query_layouts = [q_layout, do_layout, lse_layout, delta_layout]
    query_dims = [rows] * 4
    if q_ids is not None:
        query_values.append(q_ids)
        query_layouts.append(masks.id_layouts[0])
        query_dims.append(masks.ids_dim())
    query_parts = [_rows(ring, query_values, query_layouts, query_dims, p) for p in q_pieces]
    q_positions = [p.position(ring.rank) for p in q_pieces] if masks.positional else []
    dq: list[SSAValue | None] = [None] * len(q_pieces)
    pairs = masks.pairs(ring, length, zigzag)
    block_layouts = [k_layout, v_layout, *masks.id_layouts[1:]]
    block_dims = [rows, rows, *([masks.ids_dim()] if kv_ids is not None else [])]

    def step_gradients(step: int, block: Sequence[SSAValue]) -> tuple[SSAValue, SSAValue]:
        """Adds this step's dq; returns the step's (dk, dv) of ``block``."""
        owner = ring.source(step) if masks.positional else ring.rank
        dk_parts, dv_parts = [], []
        for ki, kp in enumerate(k_pieces):
            key, value, *key_ids = _rows(ring, block, block_layouts, block_dims, kp)
            k_position = kp.position(owner) if masks.positional else None
            dk_part: SSAValue | None = None
            dv_part: SSAValue | None = None
            for qi, (query, d_out, q_lse, q_delta, *query_ids) in enumerate(query_parts):
                if (qi, ki) not in pairs[step]:
                    continue
                positions = (
                    _offsets(ring, masks.user, q_positions[qi], k_position)  # type: ignore[arg-type]
                    if masks.positional
                    else masks.user
                )
                dq_i, dk_i, dv_i = ring.op(
                    graph.AttentionBackwardOp,
                    [query, key, value, d_out, q_lse, q_delta, *query_ids, *key_ids, *positions],
                    [dq_layout, dk_layout, dv_layout],
                    **attrs,
                )
                dq[qi] = ring.add(dq[qi], dq_i, dq_layout)
                dk_part, dv_part = (
                    ring.add(dk_part, dk_i, dk_layout),
                    ring.add(dv_part, dv_i, dv_layout),
                )
            if dk_part is None or dv_part is None:  # no query sees this piece: zeros
                dk_part, dv_part = ring.zeros(key, dk_layout), ring.zeros(value, dv_layout)
            dk_parts.append(dk_part)
            dv_parts.append(dv_part)
        return ring.join(dk_parts, rows, dk_layout), ring.join(dv_parts, rows, dv_layout)

    # The steps that compute, the rank's own block (step 0) last: the accumulators of a
    # block start on the rank of its first step, hop from step to step and arrive home
    # (one more permute) while the own block computes, where its share is added.
    steps = [s for s in range(1, ring.size) if pairs[s]]
    own = (k, v) if kv_ids is None else (k, v, kv_ids)
    arriving = _shift_block(ring, own, block_layouts, steps[0]) if steps else None
    sent: tuple[SSAValue, SSAValue] | None = None
    for index, step in enumerate(steps):
        assert arriving is not None
        block = arriving
        following = steps[index + 1] if index + 1 < len(steps) else ring.size
        if following < ring.size:
            arriving = _shift_block(ring, block, block_layouts, following - step)
        dk_block, dv_block = step_gradients(step, block)
        if sent is not None:
            dk_block = ring.add(sent[0], dk_block, dk_layout)
            dv_block = ring.add(sent[1], dv_block, dv_layout)
        sent = (
            ring.shift(dk_block, dk_layout, following - step),
            ring.shift(dv_block, dv_layout, following - step),
        )
    dk, dv = step_gradients(0, own)
    if sent is not None:
        dk, dv = ring.add(sent[0], dk, dk_layout), ring.add(sent[1], dv, dv_layout)
    results = [ring.join([d for d in dq if d is not None], rows, dq_layout), dk, dv]
    if relayout:
        results = [
            ring.unzigzag(x, rows, lay)
            for x, lay in zip(results, (dq_layout, dk_layout, dv_layout), strict=True)
        ]
    return results


__all__ = ["Ring", "RingLayouts", "block_pairs", "ring_backward", "ring_calls", "ring_forward"]
