"""``tessera.schedule``: how compiled programs schedule communication (the seeds' API).

Options apply to programs lowered while they are set, as a process-wide default or
within a ``with`` block::

    from tessera import schedule

    schedule.all_reduce_overlap(True)       # the default: overlap-comm runs
    with schedule.all_reduce_overlap(False):
        serial = step.lower(state, batch)   # starts are waited for at once

``all_reduce_overlap`` turns the ``overlap-comm`` pass on or off: collectives start as
soon as their operand is made and are waited for only where their result is first used,
so communication runs while independent kernels compute. With
``schedule.options(collective_matmul=True)`` (experimental), ``collective-matmul`` also
splits an all_gather feeding a matmul (or a matmul feeding an all_reduce or
reduce_scatter) into chunks, carried through the row-wise ops after the collective, when
simulating the schedule on ``topology`` says it pays.
``schedule.options(bucket_bytes=n)`` sets the size of the buckets data-parallel gradient
all-reduces are fused into (``bucket-gradients``; 25 MiB by default, 0 turns it off);
``schedule.options(context_parallel="ring" | "all_gather")`` forces how attention with
its sequence split over a mesh axis runs (``"auto"``, the default, lets the cost model
pick per op); ``collective_algorithms`` (on) marks every collective with the algorithm the cost model
picks (``choose-collective-algorithms``), hierarchical ones running over subgroups.
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
    # decompose collective + matmul pairs (and the row-wise chain after them) into chunks,
    # k chosen by simulation. Off by default: on an H100 each extra kernel costs 50-90 µs of
    # the Python runtime's dispatch, which the model's 4 µs launch does not see
    # (benchmarks/RESULTS.md, "Kernel cost model vs measured kernels")
    collective_matmul: bool = False
    collective_matmul_chunks: int = 0  # 0: as the cost model chooses
    # the machine the cost model prices (a tessera.topology.load_topology name): "" (the
    # default) takes the mesh's topology= (else enough DGX H100s); one naming another
    # machine than the mesh's is an error (tessera.driver.CompileConfig)
    topology: str = ""
    # fuse all-reduces whose results wait (data-parallel gradients) into buckets of this
    # many bytes (bucket-gradients; 0: off)
    bucket_bytes: int = 25 * 2**20
    # mark collectives with the cost model's algorithm (choose-collective-algorithms)
    collective_algorithms: bool = True
    # pipelined training steps (a mesh with a pp axis): microbatches per step, the
    # schedule (tessera.ir.pipeline_actions.SCHEDULE_KINDS) and model chunks per rank
    pipeline_microbatches: int = 1
    pipeline_schedule: str = "1f1b"
    pipeline_virtual: int = 1
    # context-parallel attention (the sequence split over a mesh axis): "ring" (k/v
    # blocks passed round the ring), "all_gather" (k/v gathered once), or "auto" (the
    # cost model of ``tessera.perf.context_parallel`` picks per op)
    context_parallel: str = "auto"


CONTEXT_PARALLEL_METHODS = ("auto", "ring", "all_gather")
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


def pipeline_microbatches(count: int, kind: str = "1f1b", virtual: int = 1) -> _Setting:
    """Pipelined training steps lowered from now split each batch into ``count``
    microbatches and run them with the ``kind`` schedule (``gpipe``, ``1f1b``,
    ``interleaved`` with ``virtual`` model chunks per pipeline rank, or ``zb-h1``)."""
    from tessera.ir.pipeline_actions import SCHEDULE_KINDS

    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise TesseraError(f"schedule.pipeline_microbatches expects a count >= 1, found {count!r}")
    if kind not in SCHEDULE_KINDS:
        raise TesseraError(
            f"schedule.pipeline_microbatches: unknown schedule {kind!r}; known: {', '.join(SCHEDULE_KINDS)}"
        )
    if not isinstance(virtual, int) or virtual < 1 or (virtual > 1 and kind != "interleaved"):
        raise TesseraError(
            f"schedule.pipeline_microbatches: virtual={virtual!r} needs kind='interleaved' "
            f"(and an int >= 1)"
        )
    global _current
    previous = _current
    _current = replace(
        _current, pipeline_microbatches=count, pipeline_schedule=kind, pipeline_virtual=virtual
    )
    return _Setting(previous)


_AT_LEAST = {"bucket_bytes": 0, "collective_matmul_chunks": 0, "pipeline_microbatches": 1,
             "pipeline_virtual": 1}  # fmt: skip


def _check_option(name: str, value: Any) -> None:
    """A TesseraError unless ``value`` has the option's type (and range)."""
    kind = {"bool": bool, "int": int, "str": str}[ScheduleOptions.__dataclass_fields__[name].type]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise TesseraError(f"schedule option {name} must be a {kind.__name__}, found {value!r}")
    if name in _AT_LEAST and value < _AT_LEAST[name]:
        raise TesseraError(f"schedule option {name} must be >= {_AT_LEAST[name]}, found {value!r}")
    if name == "context_parallel" and value not in CONTEXT_PARALLEL_METHODS:
        raise TesseraError(
            f"schedule option context_parallel must be one of "
            f"{', '.join(CONTEXT_PARALLEL_METHODS)}, found {value!r}"
        )
    if name == "pipeline_schedule":
        from tessera.ir.pipeline_actions import SCHEDULE_KINDS

        if value not in SCHEDULE_KINDS:
            raise TesseraError(
                f"schedule option pipeline_schedule must be one of {', '.join(SCHEDULE_KINDS)}, "
                f"found {value!r}"
            )


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
    for name, value in changes.items():
        _check_option(name, value)
    previous, _current = _current, replace(_current, **changes)
    try:
        yield _current
    finally:
        _current = previous
