"""What can be addressed: bounds on tensor, buffer, mesh and launch-grid sizes.

The verifiers reject sizes beyond these bounds, so that passes and the runtime never
meet a size they cannot represent (an ``i64`` byte offset, a device list, a CUDA grid):

- a tensor or buffer holds at most :data:`MAX_BYTES` = 2**48 bytes (256 TiB), the size of
  the 48-bit virtual address space of x86-64 and of CUDA's unified addressing (and so is
  a rank's memory arena, which ``plan-memory`` checks);
- a mesh has at most :data:`MAX_MESH_DEVICES` = 2**20 devices, several times the largest
  GPU clusters built (its device list is materialised);
- a tile kernel's grid has at most 2**31 - 1 programs along axis 0 and 65,535 along axes
  1 and 2, CUDA's launch limits.

:func:`check_sizes` checks every tensor type of a module in one walk (each distinct type
once).
"""

from __future__ import annotations

from math import prod

from xdsl.dialects.builtin import ModuleOp, TensorType
from xdsl.dialects.func import FuncOp
from xdsl.ir import Attribute, Operation

from tessera.ir.attribute_set import AttributeSet
from tessera.ir.located_error import LocatedVerifyException

MAX_BYTES = 1 << 48
MAX_MESH_DEVICES = 1 << 20
MAX_GRID = (2**31 - 1, 65535, 65535)


def tensor_bytes(tensor: TensorType) -> int:
    """The bytes of a static tensor type (an element of unknown width counts 8 bytes)."""
    width = getattr(tensor.get_element_type(), "bitwidth", 64)
    return prod(tensor.get_shape()) * max(1, (width + 7) // 8)


def size_error(t: Attribute) -> str | None:
    """Why a type holds more than can be addressed, or None if it does not."""
    tensor = getattr(t, "tensor", t)  # a !schedule.handle holds a tensor type
    if not isinstance(tensor, TensorType) or any(d < 0 for d in tensor.get_shape()):
        return None  # not a tensor, or dynamic: the op verifiers say what they accept
    if (size := tensor_bytes(tensor)) > MAX_BYTES:
        return f"{t} holds {size} bytes, more than the {MAX_BYTES} (2**48) that can be addressed"
    return None


def check_sizes(module: ModuleOp) -> None:
    """Raises :class:`LocatedVerifyException` at the first op whose result, block
    argument or signature has a tensor type of more than :data:`MAX_BYTES` bytes."""
    checked = AttributeSet()

    def check(op: Operation, what: str, types: list[Attribute]) -> None:
        for t in types:
            if t not in checked:
                if (error := size_error(t)) is not None:
                    raise LocatedVerifyException(op, f"{op.name}: {what}: {error}")
                checked.add(t)

    for op in module.walk():
        check(op, "result type", [r.type for r in op.results])
        for region in op.regions:
            for block in region.blocks:
                check(op, "block argument type", [a.type for a in block.args])
        if isinstance(op, FuncOp):
            signature = op.function_type
            check(op, "signature", [*signature.inputs.data, *signature.outputs.data])
