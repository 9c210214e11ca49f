"""The timeline format shared by the simulator and the runtime recorder.

An :class:`Event` is one kernel or collective on one rank's stream. :func:`chrome_trace`
turns events into a Chrome-trace / Perfetto object (one process per rank, one thread per
stream, compute first; times in µs) that https://ui.perfetto.dev and chrome://tracing open.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

COMPUTE = "compute"


@dataclass(frozen=True)
class Event:
    """One kernel or collective on one rank's stream (times in seconds)."""

    rank: int
    stream: str
    name: str
    start_s: float
    end_s: float
    args: dict[str, Any] = field(default_factory=dict)

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


def chrome_trace(events: Iterable[Event], other: dict[str, Any] | None = None) -> dict[str, Any]:
    """``events`` as a Chrome-trace object (``traceEvents``, ``otherData`` = ``other``)."""
    events = list(events)
    streams: dict[int, list[str]] = defaultdict(list)
    for e in events:
        if e.stream not in streams[e.rank]:
            streams[e.rank].append(e.stream)
    tids: dict[tuple[int, str], int] = {}
    trace: list[dict[str, Any]] = []
    for rank, names in sorted(streams.items()):
        trace.append(_meta("process_name", rank, 0, {"name": f"rank {rank}"}))
        trace.append(_meta("process_sort_index", rank, 0, {"sort_index": rank}))
        for tid, stream in enumerate(sorted(names, key=lambda s: (s != COMPUTE, s))):
            trace.append(_meta("thread_name", rank, tid, {"name": stream}))
            tids[(rank, stream)] = tid
    for e in events:
        trace.append(
            {
                "name": e.name,
                "cat": "compute" if e.stream == COMPUTE else "communication",
                "ph": "X",
                "ts": e.start_s * 1e6,
                "dur": e.duration_s * 1e6,
                "pid": e.rank,
                "tid": tids[(e.rank, e.stream)],
                "args": e.args,
            }
        )
    return {"traceEvents": trace, "displayTimeUnit": "ms", "otherData": other or {}}


def save_json(trace: dict[str, Any], path: str | os.PathLike[str]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(trace, f)


def _meta(name: str, pid: int, tid: int, args: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "ph": "M", "pid": pid, "tid": tid, "args": args}
