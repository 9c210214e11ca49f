"""``lower-graph-to-schedule``: group a partitioned graph function into kernels and async collectives.

Runs after ``shard-partition`` (or on a function without collectives). First two
rewrites: a ``cross_entropy`` with a reduction becomes per-row losses and their mean or
sum, and a sum over the batch dims of a batched matmul used only there (a weight
gradient, ``sum_b xᵀ_b dy_b``) becomes one matmul with the batch folded into K (the
operands re-viewed as ``[M, batch·K]`` and ``[batch·K, N]`` by layout ops). Then:

1. *Group* (greedy, in program order). Every graph op but a collective or a constant
   belongs to a group; a group becomes one ``schedule.kernel``. What an op may join is its
   fusion class (``tessera.opdefs.op_def(op).fusion``). Each group has one iteration space
   (the broadcast of an elementwise group's results, a matmul's result, or the operand of
   a reduction group's reductions), and the kernel computes every value over it:

   - First, each ``softmax(score(q kᵀ)) v`` (``codegen.attention.find_attention``: the
     optional transpose of k, the two matmuls, the elementwise score ops such as a scale,
     a mask select or an additive bias, the softmax and an optional cast, every
     intermediate used once) becomes an ``attention`` group: one flash-attention kernel.
     It takes no other op. So does each ``graph.attention`` and
     ``graph.attention_backward`` op (fusion class ``attention``), which reads the
     layout ops making its scalar position offsets in place.
   - An elementwise op joins the group of the first operand it may: an elementwise group
     (the chain; the space may grow by broadcasting), a matmul's (epilogue: bias,
     activation, residual add) or a row reduction's (prologue or epilogue). Otherwise it
     starts an elementwise group.
   - A row reduction (sum, mean, max, min, softmax, log_softmax, layer_norm, rms_norm,
     cross_entropy) joins its operand's group when that group is elementwise (its
     prologue) or reduces the same rows (several reductions in one row kernel, such as a
     layer norm's backward); it then takes epilogues as above.
   - *Multi-output*: a value may have users outside its group; it is then an output of
     the kernel, which the users wait for. Only a value computed over the whole space may
     be one (a row reduction's kept or squeezed row values too), so a group whose values
     are used elsewhere does not grow its space, and a reduction takes an elementwise
     group as its prologue only if those values fit its space.
   - *Merging*: after an elementwise op or a reduction is placed, the groups of its other
     operands merge into its group when they may: an elementwise group into any group
     whose space it spans (two moment chains of an optimizer update, a residual computed
     apart), or two reduction groups over the same rows. No prologue reaches a matmul this
     way (its operands stay kernel inputs). A new reduction also merges with a recent
     reduction group over the same rows that reads a common value, directly or through
     the kernels making their inputs (a layer norm's bias and weight gradients).
   - A matmul always starts a group.
   - *Layout ops read in place*: a layout op with one operand (reshape, transpose,
     broadcast_to, slice, all_slice) belongs to no group; every kernel that uses it
     clones it (with the layout ops it reads), and the kernel evaluates it as index
     arithmetic: a transposed or head-split matmul operand is loaded with strides (the
     matmul's prologue), a reshaped input of an elementwise op or a reduction is read
     through its flat offset. One with a user that does not read through it (a return, a
     collective, an attention kernel) is also a kernel of its own, and so is a slice of
     a collective's result (a piece of a gradient bucket: a free view, which keeps the
     kernels reading it independent of the piece's offset, so identical layers share
     their kernels). Other layout ops
     (concat, split, gather) are a group of their own, which reads its operands through
     layout ops too, and take no epilogue.
   - No join or merge closes a cycle between groups (through other groups, collectives
     or layout ops): the dependence search only visits groups that end after the first
     op of the group it looks for, so it stays local.
   - No join or merge spans an attention kernel: an op (or group) that depends on an
     attention kernel beginning after a group's first op does not join (merge with) that
     group, which would hold the group's work, and every value it reads, until after
     the kernel. Each group keeps the first index of the latest attention kernel it
     depends on (through groups, collectives and layout ops). So a ring's
     online-softmax merge of each step, and the accumulation of each step's gradients,
     stay kernels of their step and the steps' partial results are not live at once.
   - Constants join no group: each kernel that uses one gets its own copy; a constant
     used outside kernels (returned, or sent to a collective) becomes a kernel alone.
   - *Recomputation stays in the backward*: an op tagged ``graph.remat`` (a checkpointed
     block recomputed, :mod:`tessera.transforms.remat`) shares a kernel with no op before the
     first op of its recomputation, so the values it makes again are not kept from the
     forward.

2. *Collectives* become ``schedule.start`` / ``schedule.wait`` pairs.

3. *Order*. Kernels are emitted in dependence order, earliest first op first; a
   collective's start, and its wait right after it, as soon as its operand is made. The
   schedule is serial (no communication overlaps computation); ``overlap-comm`` then
   moves the waits down to their first use. A ``graph.wait`` of a collective's result
   (per-rank code's ``h.wait()``) is no kernel op: its uses read the collective's result,
   and the collective's wait goes where it was, before the first kernel that begins
   after it, marked ``schedule.user_wait`` (which ``overlap-comm`` leaves in place); a
   ``graph.wait`` of any other value is an elementwise identity. In a kernel's body, the cloned constants
   come first, then the layout ops it reads through, then its ops in program order.

Kernels are named ``@<function>_k<N>_<op>``: N counts kernels in emission order, and op
is ``attention`` for an attention group, else the group's matmul or first reduction,
else its first op (without ``graph.``).
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from math import prod

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp, TensorType, UnitAttr
from xdsl.ir import Block, Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.rewriter import InsertPoint, Rewriter
from xdsl.utils.exceptions import PassFailedException

from tessera.codegen.attention import find_attention
from tessera.codegen.kernels import reduced_axes
from tessera.ir import graph, schedule
from tessera.ir.located_error import LocatedPassFailure
from tessera.opdefs import Fusion, fusion_of
from tessera.transforms.remat import REMAT


def _is(op: Operation | None, fusion: Fusion) -> bool:
    return isinstance(op, Operation) and fusion_of(op) is fusion


def _communicates(op: Operation | None) -> bool:
    """A collective that communicates (all_slice is a local slice: a layout op)."""
    return _is(op, Fusion.COLLECTIVE)


def _reduces_rows(op: Operation) -> bool:
    fusion = fusion_of(op)
    return fusion is not None and fusion.reduces_rows


@dataclass(frozen=True)
class LowerGraphToSchedulePass(ModulePass):
    """Groups graph ops into kernels and turns collectives into start/wait pairs."""

    name = "lower-graph-to-schedule"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        functions = {f.sym_name.data: f for f in op.ops if isinstance(f, func.FuncOp)}
        for function in functions.values():
            if graph.is_graph_function(function, self.name):
                if graph.PARTITIONED not in function.attributes:
                    _check_partitioned(function, functions)
                _split_cross_entropy(function)
                _fold_batch_sums(function)
                _Lowering(function).run()


def _split_cross_entropy(function: func.FuncOp) -> None:
    """``cross_entropy`` with reduction mean or sum becomes per-row losses and a mean or
    sum over them: a row kernel, then a reduction across rows (no atomics needed)."""
    for op in list(function.body.block.ops):
        if isinstance(op, graph.CrossEntropyOp) and op.attrs()["reduction"] != "none":
            per_row = graph.build(graph.CrossEntropyOp, list(op.operands), reduction="none")
            rank = len(_dims(per_row.results[0]))
            kind = graph.MeanOp if op.attrs()["reduction"] == "mean" else graph.SumOp
            total = graph.build(kind, [per_row.results[0]], axes=list(range(rank)), keepdims=False)
            Rewriter.replace_op(op, [per_row, total])


def _fold_batch_sums(function: func.FuncOp) -> None:
    """A sum over the batch dims of a batched matmul used only there (a weight gradient:
    ``sum_b xᵀ_b dy_b``) becomes one matmul with the batch folded into K,
    ``A' B'`` with ``A' = [M, batch·K]`` and ``B' = [batch·K, N]``: layout ops, which
    the matmul reads in place."""
    for op in list(function.body.block.ops):
        if not isinstance(op, graph.SumOp) or op.attrs()["keepdims"]:
            continue
        source = op.operands[0].owner
        if not isinstance(source, graph.MatmulOp) or source.result.uses.get_length() != 1:
            continue
        out = _dims(source.result)
        rank = len(out)
        lhs, rhs = source.operands
        batch_axes = sorted(a % rank for a in op.attrs()["axes"])
        if rank < 3 or batch_axes != list(range(rank - 2)):
            continue
        if not _dims(lhs)[:-2] == _dims(rhs)[:-2] == out[:-2]:
            continue
        batch, (m, k), n = prod(out[:-2]), _dims(lhs)[-2:], out[-1]
        perm = [rank - 2, *range(rank - 2), rank - 1]
        if isinstance(lhs.owner, graph.TransposeOp):  # compose with lhs's transpose
            inner = lhs.owner.attrs()["perm"]
            lhs, perm = lhs.owner.operands[0], [inner[p] for p in perm]
        moved = graph.build(graph.TransposeOp, [lhs], perm=perm)
        a = graph.build(graph.ReshapeOp, [moved.results[0]], shape=(m, batch * k))
        b = graph.build(graph.ReshapeOp, [rhs], shape=(batch * k, n))
        product = graph.build(graph.MatmulOp, [a.results[0], b.results[0]])
        Rewriter.replace_op(op, [moved, a, b, product])
        Rewriter.erase_op(source)


def _check_partitioned(function: func.FuncOp, functions: dict[str, func.FuncOp]) -> None:
    """An unpartitioned function (global types) may not hold collectives, nor call a
    partitioned one of ``functions`` (per-rank types: a ``dist.shard_map`` region) with
    other types."""
    name = function.sym_name.data
    if any(isinstance(o, graph.CollectiveOp) for o in function.body.block.ops):
        raise PassFailedException(
            f"lower-graph-to-schedule: @{name} has collectives with global types; run "
            f"shard-partition first"
        )
    for call in function.body.block.ops:
        if not isinstance(call, graph.CallOp):
            continue
        callee = functions.get(call.callee_name)
        if callee is None or graph.PARTITIONED not in callee.attributes:
            continue
        if [v.type for v in call.operands] != list(callee.function_type.inputs.data):
            raise LocatedPassFailure(
                call,
                f"lower-graph-to-schedule: @{name} calls @{call.callee_name}, a per-rank "
                f"(partitioned) function, with global types; run shard-partition first",
            )


def _short(op: Operation) -> str:
    return op.name.split(".", 1)[1]


def _kernel_kind(group: _Group) -> str:
    """The last part of a kernel's name: ``attention`` for the matched pattern, else its
    anchor op's short name (``attention``, ``attention_backward`` for the ops)."""
    if group.kind == "attention" and isinstance(group.anchor(), graph.SoftmaxOp):
        return "attention"
    return _short(group.anchor())


