"""Manual (per-rank) functions: the bodies of ``dist.shard_map``, and what they claim.

A manual function is a private ``func.func`` marked ``graph.manual`` (and
``graph.partitioned``: its types are per rank and its collectives have per-rank
semantics). Its argument attributes carry the ``in_specs`` and its result attributes the
``out_specs`` as ``graph.sharding``. A global function calls it with ``graph.call`` on
global values: each rank runs the body on its blocks of the operands (laid out as the
``in_specs``), and its results are the blocks of global values laid out as the
``out_specs``.

An ``out_spec`` that leaves a mesh axis unsplit claims that the value is the same on
every rank along it (replicated). :func:`varying` tracks, as JAX's ``shard_map``
replication check does, the axes along which each value of the body may differ between
ranks: an argument varies along the axes its ``in_spec`` splits; an all-reduce, an
all-gather or a broadcast over an axis makes a value the same along it; a reduce-scatter,
an all-to-all, a permute, a slice by position or ``axis_index`` makes it vary; any other
op varies along the union of its operands' axes. :func:`check_manual` reports a claim the
body does not keep.
"""

from __future__ import annotations

from collections.abc import Sequence

from xdsl.dialects.builtin import ArrayAttr, DictionaryAttr, ModuleOp, TensorType
from xdsl.dialects.func import FuncOp
from xdsl.ir import Attribute, SSAValue

from tessera.errors import TesseraError
from tessera.ir import graph
from tessera.ir.abstract import AbstractTensor
from tessera.ir.located_error import LocatedVerifyException
from tessera.ir.sharding import SHARDING_KEY, AxisSizes, Sharding, ShardingAttr

MANUAL = graph.MANUAL

_INVARIANT_OVER = (graph.AllReduceOp, graph.AllGatherOp, graph.BroadcastOp)
_VARYING_OVER = (
    graph.ReduceScatterOp, graph.AllToAllOp, graph.CollectivePermuteOp, graph.AllSliceOp,
)  # fmt: skip


def is_manual(function: FuncOp | None) -> bool:
    return function is not None and MANUAL in function.attributes


def _specs(attrs: ArrayAttr | None, count: int) -> list[Sharding | None]:
    if attrs is None:
        return [None] * count
    found: list[Sharding | None] = []
    for entry in attrs.data:
        attr = entry.data.get(SHARDING_KEY) if isinstance(entry, DictionaryAttr) else None
        found.append(attr.sharding if isinstance(attr, ShardingAttr) else None)
    return found


def in_specs(function: FuncOp) -> list[Sharding | None]:
    """The ``in_specs`` of a manual function (its arguments' ``graph.sharding``)."""
    return _specs(function.arg_attrs, len(function.args))


def out_specs(function: FuncOp) -> list[Sharding | None]:
    """The ``out_specs`` of a manual function (its results' ``graph.sharding``)."""
    return _specs(function.res_attrs, len(function.function_type.outputs.data))


def global_type(local: Attribute, spec: Sharding, mesh: AxisSizes) -> Attribute:
    """The global tensor type whose blocks laid out as ``spec`` have type ``local``."""
    value = AbstractTensor.from_xdsl(local)
    shape = tuple(n * spec.shards(mesh, d) for d, n in enumerate(value.shape))
    return value.with_shape(shape).to_xdsl()


def local_type(global_: Attribute, spec: Sharding, mesh: AxisSizes) -> Attribute:
    """The per-rank block type of a ``global_`` value laid out as ``spec``."""
    value = AbstractTensor.from_xdsl(global_)
    return value.with_shape(spec.local_shape(mesh, value.shape)).to_xdsl()


def varying(function: FuncOp) -> dict[SSAValue, frozenset[str]]:
    """The mesh axes along which each value of the manual ``function`` may differ
    between ranks (see the module docstring)."""
    axes: dict[SSAValue, frozenset[str]] = {}
    for arg, spec in zip(function.args, in_specs(function), strict=True):
        axes[arg] = frozenset(spec.split_axes) if spec is not None else frozenset()
    for op in function.walk():
        if op is not function and isinstance(op, graph.GraphOp):
            op_varying(op, axes)
    return axes


def op_varying(op: graph.GraphOp, axes: dict[SSAValue, frozenset[str]]) -> frozenset[str]:
    """Records in ``axes`` the axes ``op``'s results vary along (its operands' already
    there) and returns them."""
    union = frozenset().union(*(axes.get(v, frozenset()) for v in op.operands))
    if isinstance(op, graph.AxisIndexOp):
        union = frozenset(op.attrs()["axes"])
    elif isinstance(op, _INVARIANT_OVER):
        union = union - frozenset(op.attrs()["axes"])
    elif isinstance(op, _VARYING_OVER):
        union = union | frozenset(op.attrs()["axes"])
    for result in op.results:
        axes[result] = union
    return union


