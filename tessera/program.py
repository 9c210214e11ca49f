"""``Lowered``: one traced program, compiled for one signature (``ts.jit(f).lower(...)``).

It holds the program at every compilation stage (``as_text``, ``module_at``; computed on
first use, shared through the program cache), its digest, per-rank layouts, memory
statistics, simulated step time, collectives and generated Triton source. Calling it runs
the program through its :class:`~tessera.execute.Executor`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp

from tessera import program_cache
from tessera.backends import distributed, schedule_runner
from tessera.backends.collective_info import CollectiveInfo, collectives
from tessera.backends.cuda_graphs import CudaGraphs
from tessera.backends.execution import Execution
from tessera.driver import STAGES, CompileConfig, pipeline_string, run_stage, stage_passes
from tessera.errors import TesseraError
from tessera.execute import Executor
from tessera.frontend import pytree
from tessera.ir.abstract import AbstractTensor
from tessera.ir.mesh import Mesh
from tessera.ir.serialize import SerializeError
from tessera.ir.sharding import Sharding, arg_sharding, value_sharding
from tessera.passes.plan_memory import peak_bytes
from tessera.program_cache import ProgramCache
from tessera.schedule import ScheduleOptions


@dataclass(frozen=True)
class Signature:
    """What a compiled program is specialised on."""

    treedef: pytree.TreeDef
    leaves: tuple[Any, ...]  # AbstractTensor for arrays, the value itself for static leaves
    shardings: tuple[Sharding | None, ...] = ()  # per array leaf, when traced with a mesh


@dataclass(frozen=True)
class ModelStateMemory:
    """Per-rank bytes of a training step's state (the ZeRO paper's "model states")."""

    params: int
    grads: int  # the reduced gradients the optimizer consumes
    optimizer_state: int

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer_state


@dataclass(frozen=True)
class MemoryStats:
    """Per-rank memory of a compiled program."""

    peak_bytes: int  # arguments, results and intermediates live at the worst point
    model_states: ModelStateMemory | None = None  # training steps (graph.training_step)


class Lowered:
    """A traced program for one signature (like ``jax.jit(f).lower(...)``)."""

    def __init__(
        self,
        name: str,
        module: ModuleOp,
        signature: Signature,
        out_tree: pytree.TreeDef,
        config: CompileConfig,
    ):
        self.name = name
        self.module = module  # as traced
        self.signature = signature
        self.out_tree = out_tree
        self.config = config
        self._stages: dict[str, ModuleOp] = {"traced": module}
        # compiled stages on disk, shared by every process tracing the same program
        self._program_cache = ProgramCache(module, config) if program_cache.enabled() else None
        self._sources: dict[str, str] | None = None  # Triton source by tile kernel
        self._digest: bytes | None = None
        self._layout_cache: tuple[list[Sharding], list[Sharding]] | None = None
        # set by graph.training_step: the per-rank bytes of parameters, gradients, state
        self.model_states: Callable[[], ModelStateMemory] | None = None
        self.executor = Executor(self)  # runs it; holds its launch plans

    @property
    def mesh(self) -> Mesh | None:
        return self.config.mesh

    @property
    def kernels(self) -> str:
        return self.config.kernels

    @property
    def schedule_options(self) -> ScheduleOptions:
        return self.config.schedule

    def pipeline(self, *stages: str) -> str:
        """The passes that compile this program (or only ``stages``' passes), as a
        ``tessera-opt -p`` string: ``tessera-opt`` given the text of the stage before the
        first of ``stages`` reproduces the text of the last."""
        return pipeline_string(self.config, stages or STAGES[1:])

    def as_text(self, stage: str = "graph") -> str:
        """The IR at ``stage``: ``"traced"`` (as traced), ``"autodiff"`` (a gradient
        program's forward and backward; other programs: as traced), ``"graph"`` (cleaned up by
        canonicalize, cse and dce; global shapes), ``"sharded"`` (every
        value annotated with its sharding, collectives inserted), ``"partitioned"``
        (the per-rank program, local shapes), ``"schedule"`` (kernels, collective
        start/wait pairs, buffer offsets) or ``"tile"`` (the schedule plus one
        ``tile.kernel`` per kernel)."""
        return str(self.module_at(stage))

    def triton_source(self) -> dict[str, str]:
        """The generated Triton source of every kernel, by kernel name (emitted once, or
        read from the program cache)."""
        if self._sources is None and self._program_cache:
            self._sources = self._program_cache.load_sources()
        if self._sources is None:
            from tessera.backends.triton.emit import emit_module

            self._sources = emit_module(self.module_at("tile"))
            if self._program_cache:
                self._program_cache.store_sources(self._sources)
        return dict(self._sources)

    def kernel_runner(self) -> schedule_runner.KernelBinder:
        """How its kernels run (:meth:`tessera.execute.Executor.kernel_runner`)."""
        return self.executor.kernel_runner()

    def launch_plan(self, execution: Execution, ranks: Sequence[int] | None = None) -> Any:
        """The program planned for ``execution`` and ``ranks`` (built once:
        :meth:`tessera.execute.Executor.launch_plan`)."""
        return self.executor.launch_plan(execution, ranks)

    @property
    def plan_builds(self) -> int:
        """Launch plans built so far (one per execution and ranks)."""
        return self.executor.plan_builds

    @property
    def last_run(self) -> distributed.RunRecord | None:
        """The record of the latest multi-process call (None before one)."""
        return self.executor.last_run

    @property
    def graphs(self) -> CudaGraphs | None:
        """Its CUDA graphs, with ``ts.jit(cuda_graphs=True)``."""
        return self.executor.graphs

    def digest(self) -> bytes:
        """A digest of the whole program: of Tessera's code, the compile configuration and
        the traced module (the program cache's key; computed once). Processes compare it
        before running the program."""
        if self._digest is None:
            cache = self._program_cache or ProgramCache(self.module, self.config)
            try:
                self._digest = bytes.fromhex(cache.key)
            except SerializeError:  # not storable: the digest of its text
                self._digest = hashlib.sha256(str(self.module).encode()).digest()
        return self._digest

    def module_at(self, stage: str) -> ModuleOp:
        """The module after ``stage``'s passes (computed once, on a copy)."""
        if stage not in STAGES:
            raise TesseraError(f"unknown or not yet available stage {stage!r}; available: {STAGES}")
        if stage not in self._stages and not stage_passes(stage, self.config):
            # a stage this program does not have (autodiff): the previous stage's module
            self._stages[stage] = self.module_at(STAGES[STAGES.index(stage) - 1])
        if stage not in self._stages:
            stored = self._program_cache.load(stage) if self._program_cache else None
            if stored is None:
                previous = self.module_at(STAGES[STAGES.index(stage) - 1])
                stored = run_stage(stage, previous, self.config)
                if self._program_cache:
                    self._program_cache.store(stage, stored)
            self._stages[stage] = stored
        return self._stages[stage]

    def memory(self) -> MemoryStats:
        """Per-rank memory of the scheduled program (``plan-memory``'s buffer plan) and,
        for a training step, of its parameters, gradients and optimizer state."""
        return MemoryStats(
            peak_bytes=peak_bytes(self.module_at("schedule"))[self.name],
            model_states=self.model_states() if self.model_states else None,
        )

    def simulate(self, topology: Any = None) -> Any:
        """The scheduled program simulated on ``topology`` (a ``tessera.perf.Topology``, a
        preset name such as ``"gb200_nvl72"``, or a JSON file; by default the machine it
        was compiled for: the mesh's ``topology=``, else DGX H100 nodes enough for the
        mesh): step time, exposed communication and a timeline
        (``.save_trace("trace.json")``); see :mod:`tessera.perf.simulate`."""
        from tessera.perf.simulate import simulate

        if topology is None and self.mesh is not None:
            topology = self.config.machine()
        return simulate(self.module_at("schedule"), self.name, self.mesh, topology)

    def collectives(self) -> list[CollectiveInfo]:
        """The communicating collectives of the partitioned program, in program order: one
        per move the sharding passes made, before the schedule buckets, hoists or splits
        any (what runs: ``collectives(self.module_at("schedule"))`` of
        ``tessera.backends.collective_info``)."""
        if self.mesh is None:
            return []
        return collectives(self.module_at("partitioned"))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        leaves, _ = pytree.flatten((args, kwargs))
        return self.run(leaves)

    def run(self, leaves: Sequence[Any], checked: bool = False) -> Any:
        """Runs the program on the array ``leaves`` of a call
        (:meth:`tessera.execute.Executor.run`)."""
        return self.executor.run(leaves, checked)

    def layouts(self) -> tuple[list[Sharding], list[Sharding]]:
        """The per-rank layouts of the program's arguments and results (computed once)."""
        if self._layout_cache is None and self._program_cache:
            self._layout_cache = self._program_cache.load_layouts()
        if self._layout_cache is None:
            module = self.module_at("partitioned")
            function = next(
                o for o in module.ops if isinstance(o, func.FuncOp) and o.sym_name.data == self.name
            )
            args = [
                arg_sharding(function, i)
                or Sharding.replicated(AbstractTensor.from_xdsl(a.type).rank)
                for i, a in enumerate(function.args)
            ]
            results = [value_sharding(function, v) for v in function.body.block.last_op.operands]
            self._layout_cache = (args, results)
            if self._program_cache:
                self._program_cache.store_layouts(self._layout_cache)
        return self._layout_cache


__all__ = ["Lowered", "MemoryStats", "ModelStateMemory", "Signature"]
