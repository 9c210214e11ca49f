"""What a partitioned program communicates: one :class:`CollectiveInfo` per collective.

``low.collectives()`` reports these. ``nbytes`` is the local operand size for
all_reduce / all_to_all / broadcast (and send / recv), the gathered result for
all_gather and the unscattered input for reduce_scatter. ``all_slice`` moves no data
and is not listed.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp

from tessera.ir import graph
from tessera.ir.abstract import AbstractTensor


@dataclass(frozen=True)
class CollectiveInfo:
    """One communicating collective of a partitioned function."""

    kind: str  # all_reduce, all_gather, reduce_scatter, all_to_all, broadcast
    mesh_axes: tuple[str, ...]
    group_size: int
    shape: tuple[int, ...]  # the local operand shape
    dtype: str  # f32, bf16...
    nbytes: int


def collectives(module: ModuleOp) -> list[CollectiveInfo]:
    """The communicating collectives of every partitioned function, in program order."""
    infos = []
    for function in module.walk():
        if not isinstance(function, func.FuncOp) or graph.PARTITIONED not in function.attributes:
            continue
        for op in function.walk():
            if not isinstance(op, graph.CollectiveOp) or isinstance(op, graph.AllSliceOp):
                continue
            operand = AbstractTensor.from_xdsl(op.input.type)
            moved = (
                AbstractTensor.from_xdsl(op.result.type)
                if isinstance(op, graph.AllGatherOp)
                else operand
            )
            infos.append(
                CollectiveInfo(
                    kind=op.name.removeprefix("graph."),
                    mesh_axes=tuple(op.attrs()["axes"]),
                    group_size=op.group_size() or 1,
                    shape=operand.shape,
                    dtype=operand.dtype.value,
                    nbytes=moved.nbytes,
                )
            )
    return infos
