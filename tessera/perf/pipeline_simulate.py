"""Simulates pipeline schedules: per-rank action lists run literally, in order.

Each rank executes its list (``tessera.ir.pipeline_actions``) one action after another:

- a computation starts when the rank is free and takes the time of its stage
  (``forward_s``, ``backward_input_s``, ``backward_weight_s``; a full ``backward`` takes
  ``backward_input_s + backward_weight_s``);
- a send costs the sender nothing; its message arrives ``p2p_s`` later;
- a receive waits for its message: it completes at ``max(rank free, arrival)``.

A receive whose message is never sent is a deadlock (:class:`TesseraError` naming every
stuck rank's next action). Activations are counted per rank as (microbatch, stage) pairs
held: +1 at a ``forward``, −1 at the last backward piece of that pair (``backward``, or
``backward_weight`` when the backward is split: the weight gradient still needs the
stage's inputs). :meth:`PipelineSimulation.save_trace` writes a Chrome-trace / Perfetto
timeline (one process per rank; threads ``compute`` and ``p2p``, a transfer shown on the
sender from send to arrival). A schedule simulated with many stage times is compiled once
(:class:`PipelineProgram`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, NoReturn

from tessera.errors import TesseraError
from tessera.ir.pipeline_actions import (
    COMPUTE_KINDS,
    RECV_ACTIVATION,
    RECV_GRAD,
    SEND_ACTIVATION,
    SEND_GRAD,
    Action,
    Step,
    rank_of,
)
from tessera.perf.trace import COMPUTE, Event, chrome_trace, save_json

P2P = "p2p"
StageTimes = float | Sequence[float]

# action kind -> code: the computations 0-3 (their index in COMPUTE_KINDS), then the
# transfers 4-7, a receive's code odd and its send's one less
_TRANSFERS = (SEND_ACTIVATION, RECV_ACTIVATION, SEND_GRAD, RECV_GRAD)
_CODES = {kind: code for code, kind in enumerate(COMPUTE_KINDS + _TRANSFERS)}


@dataclass(frozen=True)
class PipelineSimulation:
    """The simulated timeline of one pipeline schedule (times in seconds)."""

    makespan_s: float
    busy_s: tuple[float, ...]  # compute time per rank
    peak_activations: tuple[int, ...]  # most (microbatch, stage) activations held, per rank
    events: tuple[Event, ...]

    @property
    def ranks(self) -> int:
        return len(self.busy_s)

    @property
    def bubble_fraction(self) -> float:
        """1 − Σ busy / (ranks · makespan): the idle share of all ranks' time."""
        if self.makespan_s == 0:
            return 0.0
        return 1 - sum(self.busy_s) / (self.ranks * self.makespan_s)

    @property
    def bubble_fractions(self) -> tuple[float, ...]:
        """1 − busy / makespan, per rank."""
        if self.makespan_s == 0:
            return tuple(0.0 for _ in self.busy_s)
        return tuple(1 - b / self.makespan_s for b in self.busy_s)

    def rank_events(self, rank: int) -> list[Event]:
        return [e for e in self.events if e.rank == rank]

    def trace(self) -> dict[str, Any]:
        """The timeline as a Chrome-trace object (``traceEvents``, times in µs)."""
        return chrome_trace(
            self.events,
            {
                "makespan_us": self.makespan_s * 1e6,
                "bubble_fraction": self.bubble_fraction,
                "peak_activations": list(self.peak_activations),
            },
        )

    def save_trace(self, path: str | os.PathLike[str]) -> None:
        """Writes :meth:`trace` as JSON (open it in https://ui.perfetto.dev or chrome://tracing)."""
        save_json(self.trace(), path)

    def summary(self) -> str:
        return (
            f"{self.ranks} ranks: makespan {self.makespan_s:.6g} s, bubble "
            f"{self.bubble_fraction:.4f}, peak activations {list(self.peak_activations)}"
        )


