"""Where scheduled programs run: one interface over the virtual mesh and processes.

An :class:`Execution` runs a scheduled function for the ranks this process is
responsible for: every rank of the mesh, in memory (:class:`VirtualMesh`, the default
without a launcher), or the one rank of this process in a ``tessera run`` / ``torchrun``
job (:class:`Processes`, collectives through ``torch.distributed``). Front-ends cut
their arguments per rank for :attr:`Execution.ranks`, plan the program once
(:meth:`Execution.plan`, cached under :attr:`Execution.plan_key`), call
:meth:`Execution.run_plan`, and get one tuple of results per rank back, whichever the
backend.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Hashable, Sequence
from typing import Any

import torch
from xdsl.dialects.builtin import ModuleOp

from tessera.backends import distributed
from tessera.backends.launch_plan import LaunchPlan, virtual_plan
from tessera.backends.schedule_runner import KernelBinder, KernelRunner
from tessera.ir.mesh import Mesh


class Execution(ABC):
    """Runs scheduled functions for :attr:`ranks` of ``mesh``."""

    processes: bool

    def __init__(self, mesh: Mesh):
        self.mesh = mesh

    @property
    @abstractmethod
    def ranks(self) -> list[int]:
        """The ranks this process runs, in mesh order."""

    @property
    @abstractmethod
    def device(self) -> torch.device:
        """Where this process's kernels run."""

    @property
    @abstractmethod
    def plan_key(self) -> Hashable:
        """Plans of this execution's kind, mesh and device are the same (a cache key)."""

    @abstractmethod
    def plan(
        self,
        module: ModuleOp,
        name: str,
        kernels: KernelBinder | KernelRunner,
        ranks: Sequence[int] | None = None,
        digest: bytes | None = None,
    ) -> Any:
        """The scheduled ``@name`` planned for ``ranks`` (by default :attr:`ranks`), every
        kernel bound by ``kernels``: what :meth:`run_plan` runs, any number of times.
        ``digest`` identifies the whole program (processes compare it before running)."""

    @abstractmethod
    def run_plan(
        self, plan: Any, rank_args: Sequence[Sequence[torch.Tensor]], check_program: bool = True
    ) -> list[tuple[torch.Tensor, ...]]:
        """The results of a planned function for each of its ranks, given each rank's
        arguments in the same order. ``check_program`` lets processes first compare
        their program digests (pipeline stages, whose ranks run different
        programs, turn it off)."""

    def run(
        self,
        module: ModuleOp,
        name: str,
        rank_args: Sequence[Sequence[torch.Tensor]],
        kernel: KernelBinder | KernelRunner,
        ranks: Sequence[int] | None = None,
        check_program: bool = True,
    ) -> list[tuple[torch.Tensor, ...]]:
        """Plans ``@name`` for this call and runs it (see :meth:`plan`)."""
        return self.run_plan(self.plan(module, name, kernel, ranks), rank_args, check_program)


class VirtualMesh(Execution):
    """Every rank in this process; collectives computed exactly in memory."""

    processes = False

    def __init__(self, mesh: Mesh, device: torch.device | None = None):
        super().__init__(mesh)
        self._device = device or torch.device("cpu")

    @property
    def ranks(self) -> list[int]:
        return list(range(self.mesh.size))

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def plan_key(self) -> Hashable:
        return ("virtual", self.mesh, self._device)

    def plan(
        self,
        module: ModuleOp,
        name: str,
        kernels: KernelBinder | KernelRunner,
        ranks: Sequence[int] | None = None,
        digest: bytes | None = None,
    ) -> LaunchPlan:
        return virtual_plan(module, name, self.mesh, kernels, ranks, self._device)

    def run_plan(
        self,
        plan: LaunchPlan,
        rank_args: Sequence[Sequence[torch.Tensor]],
        check_program: bool = True,
    ) -> list[tuple[torch.Tensor, ...]]:
        return plan.run(rank_args)


class Processes(Execution):
    """This process's rank of a multi-process job (``torch.distributed``)."""

    processes = True

    def __init__(self, mesh: Mesh):
        super().__init__(mesh)
        self.runtime = distributed.runtime()
        self.runtime.check_mesh(mesh)
        self.last_run: distributed.RunRecord | None = None

    @property
    def ranks(self) -> list[int]:
        return [self.runtime.rank]

    @property
    def device(self) -> torch.device:
        return self.runtime.device

    @property
    def plan_key(self) -> Hashable:
        return ("processes", self.mesh, self.runtime.rank, self.runtime.device)

    def plan(
        self,
        module: ModuleOp,
        name: str,
        kernels: KernelBinder | KernelRunner,
        ranks: Sequence[int] | None = None,
        digest: bytes | None = None,
    ) -> distributed.RankPlan:
        return distributed.RankPlan(module, name, self.mesh, self.runtime, kernels, digest)

    def run_plan(
        self,
        plan: distributed.RankPlan,
        rank_args: Sequence[Sequence[torch.Tensor]],
        check_program: bool = True,
    ) -> list[tuple[torch.Tensor, ...]]:
        (args,) = rank_args
        outputs, self.last_run = plan.run(args, check_program)
        return [outputs]


def kernel_device(arrays: Sequence[Any], kernels: str) -> torch.device:
    """Where kernels run in this process: the GPU when there is one (Triton kernels;
    the first CUDA argument's device), else the CPU."""
    if kernels == "triton" and torch.cuda.is_available():
        on_gpu = [a.device for a in arrays if isinstance(a, torch.Tensor) and a.is_cuda]
        return on_gpu[0] if on_gpu else torch.device("cuda")
    return torch.device("cpu")


def execution_for(mesh: Mesh, arrays: Sequence[Any] = (), kernels: str = "triton") -> Execution:
    """Processes under a launcher (``tessera run``, ``torchrun``), else the virtual mesh
    with kernels on :func:`kernel_device`."""
    if distributed.launched():
        return Processes(mesh)
    return VirtualMesh(mesh, kernel_device(arrays, kernels))


__all__ = ["Execution", "Processes", "VirtualMesh", "execution_for", "kernel_device"]
