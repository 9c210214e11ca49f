"""Per-rank peak memory of a pipelined step, from its stage programs and its schedule.

Between a stage's programs the runtime (:mod:`tessera.pipeline.runtime`) holds values
that no single program's ``plan-memory`` sees: each microbatch's forward outputs (what
the stage sends on and the *residuals* its backward reads) until that microbatch's
backward, the gradients to send back until they are sent, the backward-input half's
outputs until the weight half (zero-bubble), the received activations and gradients
until the backward, and the parameter gradients summed over microbatches until the
update. :func:`pipeline_memory` replays each pipeline rank's action list, in the order
the schedule gives it, with those values' per-rank bytes (from the compiled programs'
result types and layouts) and takes the worst point over the rank's program runs of

    the running program's plan-memory peak (its arguments, results, intermediates)
    + everything held that the program does not read (residuals, received values,
      accumulated gradients, the rank's parameters and optimizer state).

So 1F1B keeps at most ``pp - stage`` microbatches' residuals on a rank and GPipe all of
them; the replay reads that off the actual action lists rather than a closed form.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from math import prod
from typing import TYPE_CHECKING

from xdsl.dialects import func

from tessera.ir import pipeline_actions as A
from tessera.ir.abstract import AbstractTensor
from tessera.ir.mesh import Mesh
from tessera.ir.sharding import Sharding
from tessera.program import MemoryStats, ModelStateMemory

if TYPE_CHECKING:
    from tessera.pipeline.programs import Program, StagePrograms
    from tessera.program import Lowered


@dataclass(frozen=True)
class RankMemory:
    """One pipeline rank's memory over one step (bytes per mesh rank at that pp
    coordinate)."""

    pipeline_rank: int
    peak_bytes: int  # the worst point: a program's plan-memory peak + what is held
    worst: str  # the action (or "update") at the worst point
    saved_bytes: int  # most bytes of kept program outputs (the runtime's state.saved)
    held_bytes: int  # most bytes held between programs (saved, received, gradients)
    saved_at_worst: int  # kept program outputs at the worst point
    residuals_per_microbatch: dict[int, int]  # stage -> bytes its forward keeps per mb
    program_peaks: dict[str, int]  # program -> its plan-memory peak
    model_states: ModelStateMemory


@dataclass(frozen=True)
class PipelineMemoryStats(MemoryStats):
    """Per-rank memory of a pipelined step: ``peak_bytes`` and ``model_states`` are the
    worst pipeline rank's; ``ranks`` has every pipeline rank's."""

    ranks: tuple[RankMemory, ...] = field(default=())


def _results(lowered: Lowered) -> list[tuple[AbstractTensor, bool]]:
    """Each result's type, and whether an earlier result is the same value (the loss
    returned as a metric too: one tensor)."""
    function = next(
        o
        for o in lowered.module.ops
        if isinstance(o, func.FuncOp) and o.sym_name.data == lowered.name
    )
    operands = list(function.body.block.last_op.operands)  # type: ignore[union-attr]
    return [(AbstractTensor.from_xdsl(v.type), v in operands[:i]) for i, v in enumerate(operands)]


def _bytes(mesh: Mesh, aval: AbstractTensor, layout: Sharding) -> int:
    return prod(layout.local_shape(mesh, aval.shape)) * aval.dtype.itemsize


def output_bytes(program: Program | Lowered, mesh: Mesh) -> list[int]:
    """Per-rank bytes of each result of a compiled program (0 for a result repeating an
    earlier one)."""
    lowered = getattr(program, "lowered", program)
    layouts = lowered.layouts()[1]
    return [
        0 if repeated else _bytes(mesh, a, s)
        for (a, repeated), s in zip(_results(lowered), layouts, strict=True)
    ]


def argument_bytes(program: Program | Lowered, mesh: Mesh) -> list[int]:
    """Per-rank bytes of each argument of a compiled program."""
    lowered = getattr(program, "lowered", program)
    layouts = lowered.layouts()[0]
    avals = [a for a in lowered.signature.leaves if isinstance(a, AbstractTensor)]
    return [_bytes(mesh, a, s) for a, s in zip(avals, layouts, strict=True)]


class _Replay:
    """One pipeline rank's held values, action by action (mirrors the runtime)."""

    def __init__(
        self, stages: Sequence[StagePrograms], mesh: Mesh, params: dict[int, int],
        opt_state: int,
    ):  # fmt: skip
        self.stages, self.mesh = stages, mesh
        self.values: dict[tuple, int] = {}  # value -> bytes
        self.entries: dict[tuple, list[tuple]] = {}  # state.saved key -> its values
        self.inbox: dict[tuple, int] = {}  # (kind, mb, stage) -> bytes
        self.grads: dict[int, int] = {}  # param -> accumulated gradient bytes
        self.params, self.opt_state = params, opt_state  # held for the whole step

    def saved(self) -> int:
        live = {v for values in self.entries.values() for v in values}
        return sum(self.values[v] for v in live)

    def held(self) -> int:
        return self.saved() + sum(self.inbox.values()) + sum(self.grads.values())

    def not_read(self, program: Program, mb: int, stage: int) -> int:
        """Bytes held that ``program`` does not take as arguments."""
        read_values = {
            (mb, stage, source[1], source[2]) for source in program.inputs if source[0] == "saved"
        }
        read_inbox = set()
        read_params = set()
        for source in program.inputs:
            if source[0] == "received":
                read_inbox.add((A.RECV_ACTIVATION, mb, stage))
            elif source[0] == "seed":
                read_inbox.add((A.RECV_GRAD, mb, stage))
            elif source[0] == "param":
                read_params.add(source[1])
        live = {v for values in self.entries.values() for v in values} - read_values
        return (
            sum(self.values[v] for v in live)
            + sum(b for k, b in self.inbox.items() if k not in read_inbox)
            + sum(self.grads.values())
            + sum(b for p, b in self.params.items() if p not in read_params)
            + self.opt_state
        )

    def keep(self, key: tuple, program: str, count: int, mb: int, stage: int) -> None:
        self.entries[key] = [(mb, stage, program, i) for i in range(count)]

    def step(self, action: A.Action, program: Program | None) -> None:
        """The held values after ``action`` (``program``: the one a compute runs)."""
        mb, s = action.microbatch, action.stage
        if action.kind in (A.RECV_ACTIVATION, A.RECV_GRAD):
            stage = self.stages[s]  # type: ignore[index]
            if action.kind == A.RECV_ACTIVATION:
                values, layouts = stage.received, stage.received_layouts
            else:
                values = [stage.sent[i] for i in stage.sent_grads]
                layouts = [stage.sent_layouts[i] for i in stage.sent_grads]
            self.inbox[(action.kind, mb, s)] = sum(
                _bytes(self.mesh, v, lay) for v, lay in zip(values, layouts, strict=True)
            )
            return
        if action.kind == A.SEND_GRAD:
            self.entries.pop((mb, s, "grads_back"), None)
            return
        if program is None:
            return
        outputs = output_bytes(program, self.mesh)
        part = {
            A.FORWARD: "forward",
            A.BACKWARD: "backward",
            A.BACKWARD_INPUT: "backward_input",
            A.BACKWARD_WEIGHT: "backward_weight",
        }[action.kind]
        for i, b in enumerate(outputs):
            self.values[(mb, s, part, i)] = b
        if action.kind == A.FORWARD:
            self.keep((mb, s, "forward"), part, len(outputs), mb, s)
            return
        stage = self.stages[s]  # type: ignore[index]
        grads_back = len(stage.received_grads)
        if action.kind != A.BACKWARD_WEIGHT and grads_back:
            self.keep((mb, s, "grads_back"), part, grads_back, mb, s)
        if action.kind == A.BACKWARD_INPUT:
            self.keep((mb, s, "backward_input"), part, len(outputs), mb, s)
            return
        first = grads_back if action.kind == A.BACKWARD else 0
        for position, param in enumerate(stage.params):
            self.grads.setdefault(param, outputs[first + position])
        for key in [k for k in self.entries if k[0] == mb and k[1] == s]:
            if key[2] != "grads_back":
                del self.entries[key]
        self.inbox.pop((A.RECV_ACTIVATION, mb, s), None)
        self.inbox.pop((A.RECV_GRAD, mb, s), None)


