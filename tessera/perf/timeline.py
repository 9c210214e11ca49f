"""Records the real timeline of scheduled runs, per rank, in the simulator's trace format.

::

    from tessera import perf

    with perf.record_timeline() as timeline:
        step(state, batch)
    timeline.save_trace("measured.json")  # next to lowered.simulate().save_trace(...)

Every scheduled run inside the block adds one event per kernel on the ``compute`` stream
and one per collective on its communication stream (``comm`` unless the start names
another): every rank of a virtual-mesh run, or this process's rank under
``tessera run -n N`` (:meth:`Timeline.gathered` collects all ranks). Times:

- on the CPU, ``time.perf_counter`` (CLOCK_MONOTONIC, shared by the processes of one
  machine, so their ranks line up); a kernel spans its call, a collective its issue to its
  completion (the work's completion callback; when there is none, the return of its wait);
- on a GPU, CUDA events recorded on the current stream and read when the timeline is
  (after a synchronize); a collective's end is where its wait lets the compute stream go
  on, an upper bound of its completion.

On the virtual mesh every collective completes when issued (in memory) and ranks run one
after another, so its timeline measures kernels, not overlap.
"""

from __future__ import annotations

import os
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any

import torch

from tessera.perf.trace import COMPUTE, Event, chrome_trace, save_json

Mark = float | torch.cuda.Event  # a perf_counter reading, or a recorded CUDA event


@dataclass
class _Raw:
    rank: int
    stream: str
    name: str
    start: Mark
    end: Mark | _Completion
    args: dict[str, Any]


class _Completion:
    """When an issued collective completed: set by its work's callback, else at its wait."""

    def __init__(self) -> None:
        self.at: Mark | None = None

    def set(self, at: Mark) -> None:
        if self.at is None:
            self.at = at


class Timeline:
    """The recorded events of the runs inside one :func:`record_timeline` block."""

    def __init__(self) -> None:
        self._raw: list[_Raw] = []
        self._resolved: list[Event] | None = None
        self._base: tuple[float, torch.cuda.Event] | None = None  # wall clock at a CUDA event
        self._lock = threading.Lock()

    # --- recording (called by the runtimes) ---

    def now(self, device: torch.device) -> Mark:
        """A mark of the present moment on ``device``'s timeline."""
        if device.type != "cuda":
            return time.perf_counter()
        if self._base is None:
            torch.cuda.synchronize(device)
            base = torch.cuda.Event(enable_timing=True)
            base.record()
            self._base = (time.perf_counter(), base)
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def add(
        self,
        rank: int,
        stream: str,
        name: str,
        start: Mark,
        end: Mark | _Completion,
        args: dict[str, Any] | None = None,
    ) -> None:
        with self._lock:
            self._raw.append(_Raw(rank, stream, name, start, end, args or {}))
            self._resolved = None

    def completion(self, work: object, device: torch.device) -> _Completion:
        """A completion time filled in by ``work``'s callback on the CPU (gloo), else by
        the runtime at the wait."""
        done = _Completion()
        get_future = getattr(work, "get_future", None)
        if get_future is not None and device.type != "cuda":
            with suppress(RuntimeError):  # a backend without futures: set at the wait
                get_future().add_done_callback(lambda _: done.set(time.perf_counter()))
        return done

    # --- reading ---

    @property
    def events(self) -> list[Event]:
        """The events in seconds from the first one's start, ordered by start."""
        if self._resolved is None:
            with self._lock:
                raw = list(self._raw)
            if self._base is not None:
                torch.cuda.synchronize()
            timed = [
                (r, self._seconds(r.start), self._seconds(r.end)) for r in raw
            ]
            origin = min((start for _, start, _ in timed), default=0.0)
            self._resolved = sorted(
                (
                    Event(r.rank, r.stream, r.name, start - origin, max(end, start) - origin, r.args)
                    for r, start, end in timed
                ),
                key=lambda e: (e.start_s, e.rank),
            )
        return self._resolved

    def _seconds(self, mark: Mark | _Completion) -> float:
        if isinstance(mark, _Completion):
            assert mark.at is not None, "a collective's completion was never recorded"
            mark = mark.at
        if isinstance(mark, float):
            return mark
        assert self._base is not None
        wall, base = self._base
        return wall + base.elapsed_time(mark) / 1e3

    def rank_events(self, rank: int) -> list[Event]:
        return [e for e in self.events if e.rank == rank]

    def busy_s(self) -> dict[tuple[int, str], float]:
        """Seconds each (rank, stream) was busy."""
        busy: dict[tuple[int, str], float] = defaultdict(float)
        for e in self.events:
            busy[(e.rank, e.stream)] += e.duration_s
        return dict(busy)

    def kernel_times(self) -> dict[str, list[float]]:
        """Every measured duration of each kernel (all ranks and runs), by kernel name."""
        times: dict[str, list[float]] = defaultdict(list)
        for e in self.events:
            if e.stream == COMPUTE:
                times[e.name].append(e.duration_s)
        return dict(times)

    def gathered(self) -> Timeline:
        """Every process's events (``tessera run``); every rank must call it. Without a
        process group, this timeline."""
        import torch.distributed as tdist

        if not (tdist.is_available() and tdist.is_initialized()):
            return self
        everyone: list[list[Event] | None] = [None] * tdist.get_world_size()
        mine = [
            Event(r.rank, r.stream, r.name, self._seconds(r.start), self._seconds(r.end), r.args)
            for r in self._raw
        ]
        tdist.all_gather_object(everyone, mine)
        merged = Timeline()
        for events in everyone:
            for e in events or []:
                merged.add(e.rank, e.stream, e.name, e.start_s, e.end_s, e.args)
        return merged

    def trace(self) -> dict[str, Any]:
        """The timeline as a Chrome-trace object (``traceEvents``, times in µs)."""
        return chrome_trace(self.events, {"source": "recorded"})

    def save_trace(self, path: str | os.PathLike[str]) -> None:
        """Writes :meth:`trace` as JSON (open it in https://ui.perfetto.dev)."""
        save_json(self.trace(), path)


_active: Timeline | None = None


def active() -> Timeline | None:
    """The timeline runs record into now, if any."""
    return _active


@contextmanager
def record_timeline() -> Iterator[Timeline]:
    """Records every scheduled run inside the block into the :class:`Timeline` it yields."""
    global _active
    previous, _active = _active, Timeline()
    try:
        yield _active
    finally:
        _active = previous
