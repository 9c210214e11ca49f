"""The module's ``graph.mesh`` symbol, and the functions the sharding passes work on."""

from __future__ import annotations

from collections.abc import Iterator

from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp

from tessera.errors import ShardingError
from tessera.ir import graph
from tessera.ir.mesh import Mesh


def module_mesh(module: ModuleOp) -> tuple[str, Mesh] | None:
    """The module's ``graph.mesh`` as a (symbol, Mesh) pair, or None."""
    meshes = [op for op in module.ops if isinstance(op, graph.MeshOp)]
    if not meshes:
        return None
    if len(meshes) > 1:
        raise ShardingError("expected one graph.mesh per module, found several")
    axes = meshes[0].axes
    topology = meshes[0].topology
    mesh = Mesh(
        [a for a, _ in axes], [s for _, s in axes], topology=topology and topology.data
    )
    return meshes[0].sym_name.data, mesh


def sharded_functions(
    module: ModuleOp, pass_name: str
) -> Iterator[tuple[str, Mesh, func.FuncOp]]:
    """(mesh symbol, mesh, function) for every global graph function (not one already
    partitioned: its types are per rank; not a scheduled one), when the module has a
    mesh; nothing otherwise. A function mixing graph ops with others is an error."""
    found = module_mesh(module)
    if found is None:
        return
    for function in list(module.ops):
        if (
            isinstance(function, func.FuncOp)
            and graph.PARTITIONED not in function.attributes
            and graph.is_graph_function(function, pass_name)
        ):
            yield found[0], found[1], function
