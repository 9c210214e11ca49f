"""How a ``schedule.kernel`` runs: bound once to a rank, then called on tensors.

A :class:`KernelBinder` turns a kernel and the rank that runs it into a
:data:`BoundKernel`, a function of the kernel's input tensors returning its outputs that
reads no IR when called. Launch plans (:mod:`tessera.backends.launch_plan`) bind every
kernel of a program once and then only call the bound functions.

:data:`reference_kernel` binds a kernel to its reference semantics (the oracle):
:func:`compile_block` turns the kernel's body into a closure calling each op's torch
reference (:func:`tessera.opdefs.bind_reference`) in order, values in a list of slots.
Generated Triton kernels are the other binder
(:class:`tessera.backends.triton.runtime.TritonKernels`). Either is also callable as a
:data:`KernelRunner`, ``runner(kernel, inputs, context)``, which binds and runs once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from xdsl.dialects import func
from xdsl.dialects.builtin import FileLineColLoc
from xdsl.ir import Block, Operation

from tessera.errors import ExecutionError, TesseraError, describe_location
from tessera.ir import graph, schedule
from tessera.ir.mesh import Mesh
from tessera.opdefs import RankReference, bind_reference, lookup


@dataclass(frozen=True)
class KernelContext:
    """Which rank runs a kernel: a rank-local slice (``graph.all_slice``) and a rank's
    position (``graph.axis_index``) depend on it."""

    mesh: Mesh
    rank: int

    def position(self, axes: Sequence[str]) -> tuple[int, int]:
        """This rank's index in its group along ``axes``, and the group's size."""
        group = next(g for g in self.mesh.groups(axes) if self.rank in g)
        return group.index(self.rank), len(group)


BoundKernel = Callable[..., Sequence[torch.Tensor]]
"""A kernel bound to a rank and a device: ``fn(*inputs) -> outputs``."""

KernelRunner = Callable[
    [schedule.KernelOp, Sequence[torch.Tensor], KernelContext], Sequence[torch.Tensor]
]
"""Runs a kernel once: ``runner(kernel, inputs, context) -> outputs``."""


Buffers = Sequence[torch.Tensor | None] | None
"""Per output of a kernel, a preallocated tensor it may write (a view of the rank's
arena, at ``plan-memory``'s offset) or None; None for all: allocate every output."""


class KernelBinder(Protocol):
    """Binds kernels, once per kernel, rank and device (see the module docstring).
    ``outputs`` offers buffers for the outputs; a binder may ignore them (plans offer
    them only to binders with a true ``uses_buffers`` attribute)."""

    def bind(
        self,
        kernel: schedule.KernelOp,
        context: KernelContext,
        device: torch.device,
        outputs: Buffers = None,
    ) -> BoundKernel: ...


def traced_at(op: Operation) -> str:
    """The user's line that created ``op``, when the tracer recorded it."""
    location = op.location
    if not isinstance(location, FileLineColLoc):
        return ""
    return f"\n  at {describe_location(location.filename.data, location.line.data)}"


def _reference_of(op: Operation, context: KernelContext | None) -> Callable[..., Any]:
    """``op``'s reference as a function of its operands; a rank-local slice takes this
    rank's chunk and a per-rank value (``axis_index``) this rank's (``context``)."""
    if isinstance(op, graph.AllSliceOp) and context is not None:
        attrs = op.attrs()
        index, size = context.position(attrs["axes"])
        dim = attrs["dim"]
        return lambda x: x.chunk(size, dim)[index]
    found = lookup(op)
    if found is None:
        raise ExecutionError(f"no reference semantics for {op.name}")
    if isinstance(found.reference, RankReference) and context is not None:
        rank_context = context
        return found.reference.at(op, lambda axes: rank_context.position(axes)[0])
    return bind_reference(op)


def _call_of(
    op: graph.CallOp | graph.ScanOp,
    context: KernelContext | None,
    callees: dict[str, Callable[..., list[torch.Tensor]]],
) -> Callable[..., Any]:
    """A ``graph.call`` as a function of its operands: the callee compiled once for
    every call of it in the program (or, for a scan, its step)."""
    name = op.callee_name
    if name not in callees:
        function = op.callee_function()
        if function is None:
            raise ExecutionError(f"graph.call: no function @{name} in the module")
        callees[name] = compile_block(function.body.block, context, f"@{name}", callees)
    run = callees[name]
    return lambda *inputs: tuple(run(*inputs))


def run_scan(
    step: Callable[..., Sequence[torch.Tensor]],
    inputs: Sequence[torch.Tensor],
    length: int,
    carries: int,
    reverse: bool,
) -> tuple[torch.Tensor, ...]:
    """A scan's results: ``step`` run ``length`` times on the carries and each step's
    slices of the other inputs (from the last step with ``reverse``), its other results
    stacked on dim 0 in step order."""
    carry = list(inputs[:carries])
    stacked = inputs[carries:]
    outputs: list[Sequence[torch.Tensor]] = [()] * length
    for i in reversed(range(length)) if reverse else range(length):
        results = step(*carry, *(x[i] for x in stacked))
        carry, outputs[i] = list(results[:carries]), results[carries:]
    ys = [torch.stack(list(column)) for column in zip(*outputs, strict=True)]
    return (*carry, *ys)


def _scan_of(
    op: graph.ScanOp,
    context: KernelContext | None,
    callees: dict[str, Callable[..., list[torch.Tensor]]],
) -> Callable[..., Any]:
    """A ``graph.scan`` as a function of its operands (its step compiled once)."""
    step = _call_of(op, context, callees)  # type: ignore[arg-type]
    length, carries, reverse = op.steps, op.carry_count, op.reversed
    return lambda *inputs: run_scan(step, inputs, length, carries, reverse)


def compile_block(
    block: Block,
    context: KernelContext | None = None,
    what: str = "",
    callees: dict[str, Callable[..., list[torch.Tensor]]] | None = None,
) -> Callable[..., list[torch.Tensor]]:
    """The ops of ``block`` (a kernel body or a graph function, ending in
    ``schedule.yield`` or ``func.return``) as one closure from the block's arguments to
    the terminator's operands. Values live in a list of slots, each cleared after its
    last use; each op is its bound reference. An op that fails raises an error naming it
    and the line that traced it."""
    callees = {} if callees is None else callees
    slots = {arg: index for index, arg in enumerate(block.args)}
    program: list[tuple[Callable[..., Any], tuple[int, ...], tuple[int, ...], tuple[int, ...]]] = []
    ops: list[Operation] = []
    returned: tuple[int, ...] | None = None
    for op in block.ops:
        if isinstance(op, (schedule.YieldOp, func.ReturnOp)):
            returned = tuple(slots[v] for v in op.operands)
            break
        try:
            if isinstance(op, graph.CallOp):
                fn = _call_of(op, context, callees)
            elif isinstance(op, graph.ScanOp):
                fn = _scan_of(op, context, callees)
            else:
                fn = _reference_of(op, context)
        except TesseraError as error:
            raise type(error)(f"{what}{': ' if what else ''}{error}") from None
        outputs = tuple(range(len(slots), len(slots) + len(op.results)))
        slots.update(zip(op.results, outputs, strict=True))
        program.append((fn, tuple(slots[v] for v in op.operands), outputs, ()))
        ops.append(op)
    if returned is None:
        raise ExecutionError(f"{what}{': ' if what else ''}the block has no terminator")
    last = {slot: index for index, entry in enumerate(program) for slot in entry[1]}
    dead: list[list[int]] = [[] for _ in program]
    for slot, index in last.items():
        if slot not in returned:
            dead[index].append(slot)
    program = [(*entry[:3], tuple(d)) for entry, d in zip(program, dead, strict=True)]
    size, arity = len(slots), len(block.args)
    results = returned

    def run(*inputs: torch.Tensor) -> list[torch.Tensor]:
        if len(inputs) != arity:
            raise ExecutionError(f"{what}: expected {arity} inputs, found {len(inputs)}")
        env: list[Any] = [*inputs, *([None] * (size - arity))]
        step = 0
        try:
            for step, (fn, operands, outputs, free) in enumerate(program):  # noqa: B007
                result = fn(*[env[i] for i in operands])
                if type(result) is tuple:  # an op of several results (or split into one)
                    for slot, value in zip(outputs, result, strict=True):
                        env[slot] = value
                else:
                    env[outputs[0]] = result
                for slot in free:
                    env[slot] = None
        except TesseraError as error:
            raise type(error)(f"{error}{traced_at(ops[step])}") from None
        except Exception as error:  # a torch error: name the op that raised it
            raise ExecutionError(
                f"{ops[step].name} failed: {error}{traced_at(ops[step])}"
            ) from None
        return [env[i] for i in results]

    return run


class ReferenceKernels:
    """Binds kernels to their reference semantics (:func:`compile_block` of the body;
    torch allocates the outputs)."""

    def bind(
        self,
        kernel: schedule.KernelOp,
        context: KernelContext,
        device: torch.device,
        outputs: Buffers = None,
    ) -> BoundKernel:
        return compile_block(kernel.body.block, context, kernel.kernel_name)

    def __call__(
        self, kernel: schedule.KernelOp, inputs: Sequence[torch.Tensor], context: KernelContext
    ) -> list[torch.Tensor]:
        """Runs ``kernel`` once (binding it first)."""
        device = inputs[0].device if inputs else torch.device("cpu")
        return list(self.bind(kernel, context, device)(*inputs))


reference_kernel = ReferenceKernels()


class _Runner:
    """A plain :data:`KernelRunner` as a binder (it gets the kernel at every call)."""

    def __init__(self, runner: KernelRunner):
        self.runner = runner

    def bind(
        self,
        kernel: schedule.KernelOp,
        context: KernelContext,
        device: torch.device,
        outputs: Buffers = None,
    ) -> BoundKernel:
        runner = self.runner
        return lambda *inputs: runner(kernel, inputs, context)


def binder(kernels: KernelBinder | KernelRunner) -> KernelBinder:
    """``kernels`` as a binder (a plain runner function is wrapped)."""
    return kernels if hasattr(kernels, "bind") else _Runner(kernels)  # type: ignore[return-value]


__all__ = [
    "BoundKernel",
    "Buffers",
    "KernelBinder",
    "KernelContext",
    "KernelRunner",
    "ReferenceKernels",
    "binder",
    "compile_block",
    "reference_kernel",
]
