"""The numerics policy: ``fast`` or ``deterministic`` (the seeds' chapter 7.8).

In ``deterministic`` mode every reduction has one fixed order, so a training run is
bit-identical run to run, and between the virtual mesh and ``tessera run`` processes for
the same mesh:

- *Across ranks*: a sum, mean or prod collective (``all_reduce``, ``reduce_scatter``;
  the kinds that round, ``reduction_kinds.KINDS``) combines the members' terms one after
  the other in mesh order, ``((x0 + x1) + x2) + …`` (f16/bf16 terms in f32, rounded
  once), on the virtual mesh and over processes alike. Over processes each rank
  all-gathers the terms and combines them itself, instead of the
  library's ring or tree whose association depends on the algorithm, the chunking and
  the group size; this moves ``n − 1`` times the operand's bytes per rank instead of
  ``2 (n − 1) / n`` times (``tessera.perf`` simulates that cost). Max and min do not
  depend on the order.
- *Inside kernels*: the generated Triton kernels and the reference executor reduce in a
  fixed order already (no atomics, no split reductions whose order depends on
  scheduling), so they are the same in both modes.

``fast`` (the default) keeps the library's algorithms. Choose the mode globally with
``TESSERA_NUMERICS`` or :func:`set_mode`, for a block with ``with numerics.mode_of(...)``,
or per training step with ``graph.training_step(..., numerics="deterministic")``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from tessera import environment
from tessera.errors import TesseraError

MODES = environment.NUMERICS_CHOICES

_override: list[str] = []
_global: list[str] = []


def mode() -> str:
    """The numerics policy in force: the innermost :func:`mode_of`, else
    :func:`set_mode`'s, else ``TESSERA_NUMERICS`` (default ``fast``)."""
    if _override:
        return _override[-1]
    if _global:
        return _global[-1]
    return environment.numerics()


def deterministic() -> bool:
    return mode() == "deterministic"


def check(value: str, where: str = "numerics") -> str:
    if value not in MODES:
        raise TesseraError(f"{where} must be one of {MODES}, found {value!r}")
    return value


def set_mode(value: str) -> None:
    """Sets the numerics policy of this process."""
    _global[:] = [check(value)]


@contextmanager
def mode_of(value: str | None) -> Iterator[None]:
    """The numerics policy ``value`` within the block (None: unchanged)."""
    if value is None:
        yield
        return
    _override.append(check(value))
    try:
        yield
    finally:
        _override.pop()
