"""Abstract values: the shape and dtype of a tensor, without its data.

Shape rules, the tracer and the verifiers all speak in abstract values, so there is one
place that decides what an op produces.
"""

from __future__ import annotations

from dataclasses import dataclass
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
        return TensorType(self.dtype.to_xdsl(), self.shape)

    @staticmethod
    def from_xdsl(attr: Attribute) -> AbstractTensor:
        if not isinstance(attr, TensorType):
            raise TesseraError(f"expected a ranked tensor type, found {attr}")
        shape = tuple(attr.get_shape())
        if any(d < 0 for d in shape):
            raise TesseraError(f"expected a static shape, found {attr}")
        return AbstractTensor(shape, dtype_from_xdsl(attr.get_element_type()))

    def __str__(self) -> str:
        dims = "".join(f"{d}x" for d in self.shape)
        return f"tensor<{dims}{self.dtype.value}>"


def aval(value: SSAValue) -> AbstractTensor:
    """The abstract value of an SSA value of tensor type."""
    return AbstractTensor.from_xdsl(value.type)
