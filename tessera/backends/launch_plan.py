"""Launch plans: a scheduled function compiled once into a flat list of steps.

:func:`build_plan` walks a scheduled ``func.func`` once, for the ranks one process runs,
and gives every value an integer slot. Each ``schedule.kernel`` becomes a
:class:`KernelStep` holding one bound kernel per rank (:mod:`.schedule_runner`: a
compiled Triton kernel with its output shapes, constants and rank positions, or a
closure of torch references); each ``schedule.start`` a step made by the
:class:`Collectives` of the backend, with its groups resolved (the virtual mesh's
:class:`VirtualCollectives` here, ``torch.distributed`` in
:mod:`tessera.backends.distributed`); a ``schedule.wait`` a step or, when the start
completed the collective, nothing (the result takes the handle's slot). A slot is
cleared after its last use, so tensors are freed as early as before.

Buffers: ``plan-memory`` placed every tensor between kernels in a per-rank arena
(``schedule.offsets``, ``schedule.peak_bytes``). A plan allocates each rank's arena
once and offers binders the arena views of the kernel results that are intermediates
(:func:`arena_offsets`: not returned, not re-viewed by a view kernel, whose view would
outlive the placement); the Triton binder writes them in place, so those outputs are
not allocated per call. Results are never arena views. A plan therefore runs one call
at a time (as a CUDA stream would order them).

:meth:`LaunchPlan.run` then walks the steps: no IR, no lookups by name. Inside
``tessera.perf.record_timeline()`` every kernel and collective is recorded.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import SSAValue

from tessera import numerics
from tessera.backends import hierarchical
from tessera.backends.schedule_runner import (
    BoundKernel,
    Buffers,
    KernelBinder,
    KernelContext,
    KernelRunner,
    binder,
    reference_kernel,
)
from tessera.errors import ExecutionError
from tessera.ir import schedule
from tessera.ir.abstract import AbstractTensor
from tessera.ir.mesh import Mesh
from tessera.ir.reduction_kinds import rounds
from tessera.opdefs.collective import on_group
from tessera.perf import timeline as perf_timeline
from tessera.perf.compute_cost import runs_as_view, runs_on_host
from tessera.perf.trace import COMPUTE

Env = list[Any]  # one rank's values, by slot
Timeline = Any  # tessera.perf.timeline.Timeline, or None outside record_timeline()


class Step(Protocol):
    """One step of a plan: reads and writes the slots of every rank's env."""

    what: str  # the IR op it runs, for error messages

    def run(self, envs: list[Env], timeline: Timeline) -> None: ...


@dataclass
class KernelStep:
    """A kernel, bound once per rank (``bound[i]`` runs for ``ranks[i]``)."""

    name: str
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    bound: list[BoundKernel]
    ranks: list[int]
    device: torch.device
    what: str = "schedule.kernel"

    def run(self, envs: list[Env], timeline: Timeline) -> None:
        inputs, outputs = self.inputs, self.outputs
        if timeline is None and len(envs) == 1:  # the common case, shortest
            (env,), (fn,) = envs, self.bound
            results = fn(*[env[i] for i in inputs])
            for slot, value in zip(outputs, results, strict=True):
                env[slot] = value
            return
        for rank, env, fn in zip(self.ranks, envs, self.bound, strict=True):
            began = timeline.now(self.device) if timeline else 0.0
            results = fn(*[env[i] for i in inputs])
            if timeline:
                timeline.add(rank, COMPUTE, self.name, began, timeline.now(self.device))
            for slot, value in zip(outputs, results, strict=True):
                env[slot] = value


@dataclass
class CallStep:
    """A ``func.call`` of a region: every call of one callee runs its one plan."""

    callee: LaunchPlan
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]

    def run(self, envs: list[Env], timeline: Timeline) -> None:
        inputs = self.inputs
        results = self.callee.run([[env[i] for i in inputs] for env in envs])
        for env, values in zip(envs, results, strict=True):
            for slot, value in zip(self.outputs, values, strict=True):
                env[slot] = value


@dataclass
class ScanStep:
    """A ``schedule.scan``: its step's plan run ``length`` times, the carries threaded
    through, the other inputs sliced and the other results stacked on dim 0."""

    callee: LaunchPlan
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    length: int
    carries: int
    reverse: bool

    def run(self, envs: list[Env], timeline: Timeline) -> None:
        """Every rank's steps together (their collectives pair up), step by step."""
        per_rank = [[env[i] for i in self.inputs] for env in envs]
        carries = [list(args[: self.carries]) for args in per_rank]
        ys: list[list[tuple[torch.Tensor, ...]]] = [[()] * self.length for _ in envs]
        for i in reversed(range(self.length)) if self.reverse else range(self.length):
            results = self.callee.run(
                [
                    [*carry, *(x[i] for x in args[self.carries :])]
                    for carry, args in zip(carries, per_rank, strict=True)
                ]
            )
            for rank, values in enumerate(results):
                carries[rank] = list(values[: self.carries])
                ys[rank][i] = values[self.carries :]
        for env, carry, steps in zip(envs, carries, ys, strict=True):
            stacked = [torch.stack(list(column)) for column in zip(*steps, strict=True)]
            for slot, value in zip(self.outputs, [*carry, *stacked], strict=True):
                env[slot] = value


