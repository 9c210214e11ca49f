"""``ShardSpec``: how a tensor is laid out over a mesh, as users write it.

``ShardSpec(partition=("row", "col"), mesh_axes=("tp", "dp"))`` splits dim 0 over ``tp``
and dim 1 over ``dp``. An entry of ``mesh_axes`` may be a tuple of axes (the dim is split
over all of them, major first), and a dim may be listed twice to the same effect.
``ShardSpec(replicate=True)`` keeps every dim whole on every device.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tessera.errors import ShardingError
from tessera.frontend import pytree
from tessera.ir.mesh import Mesh
from tessera.ir.sharding import Sharding

_NAMED_DIMS = {"row": 0, "col": 1}


def check_shard_specs(specs: object, what: str) -> None:
    """A ShardingError unless every leaf of the pytree ``specs`` (None: "let Tessera
    choose") is a ShardSpec; ``what`` names the option (``ts.jit: in_shardings``)."""
    leaves, _ = pytree.flatten(specs)
    for leaf in leaves:
        if not isinstance(leaf, ShardSpec):
            raise ShardingError(
                f"{what} must hold dist.ShardSpec values or None, found "
                f"{type(leaf).__name__} {leaf!r} (dim 0 split over 'dp' is "
                f"dist.ShardSpec(partition=(0,), mesh_axes=('dp',)))"
            )


def _partition(partition: object) -> tuple[int | str, ...]:
    """``partition`` as a tuple of dim indices (ints) and dim names ('row', 'col')."""
    entries = (partition,) if isinstance(partition, (int, str)) else partition
    if not isinstance(entries, Sequence):
        raise ShardingError(
            f"ShardSpec: partition must be a sequence of dims (ints, 'row' or 'col'), "
            f"found {partition!r}"
        )
    for entry in entries:
        named = isinstance(entry, str) and entry in _NAMED_DIMS
        if not named and (not isinstance(entry, (int, np.integer)) or isinstance(entry, bool)):
            raise ShardingError(
                f"ShardSpec: each partition entry must be a dim index (an int) or 'row' / "
                f"'col', found {entry!r} in partition={partition!r}"
            )
    return tuple(e if isinstance(e, str) else int(e) for e in entries)


def _mesh_axes(mesh_axes: object) -> tuple[str | tuple[str, ...], ...]:
    """``mesh_axes`` as a tuple of axis names or non-empty tuples of them."""
    entries = (mesh_axes,) if isinstance(mesh_axes, str) else mesh_axes
    if not isinstance(entries, Sequence):
        raise ShardingError(
            f"ShardSpec: mesh_axes must be a sequence of axis names, found {mesh_axes!r}"
        )
    normalized: list[str | tuple[str, ...]] = []
    for entry in entries:
        axes = (entry,) if isinstance(entry, str) else entry
        if not isinstance(axes, Sequence) or not all(isinstance(a, str) for a in axes):
            raise ShardingError(
                f"ShardSpec: each mesh_axes entry must be an axis name or a tuple of them, "
                f"found {entry!r} in mesh_axes={mesh_axes!r}"
            )
        normalized.append(entry if isinstance(entry, str) else tuple(entry))
    return tuple(normalized)


@dataclass(frozen=True, init=False)
class ShardSpec:
    """A tensor's layout: which dims are split over which mesh axes."""

    partition: tuple[int | str, ...]
    mesh_axes: tuple[str | tuple[str, ...], ...]
    replicate: bool

    def __init__(
        self,
        partition: Sequence[int | str] = (),
        mesh_axes: Sequence[str | Sequence[str]] = (),
        replicate: bool = False,
    ):
        if not isinstance(replicate, bool):
            raise ShardingError(f"ShardSpec: replicate must be True or False, found {replicate!r}")
        partition = _partition(partition)
        normalized = _mesh_axes(mesh_axes)
        if replicate and (partition or normalized):
            raise ShardingError("ShardSpec(replicate=True) takes no partition or mesh_axes")
        if len(partition) != len(normalized):
            raise ShardingError(
                f"ShardSpec needs one mesh axis (or tuple of axes) per partitioned dim: "
                f"partition={list(partition)} but mesh_axes={list(normalized)}"
            )
        object.__setattr__(self, "partition", partition)
        object.__setattr__(self, "mesh_axes", normalized)
        object.__setattr__(self, "replicate", replicate)

    @staticmethod
    def from_sharding(sharding: Sharding) -> ShardSpec:
        """The spec of a (non-partial) :class:`Sharding`."""
        split = [(dim, axes) for dim, axes in enumerate(sharding.dims) if axes]
        if not split:
            return ShardSpec(replicate=True)
        return ShardSpec(tuple(d for d, _ in split), tuple(a for _, a in split))

    def to_sharding(self, mesh: Mesh, shape: Sequence[int], name: str = "tensor") -> Sharding:
        """The per-dim sharding of a tensor of ``shape``; raises ShardingError if invalid."""
        rank = len(shape)
        dims: list[list[str]] = [[] for _ in range(rank)]
        split_by: dict[str, int] = {}  # mesh axis -> the dim it splits
        for entry, axes in zip(self.partition, self.mesh_axes, strict=True):
            dim = _NAMED_DIMS[entry] if isinstance(entry, str) else entry  # checked in __init__
            if not -rank <= dim < rank:
                raise ShardingError(
                    f"{name}: partition dim {entry!r} (split over {axes!r}) is out of range for "
                    f"a tensor of rank {rank} (shape {list(shape)})"
                )
            dim %= rank
            for axis in (axes,) if isinstance(axes, str) else axes:
                if axis not in mesh.axis_names:
                    raise ShardingError(
                        f"{name}: dim {dim} is split over unknown mesh axis {axis!r}; "
                        f"the mesh has axes {list(mesh.axis_names)}"
                    )
                if axis in split_by:
                    raise ShardingError(
                        f"{name}: mesh axis {axis!r} splits dim {split_by[axis]} and again dim "
                        f"{dim}; a mesh axis may split a tensor only once"
                    )
                split_by[axis] = dim
                dims[dim].append(axis)
        sharding = Sharding(tuple(tuple(d) for d in dims))
        sharding.validate(mesh, shape, name)
        # an axis of size 1 splits nothing: dropping it keeps trivial collectives out
        return Sharding(tuple(tuple(a for a in d if mesh.axis_size(a) > 1) for d in dims))
