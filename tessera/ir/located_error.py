"""A verification failure that names the op at fault.

xDSL's ``VerifyException`` says what failed but not where; the whole-module checks
(dominance, sizes, shardings) raise this subclass, so that ``tessera-opt`` can print
the op's ``FILE:LINE:COL``.
"""

from __future__ import annotations

from xdsl.ir import Operation
from xdsl.utils.exceptions import VerifyException


class LocatedVerifyException(VerifyException):
    """A verification failure at ``op``."""

    def __init__(self, op: Operation, message: str) -> None:
        super().__init__(message)
        self.op = op
