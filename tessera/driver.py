"""The compile driver: one declared list of stages, each a list of pass flags.

Every front-end (``ts.jit``, ``ts.grad``, ``graph.training_step``, a pipeline's stage
programs) traces a Graph IR module and hands it, with one immutable
:class:`CompileConfig`, to :func:`run_stage`. The passes each stage runs are declared
here and nowhere else, so the whole pipeline of a program prints as one ``tessera-opt
-p`` string (:func:`pipeline_string`) and any stage can be replayed by hand::

    tessera-opt graph.mlir -p "$(python -c 'print(lowered.pipeline("sharded"))')"

Stages, in order (``traced`` is the module as the tracer built it):

- ``autodiff``: a gradient program's backward (``ts.grad``, ``ts.value_and_grad``):
  ``autodiff{function=... in_place=true remat=... wrt=...}`` differentiates the traced
  forward; other programs have no such stage (no passes: its module is the traced one);
- ``graph``: clean-up (``canonicalize``, ``cse``, ``dce``), so a value nobody returns —
  the loss ``ts.grad`` drops, say — never reaches sharding;
- ``sharded``: ``shard-propagate``, ``insert-collectives``;
- ``partitioned``: ``shard-partition`` (per-rank shapes), ``unzigzag-attention``;
- ``schedule``: the schedule options' passes (:mod:`tessera.schedule`), from
  ``collective-matmul`` and ``bucket-gradients`` to ``plan-memory``;
- ``tile``: ``lower-schedule-to-tile``.

The configuration holds every input of the compile besides the traced module: the passes
and the program cache (:mod:`tessera.program_cache`, whose key covers the whole config)
read it, never module-level state. The user-facing context managers that shape a compile
— ``tessera.schedule``'s options (the pipeline options among them) and
``tessera.numerics``' mode — keep their settings in module-level stacks *for tracing
only*: a front-end reads them once, when it traces, into the config
(``JitFunction.compile_config``). A training step's own options (``remat``,
``precision`` and its loss scaling) are fixed by the step and recorded in the config of
its programs. While a training step traces, ``tessera.training`` keeps the step being
traced (its parameters, remat policy, loss scale: traced values) on a stack that
``graph.backward`` reads; nothing reads it once tracing ends.

Passes that need other passes get them from here, not by importing them:
``collective-matmul`` times its candidate chunkings with :func:`schedule_trial`, which
the driver (and ``tessera-opt``) hands it through :func:`available_passes`.
"""

from __future__ import annotations

import functools
import gc
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass

from tessera import numerics as numerics_policy
from tessera.errors import TesseraError
from tessera.ir.mesh import Mesh, default_machine
from tessera.ir.verifier import verify_module
from tessera.passes import get_all_passes
from tessera.precision import Precision
from tessera.schedule import ScheduleOptions
from tessera.topology import Topology, load_topology
from tessera.transforms.remat import RematPolicy

STAGES = ("traced", "autodiff", "graph", "sharded", "partitioned", "schedule", "tile")
KERNEL_BACKENDS = ("triton", "reference")

_FIXED_STAGE_PASSES: dict[str, tuple[str, ...]] = {
    "graph": ("canonicalize", "cse", "dce"),
    "sharded": ("shard-propagate", "insert-collectives"),
    "partitioned": ("shard-partition", "unzigzag-attention"),
    "tile": ("lower-schedule-to-tile",),
}
# how collective-matmul's candidates are scheduled before they are simulated
_TRIAL_PASSES = ("lower-graph-to-schedule", "overlap-comm")


@dataclass(frozen=True)
class Autodiff:
    """What a gradient program's ``autodiff`` stage differentiates: ``@function``'s first
    result (the loss) with respect to its arguments ``wrt`` (indices); the function then
    returns ``results`` (indices into its results followed by the gradients; empty: all)."""

    function: str
    wrt: tuple[int, ...]
    results: tuple[int, ...] = ()


# the config's defaults, immutable, made once (a jit function makes a config per call)
_DEFAULT_SCHEDULE = ScheduleOptions()
_DEFAULT_REMAT = RematPolicy()
_DEFAULT_PRECISION = Precision()


