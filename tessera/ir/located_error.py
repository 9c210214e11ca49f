"""Verification and pass failures that name the op at fault.

xDSL's ``VerifyException`` and ``PassFailedException`` say what failed but not where;
the whole-module checks (dominance, sizes, shardings) and passes that cannot handle an
op raise these subclasses, so that ``tessera-opt`` can print the op's
``FILE:LINE:COL``.
"""

from __future__ import annotations

from xdsl.ir import Operation
from xdsl.utils.exceptions import PassFailedException, VerifyException

from tessera.errors import ShardingError


class LocatedVerifyException(VerifyException):
    """A verification failure at ``op``."""

    def __init__(self, op: Operation, message: str) -> None:
        super().__init__(message)
        self.op = op


class LocatedPassFailure(PassFailedException):
    """A pass cannot handle its input at ``op`` (valid IR it does not lower, say)."""

    def __init__(self, op: Operation, message: str) -> None:
        super().__init__(message)
        self.op = op


class LocatedShardingFailure(LocatedPassFailure, ShardingError):
    """A program's layouts that a pass cannot compile, at ``op``: a user's error (a
    :class:`~tessera.errors.ShardingError` to ``ts.jit``), located for ``tessera-opt``."""
