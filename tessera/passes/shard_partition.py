"""``shard-partition``: rewrite a sharded function into the program one rank runs.

Runs after ``insert-collectives``. Every value's type becomes its per-rank (local) type
(``Sharding.local_shape``), the function is marked ``graph.partitioned`` so collectives
verify with local semantics, and ops whose attributes name global sizes are localised
(a slice's bounds on split dims). An op whose operands' layouts split a factor it
reduces internally does not gather them: its registered :class:`~tessera.ops.Partition`
rewrites it into local work and all-reduces of small values, for example

- softmax over a split axis: ``m = all_reduce_max(max(x))``,
  ``s = all_reduce_sum(sum(exp(x - m)))``, ``exp(x - m) / s`` (layer_norm, rms_norm and
  log_softmax likewise, see ``tessera.ops.normalization``);
- cross_entropy over split classes: the row max, the sum of exponentials and the
  label's logit (picked on the rank holding it) are the all-reduced statistics;
- gather along a split axis (a vocabulary-parallel embedding): each rank looks up the
  indices in its slice (``graph.axis_index`` gives its offset), zero rows elsewhere: a
  partial sum, which ``insert-collectives`` already resolves where it is consumed.

``graph.sharding`` annotations stay, describing how each local value sits in the global.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import FunctionType, ModuleOp, UnitAttr
from xdsl.ir import Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.rewriter import InsertPoint, Rewriter

from tessera.errors import IRError, ShardingError
from tessera.ir import graph
from tessera.ir.abstract import AbstractTensor, aval
from tessera.ir.attr_values import to_attr
from tessera.ir.grad_builder import GradBuilder
from tessera.ir.mesh import Mesh
from tessera.ir.mesh_symbol import sharded_functions
from tessera.ir.sharding import Sharding, arg_sharding, op_shardings
from tessera.ops import Partition, lookup


@dataclass(frozen=True)
class ShardPartitionPass(ModulePass):
    name = "shard-partition"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for _, mesh, function in sharded_functions(op):
            if graph.PARTITIONED not in function.attributes:
                _Partitioner(mesh, function).run()


class _Partitioner:
    def __init__(self, mesh: Mesh, function: func.FuncOp):
        self.mesh = mesh
        self.function = function
        self.layouts: dict[SSAValue, Sharding] = {}  # global layouts, for Partition rules

    def local(self, value: SSAValue, sharding: Sharding) -> AbstractTensor:
        typ = aval(value)
        sharding.validate(self.mesh, typ.shape, f"value {value.name_hint or ''} of type {typ}")
        return typ.with_shape(sharding.local_shape(self.mesh, typ.shape))

    def run(self) -> None:
        block = self.function.body.block
        for index, arg in enumerate(block.args):
            sharding = arg_sharding(self.function, index) or Sharding.replicated(aval(arg).rank)
            local = Rewriter.replace_value_with_new_type(arg, self.local(arg, sharding).to_xdsl())
            self.layouts[local] = sharding
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
        if self._expand(op, shardings):
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

    def _expand(self, op: Operation, shardings: Sequence[Sharding]) -> bool:
        """Replaces ``op`` by its registered per-rank form, if it has one for its operands'
        layouts (see :class:`~tessera.ops.Partition`); whether it did."""
        found = lookup(op)
        if found is None or not isinstance(found.partition, Partition):
            return False
        layouts = [
            self.layouts.get(v) or Sharding.replicated(aval(v).rank) for v in op.operands
        ]
        (result,) = op.results
        (sharding,) = shardings
        expected = self.local(result, sharding)
        replacement = found.partition.fn(GradBuilder(InsertPoint.before(op)), op, layouts, self.mesh)
        if replacement is None:
            return False
        if aval(replacement) != expected:
            raise IRError(
                f"shard-partition: the per-rank form of {op.name} gives {aval(replacement)}, "
                f"expected {expected}"
            )
        result.replace_all_uses_with(replacement)
        replacement.owner.attributes.update(op.attributes)  # type: ignore[union-attr]
        self.layouts[replacement] = sharding
        Rewriter.erase_op(op)
        return True