@dataclass(frozen=True)
class CompileConfig:
    """Everything a program is compiled with, handed on unchanged by every front-end.

    ``mesh`` is None for a single-device program; ``kernels`` is ``"triton"`` (generated
    kernels) or ``"reference"`` (the reference executor, the test oracle); ``schedule``
    holds the scheduling options (``tessera.schedule``, pipeline options included) and
    ``numerics`` the numerics mode (``tessera.numerics``) in force when it was traced;
    ``remat`` is what a backward keeps of checkpointed blocks (the ``autodiff`` stage's,
    a training step's ``remat=``), ``precision`` a training step's precision policy and
    loss scaling (f32, unscaled elsewhere), ``autodiff`` what a gradient program
    differentiates (None: the program has no ``autodiff`` stage).
    """

    mesh: Mesh | None = None
    kernels: str = "triton"
    schedule: ScheduleOptions = _DEFAULT_SCHEDULE
    numerics: str = "fast"
    remat: RematPolicy = _DEFAULT_REMAT
    precision: Precision = _DEFAULT_PRECISION
    autodiff: Autodiff | None = None

    def __post_init__(self) -> None:
        if self.kernels not in KERNEL_BACKENDS:
            raise TesseraError(f"kernels must be one of {KERNEL_BACKENDS}, found {self.kernels!r}")
        numerics_policy.check(self.numerics)
        if self.schedule.topology:
            self.machine()  # a bad or conflicting topology fails here

    def machine(self) -> Topology:
        """The machine the cost model prices: the schedule option ``topology`` or the mesh's
        ``topology=`` (naming two different machines is an error), else enough DGX H100s
        for the mesh (:func:`~tessera.ir.mesh.default_machine`)."""
        named = self.schedule.topology
        mesh_machine = self.mesh.topology if self.mesh is not None else None
        if not named:
            return mesh_machine or default_machine(self.mesh.size if self.mesh else 1)
        machine = load_topology(named)
        if mesh_machine is not None and machine != mesh_machine:
            raise TesseraError(
                f"schedule option topology={named!r} names another machine than the mesh's "
                f"topology {mesh_machine.name!r}; set one of them (the mesh's is the usual)"
            )
        return machine

    def replace(self, **changes: Any) -> CompileConfig:
        return replace(self, **changes)


@dataclass(frozen=True)
class PassSpec:
    """One pass of a stage: its flag and options, printed as ``tessera-opt -p`` reads it."""

    flag: str
    options: tuple[tuple[str, Any], ...] = ()

    @staticmethod
    def of(flag: str, options: Mapping[str, Any] | None = None) -> PassSpec:
        return PassSpec(flag, tuple(sorted((options or {}).items())))

    def __str__(self) -> str:
        if not self.options:
            return self.flag
        return f"{self.flag}{{{' '.join(f'{k}={_option_text(v)}' for k, v in self.options)}}}"

    def instantiate(self, passes: Mapping[str, Callable[[], type[ModulePass]]]) -> ModulePass:
        return passes[self.flag]()(**dict(self.options))


def _option_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, tuple):
        return ",".join(map(_option_text, value))
    return str(value)


def stage_passes(stage: str, config: CompileConfig) -> list[PassSpec]:
    """The passes ``stage`` runs on the previous stage's module."""
    if stage not in STAGES:
        raise TesseraError(f"unknown stage {stage!r}; stages: {', '.join(STAGES)}")
    if stage == "traced" or (stage == "autodiff" and config.autodiff is None):
        return []
    if stage == "autodiff":
        return [_autodiff_pass(config)]
    if stage == "schedule":
        return _schedule_passes(config)
    if stage == "partitioned":
        return [_partition_pass(config.schedule), PassSpec.of("unzigzag-attention")]
    if stage == "sharded" and config.schedule.topology:  # the sharding clock's machine
        topology = {"topology": config.schedule.topology}
        return [PassSpec.of(flag, topology) for flag in _FIXED_STAGE_PASSES[stage]]
    return [PassSpec.of(flag) for flag in _FIXED_STAGE_PASSES[stage]]


def program_stages(config: CompileConfig) -> tuple[str, ...]:
    """The stages a program compiled with ``config`` has (``autodiff`` only for gradient
    programs)."""
    return tuple(s for s in STAGES if s != "autodiff" or config.autodiff is not None)


def _autodiff_pass(config: CompileConfig) -> PassSpec:
    """``autodiff`` rewriting the traced forward in place, as ``config.autodiff`` says."""
    assert config.autodiff is not None
    gradient, remat = config.autodiff, config.remat
    options: dict[str, Any] = {
        "function": gradient.function,
        "in_place": True,
        "wrt": gradient.wrt,
        "remat": remat.save,
    }
    if remat.every != 1:
        options["remat_every"] = remat.every
    if gradient.results:
        options["results"] = gradient.results
    return PassSpec.of("autodiff", options)


def _partition_pass(options: ScheduleOptions) -> PassSpec:
    """``shard-partition``, with the context-parallel method and the cost model's machine
    where they are not the defaults."""
    defaults = ScheduleOptions()
    changed = {
        option: value
        for option, value, default in (
            ("context", options.context_parallel, defaults.context_parallel),
            ("topology", options.topology, defaults.topology),
        )
        if value != default
    }
    return PassSpec.of("shard-partition", changed)