@dataclass(frozen=True)
class PipelineProgram:
    """Per-rank action lists compiled once for :func:`simulate_pipeline` (the planner
    simulates one schedule with many stage times).

    Each rank's list is cut at its receives into segments ``(slot, body)``: the message
    slot the segment first waits for (``-1``: none), then its computations (``c >= 0``,
    index ``4 · stage + k`` of ``COMPUTE_KINDS[k]`` into the time table) and sends
    (``~slot``). The ``i``-th send of a message fills the slot of its ``i``-th receive. The
    activation peaks depend on the order alone, so they are counted here."""

    steps: tuple[tuple[Step, ...], ...]  # per rank: (kind, microbatch, stage, peer)
    stages: int
    segments: tuple[tuple[tuple[int, tuple[int, ...]], ...], ...]
    starts: tuple[tuple[int, ...], ...]  # per rank and segment: the index of its first step
    messages: int  # message slots
    peak_activations: tuple[int, ...]

    @property
    def ranks(self) -> int:
        return len(self.steps)

    @classmethod
    def of(cls, actions: Sequence[Sequence[Action]]) -> PipelineProgram:
        """The program of ``actions[r]``, what rank ``r`` runs."""
        return cls.from_steps(
            [[(a.kind, a.microbatch, a.stage, a.peer) for a in rank] for rank in actions]
        )

    @classmethod
    def from_steps(cls, steps: Sequence[Sequence[Step]]) -> PipelineProgram:
        """The program of ``steps[r]``, what rank ``r`` runs (a :class:`TesseraError` for
        an action on the wrong rank or a malformed step)."""
        ranks = len(steps)
        if ranks == 0:
            raise TesseraError("simulate_pipeline: no ranks (an empty list of action lists)")
        for numbered in (False, True):
            slots: dict[tuple[int, ...], int] = {}
            sent: list[int] = []  # the slot of every send
            compiled = [
                _compile_rank(rank, ranks, rank_steps, slots, sent, numbered)
                for rank, rank_steps in enumerate(steps)
            ]
            received = [slot for rank in compiled for slot, _ in rank[0] if slot >= 0]
            if len(set(sent)) == len(sent) and len(set(received)) == len(received):
                break  # else a message is sent (received) twice: number its occurrences
        stages = 1 + max((max(map(itemgetter(2), r), default=0) for r in steps), default=0)
        return cls(
            steps=tuple(tuple(rank_steps) for rank_steps in steps),
            stages=stages,
            segments=tuple(rank[0] for rank in compiled),
            starts=tuple(rank[1] for rank in compiled),
            messages=len(slots),
            peak_activations=tuple(rank[2] for rank in compiled),
        )


def _compile_rank(
    rank: int,
    ranks: int,
    steps: Sequence[Step],
    slots: dict[tuple[int, ...], int],
    sent: list[int],
    numbered: bool,
) -> tuple[tuple[tuple[int, tuple[int, ...]], ...], tuple[int, ...], int]:
    """Rank ``rank``'s segments, the index of each one's first step, and its activation
    peak. A message is (code of its receive, microbatch, from stage, to stage), with the
    occurrence when ``numbered``; ``slots`` numbers the messages, ``sent`` gets the slot of
    every send."""
    segments, starts = [], []
    slot, body, first = -1, [], 0
    held: dict[tuple[int, int], int] = {}  # (microbatch, stage) -> forwards held
    live = peak = 0
    seen: dict[tuple[int, ...], int] = {}  # message -> occurrences so far (numbered)
    codes, number = _CODES, slots.setdefault
    for position, (kind, mb, stage, peer) in enumerate(steps):
        code = codes.get(kind, -1)
        if stage % ranks != rank:
            _reject(rank, ranks, (kind, mb, stage, peer))
        if code < 4:  # a computation: 4 · stage + its index in COMPUTE_KINDS
            if code < 0 or peer is not None:
                _reject(rank, ranks, (kind, mb, stage, peer))
            body.append(4 * stage + code)
            if code == 0:
                held[mb, stage] = held.get((mb, stage), 0) + 1
                live += 1
                if live > peak:
                    peak = live
            elif code != 2 and held.get((mb, stage), 0) > 0:  # frees its activation
                held[mb, stage] -= 1
                live -= 1
        elif peer is None:
            _reject(rank, ranks, (kind, mb, stage, peer))
        elif code & 1:  # a receive: starts a segment
            message: tuple[int, ...] = (code, mb, peer, stage)
            if numbered:
                seen[message] = n = seen.get(message, -1) + 1
                message = (*message, n)
            if slot >= 0 or body:
                segments.append((slot, tuple(body)))
                starts.append(first)
            slot, body, first = number(message, len(slots)), [], position
        else:  # a send
            message = (code + 1, mb, stage, peer)
            if numbered:
                key = (-1, *message)
                seen[key] = n = seen.get(key, -1) + 1
                message = (*message, n)
            index = number(message, len(slots))
            sent.append(index)
            body.append(~index)
    if slot >= 0 or body:
        segments.append((slot, tuple(body)))
        starts.append(first)
    return tuple(segments), tuple(starts), peak


def _reject(rank: int, ranks: int, step: Step) -> NoReturn:
    """Raises the TesseraError for a step on the wrong rank or a malformed one."""
    if step[2] % ranks == rank:
        raise TesseraError(f"simulate_pipeline: malformed pipeline action {step}")
    raise TesseraError(
        f"simulate_pipeline: rank {rank} holds {Action(*step)}, but stage {step[2]} runs on "
        f"rank {rank_of(step[2], ranks)}"
    )


