"""What a partitioned program communicates: one :class:`CollectiveInfo` per collective.

``low.collectives()`` reports these. ``nbytes`` is the local operand size for
all_reduce / all_to_all / collective_permute / broadcast (and send / recv), the gathered
result for all_gather and the unscattered input for reduce_scatter. ``all_slice`` moves
no data and is not listed, nor is a collective_permute whose pairs all keep a rank's
own value (``[[r, r], ...]``). A collective_permute's ``pairs`` say which group
positions receive (the targets of its pairs whose source is another rank).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp

from tessera.ir import graph, schedule
from tessera.ir.abstract import AbstractTensor

Pairs = tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class CollectiveInfo:
    """One communicating collective of a partitioned function."""

    kind: str  # all_reduce, all_gather, reduce_scatter, all_to_all, collective_permute, broadcast
    mesh_axes: tuple[str, ...]
    group_size: int
    shape: tuple[int, ...]  # the local operand shape
    dtype: str  # f32, bf16...
    nbytes: int
    pairs: Pairs = ()  # collective_permute: (source, target) positions in each group

    @property
    def receivers(self) -> tuple[int, ...] | None:
        """Group positions that receive data: a collective_permute's targets of another
        rank's value; None for a collective every member takes part in."""
        if self.kind != "collective_permute":
            return None
        return tuple(sorted(t for s, t in self.pairs if s != t))


def describe(op: graph.CollectiveOp | schedule.StartOp, group_size: int) -> CollectiveInfo | None:
    """The :class:`CollectiveInfo` of a graph collective or a ``schedule.start`` over a
    group of ``group_size`` ranks, or None when it moves no data."""
    if isinstance(op, schedule.StartOp):
        kind, result = op.collective_name, op.handle.type.tensor
    else:
        kind, result = op.name.removeprefix("graph."), op.result.type
    attrs = op.attrs()
    pairs: Pairs = tuple((int(s), int(t)) for s, t in attrs.get("pairs", ()))
    if kind == "all_slice" or (kind == "collective_permute" and all(s == t for s, t in pairs)):
        return None
    operand = AbstractTensor.from_xdsl(op.input.type)
    moved = AbstractTensor.from_xdsl(result) if kind == "all_gather" else operand
    return CollectiveInfo(
        kind=kind,
        mesh_axes=tuple(attrs["axes"]),
        group_size=group_size,
        shape=operand.shape,
        dtype=operand.dtype.value,
        nbytes=moved.nbytes,
        pairs=pairs,
    )


def collectives(module: ModuleOp) -> list[CollectiveInfo]:
    """The communicating collectives of every partitioned function, in program order:
    graph collectives, or the ``schedule.start`` ops of a scheduled function. A region's
    are listed once per call of it."""
    infos = []
    mesh = next((dict(o.axes) for o in module.ops if isinstance(o, graph.MeshOp)), {})
    runs = _runs(module)
    for function in module.walk():
        if not isinstance(function, func.FuncOp) or graph.PARTITIONED not in function.attributes:
            continue
        for op in [o for o in function.walk()] * runs.get(function.sym_name.data, 1):
            started = isinstance(op, schedule.StartOp) and op.input is not None  # not a recv
            if not started and not isinstance(op, graph.CollectiveOp):
                continue
            group_size = math.prod(mesh.get(a, 1) for a in op.attrs()["axes"])
            info = describe(op, group_size)
            if info is not None:
                infos.append(info)
    return infos


def _runs(module: ModuleOp) -> dict[str, int]:
    """How many times each function runs per call of the program: a function no call
    names once, a callee once per call of it (a scan's step once per step) in each run
    of its callers."""
    calls: dict[str, list[str]] = {}  # caller -> its callees, once per call
    for function in module.ops:
        if isinstance(function, func.FuncOp):
            calls[function.sym_name.data] = [
                op.callee.root_reference.data  # type: ignore[union-attr]
                for op in function.walk()
                if isinstance(op, graph.CallOp | func.CallOp | graph.ScanOp | schedule.ScanOp)
                for _ in range(op.steps if isinstance(op, graph.ScanOp | schedule.ScanOp) else 1)
            ]
    runs: dict[str, int] = {}

    def count(name: str) -> int:  # regions do not recurse
        if name not in runs:
            callers = [(c, cs.count(name)) for c, cs in calls.items() if name in cs]
            runs[name] = sum(n * count(c) for c, n in callers) if callers else 1
        return runs[name]

    for name in calls:
        count(name)
    return runs
