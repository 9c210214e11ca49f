"""``shard-partition``: rewrite a sharded function into the program one rank runs.

Runs after ``insert-collectives``. Every value's type becomes its per-rank (local) type
(``Sharding.local_shape``), the function is marked ``graph.partitioned`` so collectives
verify with local semantics, and ops whose attributes name global sizes are localised
(a slice's bounds on split dims). A normalisation whose normalised axis is split does
not gather the tensor: it is expanded into local statistics, an all-reduce of those
small statistics, and local elementwise math:

- softmax: ``m = all_reduce_max(max(x))``, ``s = all_reduce_sum(sum(exp(x - m)))``,
  ``exp(x - m) / s`` (log_softmax: ``x - m - log(s)``);
- layer_norm: ``mean = all_reduce_mean(mean(x))``, ``var = all_reduce_mean(mean(d*d))``
  with ``d = x - mean``, then ``d * rsqrt(var + eps)``;
- rms_norm: ``x * rsqrt(all_reduce_mean(mean(x*x)) + eps)``.

A split, concat or slice whose windowed dim stays split (a BLOCKS factor, see
``sharding_rules``) does not gather it either: each result block is built from the
operand blocks where it lies by local slices, ``collective_permute``s (ranks that are no
target receive zeros), their sum and a concat (:mod:`tessera.ir.block_moves`).

``graph.sharding`` annotations stay, describing how each local value sits in the global.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from math import prod

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import DenseIntOrFPElementsAttr, FunctionType, ModuleOp, UnitAttr
from xdsl.ir import Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.rewriter import InsertPoint, Rewriter

from tessera.dtypes import DType
from tessera.errors import ShardingError
from tessera.ir import graph
from tessera.ir.abstract import AbstractTensor, aval
from tessera.ir.attr_values import to_attr
from tessera.ir.block_moves import Window, plan_block_moves
from tessera.ir.graph_emitter import GraphEmitter
from tessera.ir.mesh import Mesh
from tessera.ir.mesh_symbol import sharded_functions
from tessera.ir.sharding import Sharding, arg_sharding, op_shardings, set_op_shardings
from tessera.ir.sharding_rules import FactorWindows, ShardingRule
from tessera.ops import Fusion, fusion_of, has_sharding_rule, sharding_rule


@dataclass(frozen=True)
class ShardPartitionPass(ModulePass):
    name = "shard-partition"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for mesh_name, mesh, function in sharded_functions(op):
            if graph.PARTITIONED not in function.attributes:
                _Partitioner(mesh, mesh_name, function).run()


class _Partitioner:
    def __init__(self, mesh: Mesh, mesh_name: str, function: func.FuncOp):
        self.mesh = mesh
        self.mesh_name = mesh_name
        self.function = function
        self.global_types: dict[SSAValue, AbstractTensor] = {}  # of values made local

    def local(self, value: SSAValue, sharding: Sharding) -> AbstractTensor:
        typ = aval(value)
        sharding.validate(self.mesh, typ.shape, f"value {value.name_hint or ''} of type {typ}")
        return typ.with_shape(sharding.local_shape(self.mesh, typ.shape))

    def make_local(self, value: SSAValue, sharding: Sharding) -> SSAValue:
        """Gives ``value`` its per-rank type (remembering its global type)."""
        local = Rewriter.replace_value_with_new_type(value, self.local(value, sharding).to_xdsl())
        self.global_types[local] = aval(value)
        return local

    def run(self) -> None:
        block = self.function.body.block
        for index, arg in enumerate(block.args):
            sharding = arg_sharding(self.function, index) or Sharding.replicated(aval(arg).rank)
            self.make_local(arg, sharding)
        for op in list(block.ops):
            if isinstance(op, func.ReturnOp):
                continue
            shardings = op_shardings(op) or [Sharding.replicated(aval(r).rank) for r in op.results]
            if isinstance(op, graph.ShardOp):
                raise ShardingError(
                    "shard-partition needs insert-collectives first: found a graph.shard"
                )
            self._localize(op, shardings)
        self.function.attributes[graph.PARTITIONED] = UnitAttr()
        arg_types = [a.type for a in block.args]
        result_types = [v.type for v in block.last_op.operands] if block.last_op else []
        self.function.function_type = FunctionType.from_lists(arg_types, result_types)

    def _localize(self, op: Operation, shardings: Sequence[Sharding]) -> None:
        if fusion_of(op) is Fusion.NORMALIZATION:  # statistics over a split axis
            split = self._split_axes(op, shardings[0])
            if split and aval(op.operands[0]).size:  # an empty tensor has no statistics
                self._expand_normalization(op, shardings[0], split)
                return
        if isinstance(op, graph.GraphOp) and has_sharding_rule(op):  # windows of a split dim
            rule = sharding_rule(op, [self.global_types[v] for v in op.operands])
            for windows in rule.windows:
                j = next(j for j, w in enumerate(windows.results) if w is not None)
                axes = shardings[j].dims[rule.results[j].index(windows.factor)]
                if axes:
                    self._move_blocks(op, rule, windows, axes, shardings)
                    return
        for result, sharding in zip(list(op.results), shardings, strict=True):
            self.make_local(result, sharding)
        if isinstance(op, graph.SliceOp):  # only whole dims can be split: clip them
            attrs = op.attrs()
            limits = [
                min(limit, size)
                for limit, size in zip(attrs["limits"], aval(op.input).shape, strict=True)
            ]
            op.properties["limits"] = to_attr(limits)

    def _split_axes(self, op: graph.GraphOp, sharding: Sharding) -> tuple[str, ...]:
        attrs = op.attrs()
        axes = attrs["axes"] if "axes" in attrs else (attrs["axis"],)
        return tuple(a for d in axes for a in sharding.dims[d])

    def _expand_normalization(
        self, op: graph.GraphOp, sharding: Sharding, mesh_axes: tuple[str, ...]
    ) -> None:
        attrs = op.attrs()
        axes = tuple(attrs["axes"]) if "axes" in attrs else (attrs["axis"],)
        x = op.operands[0]  # already local: operands are rewritten before their users
        emit = _Emitter(op)

        def stat(kind: type[graph.GraphOp], value: SSAValue, reduce: str) -> SSAValue:
            local = emit(kind, [value], axes=axes, keepdims=True)
            return emit(graph.AllReduceOp, [local], axes=mesh_axes, kind=reduce)

        if isinstance(op, (graph.SoftmaxOp, graph.LogSoftmaxOp)):
            peak = stat(graph.MaxOp, x, "max")
            shifted = emit(graph.SubOp, [x, peak])
            exps = emit(graph.ExpOp, [shifted])
            total = stat(graph.SumOp, exps, "sum")
            if isinstance(op, graph.SoftmaxOp):
                result = emit(graph.DivOp, [exps, total])
            else:
                result = emit(graph.SubOp, [shifted, emit(graph.LogOp, [total])])
        else:
            eps = emit.scalar(attrs["eps"], aval(x))
            if isinstance(op, graph.LayerNormOp):
                centered = emit(graph.SubOp, [x, stat(graph.MeanOp, x, "mean")])
                variance = stat(graph.MeanOp, emit(graph.MulOp, [centered, centered]), "mean")
                result = emit(
                    graph.MulOp,
                    [centered, emit(graph.RsqrtOp, [emit(graph.AddOp, [variance, eps])])],
                )
            else:
                square_mean = stat(graph.MeanOp, emit(graph.MulOp, [x, x]), "mean")
                result = emit(
                    graph.MulOp, [x, emit(graph.RsqrtOp, [emit(graph.AddOp, [square_mean, eps])])]
                )
        self._replace(op.results[0], result)
        result.owner.attributes.update(op.attributes)
        Rewriter.erase_op(op)

    def _replace(self, old: SSAValue, new: SSAValue) -> None:
        """Uses of the global ``old`` take the local ``new`` (its global type is old's)."""
        self.global_types[new] = aval(old)
        old.replace_all_uses_with(new)

    def _move_blocks(
        self,
        op: graph.GraphOp,
        rule: ShardingRule,
        windows: FactorWindows,
        mesh_axes: tuple[str, ...],
        shardings: Sequence[Sharding],
    ) -> None:
        """Builds each result window's local block from the operand windows' blocks by
        local slices, collective permutes, sums and a concat (:mod:`tessera.ir.block_moves`),
        instead of gathering the dim. Every op made is annotated with the layout of the
        result it builds."""
        ranks = prod(self.mesh.axis_size(a) for a in mesh_axes)
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
            self._replace(op.results[j], result)
        Rewriter.erase_op(op)


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


class _Emitter(GraphEmitter):
    """A GraphEmitter with the constant helpers the partitioned ops need."""

    def scalar(self, value: float, like: AbstractTensor) -> SSAValue:
        dense = DenseIntOrFPElementsAttr.from_list(
            AbstractTensor((), like.dtype).to_xdsl(), [value]
        )
        op = graph.build(graph.ConstantOp, [], value=dense)
        Rewriter.insert_op(op, InsertPoint.before(self.anchor))
        return op.results[0]
