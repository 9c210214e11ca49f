"""Global values and their per-rank pieces under a :class:`Sharding`.

``scatter`` cuts a global tensor into the pieces the ranks of a mesh hold; ``assemble``
puts pieces back together. A split dim is cut into ``prod(axis sizes)`` contiguous blocks
and a rank holds the block at the mixed-radix index of its coordinates along the dim's
axes, major first (as :meth:`DistTensor.local`). A value *partial* over an axis is held
as terms whose reduction along that axis (its kind, a key of ``reduction_kinds.KINDS``)
is the value.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import prod

import torch

from tessera.dtypes import as_dtype
from tessera.errors import ShardingError
from tessera.ir.mesh import Mesh
from tessera.ir.reduction_kinds import KINDS
from tessera.ir.sharding import Sharding
from tessera.opdefs.collective import reduce_pieces


def block(rank: int, sharding: Sharding, mesh: Mesh, shape: Sequence[int]) -> tuple[slice, ...]:
    """The index of ``rank``'s block in a global tensor of ``shape``."""
    coords = mesh.coords(rank)
    index = []
    for size, axes in zip(shape, sharding.dims, strict=True):
        position = 0
        for axis in axes:  # major to minor
            position = position * mesh.axis_size(axis) + coords[axis]
        step = size // prod(mesh.axis_size(a) for a in axes)
        index.append(slice(position * step, (position + 1) * step))
    return tuple(index)


def scatter(value: torch.Tensor, sharding: Sharding, mesh: Mesh) -> list[torch.Tensor]:
    """Every rank's piece of the global ``value`` (a list indexed by rank).

    For a partial axis whose kind is idempotent (mean, max, min) every member holds the
    value; for another (sum, prod) the group's first member holds it and the others the
    identity (see :func:`piece`).
    """
    sharding.validate(mesh, tuple(value.shape), "value")
    return [piece(value, sharding, mesh, rank) for rank in range(mesh.size)]


def piece(value: torch.Tensor, sharding: Sharding, mesh: Mesh, rank: int) -> torch.Tensor:
    """``rank``'s piece of the global ``value`` (one entry of :func:`scatter`): the
    identity of the first partial axis (in reduction order) whose kind is not
    idempotent and along which ``rank`` is not its group's first member, else the
    value. Reducing the axes in order then gives each later axis's first member the
    value and its other members that axis's identity."""
    part = value[block(rank, sharding, mesh, value.shape)].clone()
    coords = mesh.coords(rank)
    for axis, kind in sharding.partial:
        if coords[axis] and not KINDS[kind].idempotent:
            return torch.full_like(part, KINDS[kind].identity(as_dtype(part.dtype)))
    return part


def assemble(pieces: Sequence[torch.Tensor], sharding: Sharding, mesh: Mesh) -> torch.Tensor:
    """The global value held as ``pieces`` (indexed by rank): partial axes are reduced
    in the order ``sharding.partial`` lists them, splits undone, and replicated copies
    taken from any one rank."""
    if len(pieces) != mesh.size:
        raise ShardingError(
            f"expected {mesh.size} pieces (one per rank of {mesh}), found {len(pieces)}"
        )
    local = tuple(pieces[0].shape)
    if len(local) != sharding.rank:
        raise ShardingError(
            f"sharding {sharding} has {sharding.rank} dims but the pieces have shape {list(local)}"
        )
    shape = tuple(size * sharding.shards(mesh, d) for d, size in enumerate(local))
    sharding.validate(mesh, shape, "value")
    for rank, piece in enumerate(pieces):
        if tuple(piece.shape) != local or piece.dtype != pieces[0].dtype:
            raise ShardingError(
                f"piece of rank {rank} is {piece.dtype}{list(piece.shape)}; rank 0's is "
                f"{pieces[0].dtype}{list(local)}"
            )
    values = list(pieces)
    for axis, kind in sharding.partial:
        for group in mesh.groups([axis]):
            reduced = reduce_pieces([values[r] for r in group], kind)
            for r in group:
                values[r] = reduced
    result = torch.empty(shape, dtype=pieces[0].dtype)
    split = set(sharding.split_axes)
    for rank in range(mesh.size):
        coords = mesh.coords(rank)
        if all(coords[a] == 0 for a in mesh.axis_names if a not in split):  # one copy per block
            result[block(rank, sharding, mesh, shape)] = values[rank]
    return result
