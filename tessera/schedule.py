"""``tessera.schedule``: how compiled programs schedule communication (the seeds' API).

Options apply to programs lowered while they are set, as a process-wide default or
within a ``with`` block::

    from tessera import schedule

    schedule.all_reduce_overlap(True)       # the default: overlap-comm runs
    with schedule.all_reduce_overlap(False):
        serial = step.lower(state, batch)   # starts are waited for at once

``all_reduce_overlap`` turns the ``overlap-comm`` pass on or off: collectives start as
soon as their operand is made and are waited for only where their result is first used,
so communication runs while independent kernels compute.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

from tessera.errors import TesseraError


@dataclass(frozen=True)
class ScheduleOptions:
    """The options a program is lowered with (part of its jit cache key)."""

    overlap: bool = True

    def passes(self) -> list[str]:
        """The Schedule IR passes these options ask for, in order."""
        return ["lower-graph-to-schedule", *(["overlap-comm"] if self.overlap else []), "plan-memory"]


_current = ScheduleOptions()


def current() -> ScheduleOptions:
    """The options programs are lowered with now."""
    return _current


class _Setting:
    """Sets an option at once; as a context manager, restores the previous value on exit."""

    def __init__(self, previous: ScheduleOptions):
        self._previous = previous

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        global _current
        _current = self._previous


def all_reduce_overlap(enabled: bool = True) -> _Setting:
    """Overlap collectives with computation (``overlap-comm``) in programs lowered from now."""
    if not isinstance(enabled, bool):
        raise TesseraError(f"schedule.all_reduce_overlap expects True or False, found {enabled!r}")
    global _current
    previous, _current = _current, replace(_current, overlap=enabled)
    return _Setting(previous)


@contextmanager
def options(**changes: Any) -> Iterator[ScheduleOptions]:
    """Within the block, programs are lowered with ``changes`` to the current options."""
    global _current
    unknown = set(changes) - set(ScheduleOptions.__dataclass_fields__)
    if unknown:
        raise TesseraError(
            f"unknown schedule option(s) {sorted(unknown)}; "
            f"known: {sorted(ScheduleOptions.__dataclass_fields__)}"
        )
    previous, _current = _current, replace(_current, **changes)
    try:
        yield _current
    finally:
        _current = previous