SIBLING_WINDOW = 8  # recent reduction groups over the same rows a new one may merge with,
SIBLING_DISTANCE = 64  # beginning at most this many ops before it (keeps the search local)


def _absorbable(op: Operation) -> bool:
    """A layout op that consumers read through (one operand and one result: reshape,
    transpose, broadcast_to, slice, all_slice): cloned into each kernel that uses it.

    Not a slice of a collective's result (a piece of a gradient bucket): it is a free
    view of the received buffer, and reading through it would make each consumer's
    kernel depend on the piece's offset, so the same update of every layer's parameter
    would compile as a distinct kernel."""
    if isinstance(op, graph.SliceOp) and _communicates(op.operands[0].owner):  # type: ignore[arg-type]
        return False
    return _is(op, Fusion.LAYOUT) and len(op.operands) == 1 and len(op.results) == 1


def _kind(op: Operation) -> str:
    if isinstance(op, graph.CallOp | graph.ScanOp):
        return "call"
    if _is(op, Fusion.ELEMENTWISE):
        return "elementwise"
    if _reduces_rows(op):
        return "reduction"
    if _is(op, Fusion.MATMUL):
        return "matmul"
    if _is(op, Fusion.ATTENTION):
        return "attention"
    if _is(op, Fusion.HOST):
        return "host"
    return "layout"


