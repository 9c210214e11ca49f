"""Runs the Schedule IR: kernels through one kernel interface, collectives as handles.

A scheduled function is a sequence of ``schedule.kernel`` ops (fused groups of graph
ops), ``schedule.start`` / ``schedule.wait`` pairs for collectives, and a return. Every
kernel runs through a :data:`KernelRunner`: :func:`reference_kernel` interprets the
kernel's body with the reference semantics (the oracle); generated Triton kernels will
be another runner with the same signature.

:func:`run_virtual` executes all ranks of a mesh in one process: a start computes the
collective across each rank group (the group semantics of ``backends.virtual``) and its
handle holds every rank's result until the wait; a start marked ``algorithm =
hierarchical`` runs its phases over the domains (:mod:`tessera.backends.hierarchical`),
other algorithm names compute the same result as the flat collective. Inside
``tessera.perf.record_timeline()`` both runners record every kernel and collective.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import SSAValue

from tessera.backends import hierarchical
from tessera.errors import ExecutionError
from tessera.ir import graph, schedule
from tessera.ir.mesh import Mesh
from tessera.ops import lookup
from tessera.ops.collective import on_group
from tessera.perf import timeline as perf_timeline
from tessera.perf.trace import COMPUTE


@dataclass(frozen=True)
class KernelContext:
    """Which rank runs a kernel: a rank-local slice (``graph.all_slice``) depends on it."""

    mesh: Mesh
    rank: int

    def position(self, axes: Sequence[str]) -> tuple[int, int]:
        """This rank's index in its group along ``axes``, and the group's size."""
        group = next(g for g in self.mesh.groups(axes) if self.rank in g)
        return group.index(self.rank), len(group)


KernelRunner = Callable[
    [schedule.KernelOp, Sequence[torch.Tensor], KernelContext], list[torch.Tensor]
]


def reference_kernel(
    kernel: schedule.KernelOp, inputs: Sequence[torch.Tensor], context: KernelContext
) -> list[torch.Tensor]:
    """Runs a kernel's body op by op with the reference semantics."""
    block = kernel.body.block
    env: dict[SSAValue, torch.Tensor] = dict(zip(block.args, inputs, strict=True))
    for op in block.ops:
        if isinstance(op, schedule.YieldOp):
            return [env[v] for v in op.values]
        if isinstance(op, graph.AllSliceOp):  # this rank's chunk along dim
            attrs = op.attrs()
            index, size = context.position(attrs["axes"])
            env[op.result] = env[op.input].chunk(size, attrs["dim"])[index]
            continue
        found = lookup(op)
        if found is None:
            raise ExecutionError(f"{kernel.sym_name.data}: no reference semantics for {op.name}")
        result = found.reference(op, *(env[v] for v in op.operands))
        env.update(zip(op.results, result if isinstance(result, tuple) else (result,), strict=True))
    raise ExecutionError(f"{kernel.sym_name.data}: kernel body has no schedule.yield")


def _function(module: ModuleOp, name: str) -> func.FuncOp:
    for op in module.ops:
        if isinstance(op, func.FuncOp) and op.sym_name.data == name:
            return op
    raise ExecutionError(f"no function @{name} in the scheduled module")


def _start(
    op: schedule.StartOp, mesh: Mesh, inputs: dict[int, torch.Tensor]
) -> dict[int, torch.Tensor]:
    """Every running rank's result of the collective ``op`` starts (the virtual mesh
    completes it); ``inputs`` holds the running ranks' operands."""
    graph_op = schedule.COLLECTIVES[op.collective_name]
    if graph_op is None:
        raise ExecutionError(f"{op.collective_name} is not supported on the virtual mesh yet")
    outputs = dict(inputs)
    attrs = op.attrs()
    for group in mesh.groups(attrs["axes"]):
        present = [r in inputs for r in group]
        if not any(present):
            continue
        if not all(present):
            raise ExecutionError(
                f"{op.label}: ranks {[r for r in group if r not in inputs]} of the group "
                f"{list(group)} do not run this program"
            )
        xs = [inputs[r] for r in group]
        if op.algorithm_name == "hierarchical":  # within domains, then across (phase by phase)
            results = hierarchical.run_group(op.collective_name, attrs, xs, op.domain_size)  # type: ignore[arg-type]
        else:  # ring, tree, nvls: how the bytes move, not what arrives
            results = on_group(graph_op)(op, xs)
        for rank, result in zip(group, results, strict=True):
            outputs[rank] = result.clone()
    return outputs


def _device(rank_args: Sequence[Sequence[torch.Tensor]]) -> torch.device:
    """Where the kernels run (the arguments' device; the CPU without arguments)."""
    return next((a.device for args in rank_args for a in args), torch.device("cpu"))


def run_virtual(
    module: ModuleOp,
    name: str,
    mesh: Mesh,
    rank_args: Sequence[Sequence[torch.Tensor]],
    kernel: KernelRunner = reference_kernel,
    ranks: Sequence[int] | None = None,
) -> list[tuple[torch.Tensor, ...]]:
    """Every rank's results of the scheduled function ``@name`` (ranks in mesh order).
    With ``ranks``, only those ranks run (``rank_args`` and the results follow their
    order): a pipeline stage's slice of the mesh, every collective group inside it."""
    function = _function(module, name)
    ranks = list(range(mesh.size)) if ranks is None else list(ranks)
    if len(rank_args) != len(ranks):
        raise ExecutionError(
            f"@{name}: expected arguments for {len(ranks)} ranks, found {len(rank_args)}"
        )
    envs: list[dict[SSAValue, object]] = [
        dict(zip(function.args, args, strict=True)) for args in rank_args
    ]
    timeline = perf_timeline.active()
    device = _device(rank_args)
    for op in function.body.block.ops:
        if isinstance(op, schedule.KernelOp):
            for rank, env in zip(ranks, envs, strict=True):
                began = timeline.now(device) if timeline else 0.0
                outputs = kernel(op, [env[v] for v in op.inputs], KernelContext(mesh, rank))  # type: ignore[misc]
                if timeline:
                    timeline.add(rank, COMPUTE, op.kernel_name, began, timeline.now(device))
                env.update(zip(op.outputs, outputs, strict=True))
        elif isinstance(op, schedule.StartOp):
            began = timeline.now(device) if timeline else 0.0
            operands = {r: env[op.operands[0]] for r, env in zip(ranks, envs, strict=True)}
            results = _start(op, mesh, operands)  # type: ignore[arg-type]
            if timeline:  # the virtual mesh completes a collective when it starts
                ended = timeline.now(device)
                for rank in ranks:
                    timeline.add(rank, op.stream_name, op.label, began, ended)
            for rank, env in zip(ranks, envs, strict=True):
                env[op.handle] = results[rank]
        elif isinstance(op, schedule.WaitOp):
            if op.result is not None:
                for env in envs:
                    env[op.result] = env[op.handle]
        elif isinstance(op, func.ReturnOp):
            return [tuple(env[v] for v in op.operands) for env in envs]  # type: ignore[misc]
        else:
            raise ExecutionError(f"@{name}: cannot run {op.name} in a scheduled function")
    raise ExecutionError(f"@{name}: the scheduled function has no return")
