"""``dist.tensor``: a global array together with its layout over a mesh."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from tessera import environment
from tessera.dist.shard_spec import ShardSpec
from tessera.dtypes import as_dtype
from tessera.errors import ArgumentError, ShardingError
from tessera.ir.mesh import Mesh
from tessera.ir.sharding import Sharding


class DistTensor:
    """A distributed value: global ``data`` laid out over ``mesh`` as ``layout`` says.

    As a ``ts.jit`` argument its layout is the argument's input sharding.
    """

    def __init__(self, data: torch.Tensor, layout: ShardSpec, mesh: Mesh, name: str = "tensor"):
        _check_layout(layout, mesh)
        self._data: torch.Tensor | None = data
        self._shard: tuple[int, torch.Tensor] | None = None  # (rank, piece) when built per rank
        self._whole = ""  # how to get the global value of a per-rank value
        self._shape = tuple(int(d) for d in data.shape)
        self._dtype = data.dtype
        self.layout = layout
        self.mesh = mesh
        self.sharding: Sharding = layout.to_sharding(mesh, self._shape, name)

    @classmethod
    def from_local(
        cls, shard: torch.Tensor, layout: ShardSpec, mesh: Mesh, rank: int | None = None,
        name: str = "tensor", whole: str = "",
    ) -> DistTensor:  # fmt: skip
        """A distributed value known only by this rank's ``shard`` (in a multi-process run,
        where each process builds its own piece). ``rank`` defaults to this process's rank;
        ``whole`` says how to get the global value (in the error :attr:`data` raises)."""
        _check_layout(layout, mesh)
        if rank is None:
            rank = _process_rank()
        shape = list(shard.shape)
        probe = layout.to_sharding(mesh, [mesh.size] * len(shape), name)  # which dims split
        global_shape = tuple(size * probe.shards(mesh, d) for d, size in enumerate(shape))
        value = cls.__new__(cls)
        value._data, value._shard, value._whole = None, (rank, shard), whole
        value._shape, value._dtype = global_shape, shard.dtype
        value.layout, value.mesh = layout, mesh
        value.sharding = layout.to_sharding(mesh, global_shape, name)
        return value

    @property
    def data(self) -> torch.Tensor:
        """The global value (not available for a value built from a local shard)."""
        if self._data is None:
            rank = self._shard[0] if self._shard else "?"
            raise ShardingError(
                self._whole.format(rank=rank)
                or f"this dist.tensor was built from rank {rank}'s local shard: its global "
                f"data is not in this process (use it in a multi-process run)"
            )
        return self._data

    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    @property
    def dtype(self) -> torch.dtype:
        return self._dtype

    def local(self, rank: int) -> torch.Tensor:
        """The shard that ``rank`` holds."""
        if self._shard is not None and self._data is None:
            if rank != self._shard[0]:
                raise ShardingError(
                    f"this dist.tensor holds rank {self._shard[0]}'s shard only, not rank {rank}'s"
                )
            return self._shard[1]
        coords = self.mesh.coords(rank)
        index = []
        for dim, axes in enumerate(self.sharding.dims):
            pieces, position = 1, 0
            for axis in axes:  # major to minor
                size = self.mesh.axis_size(axis)
                position = position * size + coords[axis]
                pieces *= size
            step = self.shape[dim] // pieces
            index.append(slice(position * step, (position + 1) * step))
        return self.data[tuple(index)]

    def with_local(self, shard: torch.Tensor) -> DistTensor:
        """This per-rank value with ``shard`` as its rank's piece (same shape, dtype and
        layout): e.g. a view of the piece in a larger buffer."""
        if self._shard is None or self._data is not None:
            raise ShardingError("with_local: this dist.tensor was not built from a local shard")
        rank, piece = self._shard
        if shard.shape != piece.shape or shard.dtype != piece.dtype:
            raise ShardingError(
                f"with_local: the new shard is {shard.dtype}{list(shard.shape)}, the old "
                f"{piece.dtype}{list(piece.shape)}"
            )
        value = copy.copy(self)
        value._shard = (rank, shard)
        return value

    def __repr__(self) -> str:
        return f"DistTensor(shape={list(self.shape)}, sharding={self.sharding}, {self.mesh})"


def _check_layout(layout: object, mesh: object) -> None:
    if not isinstance(layout, ShardSpec):
        raise ShardingError(
            f"dist.tensor: layout must be a dist.ShardSpec, found {type(layout).__name__} "
            f"{layout!r} (dim 0 split over 'dp' is dist.ShardSpec(partition=(0,), mesh_axes=('dp',)))"
        )
    if not isinstance(mesh, Mesh):
        raise ShardingError(
            f"dist.tensor: mesh must be a dist.Mesh, found {type(mesh).__name__} {mesh!r}"
        )


def _process_rank() -> int:
    import torch.distributed as tdist

    if tdist.is_available() and tdist.is_initialized():
        return tdist.get_rank()
    return environment.rank() or 0


def tensor(
    shape_or_data: Sequence[int] | Any = None,
    layout: ShardSpec | None = None,
    mesh: Mesh | None = None,
    dtype: Any = None,
    *,
    shape: Sequence[int] | None = None,
) -> DistTensor:
    """A distributed tensor from data (array or tensor) or a shape (zeros)."""
    if mesh is None:
        raise ShardingError("dist.tensor needs mesh=...")
    if (shape is None) == (shape_or_data is None):
        raise ShardingError("dist.tensor takes data or a shape (positionally, or as shape=...): give one")
    source = shape if shape is not None else shape_or_data
    torch_dtype = as_dtype(dtype).to_torch() if dtype is not None else None
    if isinstance(source, (tuple, list)) and all(isinstance(d, int) for d in source):
        if any(d < 0 for d in source):
            raise ArgumentError(f"dist.tensor: a shape has no negative sizes, found {list(source)}")
        data = torch.zeros(tuple(source), dtype=torch_dtype or torch.float32)
    elif isinstance(source, np.ndarray):
        data = torch.from_numpy(source)
    elif isinstance(source, torch.Tensor):
        data = source
    else:
        try:
            data = torch.as_tensor(source)
        except (TypeError, ValueError, RuntimeError) as error:
            raise ArgumentError(
                f"dist.tensor takes a shape or array data (a torch tensor, a numpy array, a "
                f"nested list of numbers), found {type(source).__name__} {source!r}: {error}"
            ) from None
    if torch_dtype is not None:
        data = data.to(torch_dtype)
    return DistTensor(data, layout or ShardSpec(replicate=True), mesh)
