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
sender from send to arrival).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tessera.errors import TesseraError
from tessera.ir.pipeline_actions import (
    BACKWARD,
    BACKWARD_INPUT,
    BACKWARD_WEIGHT,
    COMPUTE_KINDS,
    FORWARD,
    RECV_ACTIVATION,
    RECV_GRAD,
    SEND_ACTIVATION,
    SEND_GRAD,
    Action,
    rank_of,
)
from tessera.perf.trace import COMPUTE, Event, chrome_trace, save_json

P2P = "p2p"
StageTimes = float | Sequence[float]


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


def simulate_pipeline(
    actions: Sequence[Sequence[Action]],
    forward_s: StageTimes,
    backward_input_s: StageTimes,
    backward_weight_s: StageTimes,
    p2p_s: float = 0.0,
    record_events: bool = True,
) -> PipelineSimulation:
    """Runs ``actions`` (one list per rank) with the given per-stage times (a float for
    every stage, or a sequence indexed by stage) and point-to-point latency ``p2p_s``;
    ``record_events=False`` keeps only the totals (the planner's many simulations)."""
    ranks = len(actions)
    if ranks == 0:
        raise TesseraError("simulate_pipeline: no ranks (an empty list of action lists)")
    if p2p_s < 0:
        raise TesseraError(f"simulate_pipeline: p2p_s must be >= 0, got {p2p_s}")
    stages = 1 + max((a.stage for rank in actions for a in rank), default=0)
    times = {
        FORWARD: _per_stage("forward_s", forward_s, stages),
        BACKWARD_INPUT: _per_stage("backward_input_s", backward_input_s, stages),
        BACKWARD_WEIGHT: _per_stage("backward_weight_s", backward_weight_s, stages),
    }
    times[BACKWARD] = [
        b + w for b, w in zip(times[BACKWARD_INPUT], times[BACKWARD_WEIGHT], strict=True)
    ]
    for rank, rank_actions in enumerate(actions):
        for action in rank_actions:
            if rank_of(action.stage, ranks) != rank:
                raise TesseraError(
                    f"simulate_pipeline: rank {rank} holds {action}, but stage "
                    f"{action.stage} runs on rank {rank_of(action.stage, ranks)}"
                )

    clock = [0.0] * ranks
    position = [0] * ranks
    busy = [0.0] * ranks
    held = [Counter[tuple[int, int]]() for _ in range(ranks)]  # (mb, stage) -> forwards held
    live = [0] * ranks
    peak = [0] * ranks
    in_flight: dict[tuple[str, int, int, int], list[float]] = {}  # message -> arrival times
    events: list[Event] = []
    progress = True
    while progress:
        progress = False
        for rank in range(ranks):
            rank_actions = actions[rank]
            while position[rank] < len(rank_actions):
                action = rank_actions[position[rank]]
                if action.kind in COMPUTE_KINDS:
                    start = clock[rank]
                    clock[rank] = end = start + times[action.kind][action.stage]
                    busy[rank] += end - start
                    if record_events:
                        name = f"{action.kind} mb{action.microbatch} s{action.stage}"
                        args = {"microbatch": action.microbatch, "stage": action.stage}
                        events.append(Event(rank, COMPUTE, name, start, end, args))
                    live[rank] += _count_activation(held[rank], action)
                    peak[rank] = max(peak[rank], live[rank])
                elif action.kind in (SEND_ACTIVATION, SEND_GRAD):
                    message = _message(action)
                    in_flight.setdefault(message, []).append(clock[rank] + p2p_s)
                    if record_events:
                        name = f"{action.kind} mb{action.microbatch} s{action.stage}->s{action.peer}"
                        args = {"microbatch": action.microbatch, "from": action.stage,
                                "to": action.peer}  # fmt: skip
                        events.append(
                            Event(rank, P2P, name, clock[rank], clock[rank] + p2p_s, args)
                        )
                else:
                    arrivals = in_flight.get(_message(action))
                    if not arrivals:
                        break  # blocked until the send happens
                    clock[rank] = max(clock[rank], arrivals.pop(0))
                position[rank] += 1
                progress = True
    stuck = [r for r in range(ranks) if position[r] < len(actions[r])]
    if stuck:
        waits = "; ".join(f"rank {r} waits at {actions[r][position[r]]}" for r in stuck)
        raise TesseraError(f"deadlock: no rank can progress ({waits})")
    return PipelineSimulation(
        makespan_s=max(clock),
        busy_s=tuple(busy),
        peak_activations=tuple(peak),
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


def _message(action: Action) -> tuple[str, int, int, int]:
    """(what, microbatch, from stage, to stage): the same key on both ends of a transfer."""
    assert action.peer is not None
    if action.kind == SEND_ACTIVATION:
        return ("activation", action.microbatch, action.stage, action.peer)
    if action.kind == RECV_ACTIVATION:
        return ("activation", action.microbatch, action.peer, action.stage)
    if action.kind == SEND_GRAD:
        return ("grad", action.microbatch, action.stage, action.peer)
    assert action.kind == RECV_GRAD
    return ("grad", action.microbatch, action.peer, action.stage)


def _count_activation(held: Counter[tuple[int, int]], action: Action) -> int:
    """+1 for a forward, −1 for the backward piece that frees its activation, else 0."""
    key = (action.microbatch, action.stage)
    if action.kind == FORWARD:
        held[key] += 1
        return 1
    if action.kind in (BACKWARD, BACKWARD_WEIGHT) and held[key] > 0:
        held[key] -= 1
        return -1
    return 0
