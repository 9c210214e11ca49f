"""Errors Tessera raises for bad user programs, shardings and IR.

Every error a user can trigger is a :class:`TesseraError`; subclasses say which stage
found the problem. Messages name what was expected, what was found and, for traced
programs, the user's source line.
"""

from __future__ import annotations

import linecache


class TesseraError(Exception):
    """Base class of all errors reported to Tessera users."""


class ShapeError(TesseraError):
    """Operand shapes or dtypes do not fit an op (raised by the op's shape rule)."""


class TraceError(TesseraError):
    """A traced Python function did something Tessera cannot trace."""


class ArgumentError(TesseraError):
    """An option or argument given to Tessera's API has the wrong type or value (``ts.jit``
    options, ``ts.grad``'s ``argnums``, optimizer hyper-parameters, schedule options)."""


class ExecutionError(TesseraError):
    """Arguments given to a compiled function do not match its signature."""


class DistributedError(TesseraError):
    """A multi-process run failed: a rank raised, died, exited or hung, or the ranks'
    programs differ. ``cause_rank`` is the rank that caused it when known (another rank
    than this one), and ``cause`` what that rank did."""

    def __init__(self, message: str, cause_rank: int | None = None, cause: str = ""):
        super().__init__(message)
        self.cause_rank = cause_rank
        self.cause = cause


class IRError(TesseraError):
    """Textual IR could not be parsed, verified or emitted; ``op``, if given, is the op
    at fault (``tessera-opt`` prints its line)."""

    def __init__(self, message: str, op: object = None) -> None:
        super().__init__(message)
        self.op = op


class ShardingError(TesseraError):
    """A mesh, shard spec or sharding that does not fit its tensor or mesh."""


def describe_location(filename: str, line: int) -> str:
    """``file:line: source text``: how error messages show a user's line."""
    code = linecache.getline(filename, line).strip()
    return f"{filename}:{line}{f': {code}' if code else ''}"
