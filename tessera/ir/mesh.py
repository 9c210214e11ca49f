"""Device meshes: devices arranged in an n-d grid with named axes.

``Mesh(axes=["dp", "tp"], shape=(2, 4))`` puts 8 devices (0..7, row-major) on a 2 × 4
grid; a rank's coordinates along each axis say which shard of a split tensor it owns.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from math import prod
from typing import Any

import numpy as np

from tessera.errors import ShardingError as MeshError
from tessera.errors import TesseraError
from tessera.topology import Topology, load_topology

MAX_DEVICES = 1 << 20  # more devices than any machine: a mistyped size, not a mesh


def _is_int(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _axis_sizes(shape: object, names: Sequence[str]) -> tuple[int, ...]:
    """``shape`` (a sequence of positive ints, or one int for a one-axis mesh) checked."""
    sizes = (shape,) if _is_int(shape) else shape
    if isinstance(sizes, (str, bytes)) or not isinstance(sizes, Iterable):
        raise MeshError(f"mesh shape must be a sequence of ints, found {shape!r}")
    sizes = tuple(sizes)
    for size in sizes:
        if not _is_int(size):
            raise MeshError(
                f"mesh axis sizes must be ints, found {size!r} ({type(size).__name__}) in "
                f"shape {list(sizes)}"
            )
    if len(sizes) != len(names):
        raise MeshError(f"mesh has {len(names)} axes {list(names)} but shape {list(sizes)}")
    if any(s < 1 for s in sizes):
        raise MeshError(f"mesh axis sizes must be positive, found {list(sizes)}")
    if prod(sizes) > MAX_DEVICES:
        raise MeshError(
            f"mesh shape {list(sizes)} has {prod(sizes)} devices, more than {MAX_DEVICES}"
        )
    return tuple(int(s) for s in sizes)


def default_machine(size: int) -> Topology:
    """The machine a mesh of ``size`` ranks naming no topology compiles for: enough DGX H100s."""
    nodes = -(-size // 8)
    return load_topology("dgx_h100" if nodes == 1 else f"dgx_h100x{nodes}")


def _machine(topology: object, size: int) -> Topology | None:
    """``topology=`` (None, a :class:`Topology`, or a :func:`load_topology` name, alias or
    JSON path) as the machine a mesh of ``size`` ranks runs on; a MeshError if it is not one."""
    if topology is None:
        return None
    if isinstance(topology, str):
        try:
            machine = load_topology(topology)
        except TesseraError as error:
            raise MeshError(f"mesh topology=: {error}") from None
    elif isinstance(topology, Topology):
        machine = topology
    else:
        raise MeshError(
            f"mesh topology must be a preset name, a JSON path or a tessera.topology.Topology, "
            f"found {topology!r} ({type(topology).__name__})"
        )
    if machine.num_devices < size:
        raise MeshError(
            f"mesh of {size} devices does not fit topology {machine.name!r} of "
            f"{machine.num_devices} devices (a multi-node preset: e.g. dgx_h100x{-(-size // 8)})"
        )
    return machine


def _infer_shape(num_devices: int, num_axes: int) -> tuple[int, ...]:
    side = round(num_devices ** (1 / num_axes))
    for candidate in (side - 1, side, side + 1):
        if candidate > 0 and candidate**num_axes == num_devices:
            return (candidate,) * num_axes
    raise MeshError(
        f"cannot infer the shape of a {num_axes}-axis mesh over {num_devices} devices "
        f"(not a perfect power); pass shape=..."
    )


class Mesh:
    """A logical device mesh with named axes (major to minor)."""

    def __init__(
        self,
        axes: Sequence[str],
        shape: Sequence[int] | None = None,
        devices: Iterable[Any] | None = None,
        topology: str | Topology | None = None,
    ):
        if not isinstance(axes, (str, Iterable)):
            raise MeshError(f"mesh axes must be a sequence of names, found {axes!r}")
        names = tuple(axes) if not isinstance(axes, str) else (axes,)
        if not names:
            raise MeshError("a mesh needs at least one axis")
        for name in names:
            if not isinstance(name, str) or not name.isidentifier():
                raise MeshError(f"mesh axis names must be identifiers, found {name!r}")
        if len(set(names)) != len(names):
            raise MeshError(f"mesh axis names must be distinct, found {list(names)}")
        if devices is not None and not isinstance(devices, Iterable):
            raise MeshError(f"mesh devices must be a sequence, found {devices!r}")
        device_list = list(devices) if devices is not None else None
        if shape is None:
            if device_list is None:
                raise MeshError("give the mesh a shape=... or devices=...")
            shape = _infer_shape(len(device_list), len(names))
        sizes = _axis_sizes(shape, names)
        if device_list is None:
            device_list = list(range(prod(sizes)))
        if len(device_list) != prod(sizes):
            raise MeshError(
                f"mesh shape {list(sizes)} needs {prod(sizes)} devices, found {len(device_list)}"
            )
        try:
            distinct = len(set(device_list)) == len(device_list)
        except TypeError:  # unhashable device objects: not checked
            distinct = True
        if not distinct:
            raise MeshError(f"mesh devices must be distinct, found {device_list}")
        self.axis_names = names
        self.shape = sizes
        self.devices = np.array(device_list, dtype=object).reshape(sizes)
        # the machine the cost model prices (None: the compiler's default, a DGX H100)
        self.topology: Topology | None = _machine(topology, prod(sizes))
        # the text that rebuilds it (the graph.mesh symbol's topology), or None
        self.topology_spec: str | None = None if self.topology is None else self.topology.spec()

    @property
    def size(self) -> int:
        return prod(self.shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def layout(self) -> str:
        """Human-readable layout, e.g. ``tp × dp mesh, 4 × 4``."""
        return f"{' × '.join(self.axis_names)} mesh, {' × '.join(map(str, self.shape))}"

    def machine(self, topology: str = "") -> Topology:
        """The machine the cost model prices this mesh on: ``topology`` (a
        :func:`load_topology` name, as a pass option gives it) when given, else the mesh's
        ``topology=``, else as many DGX H100 nodes as the mesh needs (``dgx_h100`` up to 8 ranks)."""
        if topology:
            return load_topology(topology)
        if self.topology is not None:
            return self.topology
        return default_machine(self.size)

    def priced_on(self, topology: str) -> Mesh:
        """This mesh; or, where it names no topology and ``topology`` (a
        :func:`load_topology` name, as a pass option gives it) is given, the same axes on
        that machine (``schedule.options(topology=...)`` reaching the sharding passes)."""
        if not topology or self.topology is not None:
            return self
        return Mesh(list(self.axis_names), list(self.shape), topology=topology)

    def axis_size(self, axis: str) -> int:
        return self.shape[self.axis_index(axis)]

    def axis_index(self, axis: str) -> int:
        if axis not in self.axis_names:
            raise MeshError(f"unknown mesh axis {axis!r}; the mesh has axes {list(self.axis_names)}")
        return self.axis_names.index(axis)

    def coords(self, rank: int) -> dict[str, int]:
        """The coordinates of ``rank`` (row-major over the axes)."""
        if not 0 <= rank < self.size:
            raise MeshError(f"rank {rank} is out of range for a mesh of {self.size} devices")
        index = np.unravel_index(rank, self.shape)
        return {a: int(i) for a, i in zip(self.axis_names, index, strict=True)}

    def rank(self, coords: dict[str, int]) -> int:
        index = tuple(coords[a] for a in self.axis_names)
        return int(np.ravel_multi_index(index, self.shape))

    def groups(self, axes: Sequence[str]) -> list[list[int]]:
        """Rank groups that vary only along ``axes`` (the process groups of a collective).

        Within a group, ranks are ordered by their coordinates along ``axes`` (major first).
        """
        for axis in axes:
            self.axis_index(axis)
        others = [a for a in self.axis_names if a not in axes]
        groups: dict[tuple[int, ...], list[tuple[tuple[int, ...], int]]] = {}
        for rank in range(self.size):
            c = self.coords(rank)
            key = tuple(c[a] for a in others)
            groups.setdefault(key, []).append((tuple(c[a] for a in axes), rank))
        return [[rank for _, rank in sorted(members)] for _, members in sorted(groups.items())]

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Mesh)
            and (self.axis_names, self.shape) == (other.axis_names, other.shape)
            and self.devices.tolist() == other.devices.tolist()
            and self.topology_spec == other.topology_spec
        )

    def __hash__(self) -> int:
        return hash((self.axis_names, self.shape, str(self.devices.tolist()), self.topology_spec))

    def __repr__(self) -> str:
        axes = ", ".join(f"{a}={s}" for a, s in zip(self.axis_names, self.shape, strict=True))
        if self.topology is None or self.topology_spec is None:
            return f"Mesh({axes})"
        if self.topology_spec == self.topology.name:
            return f"Mesh({axes}, topology={self.topology_spec!r})"
        digest = hashlib.sha256(self.topology_spec.encode()).hexdigest()[:12]
        return f"Mesh({axes}, topology=<{self.topology.name} {digest}>)"


def mesh(
    devices: Iterable[Any] | None = None,
    axes: Sequence[str] = ("dp",),
    shape: Sequence[int] | None = None,
    topology: str | Topology | None = None,
) -> Mesh:
    """``dist.mesh(devices, axes, shape)``: the NVL72 guide's spelling of :class:`Mesh`;
    ``dist.mesh({"dp": 2, "tp": 4})`` names the axes and their sizes in one mapping.
    ``topology=`` names the machine (a preset such as ``"gb200_nvl72"``, a JSON path, or a
    :class:`~tessera.topology.Topology`) whose cost model compiles for it."""
    if isinstance(devices, Mapping):
        if shape is not None or tuple(axes) != ("dp",):
            raise MeshError("give either a mapping of axis sizes or devices, axes and shape, not both")
        return Mesh(axes=list(devices), shape=list(devices.values()), topology=topology)
    return Mesh(axes=axes, shape=shape, devices=devices, topology=topology)
