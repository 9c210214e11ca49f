"""Distributed layouts: device meshes and shard specs (``from tessera import dist``)."""

from tessera.dist.mesh import Mesh, mesh
from tessera.dist.shard_spec import ShardSpec

__all__ = ["Mesh", "ShardSpec", "mesh"]
