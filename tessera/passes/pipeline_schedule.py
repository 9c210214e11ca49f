"""``pipeline-schedule``: the order in which each pipeline rank runs its stages' work.

For every function holding ``schedule.stage`` regions (all of one ``count`` S: the model's
pipeline stages), the pass builds the schedule ``kind`` of ``microbatches`` microbatches
over ``ranks = S / virtual`` pipeline ranks (stage ``s`` on rank ``s % ranks``) with
:func:`tessera.transforms.pipeline_schedules.pipeline_schedule`, and puts it, as a
``schedule.pipeline`` op (see :mod:`tessera.ir.schedule`), just before the function's
``func.return``. A ``schedule.pipeline`` already there is replaced, so running the pass
again with other options re-schedules::

    tessera-opt in.mlir -p 'pipeline-schedule{kind=interleaved microbatches=8 virtual=2}'

Kinds: ``gpipe`` (all forwards, then all backwards), ``1f1b`` (one forward, one backward
in the steady state), ``interleaved`` (1F1B over ``virtual`` stages per rank) and
``zb-h1`` (zero-bubble: backward split into ``backward_input`` and ``backward_weight``).
The op's verifier checks the schedule the generator returns.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass
from xdsl.utils.exceptions import VerifyException

from tessera.errors import TesseraError
from tessera.ir import schedule
from tessera.ir.located_error import LocatedPassFailure


@dataclass(frozen=True)
class PipelineSchedulePass(ModulePass):
    """Builds the schedule.pipeline of each function's stages: kind, over microbatches."""

    name = "pipeline-schedule"

    kind: str = "1f1b"
    microbatches: int = 1
    virtual: int = 1

    def __post_init__(self) -> None:
        from tessera.ir.pipeline_actions import SCHEDULE_KINDS

        if self.kind not in SCHEDULE_KINDS:
            raise ValueError(f"unknown kind {self.kind!r}; known: {', '.join(SCHEDULE_KINDS)}")
        for option in ("microbatches", "virtual"):
            if getattr(self, option) < 1:
                raise ValueError(f"{option} must be >= 1, found {getattr(self, option)}")

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for function in [o for o in op.walk() if isinstance(o, func.FuncOp)]:
            self._schedule(function)

    def _schedule(self, function: func.FuncOp) -> None:
        what = f"{self.name}: @{function.sym_name.data}"
        counts = sorted(
            {o.count.value.data for o in function.walk() if isinstance(o, schedule.StageOp)}
        )
        if not counts:
            return
        if len(counts) > 1:
            raise LocatedPassFailure(
                function,
                f"{what}: expected one stage count for all schedule.stage ops, found {counts}",
            )
        (stages,) = counts
        if stages % self.virtual:
            raise LocatedPassFailure(
                function,
                f"{what}: the {stages} stages do not divide into virtual = {self.virtual} "
                f"stages per rank",
            )
        ranks = stages // self.virtual
        from tessera.transforms.pipeline_schedules import pipeline_op, pipeline_schedule

        try:
            actions = pipeline_schedule(self.kind, ranks, self.microbatches, self.virtual)
        except TesseraError as error:
            raise LocatedPassFailure(function, f"{what}: {error}") from None
        pipeline = pipeline_op(self.kind, ranks, self.microbatches, self.virtual, actions)
        try:
            pipeline.verify()
        except VerifyException as error:  # a generator bug: say which schedule
            raise TesseraError(
                f"{what}: the {self.kind} schedule for {ranks} ranks, {self.microbatches} "
                f"microbatches and virtual = {self.virtual} is invalid: {error}"
            ) from None

        block = function.body.blocks.first
        terminator = block.last_op if block is not None else None
        if block is None or not isinstance(terminator, func.ReturnOp):
            raise LocatedPassFailure(
                function, f"{what}: expected the function body to end in func.return"
            )
        for old in [o for o in block.ops if isinstance(o, schedule.PipelineOp)]:
            block.erase_op(old)
        block.insert_op_before(pipeline, terminator)
