"""Tessera's element types and their names in xDSL, torch and numpy.

Dtype policy: every dtype is computed in itself or wider, never narrower. float64
arrays are computed in float64 end to end (matmuls included); f16 and bf16 compute in
f32 inside kernels and round once when stored. Python floats are weakly typed (``x * 2.0``
keeps ``x``'s dtype; a float constant alone is f32, torch's default dtype).
"""

from __future__ import annotations

import enum
import sys
from typing import TYPE_CHECKING

import numpy as np
from xdsl.dialects.builtin import (
    BFloat16Type,
    Float16Type,
    Float32Type,
    Float64Type,
    IntegerType,
)
from xdsl.ir import Attribute

from tessera.errors import TesseraError

if TYPE_CHECKING:
    import torch


class DType(enum.Enum):
    """An element type. The value is the MLIR spelling (``f32``, ``i1``...)."""

    f64 = "f64"
    f32 = "f32"
    f16 = "f16"
    bf16 = "bf16"
    i32 = "i32"
    i64 = "i64"
    i1 = "i1"

    def __repr__(self) -> str:
        return self.value

    __str__ = __repr__

    @property
    def is_float(self) -> bool:
        return self in (DType.f64, DType.f32, DType.f16, DType.bf16)

    @property
    def is_int(self) -> bool:
        return self in (DType.i32, DType.i64)

    @property
    def itemsize(self) -> int:
        return {"f64": 8, "f32": 4, "f16": 2, "bf16": 2, "i32": 4, "i64": 8, "i1": 1}[self.value]

    def to_xdsl(self) -> Attribute:
        if not _XDSL_TYPES:  # built once: attributes are immutable, building one is slow
            _XDSL_TYPES.update(
                {
                    DType.f64: Float64Type(),
                    DType.f32: Float32Type(),
                    DType.f16: Float16Type(),
                    DType.bf16: BFloat16Type(),
                    DType.i32: IntegerType(32),
                    DType.i64: IntegerType(64),
                    DType.i1: IntegerType(1),
                }
            )
        return _XDSL_TYPES[self]

    def to_torch(self) -> torch.dtype:
        import torch  # torch is only needed to run programs, not to read or rewrite IR

        return getattr(torch, _TORCH_NAMES[self])


_XDSL_TYPES: dict[DType, Attribute] = {}

_TORCH_NAMES = {
    DType.f64: "float64", DType.f32: "float32", DType.f16: "float16", DType.bf16: "bfloat16",
    DType.i32: "int32", DType.i64: "int64", DType.i1: "bool",
}  # fmt: skip
_ALIASES = {
    "float64": DType.f64, "double": DType.f64, "float32": DType.f32, "float": DType.f32, "float16": DType.f16, "half": DType.f16,
    "bfloat16": DType.bf16, "int32": DType.i32, "int64": DType.i64, "bool": DType.i1,
}  # fmt: skip


_FROM_XDSL: dict[Attribute, DType] = {}


def dtype_from_xdsl(attr: Attribute) -> DType:
    """The DType of an xDSL element type; raises TesseraError for unsupported ones."""
    if not _FROM_XDSL:
        _FROM_XDSL.update((d.to_xdsl(), d) for d in DType)
    found = _FROM_XDSL.get(attr)
    if found is not None:
        return found
    raise TesseraError(f"unsupported element type {attr}; expected one of {list(DType)}")


def as_dtype(value: object) -> DType:
    """Converts a DType, its name, a torch dtype or a numpy dtype to a DType."""
    if isinstance(value, DType):
        return value
    torch = sys.modules.get("torch")  # a torch dtype can only exist once torch is imported
    if torch is not None and isinstance(value, torch.dtype):
        name = str(value).removeprefix("torch.")
        if name in _ALIASES:
            return _ALIASES[name]
    elif isinstance(value, str):
        if value in DType.__members__:
            return DType[value]
        if value in _ALIASES:
            return _ALIASES[value]
    else:
        try:
            np_dtype = np.dtype(value)  # type: ignore[call-overload]
        except TypeError:
            np_dtype = None
        if np_dtype is not None and np_dtype.name in _ALIASES:
            return _ALIASES[np_dtype.name]
    raise TesseraError(
        f"unsupported dtype {value!r}; expected one of {list(DType)} (or their torch or "
        f"numpy names: float64, float32, float16, bfloat16, int32, int64, bool)"
    )


_PROMOTION_ORDER = [DType.i1, DType.i32, DType.i64, DType.bf16, DType.f16, DType.f32, DType.f64]


def promote(a: DType, b: DType) -> DType:
    """The common dtype of two operands (torch's rules; f16 with bf16 gives f32)."""
    if a == b:
        return a
    if {a, b} == {DType.f16, DType.bf16}:
        return DType.f32
    return max(a, b, key=_PROMOTION_ORDER.index)
