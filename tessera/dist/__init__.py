"""Distributed layouts: device meshes and shard specs (``from tessera import dist``)."""

from tessera.dist.collectives import (
    all_gather,
    all_reduce,
    all_to_all,
    broadcast,
    reduce_scatter,
    shard,
)
from tessera.dist.per_rank import axis_index, axis_size, ppermute
from tessera.dist.shard_map import shard_map
from tessera.dist.shard_spec import ShardSpec
from tessera.dist.tensor import DistTensor, tensor
from tessera.ir.mesh import Mesh, mesh
from tessera.ir.zigzag import zigzag_order

__all__ = [
    "DistTensor",
    "Mesh",
    "ShardSpec",
    "all_gather",
    "all_reduce",
    "all_to_all",
    "axis_index",
    "axis_size",
    "broadcast",
    "mesh",
    "ppermute",
    "reduce_scatter",
    "shard",
    "shard_map",
    "tensor",
    "zigzag_order",
]
