"""``insert-collectives``: make every operand's layout what its consumer needs.

Runs after ``shard-propagate`` (values without a ``graph.sharding`` count as
replicated). Walking each function in order, for every op:

- a graph op needs its operands laid out as ``op_sharding.decide`` says (weighing the
  result layouts ``shard-propagate`` chose, as it did); where an
  operand's layout differs, the reshard steps of ``reshard.plan_reshard`` are inserted
  before the op as collective ops (all_reduce, reduce_scatter, all_slice, all_to_all,
  all_gather), each annotated with the layout it leaves;
- a ``graph.shard`` constraint or an explicit collective written by the user is a layout
  statement: it is replaced by the planned reshard to the layout it states (nothing,
  when the value already has it); a constraint tagged ``graph.regather`` or
  ``graph.remat`` (a ZeRO-3 parameter's gather in a microbatch's forward, or the
  backward's copy, :mod:`tessera.transforms.remat`) moves the value again rather than
  reuse an earlier move;
- ``func.return`` needs values that are not partial: partial sums are all-reduced
  (but for the results a region variant returns partial, ``graph.partial_results``);
- a region call (``graph.call``) needs its operands laid out as the callee's arguments;
- constants are produced replicated (every rank builds them) and sliced where a split
  is needed, which is free.

A value resharded the same way for several consumers is resharded once, and a
transpose of a value already resharded is taken of the moved value instead of moved
itself, unless the move gathered it (holding a gathered activation until the backward
costs memory the collective saves; Megatron's sequence parallelism gathers again too): the backward's transposes of forward activations (a matmul's VJP transposes its
operand as traced, before the operand's reshard) reuse the forward's collective, e.g.
the dispatched tokens of expert parallelism are sent over ``ep`` once, not again for the
experts' weight gradient. The bypassed transpose is erased when nothing else uses it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import IntegerAttr, ModuleOp, i64
from xdsl.ir import Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.rewriter import InsertPoint, Rewriter

from tessera.analysis.op_sharding import Decisions, after_collective
from tessera.analysis.reduction_points import ReductionPoints
from tessera.ir import graph
from tessera.ir.abstract import aval
from tessera.ir.mesh import Mesh
from tessera.ir.mesh_symbol import sharded_functions
from tessera.ir.sharding import Sharding, arg_sharding, op_shardings, set_op_shardings
from tessera.opdefs import has_sharding_rule
from tessera.transforms.remat import REGATHER, REMAT
from tessera.transforms.reshard import ReshardStep, apply_step, plan_reshard, step_collective


@dataclass(frozen=True)
class InsertCollectivesPass(ModulePass):
    name = "insert-collectives"

    topology: str = ""  # the machine for a mesh naming none ("": its default, latency left out)

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for mesh_name, mesh, function in sharded_functions(op, self.name):
            _Inserter(mesh.priced_on(self.topology), mesh_name, function).run()


class _Inserter:
    def __init__(self, mesh: Mesh, mesh_name: str, function: func.FuncOp):
        self.mesh = mesh
        self.mesh_name = mesh_name
        self.function = function
        self.layout: dict[SSAValue, Sharding] = {}
        self.resharded: dict[tuple[SSAValue, Sharding], SSAValue] = {}
        self.moved: dict[SSAValue, set[Sharding]] = {}  # per value, the layouts it was moved to
        self.decisions = Decisions(mesh, ReductionPoints())
        self.bypassed: list[Operation] = []
        for index, arg in enumerate(function.args):
            self.layout[arg] = arg_sharding(function, index) or Sharding.replicated(aval(arg).rank)

    def run(self) -> None:
        partial = self.function.attributes.get(graph.PARTIAL_RESULTS)
        kept = set(partial.get_values()) if partial is not None else set()  # type: ignore[attr-defined]
        for op in list(self.function.body.block.ops):
            if isinstance(op, func.ReturnOp):
                for index, value in enumerate(op.operands):
                    current = self.of(value)
                    if index not in kept:  # returned complete
                        current = Sharding(current.dims)
                    self._use(op, index, self.reshard(value, current, op))
            elif isinstance(op, (graph.ShardOp, graph.CollectiveOp)):
                self._replace_statement(op)
            elif isinstance(op, graph.CallOp | graph.ScanOp):
                self._call(op)
            elif isinstance(op, graph.ConstantOp):
                replicated = [Sharding.replicated(aval(r).rank) for r in op.results]
                self._record(op, replicated)
            elif has_sharding_rule(op):
                # the results' layouts shard-propagate chose (with its users' wishes,
                # partial where they take a partial sum), and the moves already made
                wanted = list(op_shardings(op) or ())
                known = [self.of(v) for v in op.operands]
                available = [self._available(op, v) for v in op.operands]
                layout = self.decisions.decide(op, known, wanted, available)
                gathers = self.decisions.gathers(op, layout.assignment, known)
                for index, (value, needed) in enumerate(
                    zip(op.operands, layout.operands, strict=True)
                ):
                    self._use(op, index, self.reshard(value, needed, op))
                    if gathers[index] is not None:  # shard-partition gathers it, once
                        self.moved.setdefault(value, set()).add(gathers[index])
                self._record(op, list(layout.results))
        for op in reversed(self.bypassed):
            if all(not r.uses for r in op.results):
                self.decisions.forget(op.operands)
                Rewriter.erase_op(op)

    def _use(self, op: Operation, index: int, value: SSAValue) -> None:
        """``op`` reads ``value`` as its operand ``index`` (where that is another value,
        the users of both are counted again)."""
        if op.operands[index] is not value:
            self.decisions.forget((op.operands[index], value))
        op.operands[index] = value

    def _insert(self, op: Operation, before: Operation) -> None:
        """``op`` inserted before ``before`` (its operands' users are counted again)."""
        Rewriter.insert_op(op, InsertPoint.before(before))
        self.decisions.forget(op.operands)

    def _call(self, op: graph.CallOp | graph.ScanOp) -> None:
        """A region call: its operands laid out as the callee's arguments (a scan's
        stacked operands with a whole dim 0 before), its results as ``shard-propagate``
        found the callee returns them (constrained where ``graph.result_shardings`` says)."""
        callee = op.callee_function()
        carries = op.carry_count if isinstance(op, graph.ScanOp) else len(op.operands)
        for index, value in enumerate(op.operands):
            rank = aval(value).rank - (index >= carries)
            needed = (arg_sharding(callee, index) if callee is not None else None) or (
                Sharding.replicated(rank)
            )
            if index >= carries:
                needed = Sharding(((), *needed.dims))
            self._use(op, index, self.reshard(value, needed, op))
        shardings = op_shardings(op) or [Sharding.replicated(aval(r).rank) for r in op.results]
        # complete, but where a constraint keeps a result partial (shard-propagate)
        constraints = op.result_constraints()
        self._record(
            op,
            [
                Sharding(s.dims, c.partial if c is not None else ())
                for s, c in zip(shardings, constraints, strict=True)
            ],
        )
        # the callee's variant returns them constrained (shard-propagate), as it would
        # a graph.shard of each: the constraints are spent, as graph.shard ops are
        op.attributes.pop(graph.RESULT_SHARDINGS, None)

    def of(self, value: SSAValue) -> Sharding:
        return self.layout.get(value) or Sharding.replicated(aval(value).rank)

    def _record(self, op: Operation, shardings: list[Sharding]) -> None:
        for result, sharding in zip(op.results, shardings, strict=True):
            self.layout[result] = sharding
        set_op_shardings(op, self.mesh_name, shardings)

    def _replace_statement(self, op: graph.GraphOp) -> None:
        """A constraint or user collective becomes the reshard to the layout it states."""
        source = self.of(op.operands[0])
        if isinstance(op, graph.ShardOp):
            target = op.sharding.sharding
        else:
            target = after_collective(op, source)
        again = REMAT in op.attributes or REGATHER in op.attributes
        replacement = self.reshard(op.operands[0], target, op, again=again)
        self.decisions.forget((op.operands[0], op.results[0], replacement))
        op.results[0].replace_all_uses_with(replacement)
        Rewriter.erase_op(op)

    def reshard(
        self, value: SSAValue, target: Sharding, before: Operation, again: bool = False
    ) -> SSAValue:
        """``value`` laid out as ``target``, inserting collectives before ``before`` (with
        ``again``, even where an earlier reshard made it, and the later users keep that one)."""
        current = self.of(value)
        if current == target:
            return value
        key = (value, target)
        if key in self.resharded and not again:
            return self.resharded[key]
        moved = None if again else self._transpose_of_moved(value, target, before)
        if moved is not None:
            self.resharded[key] = moved
            return moved
        result = value
        for step in plan_reshard(current, target):
            current = apply_step(current, step)
            result = self._emit(step, result, current, before)
            if again:  # shard-partition keeps it apart from the earlier move too
                result.owner.attributes[REMAT] = IntegerAttr(-1, i64)  # type: ignore[union-attr]
        if not again:
            self.resharded[key] = result
            self.moved.setdefault(value, set()).add(target)
        return result

    def _available(self, op: Operation, value: SSAValue) -> frozenset[Sharding]:
        """The layouts ``value`` was moved to that ``op`` may read at no cost: all, but for
        a transpose (the backward's view of a forward value) those that gathered it, which
        are not kept for later (see :meth:`_transpose_of_moved`)."""
        moved = self.moved.get(value, ())
        if isinstance(op, graph.TransposeOp):
            pieces = self._pieces(value)
            return frozenset(t for t in moved if _pieces(self.mesh, t) >= pieces)
        return frozenset(moved)

    def _transpose_of_moved(
        self, value: SSAValue, target: Sharding, before: Operation
    ) -> SSAValue | None:
        """``transpose(x)`` laid out as ``target`` when ``x`` has already been resharded
        to the matching layout: the transpose of that value, no collective."""
        owner = value.owner
        if not isinstance(owner, graph.TransposeOp):
            return None
        perm = list(owner.attrs()["perm"])
        source_dims: list[tuple[str, ...]] = [()] * len(perm)
        for i, p in enumerate(perm):
            source_dims[p] = target.dims[i]
        source = owner.operands[0]
        moved = self.resharded.get((source, Sharding(tuple(source_dims), target.partial)))
        if moved is None or self._pieces(moved) < self._pieces(source):
            return None  # a gathered value is not kept for later: it is gathered again
        op = graph.build(graph.TransposeOp, [moved], perm=perm)
        self._insert(op, before)
        self._record(op, [target])
        self.bypassed.append(owner)
        return op.results[0]

    def _pieces(self, value: SSAValue) -> int:
        """How many pieces ``value``'s layout splits it into (its size per rank is its
        size over this)."""
        return math.prod(self.mesh.axis_size(a) for d in self.of(value).dims for a in d)

    def _emit(
        self, step: ReshardStep, value: SSAValue, after: Sharding, before: Operation
    ) -> SSAValue:
        op = step_collective(step, value)
        self._insert(op, before)
        self._record(op, [after])
        return op.results[0]


def _pieces(mesh: Mesh, sharding: Sharding) -> int:
    """Into how many pieces ``sharding`` splits a value on ``mesh``."""
    return math.prod(mesh.axis_size(a) for d in sharding.dims for a in d)
