"""Dense constants as numpy arrays: packing and reading ``dense<...>`` without Python loops.

xDSL stores a dense attribute as raw little-endian bytes; building or reading one element
at a time costs seconds for a 4096 x 4096 mask, so these helpers go through numpy.
A splat (every element equal) is stored as one element.
"""

from __future__ import annotations

import numpy as np
from xdsl.dialects.builtin import (
    BFloat16Type,
    BytesAttr,
    DenseIntOrFPElementsAttr,
    IntegerType,
    TensorType,
)

_BF16_NAN = 0x7FC0


def _bf16_bits(values: np.ndarray) -> np.ndarray:
    """Round-to-nearest-even f32 -> bf16 bit patterns."""
    f32 = np.ascontiguousarray(values, dtype=np.float32)
    bits = f32.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(f32), np.uint16(_BF16_NAN), rounded).astype("<u2")


def _is_bool(element: object) -> bool:
    return isinstance(element, IntegerType) and element.width.data == 1


def dense_from_numpy(values: np.ndarray, tensor_type: TensorType) -> DenseIntOrFPElementsAttr:
    """The dense attribute of ``values`` (reshaped to ``tensor_type``; splats stored once)."""
    flat = np.asarray(values).reshape(-1)
    if flat.size > 1 and np.array_equal(
        flat, np.full_like(flat, flat[0]), equal_nan=flat.dtype.kind == "f"
    ):
        flat = flat[:1]
    element = tensor_type.element_type
    if isinstance(element, BFloat16Type):
        raw = _bf16_bits(flat).tobytes()
    elif _is_bool(element):  # xDSL stores a true i1 as the signed value -1
        raw = (-(flat != 0).astype(np.int8)).tobytes()
    else:
        raw = np.ascontiguousarray(flat, dtype=np.dtype(element.format)).tobytes()  # type: ignore[attr-defined]
    if flat.size == 1 and (count := int(np.prod(tensor_type.get_shape()))) != 1:
        raw *= count  # xDSL stores splats expanded
    return DenseIntOrFPElementsAttr(tensor_type, BytesAttr(raw))


def dense_to_numpy(attr: DenseIntOrFPElementsAttr) -> np.ndarray:
    """The attribute's values with its shape (bf16 read as f32, i1 as bool)."""
    element = attr.get_element_type()
    raw = attr.data.data
    if isinstance(element, BFloat16Type):
        flat = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
    else:
        flat = np.frombuffer(raw, dtype=np.dtype(element.format))  # type: ignore[attr-defined]
        if _is_bool(element):
            flat = flat != 0
    shape = attr.get_shape()
    if flat.size == 1 and int(np.prod(shape)) != 1:
        return np.broadcast_to(flat, shape)
    return flat.reshape(shape)


def is_splat(attr: DenseIntOrFPElementsAttr) -> bool:
    """Whether every element is the same (compared as raw bytes)."""
    raw = attr.data.data
    size = attr.get_element_type().compile_time_size
    return len(raw) <= size or raw == raw[:size] * (len(raw) // size)


def first_value(attr: DenseIntOrFPElementsAttr) -> float | int | bool:
    """The first element (the value of a splat); 0 for an empty tensor, whose splat
    value nothing reads."""
    values = dense_to_numpy(attr).reshape(-1)
    return values[0].item() if values.size else values.dtype.type(0).item()
