"""``lower-graph-to-schedule``: group a partitioned graph function into kernels and async collectives.

Runs after ``shard-partition`` (or on a function without collectives). Three steps:

1. *Group* (greedy, in program order). Every graph op but a collective or a constant
   joins a group; a group becomes one ``schedule.kernel``. What an op may join is its
   fusion class (``tessera.ops.op_def(op).fusion``):

   - First, each ``softmax(score(q kᵀ)) v`` (``codegen.attention.find_attention``: the
     optional transpose of k, the two matmuls, the elementwise score ops such as a scale,
     a mask select or an additive bias, the softmax and an optional cast, every
     intermediate used once) becomes an ``attention`` group: one flash-attention kernel.
     It takes no other op.

   - An elementwise op joins the group of an operand's producer when that group is
     elementwise, matmul or reduction, and every user of that operand is already in
     the group (so no value escapes half-computed and no other op is starved): the
     epilogue of a matmul (bias, activation, residual add), of a row reduction, or a
     chain of elementwise ops. Otherwise it starts an elementwise group.
   - A row reduction (sum, mean, max, min, softmax, log_softmax, layer_norm, rms_norm,
     cross_entropy) joins its operand's group when that group is purely elementwise
     (its prologue), under the same condition; it then takes epilogues as above.
   - A matmul always starts a group (no prologue fusion).
   - Layout ops (reshape, transpose, broadcast_to, slice, concat, split, gather,
     all_slice) are a group of their own and take no epilogue.
   - A join never closes a cycle between groups (through other groups or collectives).
   - Constants join no group: each kernel that uses one gets its own copy; a constant
     used outside kernels (returned, or sent to a collective) becomes a kernel alone.

2. *Collectives* become ``schedule.start`` / ``schedule.wait`` pairs.

3. *Order*. Kernels are emitted in dependence order, earliest first op first; a
   collective's start, and its wait right after it, as soon as its operand is made. The
   schedule is serial (no communication overlaps computation); ``overlap-comm`` then
   moves the waits down to their first use.

Kernels are named ``@<function>_k<N>_<op>``: N counts kernels in emission order, and op
is ``attention`` for an attention group, else the group's matmul or reduction, else its
first op (without ``graph.``).
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp, TensorType
from xdsl.ir import Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.rewriter import InsertPoint, Rewriter
from xdsl.utils.exceptions import PassFailedException

from tessera.codegen.attention import find_attention
from tessera.codegen.kernels import reduced_axes
from tessera.ir import graph, schedule
from tessera.ops import Fusion, fusion_of


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
        for function in op.ops:
            if (
                isinstance(function, func.FuncOp)
                and function.body.blocks
                and _has_graph_ops(function)
            ):
                if graph.PARTITIONED not in function.attributes and _has_collectives(function):
                    raise PassFailedException(
                        f"lower-graph-to-schedule: @{function.sym_name.data} has collectives with global "
                        f"types; run shard-partition first"
                    )
                _split_cross_entropy(function)
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


def _has_graph_ops(function: func.FuncOp) -> bool:
    return any(isinstance(o, graph.GraphOp) for o in function.body.block.ops)


def _has_collectives(function: func.FuncOp) -> bool:
    return any(isinstance(o, graph.CollectiveOp) for o in function.body.block.ops)


def _short(op: Operation) -> str:
    return op.name.split(".", 1)[1]


def _kernel_kind(group: _Group) -> str:
    """The last part of a kernel's name: ``attention``, else its anchor op's short name."""
    return "attention" if group.kind == "attention" else _short(group.anchor())


@dataclass(eq=False)
class _Group:
    """Ops that become one kernel; ``kind`` says what may still join it."""

    kind: str  # "elementwise", "matmul", "reduction", "layout" or "attention"
    ops: list[Operation] = field(default_factory=list)

    def anchor(self) -> Operation:
        if self.kind == "attention":
            return next(o for o in self.ops if isinstance(o, graph.SoftmaxOp))
        if self.kind in ("matmul", "reduction"):
            return next(o for o in self.ops if _is(o, Fusion.MATMUL) or _reduces_rows(o))
        return self.ops[0]


def _dims(value: SSAValue) -> tuple[int, ...]:
    assert isinstance(value.type, TensorType)
    return tuple(value.type.get_shape())


def _broadcasts(shapes: Sequence[tuple[int, ...]], into: tuple[int, ...] | None = None) -> bool:
    """Whether ``shapes`` broadcast together (numpy rules), into ``into`` when given."""
    rank = max([len(s) for s in shapes] + [len(into) if into else 0])
    for i in range(1, rank + 1):
        sizes = {s[-i] for s in shapes if len(s) >= i and s[-i] != 1}
        if into is not None:
            if i > len(into) and sizes:
                return False
            if sizes - {into[-i] if i <= len(into) else 1}:
                return False
        elif len(sizes) > 1:
            return False
    return True


def _fits(op: Operation, group: _Group) -> bool:
    """Whether ``op`` joining ``group`` keeps one iteration space for the kernel (the
    generated code evaluates every value of a kernel at an index of that space)."""
    result = _dims(op.results[0])
    if group.kind == "matmul":
        return result == _dims(group.anchor().results[0])
    if group.kind == "reduction":
        anchor = group.anchor()
        full = _dims(anchor.operands[0])
        axes = reduced_axes(anchor)
        kept = tuple(1 if d in axes else s for d, s in enumerate(full))
        squeezed = tuple(s for d, s in enumerate(full) if d not in axes)
        return result in (full, kept, squeezed)
    shapes = [_dims(r) for o in group.ops for r in o.results]
    if _reduces_rows(op):  # the group becomes the reduction's prologue
        return _broadcasts(shapes, _dims(op.operands[0]))
    return _broadcasts([*shapes, result])


class _Lowering:
    def __init__(self, function: func.FuncOp):
        self.function = function
        self.block = function.body.block
        self.ops = [o for o in self.block.ops if not isinstance(o, func.ReturnOp)]
        self.index = {o: i for i, o in enumerate(self.ops)}
        self.group_of: dict[Operation, _Group] = {}
        self.groups: list[_Group] = []

    # --- 1. grouping -------------------------------------------------------------------

    def run(self) -> None:
        for ops in find_attention(self.ops):  # softmax(q kᵀ) v: one flash-attention kernel
            group = _Group("attention", list(ops))
            self.groups.append(group)
            self.group_of.update((o, group) for o in ops)
        for op in self.ops:
            if _is(op, Fusion.CONSTANT) or _communicates(op) or op in self.group_of:
                continue
            self._group(op)
        for op in self.ops:  # constants with users outside kernels are kernels alone
            if _is(op, Fusion.CONSTANT) and any(
                self._outside_kernels(u.operation) for u in op.results[0].uses
            ):
                self._new_group("elementwise", op)
        _Emitter(self).run()

    def _outside_kernels(self, user: Operation) -> bool:
        return isinstance(user, func.ReturnOp) or _communicates(user)

    def _new_group(self, kind: str, op: Operation) -> None:
        group = _Group(kind, [op])
        self.groups.append(group)
        self.group_of[op] = group

    def _group(self, op: Operation) -> None:
        if _is(op, Fusion.ELEMENTWISE):
            kind, accepts = "elementwise", ("elementwise", "matmul", "reduction")
        elif _reduces_rows(op):
            kind, accepts = "reduction", ("elementwise",)
        elif _is(op, Fusion.MATMUL):
            kind, accepts = "matmul", ()
        else:
            kind, accepts = "layout", ()
        for operand in op.operands:
            group = self.group_of.get(operand.owner)  # type: ignore[arg-type]
            if (
                group is not None
                and group.kind in accepts
                and _fits(op, group)
                and self._may_join(op, operand, group)
            ):
                group.ops.append(op)
                self.group_of[op] = group
                if group.kind == "elementwise":
                    group.kind = kind
                return
        self._new_group(kind, op)

    def _may_join(self, op: Operation, operand: SSAValue, group: _Group) -> bool:
        """``operand`` (made in ``group``) is used only there and by ``op``, and no other
        operand of ``op`` depends on ``group`` (a join would make a cycle)."""
        if any(
            u.operation is not op and self.group_of.get(u.operation) is not group
            for u in operand.uses
        ):
            return False
        for other in op.operands:
            producer = self._producer_group(other)
            if producer is not None and producer is not group and self._depends(producer, group):
                return False
        return True

    def _producer_group(self, value: SSAValue) -> _Group | None:
        """The group a value comes from, looking through collectives."""
        owner = value.owner
        while _communicates(owner):  # type: ignore[arg-type]
            owner = owner.operands[0].owner
        return self.group_of.get(owner) if isinstance(owner, Operation) else None

    def _depends(self, group: _Group, on: _Group) -> bool:
        """Whether ``group`` uses a value of ``on``, directly or through other groups.

        A chain of uses from ``on`` only reaches ops after ``on``'s first op (program
        order), so the search skips groups that end before it: it stays local."""
        earliest = min(self.index[o] for o in on.ops)
        seen: set[int] = set()
        stack = [group]
        while stack:
            current = stack.pop()
            if current is on:
                return True
            if id(current) in seen or max(self.index[o] for o in current.ops) < earliest:
                continue
            seen.add(id(current))
            stack.extend(p for p in self.group_inputs(current) if p is not None)
        return False

    def group_inputs(self, group: _Group) -> list[_Group | None]:
        return [
            self._producer_group(v)
            for o in group.ops
            for v in o.operands
            if self.group_of.get(v.owner) is not group  # type: ignore[arg-type]
        ]


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
        self.kernel_count = 0

    def insert(self, op: Operation) -> Operation:
        Rewriter.insert_op(op, InsertPoint.before(self.ret))
        return op

    def run(self) -> None:
        self.start_ready(list(self.lowering.block.args))
        for group in self._order():
            self.emit_kernel(group)
        for collective in self.collectives:  # every handle is waited for
            self.value(collective.results[0])
        self.ret.operands = [self.value(v) for v in self.ret.operands]
        for op in reversed(self.lowering.ops):
            Rewriter.erase_op(op)

    def _order(self) -> list[_Group]:
        """Groups in dependence order; among ready ones, the earliest first op first."""
        lowering = self.lowering
        first = {id(g): min(lowering.index[o] for o in g.ops) for g in lowering.groups}
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
        self.env[collective.results[0]] = wait.results[0]
        self.start_ready([collective.results[0]])

    def start_ready(self, made: Sequence[SSAValue]) -> None:
        """Starts, in program order, every collective whose operand is one of ``made``
        (values just made available), then those their results make ready."""
        ready = {c for v in made for c in self.waiting.pop(v, [])}
        for collective in sorted(ready, key=self.lowering.index.__getitem__):
            if collective not in self.handles:
                self.start(collective)

    # --- kernels ---------------------------------------------------------------------------

    def emit_kernel(self, group: _Group) -> None:
        members = set(group.ops)
        inputs: list[SSAValue] = []
        constants: list[Operation] = []
        for op in group.ops:
            for v in op.operands:
                if v.owner in members or v in inputs:
                    continue
                if _is(v.owner, Fusion.CONSTANT):  # type: ignore[arg-type]
                    if v.owner not in constants:
                        constants.append(v.owner)
                else:
                    inputs.append(v)
        outputs = [
            r
            for op in group.ops
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
        for op in [*sorted(constants, key=self.lowering.index.__getitem__), *group.ops]:
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