@dataclass(eq=False)
class _Group:
    """Ops that become one kernel; ``kind`` says what may still join it.

    ``space`` is the iteration space every value of the kernel is computed over: the
    broadcast of an elementwise group's results, a matmul's result, or the operand of a
    reduction group's reductions (which all reduce ``axes``)."""

    kind: str  # "elementwise", "matmul", "reduction", "layout", "attention", "host", "call"
    ops: list[Operation]
    first: int  # the program index of the earliest op, and of the latest
    last: int
    space: tuple[int, ...] = ()
    axes: tuple[int, ...] = ()
    anchor_op: Operation | None = None  # the matmul, the first reduction, or the softmax
    floor: int = 0  # no op before this index may join (the start of a recomputation)
    absorbed: dict[Operation, None] = field(default_factory=dict)  # layout ops read through
    after: int = -1  # the first index of the latest attention kernel it depends on

    def anchor(self) -> Operation:
        return self.anchor_op if self.anchor_op is not None else self.ops[0]

    def escapes(self, dims: tuple[int, ...]) -> bool:
        """Whether a value of shape ``dims`` may be an output: computed over the whole
        space (a reduction's kept or squeezed row values too), stored once per element."""
        if self.kind != "reduction":
            return dims == self.space
        kept = tuple(1 if d in self.axes else s for d, s in enumerate(self.space))
        squeezed = tuple(s for d, s in enumerate(self.space) if d not in self.axes)
        return dims in (self.space, kept, squeezed)


