"""Every sharding in a module names one of its meshes and fits it.

Shardings appear on function arguments and results (``graph.sharding`` argument and
result attributes), on op results (a ``graph.sharding`` attribute: one sharding, or an
array of one per result, as ``shard-propagate`` sets them) and on ``graph.shard``
constraints. Each must name a ``graph.mesh`` of the module, use only its axes and each
at most once, have the tensor's rank, and, in a global (not yet partitioned) function,
split each dim into equal pieces. :func:`check_shardings` checks them all in one walk of
the module (a sharding and type already checked are not checked again).
"""

from __future__ import annotations

from xdsl.dialects.builtin import ArrayAttr, DictionaryAttr, ModuleOp, TensorType
from xdsl.dialects.func import FuncOp
from xdsl.ir import Attribute, Operation

from tessera.errors import TesseraError
from tessera.ir.abstract import AbstractTensor
from tessera.ir.attribute_set import AttributeSet
from tessera.ir.graph import PARTITIONED, MeshOp, ShardOp
from tessera.ir.located_error import LocatedVerifyException
from tessera.ir.sharding import SHARDING_KEY, AxisSizes, ShardingAttr


def check_shardings(module: ModuleOp) -> None:
    """Raises :class:`LocatedVerifyException` at the first op (or function) whose
    sharding names no mesh of ``module`` or does not fit it."""
    checker = _Checker(
        {o.sym_name.data: AxisSizes(tuple(o.axes)) for o in module.ops if isinstance(o, MeshOp)}
    )
    for op in module.ops:
        partitioned = isinstance(op, FuncOp) and PARTITIONED in op.attributes
        if isinstance(op, FuncOp):
            checker.check_signature(op, partitioned)
        for inner in op.walk():
            checker.check_op(inner, partitioned)


class _Checker:
    def __init__(self, meshes: dict[str, AxisSizes]) -> None:
        self.meshes = meshes
        self.checked = AttributeSet()  # (sharding, type, partitioned)

    def check_signature(self, function: FuncOp, partitioned: bool) -> None:
        types = function.function_type
        for kind, attrs, values in (
            ("argument", function.arg_attrs, types.inputs.data),
            ("result", function.res_attrs, types.outputs.data),
        ):
            for index, (entry, value_type) in enumerate(zip(attrs or (), values, strict=False)):
                attr = entry.data.get(SHARDING_KEY) if isinstance(entry, DictionaryAttr) else None
                if attr is not None:
                    what = f"{kind} #{index} of @{function.sym_name.data}"
                    self.check(function, what, attr, value_type, partitioned)

    def check_op(self, op: Operation, partitioned: bool) -> None:
        if isinstance(op, ShardOp):
            self.check(op, f"{op.name}: sharding", op.sharding, op.input.type, partitioned)
        attr = op.attributes.get(SHARDING_KEY)
        if attr is None:
            return
        attrs = attr.data if isinstance(attr, ArrayAttr) else (attr,)
        if len(attrs) != len(op.results):
            raise LocatedVerifyException(
                op,
                f"{op.name}: expected {SHARDING_KEY} to give one sharding per result "
                f"({len(op.results)}), found {len(attrs)}",
            )
        for index, (one, result) in enumerate(zip(attrs, op.results, strict=True)):
            self.check(op, f"{op.name}: result #{index}", one, result.type, partitioned)

    def check(
        self, op: Operation, what: str, attr: Attribute, value_type: Attribute, partitioned: bool
    ) -> None:
        """``attr`` is a sharding of a ``value_type`` value that fits its mesh."""
        if not isinstance(attr, ShardingAttr):
            raise LocatedVerifyException(
                op, f"{what}: expected a #graph.sharding<...> for {SHARDING_KEY}, found {attr}"
            )
        if (attr, value_type, partitioned) in self.checked:
            return
        mesh = self.meshes.get(attr.mesh_name)
        if mesh is None:
            defined = ", ".join("@" + m for m in self.meshes)
            raise LocatedVerifyException(
                op,
                f"{what}: sharding names mesh @{attr.mesh_name}, which is not defined; "
                + (f"meshes: {defined}" if defined else "the module has no graph.mesh"),
            )
        if not isinstance(value_type, TensorType):
            raise LocatedVerifyException(
                op, f"{what}: a sharding needs a tensor, found {value_type}"
            )
        try:
            shape = AbstractTensor.from_xdsl(value_type).shape
            # a partitioned function's shapes are local: the divisibility was checked globally
            attr.sharding.validate(mesh, [0] * len(shape) if partitioned else shape, what)
        except TesseraError as error:
            raise LocatedVerifyException(op, str(error)) from None
        self.checked.add((attr, value_type, partitioned))
