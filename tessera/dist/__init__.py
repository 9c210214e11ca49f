"""Distributed layouts: device meshes and shard specs (``from tessera import dist``)."""

from tessera.dist.collectives import (
    all_gather,
    all_reduce,
    all_to_all,
    broadcast,
    reduce_scatter,
    shard,
)
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
    "broadcast",
    "mesh",
    "reduce_scatter",
    "shard",
    "tensor",
    "zigzag_order",
]