def _recomputation_floors(ops: Sequence[Operation]) -> dict[Operation, int]:
    """For each op tagged ``graph.remat``, the index of its recomputation's first op."""
    first: dict[object, int] = {}
    floors: dict[Operation, int] = {}
    for index, op in enumerate(ops):
        tag = op.attributes.get(REMAT)
        if tag is not None:
            floors[op] = first.setdefault(tag, index)
    return floors


def _dims(value: SSAValue) -> tuple[int, ...]:
    assert isinstance(value.type, TensorType)
    return tuple(value.type.get_shape())


def _broadcast(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...] | None:
    """The numpy broadcast of two shapes, or None when they do not broadcast."""
    rank = max(len(a), len(b))
    a, b = (1,) * (rank - len(a)) + a, (1,) * (rank - len(b)) + b
    if any(x != y and 1 not in (x, y) for x, y in zip(a, b, strict=True)):
        return None
    return tuple(max(x, y) for x, y in zip(a, b, strict=True))


def _reduction_space(op: Operation) -> tuple[tuple[int, ...], tuple[int, ...]]:
    return _dims(op.operands[0]), reduced_axes(op)  # type: ignore[arg-type]


def _remove_user_waits(block: Block) -> dict[Operation, Operation]:
    """Erases each ``graph.wait`` of a communicating collective's result (its uses take the
    result) and returns, per collective, the op that followed its earliest one: the
    collective's ``schedule.wait`` goes before the first kernel that begins there."""
    followers: dict[Operation, Operation] = {}
    for wait in [o for o in block.ops if isinstance(o, graph.WaitOp)]:
        collective = wait.operands[0].owner
        if not _communicates(collective):  # on another value: an identity kernel op
            continue
        follower = wait.next_op
        while isinstance(follower, graph.WaitOp):
            follower = follower.next_op
        assert isinstance(collective, Operation) and follower is not None
        followers.setdefault(collective, follower)
        wait.results[0].replace_all_uses_with(wait.operands[0])
        Rewriter.erase_op(wait)
    return followers


