"""Simulates a scheduled program on a topology: per-rank streams, step time, a timeline.

Every rank of the mesh runs the scheduled function (``lower-graph-to-schedule`` and the
schedule passes) on device ``rank`` of the topology, with one compute stream and the
communication streams its starts name (``comm`` by default). Ops are issued in program
order, as the runtime issues them (``torch.distributed`` with ``async_op=True``):

- a kernel runs on the compute stream after the previous kernel, for
  ``compute_cost.kernel_time``;
- a start queues its collective on its stream after the work already issued to the
  compute stream (so after its operand's producer) and after the stream's previous
  collective; the group's ranks start it together, when the last of them is ready, and it
  takes ``collective_cost.collective_time`` for its group (the time of the start's
  ``algorithm`` when ``choose-collective-algorithms`` set one the topology has, else
  of the fastest algorithm);
- a wait makes the compute stream wait until the collective ends.

The step time T is when the last rank finishes. The exposed-communication fraction is
``E = (T − T_compute_only) / T_comm``, with ``T_compute_only`` the step time of the same
schedule with free communication and ``T_comm`` the communication time of the busiest
rank: 1 for a serial schedule, 0 when all communication hides behind compute.
:meth:`Simulation.save_trace` writes a Chrome-trace / Perfetto JSON timeline (one process
per rank, one thread per stream).
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Operation, SSAValue

from tessera import numerics as numerics_policy
from tessera.errors import TesseraError
from tessera.ir import schedule
from tessera.ir.abstract import AbstractTensor, aval
from tessera.ir.mesh import Mesh
from tessera.ir.reduction_kinds import rounds
from tessera.perf.collective_cost import CollectiveCost, algorithms_for, collective_time
from tessera.perf.compute_cost import kernel_bytes, kernel_flops, kernel_time
from tessera.perf.trace import COMPUTE, Event, chrome_trace, save_json
from tessera.topology import Topology, dgx_h100, load_topology, single_gpu


@dataclass(frozen=True)
class Simulation:
    """The simulated step of one scheduled program on one topology."""

    topology: str
    events: tuple[Event, ...]
    step_time_s: float  # T
    compute_only_s: float  # T with free communication
    comm_time_s: float  # communication time of the busiest rank

    @property
    def exposed_fraction(self) -> float:
        """E = (T − T_compute_only) / T_comm (0 without communication)."""
        if self.comm_time_s == 0:
            return 0.0
        return (self.step_time_s - self.compute_only_s) / self.comm_time_s

    @property
    def exposed_comm_s(self) -> float:
        return self.step_time_s - self.compute_only_s

    def rank_events(self, rank: int) -> list[Event]:
        return [e for e in self.events if e.rank == rank]

    def trace(self) -> dict[str, Any]:
        """The timeline as a Chrome-trace object (``traceEvents``, times in µs)."""
        return chrome_trace(
            self.events,
            {
                "topology": self.topology,
                "step_time_us": self.step_time_s * 1e6,
                "compute_only_us": self.compute_only_s * 1e6,
                "comm_time_us": self.comm_time_s * 1e6,
                "exposed_fraction": self.exposed_fraction,
            },
        )

    def save_trace(self, path: str | os.PathLike[str]) -> None:
        """Writes :meth:`trace` as JSON (open it in https://ui.perfetto.dev or chrome://tracing)."""
        save_json(self.trace(), path)

    def summary(self) -> str:
        return (
            f"{self.topology}: step {self.step_time_s * 1e3:.3f} ms, compute only "
            f"{self.compute_only_s * 1e3:.3f} ms, communication {self.comm_time_s * 1e3:.3f} ms, "
            f"exposed fraction E = {self.exposed_fraction:.2f}"
        )


def default_topology(mesh: Mesh | None) -> Topology:
    """The mesh's ``topology=``, else enough DGX H100s for it."""
    if mesh is not None and mesh.topology is not None:
        return mesh.topology
    size = mesh.size if mesh is not None else 1
    return single_gpu() if size == 1 else dgx_h100(nodes=-(-size // 8))


def simulate(
    module: ModuleOp,
    name: str,
    mesh: Mesh | None,
    topology: Topology | str | None = None,
    numerics: str | None = None,
    only: Collection[Operation] | None = None,
) -> Simulation:
    """Simulates ``@name`` of a scheduled ``module`` over ``mesh`` on ``topology``, its
    reductions as the ``numerics`` mode runs them (default: the mode in force).

    ``only``: the ops of ``@name`` to run (say, the forward part of a gradient program:
    the ops its forward result depends on); by default all of them."""
    deterministic = (numerics_policy.mode() if numerics is None else numerics) == "deterministic"
    if topology is None:
        topology = default_topology(mesh)
    elif isinstance(topology, str):
        topology = load_topology(topology)
    function = next(
        (o for o in module.ops if isinstance(o, func.FuncOp) and o.sym_name.data == name), None
    )
    if function is None:
        raise TesseraError(f"simulate: no function @{name} in the scheduled module")
    ranks = mesh.size if mesh is not None else 1
    if ranks > topology.num_devices:
        raise TesseraError(
            f"simulate: the mesh has {ranks} ranks but topology {topology.name!r} has only "
            f"{topology.num_devices} devices"
        )
    timed = _Run(function, mesh, topology, ranks, deterministic, False, only)
    free = _Run(function, mesh, topology, ranks, deterministic, True, only)
    return Simulation(
        topology=topology.name,
        events=tuple(timed.events),
        step_time_s=timed.end(),
        compute_only_s=free.end(),
        comm_time_s=max(timed.comm_busy),
    )


def _ordered(kind: str, attrs: dict) -> bool:
    """Whether collective ``kind`` reduces terms in a fixed order in the deterministic
    numerics (its reduction rounds: sum, mean, prod)."""
    return kind in ("all_reduce", "reduce_scatter") and rounds(attrs.get("kind"))


def _ordered_cost(
    topology: Topology, kind: str, nbytes: int, ranks: Sequence[int]
) -> CollectiveCost:
    """A sum, mean or product in the deterministic numerics (:mod:`tessera.numerics`): an
    all-gather of every member's operand (``n`` times the operand), each rank combining
    them in order."""
    gathered = collective_time(topology, "all_gather", nbytes * len(ranks), ranks)
    return CollectiveCost(gathered.time_s, "ordered")


class _Run:
    """One pass over the program, all ranks in program order."""

    def __init__(
        self,
        function: func.FuncOp,
        mesh: Mesh | None,
        topology: Topology,
        ranks: int,
        deterministic: bool,
        free_communication: bool,
        only: Collection[Operation] | None = None,
    ):
        self.topology = topology
        self.deterministic = deterministic  # sums over ranks added in mesh order
        self.mesh = mesh
        self.ranks = ranks
        self.free = free_communication
        self.events: list[Event] = []
        self.compute = [0.0] * ranks  # when each rank's compute stream is free
        self.streams: dict[str, list[float]] = defaultdict(lambda: [0.0] * ranks)
        self.ready: dict[SSAValue, list[float]] = {}
        self.comm_busy = [0.0] * ranks
        self._kernel_times: dict[str, float] = {}
        module = function.parent_op()
        self.functions = {
            f.sym_name.data: f for f in (module.ops if module is not None else ()) if isinstance(f, func.FuncOp)
        }  # fmt: skip
        self._run(function, only)

    def _run(
        self, function: func.FuncOp, only: Collection[Operation] | None = None
    ) -> list[SSAValue]:
        """Simulates ``function``'s ops (those in ``only``, where given) in order; returns
        the values it returns."""
        for op in function.body.block.ops:
            if only is not None and op not in only and not isinstance(op, func.ReturnOp):
                continue
            if isinstance(op, schedule.KernelOp):
                self._kernel(op)
            elif isinstance(op, schedule.StartOp):
                self._start(op)
            elif isinstance(op, schedule.WaitOp):
                self._wait(op)
            elif isinstance(op, func.CallOp):
                self._call(op)
            elif isinstance(op, schedule.ScanOp):
                self._scan(op)
            elif isinstance(op, func.ReturnOp):
                return list(op.operands)
            else:
                raise TesseraError(f"simulate: cannot simulate {op.name} yet")
        return []

    def _scan(self, op: schedule.ScanOp) -> None:
        """A scan: its step's ops ``length`` times, each step's carries ready when the
        previous step made them."""
        callee = self.functions.get(op.callee_name)
        if callee is None:
            raise TesseraError(f"simulate: no function @{op.callee_name}")
        zero = [0.0] * self.ranks
        carries = op.carry_count
        inputs = [self.ready.get(v, zero) for v in op.operands]
        returned: list[SSAValue] = []
        for _ in range(op.steps):
            for argument, ready in zip(callee.body.block.args, inputs, strict=True):
                self.ready[argument] = ready
            returned = self._run(callee)
            inputs[:carries] = [self.ready.get(v, zero) for v in returned[:carries]]
        ends = [self.ready.get(v, zero) for v in returned]
        for result, ready in zip(op.results, ends, strict=True):
            self.ready[result] = ready

    def _call(self, op: func.CallOp) -> None:
        """A region call: the callee's ops, its arguments ready when the operands are."""
        callee = self.functions.get(op.callee.root_reference.data)
        if callee is None:
            raise TesseraError(f"simulate: no function @{op.callee.root_reference.data}")
        zero = [0.0] * self.ranks
        for argument, operand in zip(callee.body.block.args, op.arguments, strict=True):
            self.ready[argument] = self.ready.get(operand, zero)
        returned = self._run(callee)
        for result, value in zip(op.res, returned, strict=True):
            self.ready[result] = self.ready.get(value, zero)

    def end(self) -> float:
        streams = [self.compute, *self.streams.values()]
        return max(max(s) for s in streams) if streams else 0.0

    def _ready(self, value: SSAValue, rank: int) -> float:
        times = self.ready.get(value)
        return times[rank] if times is not None else 0.0

    def _kernel(self, op: schedule.KernelOp) -> None:
        name = op.kernel_name
        if name not in self._kernel_times:
            self._kernel_times[name] = kernel_time(self.topology.device, op)
        duration = self._kernel_times[name]
        args = {"flops": kernel_flops(op), "bytes": kernel_bytes(op)}
        ends = []
        for rank in range(self.ranks):
            start = max([self.compute[rank], *(self._ready(v, rank) for v in op.inputs)])
            end = start + duration
            self.compute[rank] = end
            ends.append(end)
            if not self.free:
                self.events.append(Event(rank, COMPUTE, name, start, end, args))
        for result in op.results:
            self.ready[result] = ends

    def _start(self, op: schedule.StartOp) -> None:
        attrs = op.attrs()
        kind = op.collective_name
        stream = op.stream_name
        axes = tuple(attrs.get("axes", ()))
        result = AbstractTensor.from_xdsl(op.handle.type.tensor)  # type: ignore[attr-defined]
        operand = aval(op.operands[0]) if op.operands else result
        nbytes = result.nbytes if kind == "all_gather" else operand.nbytes
        free_at = self.streams[stream]
        ends = [0.0] * self.ranks
        label = op.label
        for group, priced in self._groups(axes, kind, attrs.get("offset"), attrs.get("pairs")):
            begin = max(
                max(free_at[r], self.compute[r], *self._operand_ready(op, r)) for r in group
            )
            if self.deterministic and _ordered(kind, attrs):
                cost = _ordered_cost(self.topology, kind, nbytes, priced)
            else:
                cost = self._price(kind, nbytes, priced, op.algorithm_name)
            duration = 0.0 if self.free else cost.time_s
            for r in group:
                free_at[r] = ends[r] = begin + duration
                self.comm_busy[r] += duration
                if not self.free:
                    args = {"bytes": nbytes, "algorithm": cost.algorithm, "ranks": list(priced)}
                    self.events.append(Event(r, stream, label, begin, begin + duration, args))
        self.ready[op.handle] = ends

    def _price(
        self, kind: str, nbytes: int, ranks: Sequence[int], algorithm: str | None
    ) -> CollectiveCost:
        """The time of the start's ``algorithm`` (``choose-collective-algorithms``) when the
        cost model has it for these ranks, else of the fastest algorithm (an unannotated
        start, or one chosen for another topology)."""
        if algorithm is not None:
            times = algorithms_for(self.topology, kind, nbytes, ranks)
            if algorithm in times:
                return CollectiveCost(times[algorithm], algorithm)
        return collective_time(self.topology, kind, nbytes, ranks)

    def _operand_ready(self, op: schedule.StartOp, rank: int) -> list[float]:
        return [self._ready(v, rank) for v in op.operands]

    def _groups(
        self,
        axes: Sequence[str],
        kind: str,
        offset: int | None,
        pairs: Sequence[tuple[int, int]] | None,
    ) -> list[tuple[list[int], list[int]]]:
        """(ranks that start together, ranks the cost is priced over) per group: a
        collective_permute is priced over the ranks of its pairs that move data (none:
        it costs nothing)."""
        if self.mesh is None or not axes:
            return [([r], [r]) for r in range(self.ranks)]
        if kind in ("send", "recv"):  # point to point, each rank with its peer
            axis = axes[0]
            size = self.mesh.axis_size(axis)
            pairs = []
            for r in range(self.ranks):
                coords = self.mesh.coords(r)
                coords[axis] = (coords[axis] + (offset or 0)) % size
                pairs.append(([r], [r, self.mesh.rank(coords)]))
            return pairs
        groups = self.mesh.groups(tuple(axes))
        if kind == "collective_permute":
            moving = sorted({p for s, t in pairs or () if s != t for p in (s, t)})
            return [(list(g), [g[p] for p in moving] or [g[0]]) for g in groups]
        return [(list(g), list(g)) for g in groups]

    def _wait(self, op: schedule.WaitOp) -> None:
        done = self.ready.get(op.handle, [0.0] * self.ranks)
        for rank in range(self.ranks):
            self.compute[rank] = max(self.compute[rank], done[rank])
        for result in op.results:
            self.ready[result] = list(done)

