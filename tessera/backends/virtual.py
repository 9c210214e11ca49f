"""The virtual mesh: every rank of a partitioned function in one process.

:func:`run_partitioned` runs a ``func.func`` carrying ``graph.partitioned`` (all types
are per-rank local types) for all ranks of a mesh in lockstep, op by op in program
order. Compute ops run per rank through the reference semantics
(each op's ``tessera.opdefs.op_def(op).reference``); collectives are computed exactly in memory
over each rank group ``mesh.groups(axes)``, a member's group position being its index
in the group. This is the oracle the real backends are tested against.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Operation, SSAValue

from tessera.errors import ExecutionError, TesseraError
from tessera.ir import graph
from tessera.ir.abstract import AbstractTensor
from tessera.ir.mesh import Mesh
from tessera.opdefs import RankReference, lookup
from tessera.opdefs.collective import on_group

Values = list[torch.Tensor]  # one tensor per member of a rank group, in group order


def _collective(op: graph.CollectiveOp, mesh: Mesh, inputs: Values) -> Values:
    """Every rank's result of a collective, from every rank's operand."""
    outputs: Values = list(inputs)
    for group in mesh.groups(op.attrs()["axes"]):
        results = on_group(op)(op, [inputs[r] for r in group])
        for rank, result in zip(group, results, strict=True):
            outputs[rank] = result.clone()  # ranks never share storage
    return outputs


def _function(module: ModuleOp, name: str) -> func.FuncOp:
    function = next(
        (o for o in module.walk() if isinstance(o, func.FuncOp) and o.sym_name.data == name), None
    )
    if function is None:
        raise ExecutionError(f"no function @{name} in the module")
    if graph.PARTITIONED not in function.attributes:
        raise ExecutionError(
            f"@{name} is not partitioned (no {graph.PARTITIONED} attribute): the virtual mesh runs "
            f"per-rank functions; run the shard-partition pass first"
        )
    return function


def _check_mesh(module: ModuleOp, mesh: Mesh) -> None:
    declared = [o.axes for o in module.walk() if isinstance(o, graph.MeshOp)]
    expected = list(zip(mesh.axis_names, mesh.shape, strict=True))
    if any(axes != expected for axes in declared):
        raise ExecutionError(f"the module's graph.mesh {declared[0]} does not match {mesh}")


def _check_value(value: object, aval: AbstractTensor, what: str) -> None:
    if not isinstance(value, torch.Tensor):
        raise ExecutionError(
            f"{what}: expected a torch.Tensor of type {aval}, found {type(value).__name__}"
        )
    if tuple(value.shape) != aval.shape or value.dtype != aval.dtype.to_torch():
        raise ExecutionError(
            f"{what}: expected {aval}, found {value.dtype} of shape {list(value.shape)}"
        )


def _check_args(
    function: func.FuncOp, mesh: Mesh, rank_args: Sequence[Sequence[torch.Tensor]]
) -> None:
    if len(rank_args) != mesh.size:
        raise ExecutionError(
            f"expected arguments for {mesh.size} ranks ({mesh}), found {len(rank_args)}"
        )
    avals = [AbstractTensor.from_xdsl(a.type) for a in function.args]
    for rank, args in enumerate(rank_args):
        if len(args) != len(avals):
            raise ExecutionError(
                f"@{function.sym_name.data} takes {len(avals)} arguments, rank {rank} has {len(args)}"
            )
        for index, (value, aval) in enumerate(zip(args, avals, strict=True)):
            _check_value(value, aval, f"rank {rank}, argument {index}")


def _position_on(mesh: Mesh, rank: int) -> Callable[[Sequence[str]], int]:
    """``rank``'s index along mesh axes (its position in its group)."""
    return lambda axes: next(g for g in mesh.groups(axes) if rank in g).index(rank)


def _run_op(op: Operation, mesh: Mesh, inputs: list[Values]) -> list[Values]:
    """Results of ``op`` as ``[result][rank]`` from operands as ``[operand][rank]``."""
    if isinstance(op, graph.CollectiveOp):
        return [_collective(op, mesh, inputs[0])]
    found = lookup(op)
    if found is None:
        raise ExecutionError(f"the virtual mesh cannot run {op.name}")
    per_rank = []
    for rank in range(mesh.size):
        operands = (values[rank] for values in inputs)
        if isinstance(found.reference, RankReference):  # a value per rank (axis_index)
            result = found.reference.at(op, _position_on(mesh, rank))(*operands)
        else:
            result = found.reference(op, *operands)
        per_rank.append(result if isinstance(result, tuple) else (result,))
    return [list(results) for results in zip(*per_rank, strict=True)]


def run_partitioned(
    module: ModuleOp, name: str, mesh: Mesh, rank_args: Sequence[Sequence[torch.Tensor]]
) -> list[tuple[torch.Tensor, ...]]:
    """Runs the partitioned ``func.func @name`` on every rank of ``mesh``.

    ``rank_args[r]`` are rank ``r``'s arguments, of the function's (local) argument
    types; the result lists every rank's results, indexed by rank.
    """
    function = _function(module, name)
    _check_mesh(module, mesh)
    _check_args(function, mesh, rank_args)
    env: dict[SSAValue, Values] = {
        arg: [rank_args[r][i] for r in range(mesh.size)] for i, arg in enumerate(function.args)
    }
    for op in function.body.block.ops:
        operands = [env[v] for v in op.operands]
        if isinstance(op, func.ReturnOp):
            return [tuple(values[r] for values in operands) for r in range(mesh.size)]
        try:
            results = _run_op(op, mesh, operands)
        except TesseraError as error:
            raise type(error)(
                f"{op.name}: {error}" if op.name not in str(error) else str(error)
            ) from None
        except Exception as error:  # a torch error: name the op that raised it
            raise ExecutionError(f"{op.name} failed: {error}") from None
        for value, values in zip(op.results, results, strict=True):
            aval = AbstractTensor.from_xdsl(value.type)
            for rank, tensor in enumerate(values):
                _check_value(tensor, aval, f"{op.name} on rank {rank}")
            env[value] = values
    raise ExecutionError(f"@{name} has no func.return")
