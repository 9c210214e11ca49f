"""The compile driver: one declared list of stages, each a list of pass flags.

Every front-end (``ts.jit``, ``ts.grad``, ``graph.training_step``, a pipeline's stage
programs) traces a Graph IR module and hands it, with one immutable
:class:`CompileConfig`, to :func:`run_stage`. The passes each stage runs are declared
here and nowhere else, so the whole pipeline of a program prints as one ``tessera-opt
-p`` string (:func:`pipeline_string`) and any stage can be replayed by hand::

    tessera-opt graph.mlir -p "$(python -c 'print(lowered.pipeline("sharded"))')"

Stages, in order (``traced`` is the module as the tracer built it):

- ``graph``: clean-up (``canonicalize``, ``cse``, ``dce``), so a value nobody returns —
  the loss ``ts.grad`` drops, say — never reaches sharding;
- ``sharded``: ``shard-propagate``, ``insert-collectives``;
- ``partitioned``: ``shard-partition`` (per-rank shapes), ``unzigzag-attention``;
- ``schedule``: the schedule options' passes, from ``lower-graph-to-schedule`` to
  ``plan-memory`` (see :meth:`tessera.schedule.ScheduleOptions.passes`);
- ``tile``: ``lower-schedule-to-tile``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass

from tessera.errors import TesseraError
from tessera.ir.mesh import Mesh
from tessera.ir.verifier import verify_module
from tessera.passes import get_all_passes
from tessera.schedule import ScheduleOptions

STAGES = ("traced", "graph", "sharded", "partitioned", "schedule", "tile")
KERNEL_BACKENDS = ("triton", "reference")

_FIXED_STAGE_PASSES: dict[str, tuple[str, ...]] = {
    "graph": ("canonicalize", "cse", "dce"),
    "sharded": ("shard-propagate", "insert-collectives"),
    "partitioned": ("shard-partition", "unzigzag-attention"),
    "tile": ("lower-schedule-to-tile",),
}


@dataclass(frozen=True)
class CompileConfig:
    """Everything a program is compiled with, handed on unchanged by every front-end.

    ``mesh`` is None for a single-device program; ``kernels`` is ``"triton"`` (generated
    kernels) or ``"reference"`` (the reference executor, the test oracle); ``schedule``
    holds the scheduling options (``tessera.schedule``) current when it was traced.
    """

    mesh: Mesh | None = None
    kernels: str = "triton"
    schedule: ScheduleOptions = field(default_factory=ScheduleOptions)

    def __post_init__(self) -> None:
        if self.kernels not in KERNEL_BACKENDS:
            raise TesseraError(f"kernels must be one of {KERNEL_BACKENDS}, found {self.kernels!r}")

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
    return str(value)


def stage_passes(stage: str, config: CompileConfig) -> list[PassSpec]:
    """The passes ``stage`` runs on the previous stage's module."""
    if stage not in STAGES:
        raise TesseraError(f"unknown stage {stage!r}; stages: {', '.join(STAGES)}")
    if stage == "traced":
        return []
    if stage == "schedule":
        return _schedule_passes(config.schedule)
    if stage == "partitioned":
        return [_partition_pass(config.schedule), PassSpec.of("unzigzag-attention")]
    return [PassSpec.of(flag) for flag in _FIXED_STAGE_PASSES[stage]]


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


def _schedule_passes(options: ScheduleOptions) -> list[PassSpec]:
    """The passes that lower a partitioned program to its schedule, as ``options`` ask."""
    passes: list[PassSpec] = []
    if options.overlap and options.collective_matmul:
        chunking = {"chunks": options.collective_matmul_chunks, "topology": options.topology}
        passes.append(PassSpec.of("collective-matmul", chunking))
    if options.bucket_bytes:
        passes.append(PassSpec.of("bucket-gradients", {"bucket_bytes": options.bucket_bytes}))
    passes.append(PassSpec.of("lower-graph-to-schedule"))
    if options.overlap:
        passes.append(PassSpec.of("overlap-comm"))
    if options.collective_algorithms:
        passes.append(PassSpec.of("choose-collective-algorithms", {"topology": options.topology}))
    passes.append(PassSpec.of("plan-memory"))
    return passes


def pipeline_string(config: CompileConfig, stages: Sequence[str] = STAGES[1:]) -> str:
    """The passes of ``stages`` (by default all of them) as a ``tessera-opt -p`` string."""
    return ",".join(str(p) for stage in stages for p in stage_passes(stage, config))


def run_stage(stage: str, previous: ModuleOp, config: CompileConfig) -> ModuleOp:
    """``stage``'s passes applied to a copy of ``previous`` (the module of the stage
    before it); the result is verified."""
    module = previous.clone()
    passes = get_all_passes()
    for spec in stage_passes(stage, config):
        spec.instantiate(passes).apply(Context(), module)
    verify_module(module)
    return module


def previous_stage(stage: str) -> str:
    index = STAGES.index(stage)
    if index == 0:
        raise TesseraError("the traced module has no previous stage")
    return STAGES[index - 1]


__all__ = [
    "KERNEL_BACKENDS",
    "STAGES",
    "CompileConfig",
    "PassSpec",
    "pipeline_string",
    "previous_stage",
    "run_stage",
    "stage_passes",
]
