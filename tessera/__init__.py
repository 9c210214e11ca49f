"""Tessera: a compiler for distributed deep learning.

``ts.jit`` traces array code written with :mod:`tessera.op` into Graph IR and runs it.
The runtime parts (``jit``, ``op``, ``dist``) load on first use, so tools that only read
and rewrite IR (``tessera-opt``) start without importing torch.
"""

from __future__ import annotations

import glob
import importlib
import os
from typing import TYPE_CHECKING, Any

from tessera.dtypes import DType
from tessera.errors import (
    ArgumentError,
    DistributedError,
    ExecutionError,
    IRError,
    ShapeError,
    ShardingError,
    TesseraError,
    TraceError,
)

# Without an NVIDIA GPU, generated kernels run in Triton's interpreter, which must be
# chosen before triton is first imported (torch.optim, for one, may import it).
if "TRITON_INTERPRET" not in os.environ and not glob.glob("/dev/nvidia[0-9]*"):
    os.environ["TRITON_INTERPRET"] = "1"

if TYPE_CHECKING:
    from tessera import dist, models, op, random
    from tessera.jit_function import JitFunction, jit
    from tessera.program import Lowered

_LAZY = {
    "dist": ("tessera.dist", None),
    "op": ("tessera.op", None),
    "graph": ("tessera.graph", None),
    "optim": ("tessera.optim", None),
    "schedule": ("tessera.schedule", None),
    "numerics": ("tessera.numerics", None),
    "random": ("tessera.random", None),
    "models": ("tessera.models", None),
    "jit": ("tessera.jit_function", "jit"),
    "JitFunction": ("tessera.jit_function", "JitFunction"),
    "Lowered": ("tessera.program", "Lowered"),
    "grad": ("tessera.autodiff.api", "grad"),
    "value_and_grad": ("tessera.autodiff.api", "value_and_grad"),
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'tessera' has no attribute {name!r}")
    module_name, attribute = _LAZY[name]
    module = importlib.import_module(module_name)
    value = module if attribute is None else getattr(module, attribute)
    globals()[name] = value
    return value


__all__ = [
    "ArgumentError",
    "DType",
    "DistributedError",
    "ExecutionError",
    "IRError",
    "JitFunction",
    "Lowered",
    "ShapeError",
    "ShardingError",
    "TesseraError",
    "TraceError",
    "dist",
    "grad",
    "graph",
    "jit",
    "models",
    "numerics",
    "op",
    "optim",
    "random",
    "schedule",
    "value_and_grad",
]
