"""Distributed layouts: device meshes and shard specs (``from tessera import dist``)."""

from tessera.dist.collectives import (
    all_gather,
    all_reduce,
    all_to_all,
    broadcast,
    reduce_scatter,
    shard,
)
from tessera.dist.per_rank import (
    Handle,
    all_gather_async,
    all_reduce_async,
    all_to_all_async,
    axis_index,
    axis_size,
    ppermute,
    ppermute_async,
    recv,
    reduce_scatter_async,
    send,
)
from tessera.dist.shard_map import shard_map
from tessera.dist.shard_spec import ShardSpec
from tessera.dist.tensor import DistTensor, tensor
from tessera.ir.mesh import Mesh, mesh
from tessera.ir.zigzag import zigzag_order

__all__ = [
    "DistTensor",
    "Handle",
    "Mesh",
    "ShardSpec",
    "all_gather",
    "all_gather_async",
    "all_reduce",
    "all_reduce_async",
    "all_to_all",
    "all_to_all_async",
    "axis_index",
    "axis_size",
    "broadcast",
    "mesh",
    "ppermute",
    "ppermute_async",
    "recv",
    "reduce_scatter",
    "reduce_scatter_async",
    "send",
    "shard",
    "shard_map",
    "tensor",
    "zigzag_order",
]