@dataclass
class VirtualCollectiveStep:
    """A collective computed across each group of running ranks in memory (the virtual
    mesh completes a collective when it starts). ``groups`` holds env indices."""

    label: str
    stream: str
    input: int
    output: int
    groups: list[list[int]]
    compute: Callable[[list[torch.Tensor]], Sequence[torch.Tensor]]
    ranks: list[int]
    device: torch.device
    what: str = "schedule.start"

    def run(self, envs: list[Env], timeline: Timeline) -> None:
        began = timeline.now(self.device) if timeline else 0.0
        source, target = self.input, self.output
        for group in self.groups:
            results = self.compute([envs[i][source] for i in group])
            for i, result in zip(group, results, strict=True):
                envs[i][target] = result.clone()  # ranks never share storage
        if timeline:
            ended = timeline.now(self.device)
            for rank in self.ranks:
                timeline.add(rank, self.stream, self.label, began, ended)


class Collectives(Protocol):
    """How a backend runs ``schedule.start`` / ``schedule.wait`` (see :func:`build_plan`)."""

    def start(self, op: schedule.StartOp, input: int, handle: int) -> Step: ...

    def wait(self, op: schedule.WaitOp, handle: int, result: int | None) -> Step | None:
        """A step, or None when the start completed the collective (the result is the
        value in the handle's slot)."""


class _Attrs:
    """A collective's kind and properties, read once (the group functions of
    :mod:`tessera.opdefs.collective` call ``op.attrs()``)."""

    def __init__(self, op: schedule.StartOp):
        self.name = op.name
        self._attrs = op.attrs()

    def attrs(self) -> dict[str, Any]:
        return self._attrs


class VirtualCollectives:
    """Collectives of the virtual mesh: each start computes its result for every group
    at once (``hierarchical`` phase by phase over the domains, other algorithm names as
    the flat collective); a wait is its start's result."""

    def __init__(self, mesh: Mesh, ranks: Sequence[int], device: torch.device):
        self.mesh, self.ranks, self.device = mesh, list(ranks), device

    def start(self, op: schedule.StartOp, input: int, handle: int) -> Step:
        graph_op = schedule.COLLECTIVES[op.collective_name]
        if graph_op is None:
            raise ExecutionError(f"{op.collective_name} is not supported on the virtual mesh yet")
        attrs = op.attrs()
        index = {rank: i for i, rank in enumerate(self.ranks)}
        groups = []
        for group in self.mesh.groups(attrs["axes"]):
            present = [r in index for r in group]
            if not any(present):
                continue
            if not all(present):
                raise ExecutionError(
                    f"{op.label}: ranks {[r for r in group if r not in index]} of the group "
                    f"{list(group)} do not run this program"
                )
            groups.append([index[r] for r in group])
        if op.algorithm_name == "hierarchical":  # within domains, then across (phase by phase)
            name, domain = op.collective_name, op.domain_size

            ordered, frozen = on_group(graph_op), _Attrs(op)

            def compute(xs: list[torch.Tensor]) -> Sequence[torch.Tensor]:
                if numerics.deterministic() and rounds(attrs.get("kind")):
                    return ordered(frozen, xs)  # one fixed order, as processes add
                return hierarchical.run_group(name, attrs, xs, domain)  # type: ignore[arg-type]

        else:  # ring, tree, nvls: how the bytes move, not what arrives
            group_fn, frozen = on_group(graph_op), _Attrs(op)

            def compute(xs: list[torch.Tensor]) -> Sequence[torch.Tensor]:
                return group_fn(frozen, xs)

        return VirtualCollectiveStep(
            op.label, op.stream_name, input, handle, groups, compute, self.ranks, self.device
        )

    def wait(self, op: schedule.WaitOp, handle: int, result: int | None) -> Step | None:
        return None


