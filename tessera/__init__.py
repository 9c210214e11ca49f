"""Tessera: a compiler for distributed deep learning.

``ts.jit`` traces array code written with :mod:`tessera.op` into Graph IR and runs it.
"""

from tessera import dist, op
from tessera.dtypes import DType
from tessera.errors import (
    ExecutionError,
    IRError,
    ShapeError,
    ShardingError,
    TesseraError,
    TraceError,
)
from tessera.jit import JitFunction, Lowered, jit

__all__ = [
    "DType",
    "ExecutionError",
    "IRError",
    "JitFunction",
    "Lowered",
    "ShapeError",
    "ShardingError",
    "TesseraError",
    "TraceError",
    "dist",
    "jit",
    "op",
]
