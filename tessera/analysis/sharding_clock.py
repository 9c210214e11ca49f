"""Seconds for the sharding decisions: a mesh's machine prices moves and compute alike.

``op_sharding`` compares candidate layouts by modelled time per rank on the machine the
mesh runs on (``Mesh.machine()``: its ``topology=``, else enough DGX H100 nodes):

- a reshard step over mesh axes moves its ring bytes received per rank (``reshard``)
  over the link of the smallest topology level holding one of its groups (NVLink inside
  a node, InfiniBand across): ``bytes / bandwidth`` (the beta term of the alpha-beta
  model of ``tessera.perf.collective_cost``; the per-collective latency is kept a
  tie-break, ``ALPHA_BYTES``, so that tiny tensors still weigh their bytes);
- a matmul's multiply-adds per rank run at the device's peak rate for its item size
  times the device's matmul efficiency (the roofline's compute term): work left unsplit
  is repeated on every rank and costs its full time.

So gathering a weight where an all-reduce would do, which repeats the matmul on every
rank, loses when the repeated compute takes longer than the bytes it saves, and a
move across nodes weighs what its slower link makes it.

Times are given in bytes of the machine's fastest link (seconds × its bandwidth): a move
over that link costs exactly its bytes, so equal moves compare equal (no rounding of
divided floats decides a tie).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property
from math import prod

from tessera.ir.mesh import default_machine
from tessera.ir.sharding import MeshLike
from tessera.topology import Link, Topology

DTYPE_OF_ITEMSIZE = {8: "f32", 4: "f32", 2: "bf16", 1: "fp8"}  # f64 priced as f32


class ShardingClock:
    """The time model of one mesh's machine for ``op_sharding``'s costs."""

    def __init__(self, mesh: MeshLike):
        self.mesh = mesh
        self._links: dict[tuple[str, ...], Link] = {}

    @cached_property
    def machine(self) -> Topology:
        machine = getattr(self.mesh, "machine", None)
        if callable(machine):
            return machine()
        size = prod(self.mesh.axis_size(a) for a in self.mesh.axis_names)
        return default_machine(size)

    @cached_property
    def key(self) -> object:
        """What the prices depend on besides the axes' sizes (for caches)."""
        return getattr(self.mesh, "topology_spec", None) or self.machine.name

    def link(self, axes: Sequence[str]) -> Link | None:
        """The link a collective over ``axes`` runs on (None on a machine of one device)."""
        key = tuple(axes)
        found = self._links.get(key)
        if found is None:
            machine = self.machine
            if not machine.levels:
                return None
            groups = getattr(self.mesh, "groups", None)
            if callable(groups):
                level = machine.level_of(groups(list(axes))[0])
            else:  # axis sizes only: the level holding the whole mesh
                size = prod(self.mesh.axis_size(a) for a in self.mesh.axis_names)
                level = machine.level_of(range(min(size, machine.num_devices)))
            found = self._links[key] = machine.levels[level]
        return found

    @cached_property
    def unit(self) -> float:
        """Bytes per second of the fastest link: the time unit is one byte over it."""
        return max((link.bandwidth for link in self.machine.levels), default=1.0)

    def move_time(self, axes: Sequence[str], nbytes: float) -> float:
        """The time to receive ``nbytes`` per rank over the link of ``axes``."""
        link = self.link(axes)
        if link is None:
            return 0.0
        return nbytes if link.bandwidth == self.unit else nbytes * (self.unit / link.bandwidth)

    def multiply_add_time(self, itemsize: int) -> float:
        """The time of one multiply-add (two FLOPs) of a matmul of ``itemsize``-byte items."""
        device = self.machine.device
        dtype = DTYPE_OF_ITEMSIZE.get(itemsize, "f32")
        peak = device.matmul_flops.get(dtype) or max(device.matmul_flops.values())
        return 2 * self.unit / (peak * device.matmul_efficiency)
