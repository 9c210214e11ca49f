"""What a partitioned program communicates: one :class:`CollectiveInfo` per collective.

``low.collectives()`` reports these. ``nbytes`` is the local operand size for
all_reduce / all_to_all / broadcast (and send / recv), the gathered result for
all_gather and the unscattered input for reduce_scatter. ``all_slice`` moves no data
and is not listed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp

from tessera.ir import graph, schedule
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
    """The communicating collectives of every partitioned function, in program order:
    graph collectives, or the ``schedule.start`` ops of a scheduled function."""
    infos = []
    mesh = next((dict(o.axes) for o in module.ops if isinstance(o, graph.MeshOp)), {})
    for function in module.walk():
        if not isinstance(function, func.FuncOp) or graph.PARTITIONED not in function.attributes:
            continue
        for op in function.walk():
            if isinstance(op, schedule.StartOp) and op.input is not None:
                kind, result = op.collective_name, op.handle.type.tensor
            elif isinstance(op, graph.CollectiveOp) and not isinstance(op, graph.AllSliceOp):
                kind, result = op.name.removeprefix("graph."), op.result.type
            else:
                continue
            operand = AbstractTensor.from_xdsl(op.input.type)
            moved = AbstractTensor.from_xdsl(result) if kind == "all_gather" else operand
            axes = tuple(op.attrs()["axes"])
            infos.append(
                CollectiveInfo(
                    kind=kind,
                    mesh_axes=axes,
                    group_size=math.prod(mesh.get(a, 1) for a in axes),
                    shape=operand.shape,
                    dtype=operand.dtype.value,
                    nbytes=moved.nbytes,
                )
            )
    return infos
