"""``shard-partition``: rewrite a sharded function into the program one rank runs.

Runs after ``insert-collectives``. Every value's type becomes its per-rank (local) type
(``Sharding.local_shape``), the function is marked ``graph.partitioned`` so collectives
verify with local semantics, and ops whose attributes name global sizes are localised
(a slice's bounds on split dims). An op whose operands' layouts split a factor it
reduces internally does not gather them: its registered :class:`~tessera.opdefs.Partition`
rewrites it into local work and all-reduces of small values, for example

- softmax over a split axis: ``m = all_reduce_max(max(x))``,
  ``s = all_reduce_sum(sum(exp(x - m)))``, ``exp(x - m) / s`` (layer_norm, rms_norm and
  log_softmax likewise, see ``tessera.opdefs.normalization``);
- cross_entropy over split classes: the row max, the sum of exponentials and the
  label's logit (picked on the rank holding it) are the all-reduced statistics;
- gather along a split axis (a vocabulary-parallel embedding): each rank looks up the
  indices in its slice (``graph.axis_index`` gives its offset), zero rows elsewhere: a
  partial sum, which ``insert-collectives`` already resolves where it is consumed.

A split, concat or slice whose windowed dim stays split (a BLOCKS factor, see
``sharding_rules``) does not gather it either: each result block is built from the
operand blocks where it lies by local slices, ``collective_permute``s (ranks that are no
target receive zeros), their sum and a concat (:mod:`tessera.transforms.block_moves`).

An op whose sharding rule has a split ``CONTEXT`` factor (attention with the sequence
split over ``cp``: context parallelism) is expanded as the rule says
(``sharding_rules.context_layouts``): its operands with the factor are all-gathered
along it before the op (once per value, so a backward reuses its forward's gathers),
it computes whole along it, and its results with the factor, partial over the query
rows' axes, are reduce-scattered back to their layout. A collective ``insert-collectives``
placed that moves a value to a layout one of these gathers made already (the backward
of a forward computed with its sequence split, reading the gathered k and v) is that
gather's result, and the other way round: a value is moved to one layout once. An op with *position operands*
(``ShardingRule.positions``: attention's causal offsets) whose factor is split gets this
rank's start added to them (created as 0 + start when the op has none): the start is
``graph.axis_index`` over the factor's axes times the local size.

``graph.sharding`` annotations stay, describing how each local value sits in the global.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import DenseIntOrFPElementsAttr, FunctionType, ModuleOp, UnitAttr
from xdsl.ir import Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.rewriter import InsertPoint, Rewriter
from xdsl.utils.exceptions import VerifyException

from tessera.analysis.op_sharding import assignment_of, op_shape
from tessera.dtypes import DType
from tessera.errors import ShardingError
from tessera.ir import graph
from tessera.ir.abstract import AbstractTensor, aval
from tessera.ir.attr_values import to_attr
from tessera.ir.grad_builder import GradBuilder
from tessera.ir.graph_emitter import GraphEmitter
from tessera.ir.located_error import LocatedPassFailure
from tessera.ir.mesh import Mesh
from tessera.ir.mesh_symbol import sharded_functions
from tessera.ir.sharding import (
    Sharding,
    arg_sharding,
    op_shardings,
    set_op_shardings,
    value_sharding,
)
from tessera.ir.sharding_rules import FactorKind, FactorWindows, ShardingRule, context_layouts
from tessera.opdefs import Partition, has_sharding_rule, lookup
from tessera.perf.context_parallel import RingPlan, ring_plan
from tessera.transforms.block_moves import Window, plan_block_moves
from tessera.transforms.remat import REMAT
from tessera.transforms.reshard import ReshardStep, apply_step, plan_reshard, step_collective
from tessera.transforms.ring_attention import Ring, ring_backward, ring_forward


@dataclass(frozen=True)
class ShardPartitionPass(ModulePass):
    """Rewrites each sharded function into the program one rank runs (local shapes).

    ``context``: how attention with its sequence split runs, ``ring``, ``all_gather``
    or ``auto`` (priced on ``topology``, see ``tessera.perf.context_parallel``)."""

    name = "shard-partition"
    context: str = "auto"
    topology: str = ""  # the cost model's machine ("": the mesh's, Mesh.machine)

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        if self.context not in ("auto", "ring", "all_gather"):
            raise ShardingError(
                f"shard-partition: context must be auto, ring or all_gather, found {self.context!r}"
            )
        called = graph.called_functions(op)
        for mesh_name, mesh, function in sharded_functions(op, self.name):
            if graph.PARTITIONED not in function.attributes:
                partitioner = _Partitioner(mesh, mesh_name, function, self.context, self.topology)
                partitioner.in_region = function.sym_name.data in called
                partitioner.run()
        _check_calls(op)


def _check_calls(module: ModuleOp) -> None:
    """Each ``graph.call`` passes its callee per-rank operands of the callee's argument
    types: a call whose operand layouts differ from the callee's argument layouts (a module
    that did not run ``shard-propagate``, which makes one callee per layout, and
    ``insert-collectives``) is an error at the call, not IR that does not verify."""
    functions = {
        f.sym_name.data: f for f in module.body.block.ops if isinstance(f, func.FuncOp)
    }
    for call in module.walk():
        if not isinstance(call, graph.CallOp):
            continue
        callee = functions.get(call.callee_name)
        if callee is None:
            continue
        expected = list(callee.function_type.inputs.data)
        found = [v.type for v in call.operands]
        if found != expected:
            raise LocatedPassFailure(
                call,
                f"shard-partition: graph.call @{call.callee_name} passes per-rank operands "
                f"{[str(t) for t in found]} to arguments {[str(t) for t in expected]}: the "
                f"call's operand layouts differ from the callee's argument layouts (run "
                f"shard-propagate and insert-collectives first)",
            )


class _Partitioner:
    def __init__(
        self,
        mesh: Mesh,
        mesh_name: str,
        function: func.FuncOp,
        context: str = "auto",
        topology: str = "",
    ):
        self.mesh = mesh
        self.mesh_name = mesh_name
        self.function = function
        self.context = context
        self.topology = mesh.machine(topology) if context == "auto" else None
        self.zigzagged: dict[SSAValue, SSAValue] = {}  # ring attention's relayouts
        self.layouts: dict[SSAValue, Sharding] = {}  # global layouts, for Partition rules
        self.gathered: dict[tuple[SSAValue, Sharding], SSAValue] = {}  # context operands
        self.starts: dict[tuple[tuple[str, ...], int], SSAValue] = {}  # rank starts
        self.zero: SSAValue | None = None  # the 0 of position operands created here
        self.rules: dict[Operation, ShardingRule] = {}  # read while the types are global
        self.in_region = False  # a function graph.call / graph.scan ops call

    def local(self, value: SSAValue, sharding: Sharding) -> AbstractTensor:
        typ = aval(value)
        sharding.validate(self.mesh, typ.shape, f"value {value.name_hint or ''} of type {typ}")
        return typ.with_shape(sharding.local_shape(self.mesh, typ.shape))

    def run(self) -> None:
        block = self.function.body.block
        # the ops' sharding rules, read while the types are global
        self.rules = {op: op_shape(op).rule for op in block.ops if has_sharding_rule(op)}
        self.function.attributes[graph.PARTITIONED] = UnitAttr()  # collectives: local rules
        for index, arg in enumerate(block.args):
            sharding = arg_sharding(self.function, index) or Sharding.replicated(aval(arg).rank)
            local = Rewriter.replace_value_with_new_type(arg, self.local(arg, sharding).to_xdsl())
            self.layouts[local] = sharding
        for op in list(block.ops):
            if isinstance(op, func.ReturnOp):
                continue
            shardings = op_shardings(op) or [Sharding.replicated(aval(r).rank) for r in op.results]
            if isinstance(op, graph.ShardOp):
                raise LocatedPassFailure(
                    op, "shard-partition needs insert-collectives first: found a graph.shard"
                )
            self._localize(op, shardings)
        arg_types = [a.type for a in block.args]
        result_types = [v.type for v in block.last_op.operands] if block.last_op else []
        self.function.function_type = FunctionType.from_lists(arg_types, result_types)

    def _localize(self, op: Operation, shardings: Sequence[Sharding]) -> None:
        if isinstance(op, graph.CallOp | graph.ScanOp):  # the callee: as a function
            for result, sharding in zip(list(op.results), shardings, strict=True):
                local = self.local(result, sharding).to_xdsl()
                self.layouts[Rewriter.replace_value_with_new_type(result, local)] = sharding
            return
        moved = _moved_to(op, shardings)
        if moved is not None and moved in self.gathered:  # moved there already: shared
            op.results[0].replace_all_uses_with(self.gathered[moved])
            Rewriter.erase_op(op)
            return
        if self._expand(op, shardings):
            return
        rule = self.rules.get(op)
        if rule is not None and (rule.has_context or rule.positions):
            self._expand_sequences(op, rule, shardings)
            return
        if rule is not None:  # windows of a split dim: blocks move between ranks
            for windows in rule.windows:
                j = next((j for j, w in enumerate(windows.results) if w is not None), None)
                if j is None:  # no result has a window (a split into no pieces)
                    continue
                axes = shardings[j].dims[rule.results[j].index(windows.factor)]
                if axes:
                    self._move_blocks(op, rule, windows, axes, shardings)  # type: ignore[arg-type]
                    return
        for result, sharding in zip(list(op.results), shardings, strict=True):
            local = Rewriter.replace_value_with_new_type(result, self.local(result, sharding).to_xdsl())
            self.layouts[local] = sharding
        if isinstance(op, graph.SliceOp):  # only whole dims can be split: clip them
            attrs = op.attrs()
            limits = [
                min(limit, size)
                for limit, size in zip(attrs["limits"], aval(op.input).shape, strict=True)
            ]
            op.properties["limits"] = to_attr(limits)
        _check_local(op)
        if moved is not None:
            self.gathered[moved] = op.results[0]

    def _expand(self, op: Operation, shardings: Sequence[Sharding]) -> bool:
        """Replaces ``op`` by its registered per-rank form, if it has one for its operands'
        layouts (see :class:`~tessera.opdefs.Partition`); whether it did."""
        found = lookup(op)
        if found is None or not isinstance(found.partition, Partition):
            return False
        layouts = [self.layouts.get(v) or self.sharding_of(v) for v in op.operands]
        (result,) = op.results
        (sharding,) = shardings
        expected = self.local(result, sharding)
        replacement = found.partition.fn(GradBuilder(InsertPoint.before(op)), op, layouts, self.mesh)
        if replacement is None:
            return False
        if aval(replacement) != expected:
            raise LocatedPassFailure(
                op,
                f"shard-partition: the layouts of {op.name}'s operands do not give its "
                f"result's (run shard-propagate and insert-collectives first): its per-rank "
                f"form gives {aval(replacement)}, expected {expected}",
            )
        result.replace_all_uses_with(replacement)
        replacement.owner.attributes.update(op.attributes)  # type: ignore[union-attr]
        self.layouts[replacement] = sharding
        Rewriter.erase_op(op)
        return True

    def _move_blocks(
        self,
        op: graph.GraphOp,
        rule: ShardingRule,
        windows: FactorWindows,
        mesh_axes: tuple[str, ...],
        shardings: Sequence[Sharding],
    ) -> None:
        """Builds each result window's local block from the operand windows' blocks by
        local slices, collective permutes, sums and a concat (:mod:`tessera.transforms.block_moves`),
        instead of gathering the dim. Every op made is annotated with the layout of the
        result it builds."""
        ranks = math.prod(self.mesh.axis_size(a) for a in mesh_axes)
        sources = [i for i, w in enumerate(windows.operands) if w is not None]
        targets = [j for j, w in enumerate(windows.results) if w is not None]
        plan = plan_block_moves(
            [Window(*windows.operands[i]) for i in sources],  # type: ignore[misc]
            [Window(*windows.results[j]) for j in targets],  # type: ignore[misc]
            ranks,
        )
        emit = _Emitter(op)
        cuts: dict[tuple[SSAValue, int, int], SSAValue] = {}  # one slice per source range
        for j, segments in zip(targets, plan, strict=True):
            dim = rule.results[j].index(windows.factor)

            def annotated(value: SSAValue, j: int = j) -> SSAValue:
                set_op_shardings(value.owner, self.mesh_name, [shardings[j]])  # type: ignore[arg-type]
                return value

            pieces = []
            for segment in segments:
                terms = []
                for move in segment.moves:
                    index = sources[move.source]
                    source, source_dim = op.operands[index], rule.operands[index].index(windows.factor)
                    key = (source, move.start, segment.length)
                    if key not in cuts:
                        cuts[key] = _cut(emit, source, source_dim, move.start, segment.length)
                        if cuts[key] is not source:
                            annotated(cuts[key])
                    piece = cuts[key]
                    if not segment.is_local_slice(ranks):
                        pairs = [list(pair) for pair in move.pairs]
                        piece = annotated(
                            emit(graph.CollectivePermuteOp, [piece], axes=mesh_axes, pairs=pairs)
                        )
                    terms.append(piece)
                combine = graph.MaximumOp if aval(terms[0]).dtype == DType.i1 else graph.AddOp
                total = terms[0]  # each rank takes one term: the others are zeros there
                for term in terms[1:]:
                    total = annotated(emit(combine, [total, term]))
                pieces.append(total)
            if not pieces:  # an empty window: an empty slice of an operand
                first = sources[0]
                source_dim = rule.operands[first].index(windows.factor)
                pieces.append(annotated(_cut(emit, op.operands[first], source_dim, 0, 0)))
            result = pieces[0] if len(pieces) == 1 else annotated(emit(graph.ConcatOp, pieces, axis=dim))
            expected = self.local(op.results[j], shardings[j])
            assert aval(result) == expected, f"{op.name}: built {aval(result)}, expected {expected}"
            op.results[j].replace_all_uses_with(result)
            self.layouts[result] = shardings[j]
        Rewriter.erase_op(op)

    # --- context parallelism and position operands --------------------------------------

    def sharding_of(self, value: SSAValue) -> Sharding:
        """How ``value`` lies over the mesh (its producer's annotation)."""
        return value_sharding(self.function, value)

    def _expand_sequences(
        self, op: graph.GraphOp, rule: ShardingRule, shardings: Sequence[Sharding]
    ) -> None:
        """Gathers the operands of split ``CONTEXT`` factors, adds this rank's starts to
        the position operands, and reshards the results from the layouts the op computes
        in to their own (see the module docstring)."""
        have = [self.sharding_of(v) for v in op.operands]
        assignment = assignment_of(rule, have)
        in_operands = {f for dims in rule.operands for f in dims}
        for sharding, dims in zip(shardings, rule.results, strict=True):
            for factor, axes in zip(dims, sharding.dims, strict=True):
                if axes and factor is not None and factor not in in_operands:
                    assignment.setdefault(factor, axes)  # split in the result alone (an iota)
        if self.in_region and any(
            axes and rule.factors[f].kind == FactorKind.CONTEXT for f, axes in assignment.items()
        ):
            raise LocatedPassFailure(
                op,
                f"shard-partition: {op.name} with its sequence split over the mesh (context "
                f"parallelism) inside graph.region / graph.scan @{self.function.sym_name.data} "
                f"is not supported yet; call these layers unrolled on a mesh with a cp axis",
            )
        ring = ring_plan(op, rule, assignment, have, self.mesh)
        if ring is not None and self._rings(op, ring):
            computed = list(ring.layouts.results)
            results = self._ring(op, ring)
        else:
            operands, computed = context_layouts(rule, assignment, have, shardings)
            for index, (current, needed) in enumerate(zip(have, operands, strict=True)):
                if current != needed:
                    op.operands[index] = self._gathered(op.operands[index], current, needed, op)
            if not _stored_zigzag(op):  # else ``unzigzag-attention`` places its chunks
                self._localize_positions(op, rule, assignment)
            for result, layout in zip(op.results, computed, strict=True):
                Rewriter.replace_value_with_new_type(result, self.local(result, layout).to_xdsl())
            set_op_shardings(op, self.mesh_name, computed)
            _check_local(op)
            results = list(op.results)
        anchor = results[0].owner.next_op  # type: ignore[union-attr]
        assert anchor is not None
        for result, layout, target in zip(results, computed, shardings, strict=True):
            if layout == target:
                continue
            value = result
            uses = list(result.uses)
            for step in plan_reshard(layout, target):
                layout = apply_step(layout, step)
                value = self._emit_step(step, value, layout, anchor)
            for use in uses:
                use.operation.operands[use.index] = value

    def _rings(self, op: graph.GraphOp, plan: RingPlan) -> bool:
        """Whether ``op`` runs as ring attention: as asked, else as the cost model picks."""
        if self.context != "auto":
            return self.context == "ring"
        assert self.topology is not None
        return plan.cost(self.topology).method == "ring"

    def _ring(self, op: graph.GraphOp, plan: RingPlan) -> list[SSAValue]:
        """``op`` expanded round the ring (:mod:`tessera.transforms.ring_attention`); the op is
        erased and its local results returned."""
        ring = Ring(op, self.mesh_name, plan.axes, plan.size, self.zigzagged)
        expand = ring_forward if isinstance(op, graph.AttentionOp) else ring_backward
        results = expand(ring, op, plan.layouts, plan.zigzag, plan.relayout)  # type: ignore[arg-type]
        for old, new in zip(op.results, results, strict=True):
            old.replace_all_uses_with(new)
        Rewriter.erase_op(op)
        return results

    def _gathered(
        self, value: SSAValue, current: Sharding, needed: Sharding, before: Operation
    ) -> SSAValue:
        """``value`` resharded from ``current`` to ``needed`` (once per value and layout)."""
        key = (value, needed)
        if key not in self.gathered:
            result, layout = value, current
            for step in plan_reshard(current, needed):
                layout = apply_step(layout, step)
                result = self._emit_step(step, result, layout, before)
            self.gathered[key] = result
        return self.gathered[key]

    def _emit_step(
        self, step: ReshardStep, value: SSAValue, after: Sharding, before: Operation
    ) -> SSAValue:
        """The collective of one reshard step, in local (per-rank) types."""
        group_size = math.prod(self.mesh.axis_size(a) for a in step.axes)
        op = step_collective(step, value, group_size)
        Rewriter.insert_op(op, InsertPoint.before(before))
        set_op_shardings(op, self.mesh_name, [after])
        return op.results[0]

    def _localize_positions(
        self, op: graph.GraphOp, rule: ShardingRule, assignment: dict[int, tuple[str, ...]]
    ) -> None:
        """Adds this rank's start of each split factor to its position operand."""
        if not rule.positions:
            return
        split = [
            assignment.get(f, ()) if rule.kind(f) is not FactorKind.CONTEXT else ()
            for f, _ in rule.positions
        ]
        if not any(split):
            return
        first = rule.positions[0][1]
        present = len(op.operands) > first
        emit = _Emitter(op)
        values = []
        for (factor, index), axes in zip(rule.positions, split, strict=True):
            current = op.operands[index] if present else None
            if not axes:
                values.append(current if current is not None else self._zero_position(op))
                continue
            start = self._rank_start(axes, self._local_size(op, rule, factor, axes), op)
            if current is not None:
                start = emit(graph.AddOp, [current, start])
                set_op_shardings(start.owner, self.mesh_name, [Sharding(())])  # type: ignore[arg-type]
            values.append(start)
        op.operands = [*op.operands[:first], *values]

    def _zero_position(self, before: Operation) -> SSAValue:
        """An i32 scalar 0 (one per function)."""
        if self.zero is None:
            self.zero = _Emitter(before).scalar(0, _I32)
            set_op_shardings(self.zero.owner, self.mesh_name, [Sharding(())])  # type: ignore[arg-type]
        return self.zero

    def _local_size(
        self, op: Operation, rule: ShardingRule, factor: int, axes: tuple[str, ...]
    ) -> int:
        """The local size of ``factor``: an operand's dim that has it, else (a factor of
        the results alone, as an iota's) its size split over ``axes``."""
        for value, dims in zip(op.operands, rule.operands, strict=False):
            if factor in dims:
                return aval(value).shape[dims.index(factor)]
        return rule.factors[factor].size // math.prod(self.mesh.axis_size(a) for a in axes)

    def _rank_start(self, axes: tuple[str, ...], size: int, before: Operation) -> SSAValue:
        """This rank's first index of a dim of local ``size`` split over ``axes``:
        ``axis_index(axes) * size`` (an i32 scalar, once per axes and size)."""
        key = (axes, size)
        if key not in self.starts:
            position = graph.build(graph.AxisIndexOp, [], axes=axes)
            Rewriter.insert_op(position, InsertPoint.before(before))
            emit = _Emitter(before)
            block_size = emit.scalar(size, _I32)
            start = emit(graph.MulOp, [position.results[0], block_size])
            for value in (position.results[0], block_size, start):
                set_op_shardings(value.owner, self.mesh_name, [Sharding(())])  # type: ignore[arg-type]
            self.starts[key] = start
        return self.starts[key]


_I32 = AbstractTensor((), DType.i32)


class _Emitter(GraphEmitter):
    """A GraphEmitter with the constant helpers the partitioned ops need."""

    def scalar(self, value: float, like: AbstractTensor) -> SSAValue:
        dense = DenseIntOrFPElementsAttr.from_list(
            AbstractTensor((), like.dtype).to_xdsl(), [value]
        )
        op = graph.build(graph.ConstantOp, [], value=dense)
        Rewriter.insert_op(op, InsertPoint.before(self.anchor))
        return op.results[0]


def _cut(emit: GraphEmitter, value: SSAValue, dim: int, start: int, length: int) -> SSAValue:
    """``value[start:start + length]`` along ``dim`` (the value itself when that is all
    of it)."""
    shape = aval(value).shape
    if (start, length) == (0, shape[dim]):
        return value
    limits = list(shape)
    limits[dim] = start + length
    starts = [0] * len(shape)
    starts[dim] = start
    return emit(graph.SliceOp, [value], starts=starts, limits=limits, strides=[1] * len(shape))


# collectives whose result is their operand's value in another layout: two of one value
# to one layout are the same move
_LAYOUT_MOVES = (
    graph.AllGatherOp,
    graph.AllSliceOp,
    graph.AllReduceOp,
    graph.ReduceScatterOp,
    graph.AllToAllOp,
)


def _moved_to(op: Operation, shardings: Sequence[Sharding]) -> tuple[SSAValue, Sharding] | None:
    """For a collective that moves a value to another layout (one ``insert-collectives``
    placed), the value and that layout: the key of ``_Partitioner.gathered``; None for a
    move made again on purpose (tagged ``graph.remat``: a ZeRO-3 backward's gather)."""
    if not isinstance(op, _LAYOUT_MOVES) or REMAT in op.attributes:
        return None
    return op.operands[0], shardings[0]


def _stored_zigzag(op: Operation) -> bool:
    """Whether ``op`` is causal or windowed attention over a sequence stored in zig-zag
    order."""
    if not isinstance(op, graph.AttentionOp | graph.AttentionBackwardOp):
        return False
    attrs = op.attrs()
    return bool((attrs["causal"] or attrs.get("window")) and attrs.get("zigzag"))


def _check_local(op: Operation) -> None:
    """Raises at ``op`` unless its local (per-rank) types fit its rule: its operands'
    layouts must give its results' (shard-propagate and insert-collectives see to it)."""
    try:
        op.verify_()
    except VerifyException as error:
        raise LocatedPassFailure(
            op,
            f"shard-partition: the layouts of {op.name}'s operands do not give its "
            f"result's (run shard-propagate and insert-collectives first): {error}",
        ) from None