class _Lowering:
    def __init__(self, function: func.FuncOp):
        self.function = function
        self.block = function.body.block
        for op in [o for o in self.block.ops if isinstance(o, graph.GraphOp) and not o.results]:
            Rewriter.erase_op(op)  # a split into no pieces: pure, it computes nothing
        followers = _remove_user_waits(self.block)
        self.ops = [o for o in self.block.ops if not isinstance(o, func.ReturnOp)]
        self.index = {o: i for i, o in enumerate(self.ops)}
        # collective -> the index of the first op after its user's wait (no entry: none)
        self.user_waits = {
            c: self.index[f] for c, f in followers.items() if not isinstance(f, func.ReturnOp)
        }
        self.group_of: dict[Operation, _Group] = {}
        self.groups: list[_Group] = []
        self.deferred: dict[Operation, None] = {}  # absorbable layout ops, in program order
        self.reductions: dict[tuple[tuple[int, ...], ...], list[_Group]] = {}  # by space
        self.floor = _recomputation_floors(self.ops)

    # --- 1. grouping -------------------------------------------------------------------

    def run(self) -> None:
        for ops in find_attention(self.ops):  # softmax(q kᵀ) v: one flash-attention kernel
            group = self._new_group("attention", ops[0])
            for op in ops[1:]:
                self._add(group, op)
            group.anchor_op = next(o for o in ops if isinstance(o, graph.SoftmaxOp))
        for op in self.ops:
            if _is(op, Fusion.CONSTANT) or _communicates(op) or op in self.group_of:
                continue
            if _absorbable(op):
                self.deferred[op] = None
            else:
                self._group(op)
        self._materialize()
        self.groups = [g for g in self.groups if g.ops]
        for op in self.ops:  # constants with users outside kernels are kernels alone
            if _is(op, Fusion.CONSTANT) and any(
                self._outside_kernels(u.operation) for u in op.results[0].uses
            ):
                self._new_group("elementwise", op)
        _Emitter(self).run()

    def _outside_kernels(self, user: Operation) -> bool:
        return isinstance(user, func.ReturnOp | graph.CallOp | graph.ScanOp) or _communicates(user)

    def _new_group(self, kind: str, op: Operation) -> _Group:
        index = self.index[op]
        group = _Group(kind, [op], index, index, floor=self.floor.get(op, 0))
        group.after = index if kind == "attention" else self._after(op)
        if kind == "elementwise":
            group.space = _dims(op.results[0])
        elif kind == "matmul":
            group.space, group.anchor_op = _dims(op.results[0]), op
        elif kind == "reduction":
            (group.space, group.axes), group.anchor_op = _reduction_space(op), op
        elif kind == "attention":
            group.anchor_op = op
        self.groups.append(group)
        self.group_of[op] = group
        return group

    def _add(self, group: _Group, op: Operation) -> None:
        group.ops.append(op)
        group.after = max(group.after, self._after(op))
        self.group_of[op] = group
        index = self.index[op]
        group.first, group.last = min(group.first, index), max(group.last, index)
        group.floor = max(group.floor, self.floor.get(op, 0))

    def _group(self, op: Operation) -> None:
        """Puts ``op`` into the first operand's group it may join (else a new group), then
        merges the other operands' groups it may merge with, then absorbs the layout ops
        it reads through."""
        kind = _kind(op)
        if kind == "call":  # a func.call of its own: its operands are materialized
            self._new_group(kind, op)
            return
        target = None
        if kind in ("elementwise", "reduction"):
            for operand in op.operands:
                group = self.group_of.get(operand.owner)  # type: ignore[arg-type]
                if group is not None and self._may_join(op, group):
                    target = group
                    self._join(group, op)
                    break
        if target is None:
            target = self._new_group(kind, op)
        if kind in ("elementwise", "reduction"):
            for operand in op.operands:
                other = self.group_of.get(operand.owner)  # type: ignore[arg-type]
                if other is not None and other is not target and self._may_merge(target, other):
                    self._merge(target, other)
        if kind == "reduction" and target.kind == "reduction":
            self._merge_siblings(target)
        self._absorb(target, op)

    def _merge_siblings(self, group: _Group) -> None:
        """Merges into a reduction group the recent reduction groups over the same rows
        that read a common value, directly or through the kernels making their inputs
        (the bias and weight gradients of a layer norm)."""
        key = (group.space, group.axes)
        recent = self.reductions.setdefault(key, [])
        sources = self._sources(group)
        for other in recent[-SIBLING_WINDOW:]:
            if (
                other.ops
                and other is not group
                and group.last - other.first <= SIBLING_DISTANCE
                and other.kind == "reduction"
                and not sources.isdisjoint(self._sources(other))
                and self._may_merge(group, other)
            ):
                self._merge(group, other)
                sources |= self._sources(group)
        recent[:] = [g for g in recent if g.ops and g is not group] + [group]

    def _sources(self, group: _Group) -> set[SSAValue]:
        """The values a group reads, and those the groups making them read."""
        out: set[SSAValue] = set()
        for value, _ in self._inputs(group):
            out.add(value)
            producer = self.group_of.get(value.owner)  # type: ignore[arg-type]
            if producer is not None and producer is not group:
                out.update(v for v, _ in self._inputs(producer))
        return out

    def _join(self, group: _Group, op: Operation) -> None:
        kind = _kind(op)
        if group.kind == "elementwise" and kind == "elementwise":
            space = _broadcast(group.space, _dims(op.results[0]))
            assert space is not None
            group.space = space
        elif group.kind == "elementwise":  # a reduction: the group is its prologue
            group.kind, group.anchor_op = "reduction", op
            group.space, group.axes = _reduction_space(op)
        self._add(group, op)

    def _may_join(self, op: Operation, group: _Group) -> bool:
        """Whether ``op`` may join ``group`` (which makes one of its operands): the kinds
        fit, the kernel keeps one iteration space, every value with users outside the
        kernel is computed over all of it, and no cycle between groups appears."""
        kind = _kind(op)
        result = _dims(op.results[0])
        if min(group.first, self.index[op]) < max(group.floor, self.floor.get(op, 0)):
            return False  # a recomputation fused into the forward
        if group.kind == "elementwise" and kind == "elementwise":
            space = _broadcast(group.space, result)
            if space != result:  # the op's result must span the (grown) space
                return False
            if space != group.space and self._escaping(group, {op}):
                return False
        elif group.kind == "elementwise" and kind == "reduction":
            full, axes = _reduction_space(op)
            if _broadcast(group.space, full) != full:
                return False
            prologue = _Group("reduction", [], 0, 0, full, axes)
            if not prologue.escapes(group.space) and self._escaping(group, {op}):
                return False
        elif group.kind == "matmul":
            if kind != "elementwise" or result != group.space:
                return False
        elif group.kind == "reduction":
            if kind == "elementwise" and not group.escapes(result):
                return False
            if kind == "reduction" and _reduction_space(op) != (group.space, group.axes):
                return False
        else:
            return False
        if self._after(op) > group.first:
            return False  # across an attention kernel
        for operand in op.operands:
            if self.group_of.get(operand.owner) is group:  # type: ignore[arg-type]
                continue
            producer = self._producer_group(operand)
            if producer is group or (producer is not None and self._depends(producer, group)):
                return False  # through a collective, a layout op or other groups: a cycle
        return True

    def _after(self, op: Operation) -> int:
        """The first program index of the latest attention kernel ``op`` depends on
        (through groups, collectives and layout ops), -1 for none."""
        after = -1
        for operand in op.operands:
            producer = self._producer_group(operand)
            if producer is not None:
                after = max(after, producer.after)
        return after

    def _escaping(self, group: _Group, joining: set[Operation]) -> bool:
        """Whether a value of ``group`` has a user outside it and outside ``joining``."""
        return any(
            not r.uses
            or any(
                self.group_of.get(u.operation) is not group and u.operation not in joining
                for u in r.uses
            )
            for o in group.ops
            for r in o.results
        )

    def _may_merge(self, a: _Group, b: _Group) -> bool:
        """Whether groups ``a`` and ``b`` (one uses a value of the other) may become one
        kernel: one elementwise and any, or two reductions over the same space."""
        if min(a.first, b.first) < max(a.floor, b.floor):
            return False  # a recomputation fused into the forward
        if a.kind == "elementwise" and b.kind == "elementwise":
            space = _broadcast(a.space, b.space)
            if space is None or any(
                g.space != space and self._escaping(g, set(a.ops) | set(b.ops)) for g in (a, b)
            ):
                return False
        elif "elementwise" in (a.kind, b.kind):
            other, main = (a, b) if a.kind == "elementwise" else (b, a)
            if main.kind == "matmul" and other.space != main.space:
                return False
            if main.kind == "reduction" and (
                not main.escapes(other.space) or _broadcast(other.space, main.space) != main.space
            ):
                return False
            if main.kind not in ("matmul", "reduction"):
                return False
        elif not (a.kind == b.kind == "reduction" and (a.space, a.axes) == (b.space, b.axes)):
            return False
        if a.after > b.first or b.after > a.first:
            return False  # across an attention kernel
        for g, h in ((a, b), (b, a)):
            for value, direct in self._inputs(g):
                producer = self._producer_group(value)
                if producer is h:
                    if not direct or self.group_of.get(value.owner) is not h:  # type: ignore[arg-type]
                        return False  # through a collective or a layout op
                    if g.kind == "matmul" and value in g.anchor().operands:
                        return False  # no prologue fusion into a matmul
                elif producer is not None and producer is not g and self._depends(producer, h):
                    return False
        return True

    def _merge(self, group: _Group, other: _Group) -> None:
        """Moves ``other``'s ops into ``group``."""
        if group.kind == "elementwise" and other.kind == "elementwise":
            space = _broadcast(group.space, other.space)
            assert space is not None
            group.space = space
        elif group.kind == "elementwise" or (
            group.kind == other.kind == "reduction"
            and self.index[other.anchor()] < self.index[group.anchor()]
        ):
            group.kind, group.space, group.axes = other.kind, other.space, other.axes
            group.anchor_op = other.anchor_op
        for op in other.ops:
            self._add(group, op)
        group.absorbed.update(other.absorbed)
        group.after = max(group.after, other.after)
        other.ops = []  # dropped from ``groups`` after grouping

    def _absorb(self, group: _Group, op: Operation) -> None:
        """Clones the chains of absorbable layout ops ``op`` reads into ``group``. An
        attention kernel reads its tensors as kernel inputs and evaluates only its
        scalars in place (the position offsets: this rank's, from an all_slice)."""
        operands = list(op.operands)
        if group.kind == "attention":
            operands = [v for v in operands if not _dims(v)]
        for operand in operands:
            owner = operand.owner
            while owner in self.deferred and owner not in self.group_of:
                if owner in group.absorbed:
                    break
                group.absorbed[owner] = None  # type: ignore[index]
                owner = owner.operands[0].owner  # type: ignore[union-attr]

    def _materialize(self) -> None:
        """An absorbable layout op that some user does not read through (a return, a
        collective, an attention kernel) becomes a kernel of its own."""
        for op in reversed(self.deferred):
            if any(not self._reads_through(u.operation, op) for u in op.results[0].uses):
                self._absorb(self._new_group("layout", op), op)

    def _reads_through(self, user: Operation, layout: Operation) -> bool:
        if user in self.deferred and user not in self.group_of:
            return True  # absorbed wherever it is used, with ``layout``
        group = self.group_of.get(user)
        return group is not None and layout in group.absorbed

    def _producer_group(self, value: SSAValue) -> _Group | None:
        """The group a value comes from, looking through collectives and layout ops that
        are read through."""
        owner = value.owner
        while _communicates(owner) or (owner in self.deferred and owner not in self.group_of):  # type: ignore[arg-type]
            owner = owner.operands[0].owner  # type: ignore[union-attr]
        return self.group_of.get(owner) if isinstance(owner, Operation) else None

    def _depends(self, group: _Group, on: _Group) -> bool:
        """Whether ``group`` uses a value of ``on``, directly or through other groups.

        A chain of uses from ``on`` only reaches ops after ``on``'s first op (program
        order), so the search skips groups that end before it: it stays local."""
        seen: set[int] = set()
        stack = [group]
        while stack:
            current = stack.pop()
            if current is on:
                return True
            if id(current) in seen or current.last < on.first:
                continue
            seen.add(id(current))
            stack.extend(p for p in self.group_inputs(current) if p is not None)
        return False

    def _inputs(self, group: _Group) -> list[tuple[SSAValue, bool]]:
        """The values ``group`` reads from outside, each with whether an op of the group
        uses it directly (not through an absorbed layout op)."""
        out: list[tuple[SSAValue, bool]] = []
        for op in group.ops:
            for value in op.operands:
                direct = True
                while value.owner in group.absorbed:
                    value, direct = value.owner.operands[0], False  # type: ignore[union-attr]
                if self.group_of.get(value.owner) is not group:  # type: ignore[arg-type]
                    out.append((value, direct))
        return out

    def group_inputs(self, group: _Group) -> list[_Group | None]:
        return [self._producer_group(v) for v, _ in self._inputs(group)]