@dataclass
class LaunchPlan:
    """A scheduled function for ``ranks``, as steps over slots (see the module docstring)."""

    name: str
    ranks: list[int]
    slots: int
    arguments: list[int]  # the slot of each argument
    results: list[int]  # the slot of each result
    steps: list[Step]
    frees: list[tuple[int, ...]]  # slots dead after each step
    on_error: Callable[[Step, Exception], Exception] | None = None
    arenas: list[torch.Tensor] = field(default_factory=list)  # per rank, when planned

    def run(self, rank_args: Sequence[Sequence[torch.Tensor]]) -> list[tuple[torch.Tensor, ...]]:
        """Every running rank's results from its arguments (both in :attr:`ranks` order)."""
        if len(rank_args) != len(self.ranks):
            raise ExecutionError(
                f"@{self.name}: expected arguments for {len(self.ranks)} ranks, found {len(rank_args)}"
            )
        envs: list[Env] = []
        for args in rank_args:
            if len(args) != len(self.arguments):
                raise ExecutionError(
                    f"@{self.name} takes {len(self.arguments)} arguments, found {len(args)}"
                )
            env: Env = [None] * self.slots
            for slot, value in zip(self.arguments, args, strict=True):
                env[slot] = value
            envs.append(env)
        timeline = perf_timeline.active()
        step: Step | None = None
        try:
            for step, dead in zip(self.steps, self.frees, strict=True):
                step.run(envs, timeline)
                for slot in dead:
                    for env in envs:
                        env[slot] = None
        except Exception as error:
            if self.on_error is None or step is None:
                raise
            raise self.on_error(step, error) from None
        results = self.results
        return [tuple(env[slot] for slot in results) for env in envs]


def function(module: ModuleOp, name: str) -> func.FuncOp:
    """The ``func.func @name`` of ``module``."""
    for op in module.ops:
        if isinstance(op, func.FuncOp) and op.sym_name.data == name:
            return op
    raise ExecutionError(f"no function @{name} in the scheduled module")


OFFSETS = "schedule.offsets"
PEAK_BYTES = "schedule.peak_bytes"


def arena_offsets(fn: func.FuncOp) -> tuple[dict[SSAValue, int], int]:
    """The kernel results of ``fn`` that may live in the arena, at their
    ``plan-memory`` offsets, and the arena's size: results of kernels that launch
    (not views), neither returned nor read by a view kernel. Empty without a plan."""
    peak = fn.attributes.get(PEAK_BYTES)
    if peak is None:
        return {}, 0
    ops = list(fn.body.block.ops)
    returned = set(ops[-1].operands) if isinstance(ops[-1], func.ReturnOp) else set()
    kernels = [op for op in ops if isinstance(op, schedule.KernelOp)]
    views = {op for op in kernels if runs_as_view(op) or runs_on_host(op)}
    viewed = {v for op in views for v in op.inputs}
    placed: dict[SSAValue, int] = {}
    for op in kernels:
        offsets = op.attributes.get(OFFSETS)
        if op in views or offsets is None:
            continue
        for result, offset in zip(op.results, offsets.get_values(), strict=True):  # type: ignore[attr-defined]
            if result not in returned and result not in viewed:
                placed[result] = int(offset)
    return placed, peak.value.data  # type: ignore[attr-defined]


def _buffer(arena: torch.Tensor, offset: int, value: SSAValue) -> torch.Tensor:
    """The arena's bytes at ``offset`` as ``value``'s tensor."""
    aval = AbstractTensor.from_xdsl(value.type)
    return arena[offset : offset + aval.nbytes].view(aval.dtype.to_torch()).view(aval.shape)


