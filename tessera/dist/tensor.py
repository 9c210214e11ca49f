"""``dist.tensor``: a global array together with its layout over a mesh."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from tessera.dist.mesh import Mesh
from tessera.dist.shard_spec import ShardSpec
from tessera.dtypes import as_dtype
from tessera.ir.sharding import Sharding


class DistTensor:
    """A distributed value: global ``data`` laid out over ``mesh`` as ``layout`` says.

    As a ``ts.jit`` argument its layout is the argument's input sharding.
    """

    def __init__(self, data: torch.Tensor, layout: ShardSpec, mesh: Mesh, name: str = "tensor"):
        self.data = data
        self.layout = layout
        self.mesh = mesh
        self.sharding: Sharding = layout.to_sharding(mesh, tuple(data.shape), name)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.data.shape)

    @property
    def dtype(self) -> torch.dtype:
        return self.data.dtype

    def local(self, rank: int) -> torch.Tensor:
        """The shard that ``rank`` holds."""
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

    def __repr__(self) -> str:
        return f"DistTensor(shape={list(self.shape)}, sharding={self.sharding}, {self.mesh})"


def tensor(
    shape_or_data: Sequence[int] | Any = None,
    layout: ShardSpec | None = None,
    mesh: Mesh | None = None,
    dtype: Any = None,
    *,
    shape: Sequence[int] | None = None,
) -> DistTensor:
    """A distributed tensor from data (array or tensor) or a shape (zeros)."""
    from tessera.errors import ShardingError

    if mesh is None:
        raise ShardingError("dist.tensor needs mesh=...")
    if (shape is None) == (shape_or_data is None):
        raise ShardingError("dist.tensor takes data or a shape (positionally, or as shape=...): give one")
    source = shape if shape is not None else shape_or_data
    torch_dtype = as_dtype(dtype).to_torch() if dtype is not None else None
    if isinstance(source, (tuple, list)) and all(isinstance(d, int) for d in source):
        data = torch.zeros(tuple(source), dtype=torch_dtype or torch.float32)
    elif isinstance(source, np.ndarray):
        data = torch.from_numpy(source)
    elif isinstance(source, torch.Tensor):
        data = source
    else:
        data = torch.as_tensor(source)
    if torch_dtype is not None:
        data = data.to(torch_dtype)
    return DistTensor(data, layout or ShardSpec(replicate=True), mesh)