class _Emitter:
    """Steps 2 and 3: builds kernels and start/wait pairs in order before the return."""

    def __init__(self, lowering: _Lowering):
        self.lowering = lowering
        self.ret = lowering.block.last_op
        assert isinstance(self.ret, func.ReturnOp)
        self.env: dict[SSAValue, SSAValue] = {a: a for a in lowering.block.args}
        self.collectives = [o for o in lowering.ops if _communicates(o)]
        self.waiting: dict[SSAValue, list[graph.CollectiveOp]] = {}  # operand -> collectives
        for collective in self.collectives:
            self.waiting.setdefault(collective.operands[0], []).append(collective)
        self.handles: dict[Operation, SSAValue] = {}  # collective -> its start's handle
        self.late_waits: set[Operation] = set()  # user waits before their collective's start
        self.kernel_count = 0

    def insert(self, op: Operation) -> Operation:
        Rewriter.insert_op(op, InsertPoint.before(self.ret))
        return op

    def run(self) -> None:
        self.start_ready(list(self.lowering.block.args))
        for group in self._order():
            self.place_user_waits(group.first)
            self.emit_kernel(group)
        for collective in self.collectives:  # every handle is waited for
            self.value(collective.results[0])
        self.ret.operands = [self.value(v) for v in self.ret.operands]
        for op in reversed(self.lowering.ops):
            Rewriter.erase_op(op)

    def _order(self) -> list[_Group]:
        """Groups in dependence order; among ready ones, the earliest first op first."""
        lowering = self.lowering
        first = {id(g): g.first for g in lowering.groups}
        preds = {
            id(g): {id(p) for p in lowering.group_inputs(g) if p is not None and p is not g}
            for g in lowering.groups
        }
        by_id = {id(g): g for g in lowering.groups}
        successors: dict[int, list[int]] = {key: [] for key in preds}
        for key, p in preds.items():
            for predecessor in p:
                successors[predecessor].append(key)
        ready = [(first[k], k) for k, p in preds.items() if not p]
        heapq.heapify(ready)
        order: list[_Group] = []
        while ready:
            _, key = heapq.heappop(ready)
            order.append(by_id[key])
            for other in successors[key]:
                preds[other].discard(key)
                if not preds[other]:
                    heapq.heappush(ready, (first[other], other))
        if len(order) != len(lowering.groups):
            raise PassFailedException(
                "lower-graph-to-schedule: kernel groups depend on each other in a cycle"
            )
        return order

    # --- values, starts and waits ---------------------------------------------------------

    def value(self, old: SSAValue) -> SSAValue:
        """The new value for ``old``; a collective's result is waited for when it starts."""
        if old not in self.env:
            collective = old.owner
            assert isinstance(collective, graph.CollectiveOp), f"{old} is used before it is made"
            self.start(collective)
        return self.env[old]

    def start(self, collective: graph.CollectiveOp) -> None:
        value = self.value(collective.operands[0])
        if collective in self.handles:  # waiting for the operand started it already
            return
        properties = {n: collective.properties[n] for n in collective._property_names()}
        result = collective.results[0].type
        assert isinstance(result, TensorType)
        op = schedule.StartOp.get(_short(collective), value, result, **properties)
        handle = self.insert(op).results[0]
        self.handles[collective] = handle
        wait = self.insert(schedule.WaitOp.create(operands=[handle], result_types=[result]))
        if collective in self.late_waits:
            wait.attributes[schedule.USER_WAIT] = UnitAttr()
        self.env[collective.results[0]] = wait.results[0]
        self.start_ready([collective.results[0]])

    def place_user_waits(self, before: int) -> None:
        """Moves here (the end of the schedule so far) the wait of each collective whose
        user's ``h.wait()`` came before op ``before``, the first op of the next kernel,
        and marks it :data:`schedule.USER_WAIT` (``overlap-comm`` keeps it there). A
        wait already used (a ring's block sent on by the next permute) stays unmarked,
        before that use: ``overlap-comm`` sinks it no further than its first use, which
        is before the point. A collective not yet started (its operand is made later) is
        waited for right after its start."""
        pending = self.lowering.user_waits
        for collective in [c for c, at in pending.items() if at <= before]:
            del pending[collective]
            if collective not in self.handles:
                self.late_waits.add(collective)
                continue
            wait = self.env[collective.results[0]].owner
            assert isinstance(wait, schedule.WaitOp)
            if not wait.results[0].uses:  # else already used here: overlap-comm keeps
                wait.detach()  # it before that use, before the user's point
                self.insert(wait)
                wait.attributes[schedule.USER_WAIT] = UnitAttr()

    def start_ready(self, made: Sequence[SSAValue]) -> None:
        """Starts, in program order, every collective whose operand is one of ``made``
        (values just made available), then those their results make ready."""
        ready = {c for v in made for c in self.waiting.pop(v, [])}
        for collective in sorted(ready, key=self.lowering.index.__getitem__):
            if collective not in self.handles:
                self.start(collective)

    # --- kernels ---------------------------------------------------------------------------

    def emit_call(self, call: graph.CallOp | graph.ScanOp) -> None:
        """A region call: ``func.call`` of the callee's schedule (a scan:
        ``schedule.scan``)."""
        operands = [self.value(v) for v in call.operands]
        if isinstance(call, graph.ScanOp):
            new: Operation = self.insert(schedule.ScanOp.of(call, operands))
        else:
            new = self.insert(func.CallOp(call.callee_name, operands, call.result_types))
        for key, value in call.attributes.items():
            new.attributes[key] = value
        for old, result in zip(call.results, new.results, strict=True):
            result.name_hint = old.name_hint
            self.env[old] = result
        self.start_ready(list(call.results))

    def emit_kernel(self, group: _Group) -> None:
        if group.kind == "call":
            assert isinstance(group.ops[0], graph.CallOp | graph.ScanOp)
            self.emit_call(group.ops[0])
            return
        index = self.lowering.index
        group.ops = ops = sorted(group.ops, key=index.__getitem__)
        members = set(ops)
        found: dict[SSAValue, None] = {}
        constants: dict[Operation, None] = {}
        for v, _ in self.lowering._inputs(group):
            if _is(v.owner, Fusion.CONSTANT):  # type: ignore[arg-type]
                constants[v.owner] = None  # type: ignore[index]
            else:
                found[v] = None
        inputs = list(found)
        outputs = [
            r
            for op in ops
            for r in op.results
            if not r.uses or any(u.operation not in members for u in r.uses)
        ]
        new_inputs = [self.value(v) for v in inputs]
        body = schedule.kernel_body([v.type for v in inputs])
        block = body.block
        mapping: dict[SSAValue, SSAValue] = {}
        for old, arg in zip(inputs, block.args, strict=True):
            arg.name_hint = old.name_hint
            mapping[old] = arg
        absorbed = sorted(group.absorbed, key=index.__getitem__)
        for op in [*sorted(constants, key=index.__getitem__), *absorbed, *ops]:
            block.add_op(op.clone(value_mapper=mapping))
        block.add_op(schedule.YieldOp.create(operands=[mapping[r] for r in outputs]))
        name = re.sub(
            r"\W",
            "_",
            f"{self.lowering.function.sym_name.data}_k{self.kernel_count}_{_kernel_kind(group)}",
        )
        self.kernel_count += 1
        kernel = self.insert(
            schedule.KernelOp.get(name, new_inputs, [r.type for r in outputs], body)
        )
        for old, new in zip(outputs, kernel.results, strict=True):
            new.name_hint = old.name_hint
            self.env[old] = new
        self.start_ready(outputs)