def build_plan(
    fn: func.FuncOp,
    mesh: Mesh,
    ranks: Sequence[int],
    kernels: KernelBinder,
    collectives: Collectives,
    device: torch.device,
    arena: bool = True,
    callees: dict[str, LaunchPlan] | None = None,
) -> LaunchPlan:
    """The launch plan of the scheduled function ``fn`` for ``ranks`` of ``mesh``:
    every kernel bound by ``kernels`` for each rank, collectives by ``collectives``;
    with ``arena``, kernels are offered arena buffers when their binder writes them
    (``uses_buffers``; see the module docstring)."""
    name = fn.sym_name.data
    ranks = list(ranks)
    callees = {} if callees is None else callees
    slots: dict[SSAValue, int] = {}
    arena = arena and getattr(kernels, "uses_buffers", False)
    placed, size = arena_offsets(fn) if arena else ({}, 0)
    arenas = [torch.empty(size, dtype=torch.uint8, device=device) for _ in ranks] if placed else []

    def buffers(op: schedule.KernelOp, index: int) -> Buffers:
        if not arenas or not any(r in placed for r in op.results):
            return None
        return [_buffer(arenas[index], placed[r], r) if r in placed else None for r in op.results]

    def slot(value: SSAValue) -> int:
        if value not in slots:
            slots[value] = len(slots)
        return slots[value]

    def read(value: SSAValue) -> int:
        return slots[value]

    arguments = [slot(a) for a in fn.args]
    steps: list[Step] = []
    reads: list[tuple[int, ...]] = []  # the slots each step reads
    results: list[int] | None = None
    for op in fn.body.block.ops:
        if isinstance(op, schedule.KernelOp):
            inputs = tuple(read(v) for v in op.inputs)
            bound = [
                kernels.bind(op, KernelContext(mesh, rank), device, buffers(op, index))
                for index, rank in enumerate(ranks)
            ]
            step: Step = KernelStep(
                op.kernel_name, inputs, tuple(slot(v) for v in op.outputs), bound, ranks, device
            )
        elif isinstance(op, schedule.StartOp):
            inputs = (read(op.operands[0]),)
            step = collectives.start(op, inputs[0], slot(op.handle))
        elif isinstance(op, schedule.WaitOp):
            handle = read(op.handle)
            result = slot(op.result) if op.result is not None else None
            waited = collectives.wait(op, handle, result)
            if waited is None:  # the handle holds the result
                if op.result is not None:
                    slots[op.result] = handle
                continue
            step, inputs = waited, (handle,)
        elif isinstance(op, func.CallOp | schedule.ScanOp):
            inputs = tuple(read(v) for v in op.operands)
            callee = op.callee.root_reference.data
            if callee not in callees:
                module = fn.parent_op()
                assert isinstance(module, ModuleOp), f"@{name} is not in a module"
                callees[callee] = build_plan(
                    function(module, callee), mesh, ranks, kernels, collectives, device, arena,
                    callees,
                )  # fmt: skip
            outputs = tuple(slot(v) for v in op.results)
            if isinstance(op, schedule.ScanOp):
                step = ScanStep(
                    callees[callee], inputs, outputs, op.steps, op.carry_count, op.reversed
                )
            else:
                step = CallStep(callees[callee], inputs, outputs)
        elif isinstance(op, func.ReturnOp):
            results = [read(v) for v in op.operands]
            break
        else:
            raise ExecutionError(f"@{name}: cannot run {op.name} in a scheduled function")
        steps.append(step)
        reads.append(inputs)
    if results is None:
        raise ExecutionError(f"@{name}: the scheduled function has no return")
    frees = _frees(reads, results)
    return LaunchPlan(name, ranks, len(slots), arguments, results, steps, frees, arenas=arenas)


def _frees(reads: list[tuple[int, ...]], results: list[int]) -> list[tuple[int, ...]]:
    """For each step, the slots read last by it (results stay)."""
    last: dict[int, int] = {}
    for index, slots in enumerate(reads):
        for s in slots:
            last[s] = index
    frees: list[list[int]] = [[] for _ in reads]
    for s, index in last.items():
        if s not in results:
            frees[index].append(s)
    return [tuple(f) for f in frees]


def virtual_plan(
    module: ModuleOp,
    name: str,
    mesh: Mesh,
    kernels: KernelBinder | KernelRunner,
    ranks: Sequence[int] | None = None,
    device: torch.device | None = None,
) -> LaunchPlan:
    """The plan of ``@name`` on the virtual mesh (every rank, or ``ranks``)."""
    ranks = list(range(mesh.size)) if ranks is None else list(ranks)
    device = device or torch.device("cpu")
    return build_plan(
        function(module, name),
        mesh,
        ranks,
        binder(kernels),
        VirtualCollectives(mesh, ranks, device),
        device,
    )


def run_virtual(
    module: ModuleOp,
    name: str,
    mesh: Mesh,
    rank_args: Sequence[Sequence[torch.Tensor]],
    kernel: KernelBinder | KernelRunner = reference_kernel,
    ranks: Sequence[int] | None = None,
) -> list[tuple[torch.Tensor, ...]]:
    """Every rank's results of the scheduled function ``@name`` (ranks in mesh order),
    through a plan built for this call. With ``ranks``, only those ranks run
    (``rank_args`` and the results follow their order): a pipeline stage's slice of the
    mesh, every collective group inside it."""
    ranks = list(range(mesh.size)) if ranks is None else list(ranks)
    if len(rank_args) != len(ranks):
        raise ExecutionError(
            f"@{name}: expected arguments for {len(ranks)} ranks, found {len(rank_args)}"
        )
    device = next((a.device for args in rank_args for a in args), torch.device("cpu"))
    return virtual_plan(module, name, mesh, kernel, ranks, device).run(rank_args)


__all__ = [
    "CallStep",
    "Collectives",
    "KernelStep",
    "LaunchPlan",
    "ScanStep",
    "Step",
    "VirtualCollectives",
    "arena_offsets",
    "build_plan",
    "run_virtual",
    "virtual_plan",
]
