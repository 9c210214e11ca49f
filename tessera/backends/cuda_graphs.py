"""CUDA graphs of launch plans (``ts.jit(..., cuda_graphs=True)``).

A launch plan (:mod:`.launch_plan`) still costs Python and one launch per kernel at every
call. With CUDA graphs a plan runs plainly at its first call (its Triton kernels compile
and autotune there) and is captured into one ``torch.cuda.CUDAGraph`` at its second:
the capture reads static input buffers and leaves its results in static output buffers.
That call and every later one copy their arguments into the static inputs, replay the
graph and return clones of the static outputs, so results are new tensors, as without
graphs (a later call never overwrites them). Those copies cost a pass over every argument
and result per call (for a training step, over the parameters and optimizer state), so
graphs pay where launches, not bytes, dominate. A captured graph keeps its memory (static
buffers and the graph's private pool of intermediates) while the compiled program lives.

Captured: single-process plans whose every step runs on one CUDA device: kernels
(generated Triton kernels, torch views) and the virtual mesh's in-memory collectives
(a single-process mesh whose ranks share the device). Run plainly, with one
:class:`CudaGraphWarning` per program and reason (:func:`why_not_capturable`): no CUDA,
kernels on the CPU (``kernels="reference"`` included), multi-process plans (collectives
through ``torch.distributed``: NCCL is capturable in principle, gloo is not; neither is
tried), host kernels (MoE routing, top-k: torch references that may read values on the
host), steps of any other kind, and a capture that fails (an op that synchronizes with
the host). Calls inside ``perf.record_timeline()`` run plainly (timed per kernel), without
a warning.

Range checks of gather indices and cross-entropy labels read values on the host: the
capture defers them (:func:`~tessera.backends.reference.deferred_index_checks`) and
every replay runs them first, on the static inputs, so a plan is captured only when each
checked tensor is an argument (or a view of one); such a replay synchronizes once per check.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from xdsl.dialects.builtin import ModuleOp

from tessera.backends.execution import Execution
from tessera.backends.launch_plan import (
    CallStep,
    KernelStep,
    LaunchPlan,
    ScanStep,
    VirtualCollectiveStep,
    function,
)
from tessera.backends.reference import DeferredCheck, deferred_index_checks
from tessera.ir import schedule
from tessera.perf import timeline as perf_timeline
from tessera.perf.compute_cost import runs_on_host

Results = list[tuple[torch.Tensor, ...]]  # per rank


class CudaGraphWarning(UserWarning):
    """A program compiled with ``cuda_graphs=True`` runs without a CUDA graph."""


def _devices(plan: LaunchPlan, host: Collection[str], devices: set[torch.device]) -> str | None:
    """Adds the devices ``plan``'s steps (and its regions' steps) run on to ``devices``;
    returns why a step cannot be captured, or None."""
    for step in plan.steps:
        if isinstance(step, KernelStep):
            if step.name in host:
                return f"kernel @{step.name} runs on the host (ops without generated code)"
            devices.add(step.device)
        elif isinstance(step, VirtualCollectiveStep):
            devices.add(step.device)
        elif isinstance(step, CallStep | ScanStep):  # a region: its steps, once per call
            found = _devices(step.callee, host, devices)
            if found is not None:
                return found
        else:
            what = getattr(step, "what", type(step).__name__)
            return f"{what} steps ({type(step).__name__}) are not known to be capturable"
    return None


class NotCapturable(Exception):
    """A plan could not be captured (the message says why)."""


def host_kernels(module: ModuleOp, name: str) -> set[str]:
    """The kernels of the scheduled function ``@name`` of ``module`` and of the regions it
    calls that run on the host."""
    function(module, name)  # raises for a missing function
    return {
        op.kernel_name
        for op in module.walk()
        if isinstance(op, schedule.KernelOp) and runs_on_host(op)
    }


def why_not_capturable(plan: Any, host: Collection[str] = ()) -> str | None:
    """Why ``plan`` cannot be captured into one CUDA graph, or None when it can (see the
    module docstring); ``host`` names its kernels that run on the host."""
    if not isinstance(plan, LaunchPlan):
        return (
            f"{type(plan).__name__} runs one rank of a multi-process job (collectives through "
            f"torch.distributed); only single-process plans are captured"
        )
    if not plan.steps:
        return f"@{plan.name} launches no kernel"
    devices: set[torch.device] = set()
    found = _devices(plan, host, devices)
    if found is not None:
        return found
    off = sorted({str(d) for d in devices if d.type != "cuda"})
    if off:
        return f"kernels run on {', '.join(off)}, not on a CUDA device"
    if len(devices) > 1:
        return f"kernels run on {len(devices)} devices: {', '.join(sorted(map(str, devices)))}"
    return None


class CapturedPlan:
    """A plan captured into a CUDA graph over static inputs (copies of ``rank_args``).
    Raises :class:`NotCapturable` when the capture fails; errors of the warm-up run
    before it (the program's own) propagate."""

    def __init__(self, plan: LaunchPlan, rank_args: Sequence[Sequence[torch.Tensor]]):
        device = plan.steps[0].device  # type: ignore[attr-defined]
        self.inputs = [
            [torch.empty_like(a, memory_format=torch.contiguous_format).copy_(a) for a in args]
            for args in rank_args
        ]
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.device(device):
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # a warm-up on a side stream, as PyTorch advises
                plan.run(self.inputs)
            torch.cuda.current_stream().wait_stream(side)
            try:
                with deferred_index_checks() as checks, torch.cuda.graph(self.graph):
                    self.outputs: Results = plan.run(self.inputs)
            except Exception as error:
                raise NotCapturable(
                    f"the capture failed: {type(error).__name__}: {str(error)[:300]}"
                ) from error
        self.checks: list[DeferredCheck] = list(checks)
        storages = {a.untyped_storage().data_ptr() for args in self.inputs for a in args}
        for tensor, _ in self.checks:
            if tensor.untyped_storage().data_ptr() not in storages:
                raise NotCapturable(
                    "a kernel range-checks gather indices or labels computed on the device "
                    "(the check reads them on the host)"
                )

    def run(self, rank_args: Sequence[Sequence[torch.Tensor]]) -> Results:
        """The results for ``rank_args`` (shaped as the captured call's): copied in,
        checked, replayed, copied out."""
        for statics, args in zip(self.inputs, rank_args, strict=True):
            for static, arg in zip(statics, args, strict=True):
                static.copy_(arg)
        for tensor, check in self.checks:
            check(tensor)
        self.graph.replay()
        return [tuple(o.clone() for o in outputs) for outputs in self.outputs]


@dataclass
class _Entry:
    """What one plan runs as: plainly (``reason``), or ``captured`` once warm."""

    plan: Any
    reason: str | None = None
    captured: CapturedPlan | None = None


class CudaGraphs:
    """The CUDA graphs of one compiled program, one per launch plan (see the module
    docstring); :meth:`run` replaces ``execution.run_plan``."""

    def __init__(self, name: str):
        self.name = name
        self.captures = 0  # graphs captured
        self._entries: dict[int, _Entry] = {}
        self._warned: set[str] = set()

    def fallback(self, reason: str) -> None:
        """Warns, once per reason, that the program runs without a CUDA graph."""
        if reason not in self._warned:
            self._warned.add(reason)
            warnings.warn(
                f"{self.name}: cuda_graphs=True, but running without a CUDA graph: {reason}",
                CudaGraphWarning,
                stacklevel=2,
            )

    def reason(self, plan: Any) -> str | None:
        """Why ``plan`` runs plainly (None: it is, or will be, captured)."""
        entry = self._entries.get(id(plan))
        return entry.reason if entry else None

    def run(
        self,
        execution: Execution,
        plan: Any,
        rank_args: Sequence[Sequence[torch.Tensor]],
        host: Callable[[], Collection[str]] = frozenset,
    ) -> Results:
        """``plan``'s results for ``rank_args``: plainly at its first call, replayed from
        a graph captured at the second; ``host()`` names its host kernels."""
        entry = self._entries.get(id(plan))
        if entry is not None and entry.captured is not None and perf_timeline.active() is None:
            return entry.captured.run(rank_args)
        if entry is None:  # the first call: the warm-up
            reason = (
                why_not_capturable(plan, host())
                if torch.cuda.is_available()
                else "CUDA is not available"
            )
            entry = self._entries[id(plan)] = _Entry(plan, reason)
            if reason:
                self.fallback(reason)
        elif entry.reason is None and perf_timeline.active() is None:
            try:
                entry.captured = CapturedPlan(plan, rank_args)
            except NotCapturable as error:
                entry.reason = str(error)
                self.fallback(entry.reason)
            else:
                self.captures += 1
                return entry.captured.run(rank_args)
        return execution.run_plan(plan, rank_args)


__all__ = [
    "CapturedPlan",
    "CudaGraphWarning",
    "CudaGraphs",
    "NotCapturable",
    "host_kernels",
    "why_not_capturable",
]