def replication_error(
    index: int, spec: Sharding, varies: frozenset[str], mesh_axes: Sequence[str]
) -> str | None:
    """Why result ``index`` may not claim ``spec`` while varying along ``varies``, or None."""
    claimed = [a for a in mesh_axes if a in varies and a not in spec.split_axes]
    if not claimed:
        return None
    names = ", ".join(repr(a) for a in claimed)
    return (
        f"out_specs[{index}] ({spec}) claims the result is replicated over {names}, but it "
        f"varies over {names} (it depends on the rank's position there); reduce or gather "
        f"it over {names} in the body (dist.all_reduce, dist.all_gather), or split a dim "
        f"over {names} in out_specs"
    )


def check_manual(module: ModuleOp) -> None:
    """Raises :class:`LocatedVerifyException` for a manual function of ``module`` that
    lacks a spec or whose results vary along an axis its ``out_specs`` claims them
    replicated over, and for a global function's call of one whose operands' blocks do
    not have its argument types (one walk of the functions that call manual ones)."""
    manual = {f.sym_name.data: f for f in module.ops if isinstance(f, FuncOp) and is_manual(f)}
    if not manual:
        return
    meshes = [o for o in module.ops if isinstance(o, graph.MeshOp)]
    for function in manual.values():
        _check_function(function, meshes)
    mesh = AxisSizes(tuple(meshes[0].axes))
    for function in module.ops:
        if not isinstance(function, FuncOp) or graph.PARTITIONED in function.attributes:
            continue
        for call in function.walk():
            if isinstance(call, graph.CallOp) and call.callee_name in manual:
                _check_call(call, manual[call.callee_name], mesh)


def _check_function(function: FuncOp, meshes: Sequence[graph.MeshOp]) -> None:
    name = function.sym_name.data
    if len(meshes) != 1:
        raise LocatedVerifyException(
            function, f"@{name}: a manual function needs exactly one graph.mesh"
        )
    if graph.PARTITIONED not in function.attributes:
        raise LocatedVerifyException(
            function, f"@{name}: a manual function has per-rank types: it needs {graph.PARTITIONED}"
        )
    outs = out_specs(function)
    for what, specs in (("argument", in_specs(function)), ("result", outs)):
        missing = [i for i, s in enumerate(specs) if s is None]
        if missing:
            raise LocatedVerifyException(
                function,
                f"@{name}: manual function {what} #{missing[0]} has no graph.sharding spec",
            )
    returned = function.body.block.last_op if function.body.blocks else None
    if returned is None:
        return
    axes = varying(function)
    mesh_axes = [a for a, _ in meshes[0].axes]
    for index, (value, spec) in enumerate(zip(returned.operands, outs, strict=True)):
        assert spec is not None
        message = replication_error(index, spec, axes.get(value, frozenset()), mesh_axes)
        if message is not None:
            raise LocatedVerifyException(returned, f"@{name}: {message}")


def _check_call(call: graph.CallOp, callee: FuncOp, mesh: AxisSizes) -> None:
    """A global function's call of a manual ``callee`` passes global values whose blocks
    under the ``in_specs`` have the callee's argument types, and gets global results."""
    name = callee.sym_name.data
    for what, values, specs, types in (
        ("operand", call.operands, in_specs(callee), callee.function_type.inputs.data),
        ("result", call.results, out_specs(callee), callee.function_type.outputs.data),
    ):
        if len(values) != len(types):
            raise LocatedVerifyException(
                call, f"graph.call @{name}: expected {len(types)} {what}s, found {len(values)}"
            )
        for index, (value, spec, local) in enumerate(zip(values, specs, types, strict=True)):
            if spec is None or not isinstance(value.type, TensorType):
                continue
            try:
                found = local_type(value.type, spec, mesh)
            except TesseraError as error:
                raise LocatedVerifyException(
                    call, f"graph.call @{name}: {what} #{index}: {error}"
                ) from None
            if found != local:
                raise LocatedVerifyException(
                    call,
                    f"graph.call @{name}: {what} #{index} of type {value.type} laid out as "
                    f"{spec} gives per-rank blocks {found}, but the manual function's "
                    f"{what} #{index} is {local}",
                )