def simulate_pipeline(
    actions: Sequence[Sequence[Action]] | PipelineProgram,
    forward_s: StageTimes,
    backward_input_s: StageTimes,
    backward_weight_s: StageTimes,
    p2p_s: float = 0.0,
    record_events: bool = True,
) -> PipelineSimulation:
    """Runs ``actions`` (one list per rank, or their :class:`PipelineProgram`) with the
    given per-stage times (a float for every stage, or a sequence indexed by stage) and
    point-to-point latency ``p2p_s``; ``record_events=False`` keeps only the totals (the
    planner's many simulations).

    The ranks run in sweeps: in each, rank 0, 1, … in turn runs until it waits for a
    message not yet sent; the events are recorded in that order."""
    program = actions if isinstance(actions, PipelineProgram) else PipelineProgram.of(actions)
    if p2p_s < 0:
        raise TesseraError(f"simulate_pipeline: p2p_s must be >= 0, got {p2p_s}")
    stages = program.stages
    forward = _per_stage("forward_s", forward_s, stages)
    backward_input = _per_stage("backward_input_s", backward_input_s, stages)
    backward_weight = _per_stage("backward_weight_s", backward_weight_s, stages)
    durations: list[float] = []  # index 4 · stage + COMPUTE_KINDS.index(kind)
    for f, b, w in zip(forward, backward_input, backward_weight, strict=False):
        durations += (f, b + w, b, w)

    ranks = program.ranks
    clock = [0.0] * ranks
    busy = [0.0] * ranks
    position = [0] * ranks  # segments done, per rank
    arrival: list[float | None] = [None] * program.messages
    events: list[Event] = []
    progress = True
    while progress:
        progress = False
        for rank, segments in enumerate(program.segments):
            done, count = position[rank], len(segments)
            if done == count:
                continue
            t, spent = clock[rank], busy[rank]
            while done < count:
                slot, body = segments[done]
                if slot >= 0:
                    arrived = arrival[slot]
                    if arrived is None:
                        break  # blocked until the send happens
                    if arrived > t:  # max(t, arrived), the first on a tie
                        t = arrived
                if record_events:
                    _record(events, program, rank, done, t, body, durations, p2p_s)
                for op in body:
                    if op >= 0:
                        end = t + durations[op]
                        spent += end - t
                        t = end
                    else:
                        arrival[~op] = t + p2p_s
                done += 1
            if done != position[rank]:
                position[rank] = done
                clock[rank], busy[rank] = t, spent
                progress = True
    stuck = [r for r in range(ranks) if position[r] < len(program.segments[r])]
    if stuck:
        waits = "; ".join(
            f"rank {r} waits at {Action(*program.steps[r][program.starts[r][position[r]]])}"
            for r in stuck
        )
        raise TesseraError(f"deadlock: no rank can progress ({waits})")
    return PipelineSimulation(
        makespan_s=max(clock),
        busy_s=tuple(busy),
        peak_activations=program.peak_activations,
        events=tuple(events),
    )


def _per_stage(name: str, value: StageTimes, stages: int) -> list[float]:
    if isinstance(value, int | float):
        values = [float(value)] * stages
    else:
        values = [float(v) for v in value]
        if len(values) < stages:
            raise TesseraError(
                f"simulate_pipeline: {name} has {len(values)} times but the schedule has "
                f"{stages} stages"
            )
    if any(v < 0 for v in values):
        raise TesseraError(f"simulate_pipeline: {name} must be >= 0, got {values}")
    return values


def _record(
    events: list[Event], program: PipelineProgram, rank: int, segment: int, t: float,
    body: tuple[int, ...], durations: list[float], p2p_s: float,
) -> None:  # fmt: skip
    """Appends the events of ``body`` (the computations and sends of ``segment``), which
    starts at time ``t`` (the arithmetic of the simulation, repeated)."""
    steps = program.steps[rank]
    first = program.starts[rank][segment] + (program.segments[rank][segment][0] >= 0)
    for index, op in enumerate(body, first):
        kind, mb, stage, peer = steps[index]
        if op >= 0:
            end = t + durations[op]
            args = {"microbatch": mb, "stage": stage}
            events.append(Event(rank, COMPUTE, f"{kind} mb{mb} s{stage}", t, end, args))
            t = end
        else:
            name = f"{kind} mb{mb} s{stage}->s{peer}"
            args = {"microbatch": mb, "from": stage, "to": peer}
            events.append(Event(rank, P2P, name, t, t + p2p_s, args))
