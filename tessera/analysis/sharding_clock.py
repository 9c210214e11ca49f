"""Time for the sharding decisions: a mesh's machine prices moves and compute alike.

``op_sharding`` compares candidate layouts by modelled time per rank on the machine the
mesh runs on (``Mesh.machine()``: its ``topology=``, else enough DGX H100 nodes):

- a collective (a reshard step over mesh axes, a block move's permutes) takes the time
  of :mod:`tessera.analysis.collective_cost`'s alpha-beta model for its kind, size and
  process groups, with the algorithm ``choose-collective-algorithms`` will pick (ring,
  tree, NVLS, hierarchical: the fastest that applies to every group; the slowest group
  decides): latency included, so that a tiny tensor's collectives weigh their count;
- a matmul's multiply-adds per rank run at the device's peak rate for its item size
  times the device's matmul efficiency (the roofline's compute term): work left unsplit
  is repeated on every rank and costs its full time.

So gathering a weight where an all-reduce would do, which repeats the matmul on every
rank, loses when the repeated compute takes longer than the collective saves; a move
across nodes weighs what its slower link makes it; and at a small batch, one
collective moving more bytes may beat two moving fewer.

A mesh naming no ``topology=`` is priced on its default DGX H100s with link latency left
out (:func:`without_latency`): collectives cost their bytes and compute its time, as at
full size, so a small program (a test, an example, a toy standing for a large model)
gets the layouts its full-size version would, and its choices do not flip with its
sizes. Name the machine (``dist.mesh(..., topology="dgx_h100")``) to price latency too:
then a few kilobytes may be gathered where gigabytes would be reduced, because one
collective's latency outweighs their bytes.

Overlap, in part: ``overlap-comm`` starts a collective when its operand is made and waits
where its result is first read, so the moves of an op's *results* (a partial sum's
reduction, a reshard to the split its users want) run while the matmuls between the op
and that first reader compute. ``op_sharding`` credits them that compute
(``Decisions.overlap``: each matmul's multiply-adds split over the whole mesh, the least
it can take per rank): a weight gradient reduced while the rest of the backward runs is
priced at what it leaves exposed. Not credited: moves of operands (a gather waits for its
operand and is read at once, unless prefetched, which gathered weights would pay for in
memory), and several moves under one window, which share the link, are each credited
with all of it.

Times are given in bytes of the machine's fastest link (seconds × its bandwidth),
rounded to whole units (about 2 ps on NVLink): sums of them are exact, so equal choices
compare equal whatever the order of their terms (no rounding of divided floats decides
a tie). ``op_sharding`` breaks ties by the bytes moved, then by memory per rank.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from functools import cached_property
from math import prod

from tessera.analysis.collective_cost import groups_time
from tessera.ir.mesh import default_machine
from tessera.ir.sharding import MeshLike
from tessera.topology import Topology

DTYPE_OF_ITEMSIZE = {8: "f32", 4: "f32", 2: "bf16", 1: "fp8"}  # f64 priced as f32


def without_latency(machine: Topology) -> Topology:
    """``machine`` with every link's and the switch's latency zero: a collective costs its
    bytes only (the sharding clock of a mesh naming no topology)."""
    sharp = machine.sharp and replace(machine.sharp, latency_s=0.0)
    levels = tuple(replace(link, latency_s=0.0) for link in machine.levels)
    return replace(machine, name=f"{machine.name} without latency", levels=levels, sharp=sharp)


class ShardingClock:
    """The time model of one mesh's machine for ``op_sharding``'s costs."""

    def __init__(self, mesh: MeshLike):
        self.mesh = mesh
        self._groups: dict[tuple[str, ...], list[list[int]]] = {}
        self._times: dict[tuple[str, tuple[str, ...], float], float] = {}

    @cached_property
    def machine(self) -> Topology:
        """The mesh's named machine; else its default machine without link latency."""
        machine = getattr(self.mesh, "machine", None)
        if callable(machine) and getattr(self.mesh, "topology", None) is not None:
            return machine()
        return without_latency(default_machine(self.size))

    @cached_property
    def size(self) -> int:
        return prod(self.mesh.axis_size(a) for a in self.mesh.axis_names)

    @cached_property
    def key(self) -> object:
        """What the prices depend on besides the axes' sizes (for caches)."""
        return getattr(self.mesh, "topology_spec", None) or self.machine.name

    def groups(self, axes: Sequence[str]) -> list[list[int]]:
        """The process groups of a collective over ``axes`` on the machine's devices (mesh
        rank ``r`` on device ``r``). A mesh of axis sizes only, or one larger than the
        machine, is taken as spread over the machine: one group of ranks evenly strided
        over it (the level holding the whole mesh)."""
        key = tuple(axes)
        found = self._groups.get(key)
        if found is None:
            groups = getattr(self.mesh, "groups", None)
            devices = self.machine.num_devices
            if callable(groups) and self.size <= devices:
                found = groups(list(axes))
            else:
                n = prod(self.mesh.axis_size(a) for a in axes)
                span = min(self.size, devices)
                found = [list(range(0, span, max(span // n, 1)))[:n]]
            self._groups[key] = found
        return found

    @cached_property
    def unit(self) -> float:
        """Bytes per second of the fastest link: the time unit is one byte over it."""
        return max((link.bandwidth for link in self.machine.levels), default=1.0)

    def collective(self, kind: str, axes: Sequence[str], nbytes: float) -> float:
        """The time of collective ``kind`` of size ``nbytes`` (``collective_cost``'s
        ``S``) over ``axes``, with its fastest algorithm (memoized)."""
        key = (kind, tuple(axes), nbytes)
        found = self._times.get(key)
        if found is None:
            groups = self.groups(axes)
            if not self.machine.levels or len(groups[0]) < 2:
                found = 0.0
            else:
                cost = groups_time(self.machine, kind, int(nbytes), groups)
                found = self._units(cost.time_s)
            self._times[key] = found
        return found

    def permutes(self, axes: Sequence[str], nbytes: float, count: int) -> float:
        """The time of ``count`` collective permutes over ``axes`` of which the busiest
        rank receives ``nbytes`` in all: ``count`` latencies and the bytes once."""
        if count == 0:
            return 0.0
        empty = self.collective("collective_permute", axes, 0)
        return self.collective("collective_permute", axes, nbytes) + (count - 1) * empty

    def compute(self, multiply_adds: float, itemsize: int) -> float:
        """The time of ``multiply_adds`` (two FLOPs each) of a matmul of ``itemsize``-byte
        items at the device's matmul rate."""
        device = self.machine.device
        dtype = DTYPE_OF_ITEMSIZE.get(itemsize, "f32")
        peak = device.matmul_flops.get(dtype) or max(device.matmul_flops.values())
        return self._units(2 * multiply_adds / (peak * device.matmul_efficiency))

    def seconds(self, time: float) -> float:
        """A time of this clock in seconds."""
        return time / self.unit

    def _units(self, seconds: float) -> float:
        return float(round(seconds * self.unit))
