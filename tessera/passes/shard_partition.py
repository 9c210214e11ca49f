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

``graph.sharding`` annotations stay, describing how each local value sits in the global.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import DenseIntOrFPElementsAttr, FunctionType, ModuleOp, UnitAttr
from xdsl.ir import Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.rewriter import InsertPoint, Rewriter
from xdsl.utils.exceptions import VerifyException

from tessera.ir import graph
from tessera.ir.abstract import AbstractTensor, aval
from tessera.ir.attr_values import to_attr
from tessera.ir.graph_emitter import GraphEmitter
from tessera.ir.located_error import LocatedPassFailure
from tessera.ir.mesh import Mesh
from tessera.ir.mesh_symbol import sharded_functions
from tessera.ir.sharding import Sharding, arg_sharding, op_shardings
from tessera.ops import Fusion, fusion_of


@dataclass(frozen=True)
class ShardPartitionPass(ModulePass):
    name = "shard-partition"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for _, mesh, function in sharded_functions(op, self.name):
            if graph.PARTITIONED not in function.attributes:
                _Partitioner(mesh, function).run()


class _Partitioner:
    def __init__(self, mesh: Mesh, function: func.FuncOp):
        self.mesh = mesh
        self.function = function

    def local(self, value: SSAValue, sharding: Sharding) -> AbstractTensor:
        typ = aval(value)
        sharding.validate(self.mesh, typ.shape, f"value {value.name_hint or ''} of type {typ}")
        return typ.with_shape(sharding.local_shape(self.mesh, typ.shape))

    def run(self) -> None:
        block = self.function.body.block
        self.function.attributes[graph.PARTITIONED] = UnitAttr()  # collectives: local rules
        for index, arg in enumerate(block.args):
            sharding = arg_sharding(self.function, index) or Sharding.replicated(aval(arg).rank)
            Rewriter.replace_value_with_new_type(arg, self.local(arg, sharding).to_xdsl())
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
        if fusion_of(op) is Fusion.NORMALIZATION:  # statistics over a split axis
            split = self._split_axes(op, shardings[0])
            if split:
                self._expand_normalization(op, shardings[0], split)
                return
        for result, sharding in zip(list(op.results), shardings, strict=True):
            Rewriter.replace_value_with_new_type(result, self.local(result, sharding).to_xdsl())
        if isinstance(op, graph.SliceOp):  # only whole dims can be split: clip them
            attrs = op.attrs()
            limits = [
                min(limit, size)
                for limit, size in zip(attrs["limits"], aval(op.input).shape, strict=True)
            ]
            op.properties["limits"] = to_attr(limits)
        try:  # its operands are local already: the local types must fit its rule
            op.verify_()
        except VerifyException as error:
            raise LocatedPassFailure(
                op,
                f"shard-partition: the layouts of {op.name}'s operands do not give its "
                f"result's (run shard-propagate and insert-collectives first): {error}",
            ) from None

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
        op.results[0].replace_all_uses_with(result)
        result.owner.attributes.update(op.attributes)
        Rewriter.erase_op(op)


class _Emitter(GraphEmitter):
    """A GraphEmitter with the constant helpers the partitioned ops need."""

    def scalar(self, value: float, like: AbstractTensor) -> SSAValue:
        dense = DenseIntOrFPElementsAttr.from_list(
            AbstractTensor((), like.dtype).to_xdsl(), [value]
        )
        op = graph.build(graph.ConstantOp, [], value=dense)
        Rewriter.insert_op(op, InsertPoint.before(self.anchor))
        return op.results[0]