def _program(stage: StagePrograms, kind: str) -> Program | None:
    return {
        A.FORWARD: stage.forward,
        A.BACKWARD: stage.backward,
        A.BACKWARD_INPUT: stage.backward_input,
        A.BACKWARD_WEIGHT: stage.backward_weight,
    }[kind]


def pipeline_memory(
    stages: Sequence[StagePrograms],
    lists: Sequence[Sequence[A.Action]],
    updates: Sequence[Lowered],
    update_params: Sequence[Sequence[int]],
    param_layouts: Sequence[Sharding],
    param_avals: Sequence[AbstractTensor],
    mesh: Mesh,
    reductions: Sequence[Lowered | None] = (),
) -> PipelineMemoryStats:
    """Every pipeline rank's peak over its action list (see the module docstring);
    ``reductions``: per pipeline rank, the program reducing its gradients before the
    update when the update needs global statistics (clipping, fp16 loss scaling)."""
    ranks = []
    for rank, actions in enumerate(lists):
        owned = list(update_params[rank])
        params = {p: _bytes(mesh, param_avals[p], param_layouts[p]) for p in owned}
        grads = 0
        opt_state = 0
        reduction = reductions[rank] if reductions else None
        if owned:
            args = argument_bytes(updates[rank], mesh)
            body = args[: len(args) - 2] if reduction is not None else args  # less the statistics
            grads = sum(body[len(body) - len(owned) :])
            opt_state = sum(body) - sum(params.values()) - grads
            if reduction is not None:  # the gradients summed over microbatches it reads
                grads = sum(argument_bytes(reduction, mesh)[: len(owned)])
        replay = _Replay(stages, mesh, params, opt_state)
        peaks: dict[str, int] = {}
        best = (-1, "", 0)
        saved_most = held_most = 0
        for action in actions:
            program = None
            if action.kind in A.COMPUTE_KINDS:
                program = _program(stages[action.stage], action.kind)  # type: ignore[index]
                assert program is not None, f"{action} has no compiled program"
                if program.name not in peaks:
                    peaks[program.name] = program.lowered.memory().peak_bytes
                point = peaks[program.name] + replay.not_read(
                    program,
                    action.microbatch,
                    action.stage,  # type: ignore[arg-type]
                )
                if point > best[0]:
                    best = (point, str(action), replay.saved())
            replay.step(action, program)
            saved_most = max(saved_most, replay.saved())
            held_most = max(held_most, replay.held())
        if owned:
            leftover = replay.saved() + sum(replay.inbox.values())
            for name, program in (("reduction", reduction), ("update", updates[rank])):
                if program is None:
                    continue
                peaks[program.name] = program.memory().peak_bytes
                point = peaks[program.name] + leftover
                if point > best[0]:
                    best = (point, name, replay.saved())
        ranks.append(
            RankMemory(
                pipeline_rank=rank,
                peak_bytes=best[0],
                worst=best[1],
                saved_bytes=saved_most,
                held_bytes=held_most,
                saved_at_worst=best[2],
                residuals_per_microbatch={
                    s.index: sum(output_bytes(s.forward, mesh))
                    for s in stages
                    if A.rank_of(s.index, len(lists)) == rank
                },
                program_peaks=peaks,
                model_states=ModelStateMemory(
                    params=sum(params.values()), grads=grads, optimizer_state=opt_state
                ),
            )
        )
    worst = max(ranks, key=lambda r: r.peak_bytes)
    return PipelineMemoryStats(
        peak_bytes=worst.peak_bytes, model_states=worst.model_states, ranks=tuple(ranks)
    )