def _schedule_passes(config: CompileConfig) -> list[PassSpec]:
    """The passes that lower a partitioned program to its schedule, as the schedule
    options ask."""
    options = config.schedule
    passes: list[PassSpec] = []
    if options.overlap and options.collective_matmul:
        chunking: dict[str, Any] = {"chunks": options.collective_matmul_chunks}
        if options.topology:  # else the passes read the graph.mesh symbol's
            chunking["topology"] = options.topology
        if config.numerics != "fast":  # the simulation prices deterministic reductions
            chunking["numerics"] = config.numerics
        passes.append(PassSpec.of("collective-matmul", chunking))
    passes.append(PassSpec.of("hoist-all-gathers"))
    if options.bucket_bytes:
        passes.append(PassSpec.of("bucket-gradients", {"bucket_bytes": options.bucket_bytes}))
    passes.append(PassSpec.of("lower-graph-to-schedule"))
    if options.overlap:
        passes.append(PassSpec.of("overlap-comm"))
    if options.collective_algorithms:
        topology = {"topology": options.topology} if options.topology else {}
        passes.append(PassSpec.of("choose-collective-algorithms", topology))
    passes.append(PassSpec.of("plan-memory"))
    return passes


def pipeline_string(config: CompileConfig, stages: Sequence[str] = STAGES[1:]) -> str:
    """The passes of ``stages`` (by default all of them) as a ``tessera-opt -p`` string."""
    return ",".join(str(p) for stage in stages for p in stage_passes(stage, config))


def run_stage(stage: str, previous: ModuleOp, config: CompileConfig) -> ModuleOp:
    """``stage``'s passes applied to a copy of ``previous`` (the module of the stage
    before it); the result is verified."""
    with collection_paused():
        module = previous.clone()
        passes = available_passes()
        for spec in stage_passes(stage, config):
            spec.instantiate(passes).apply(Context(), module)
        verify_module(module)
    return module


_paused = 0  # how many compiles (threads, nested calls) are in collection_paused
_resume = True  # whether the collector was enabled when the first of them began
_paused_lock = threading.Lock()


@contextmanager
def collection_paused() -> Iterator[None]:
    """Python's cyclic garbage collector paused while compiling (tracing, a stage): a
    compile allocates many IR objects and frees few, and each full collection walks every
    live object (the modules of the stages before, kept), so collections during a compile
    cost time that grows with the program's size squared. The collector runs again after,
    on whatever the compile left behind."""
    global _paused, _resume
    with _paused_lock:
        if _paused == 0:
            _resume = gc.isenabled()
            gc.disable()
        _paused += 1
    try:
        yield
    finally:
        with _paused_lock:
            _paused -= 1
            if _paused == 0 and _resume:
                gc.enable()


def available_passes() -> dict[str, Callable[[], type[ModulePass]]]:
    """Every pass by flag (:func:`tessera.passes.get_all_passes`), as the driver and
    ``tessera-opt`` run them: ``collective-matmul`` times its candidates with
    :func:`schedule_trial`."""
    passes = get_all_passes()
    passes["collective-matmul"] = _collective_matmul
    return passes


@functools.cache
def _collective_matmul() -> type[ModulePass]:
    from tessera.passes.collective_matmul import CollectiveMatmulPass

    return CollectiveMatmulPass.using(schedule_trial)


def schedule_trial(
    module: ModuleOp, function: str, mesh: Mesh, topology: Topology, numerics: str
) -> float:
    """The step time of ``@function`` of a partitioned ``module`` lowered as the
    ``schedule`` stage lowers it (``lower-graph-to-schedule``, ``overlap-comm``; in place:
    pass a copy) and simulated on ``topology`` in ``numerics`` mode: how
    ``collective-matmul`` prices a candidate chunking."""
    from tessera.perf.simulate import simulate

    passes = get_all_passes()
    for flag in _TRIAL_PASSES:
        PassSpec.of(flag).instantiate(passes).apply(Context(), module)
    return simulate(module, function, mesh, topology, numerics=numerics).step_time_s


def previous_stage(stage: str) -> str:
    index = STAGES.index(stage)
    if index == 0:
        raise TesseraError("the traced module has no previous stage")
    return STAGES[index - 1]


__all__ = [
    "KERNEL_BACKENDS",
    "STAGES",
    "Autodiff",
    "CompileConfig",
    "PassSpec",
    "available_passes",
    "collection_paused",
    "pipeline_string",
    "previous_stage",
    "program_stages",
    "run_stage",
    "schedule_trial",
    "stage_passes",
]
