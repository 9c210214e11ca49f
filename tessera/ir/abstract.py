"""Abstract values: the shape and dtype of a tensor, without its data.

Shape rules, the tracer and the verifiers all speak in abstract values, so there is one
place that decides what an op produces.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from math import prod

from xdsl.dialects.builtin import TensorType
from xdsl.ir import Attribute, SSAValue

from tessera.dtypes import DType, dtype_from_xdsl
from tessera.errors import TesseraError


@dataclass(frozen=True)
class AbstractTensor:
    """A tensor's static type: its shape and element type."""

    shape: tuple[int, ...]
    dtype: DType

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def with_shape(self, shape: tuple[int, ...]) -> AbstractTensor:
        return AbstractTensor(tuple(shape), self.dtype)

    def with_dtype(self, dtype: DType) -> AbstractTensor:
        return AbstractTensor(self.shape, dtype)

    def to_xdsl(self) -> TensorType:
        return _tensor_type(self.shape, self.dtype)

    @staticmethod
    def from_xdsl(attr: Attribute) -> AbstractTensor:
        if isinstance(attr, TensorType):
            return _abstract(attr)
        raise TesseraError(f"expected a ranked tensor type, found {attr}")

    @staticmethod
    def _from_tensor_type(attr: Attribute) -> AbstractTensor:
        if not isinstance(attr, TensorType):
            raise TesseraError(f"expected a ranked tensor type, found {attr}")
        shape = tuple(attr.get_shape())
        if any(d < 0 for d in shape):
            raise TesseraError(f"expected a static shape, found {attr}")
        return AbstractTensor(shape, dtype_from_xdsl(attr.get_element_type()))

    def __str__(self) -> str:
        dims = "".join(f"{d}x" for d in self.shape)
        return f"tensor<{dims}{self.dtype.value}>"


@lru_cache(maxsize=65536)
def _tensor_type(shape: tuple[int, ...], dtype: DType) -> TensorType:
    """The xDSL type (cached: attributes are immutable and slow to build and verify)."""
    return TensorType(dtype.to_xdsl(), shape)


@lru_cache(maxsize=65536)
def _abstract(attr: TensorType) -> AbstractTensor:
    return AbstractTensor._from_tensor_type(attr)


def aval(value: SSAValue) -> AbstractTensor:
    """The abstract value of an SSA value of tensor type."""
    return AbstractTensor.from_xdsl(value.type)
