"""``tessera.dist``: meshes, shard specs and distributed tensors.

A mesh puts devices on a row-major grid of named axes; a ``ShardSpec`` says which dims
are split over which axes; ``DistTensor.local(rank)`` is the block a rank holds. The
random-layout test puts every rank's block back together and expects the global tensor.
"""

from __future__ import annotations

from collections.abc import Callable
from math import prod

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from tessera import dist
from tessera.dist import DistTensor, Mesh, ShardSpec
from tessera.errors import ShardingError
from tessera.ir.mesh import MeshError
from tessera.ir.sharding import Sharding

# --- Mesh ---------------------------------------------------------------------------------


def test_mesh_shape_inferred_from_devices() -> None:
    mesh = Mesh(axes=["tp", "dp"], devices=range(16))
    assert mesh.shape == (4, 4)
    assert mesh.layout == "tp × dp mesh, 4 × 4"
    assert mesh.size == 16 and mesh.ndim == 2
    assert Mesh(axes=["a", "b", "c"], devices=range(8)).shape == (2, 2, 2)
    assert Mesh(axes="dp", devices=range(5)).shape == (5,)


def test_mesh_explicit_shape_and_devices() -> None:
    mesh = Mesh(axes=["dp", "tp"], shape=(2, 4))
    assert mesh.layout == "dp × tp mesh, 2 × 4"
    assert mesh.devices.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert mesh.axis_size("tp") == 4 and mesh.axis_index("tp") == 1
    named = Mesh(axes=["x", "y"], shape=(1, 3), devices=["cuda:0", "cuda:1", "cuda:2"])
    assert named.devices.tolist() == [["cuda:0", "cuda:1", "cuda:2"]]
    assert repr(mesh) == "Mesh(dp=2, tp=4)"


def test_dist_mesh_spelling() -> None:
    mesh = dist.mesh(devices=range(8), axes=("dp", "tp"), shape=(2, 4))
    assert mesh == Mesh(axes=["dp", "tp"], shape=(2, 4))
    assert hash(mesh) == hash(Mesh(axes=["dp", "tp"], shape=(2, 4)))
    assert dist.mesh(devices=range(4)).axis_names == ("dp",)
    assert dist.mesh(devices=range(9), axes=["x", "y"]).shape == (3, 3)
    assert mesh != Mesh(axes=["dp", "tp"], shape=(4, 2))


@pytest.mark.parametrize("shape", [(2, 4), (3,), (2, 3, 2)])
def test_mesh_coords_rank_round_trip(shape: tuple[int, ...]) -> None:
    axes = ["a", "b", "c"][: len(shape)]
    mesh = Mesh(axes=axes, shape=shape)
    for rank in range(mesh.size):
        coords = mesh.coords(rank)
        assert mesh.rank(coords) == rank
        assert all(0 <= coords[a] < s for a, s in zip(axes, shape, strict=True))
        assert mesh.devices[tuple(coords[a] for a in axes)] == rank
    # row-major: the last axis varies fastest
    assert Mesh(axes=["dp", "tp"], shape=(2, 4)).coords(5) == {"dp": 1, "tp": 1}


def test_mesh_groups_along_axes() -> None:
    mesh = Mesh(axes=["dp", "tp"], shape=(2, 4))
    assert mesh.groups(["tp"]) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert mesh.groups(["dp"]) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert mesh.groups(["dp", "tp"]) == [list(range(8))]
    assert mesh.groups([]) == [[r] for r in range(8)]
    # within a group, ranks are ordered by their coordinates along the axes as given
    assert mesh.groups(["tp", "dp"]) == [[0, 4, 1, 5, 2, 6, 3, 7]]


@pytest.mark.parametrize("axes", [["x"], ["y"], ["z"], ["x", "z"], ["z", "x"], ["x", "y", "z"]])
def test_mesh_groups_partition_the_ranks(axes: list[str]) -> None:
    mesh = Mesh(axes=["x", "y", "z"], shape=(2, 3, 2))
    groups = mesh.groups(axes)
    assert sorted(r for g in groups for r in g) == list(range(mesh.size))
    others = [a for a in mesh.axis_names if a not in axes]
    for group in groups:
        assert len(group) == prod(mesh.axis_size(a) for a in axes)
        coords = [mesh.coords(r) for r in group]
        assert len({tuple(c[a] for a in others) for c in coords}) == 1
        along = [tuple(c[a] for a in axes) for c in coords]
        assert along == sorted(along) and len(set(along)) == len(along)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Mesh(axes=["dp", "dp"], shape=(2, 2)), r"distinct, found \['dp', 'dp'\]"),
        (
            lambda: Mesh(axes=["dp", "tp"], shape=(2, 4), devices=range(6)),
            "needs 8 devices, found 6",
        ),
        (
            lambda: Mesh(axes=["dp", "tp"], devices=range(8)),
            "cannot infer the shape of a 2-axis mesh over 8",
        ),
        (lambda: Mesh(axes=["dp"]), r"shape=\.\.\. or devices=\.\.\."),
        (lambda: Mesh(axes=[], shape=()), "at least one axis"),
        (lambda: Mesh(axes=["dp", "tp"], shape=(8,)), r"2 axes \['dp', 'tp'\] but shape \[8\]"),
        (lambda: Mesh(axes=["dp", "tp"], shape=(2, 0)), r"positive, found \[2, 0\]"),
        (lambda: Mesh(axes=["d p"], shape=(2,)), "identifiers, found 'd p'"),
        (lambda: Mesh(axes=["dp"], shape=(2,)).coords(2), "rank 2 is out of range for a mesh of 2"),
        (lambda: Mesh(axes=["dp"], shape=(2,)).groups(["tp"]), r"unknown mesh axis 'tp'.*\['dp'\]"),
    ],
)
def test_mesh_errors(make: Callable[[], object], message: str) -> None:
    with pytest.raises(ShardingError, match=message):
        make()


# --- ShardSpec ----------------------------------------------------------------------------

MESH = Mesh(axes=["dp", "tp"], shape=(2, 4))


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (ShardSpec(partition=("row", "col"), mesh_axes=("tp", "dp")), (("tp",), ("dp",))),
        (ShardSpec(partition="col", mesh_axes="tp"), ((), ("tp",))),
        (ShardSpec(partition=(0,), mesh_axes=(("dp", "tp"),)), (("dp", "tp"), ())),
        (ShardSpec(partition=(0,), mesh_axes=(["tp", "dp"],)), (("tp", "dp"), ())),
        (ShardSpec(partition=("row", 0), mesh_axes=("dp", "tp")), (("dp", "tp"), ())),
        (ShardSpec(partition=(-1,), mesh_axes=("tp",)), ((), ("tp",))),
        (ShardSpec(replicate=True), ((), ())),
        (ShardSpec(), ((), ())),
    ],
)
def test_shard_spec_to_sharding(spec: ShardSpec, expected: tuple[tuple[str, ...], ...]) -> None:
    assert spec.to_sharding(MESH, (8, 16), "w") == Sharding(expected)


@pytest.mark.parametrize(
    ("spec", "shape", "message"),
    [
        (ShardSpec(("row",), ("ep",)), (8, 16), r"w1: dim 0 is split over unknown mesh axis 'ep'; the mesh has axes \['dp', 'tp'\]"),
        (ShardSpec(("row", "col"), ("tp", "tp")), (8, 16), "w1: mesh axis 'tp' splits dim 0 and again dim 1"),
        (ShardSpec((1,), (("tp", "tp"),)), (8, 16), "w1: mesh axis 'tp' splits dim 1 and again dim 1"),
        (ShardSpec(("col",), ("tp",)), (8, 6), r"w1: dim 1 of size 6 is not divisible by mesh axes tp=4 \(4 shards\)"),
        (ShardSpec((0,), (("dp", "tp"),)), (4, 16), r"w1: dim 0 of size 4 is not divisible by mesh axes dp=2 × tp=4 \(8 shards\)"),
        (ShardSpec((2,), ("tp",)), (8, 16), r"w1: partition dim 2 \(split over 'tp'\) is out of range for a tensor of rank 2"),
        (ShardSpec(("col",), ("tp",)), (8,), r"w1: partition dim 'col' \(split over 'tp'\) is out of range for a tensor of rank 1"),
    ],
)  # fmt: skip
def test_shard_spec_errors_name_tensor_dim_and_axis(
    spec: ShardSpec, shape: tuple[int, ...], message: str
) -> None:
    with pytest.raises(ShardingError, match=message):
        spec.to_sharding(MESH, shape, "w1")


def test_shard_spec_construction_errors() -> None:
    with pytest.raises(
        ShardingError, match=r"a dim index \(an int\) or 'row' / 'col', found 'diag'"
    ):
        ShardSpec(partition=("diag",), mesh_axes=("tp",))
    with pytest.raises(ShardingError, match=r"partition=\['row', 'col'\] but mesh_axes=\['tp'\]"):
        ShardSpec(partition=("row", "col"), mesh_axes=("tp",))
    with pytest.raises(ShardingError, match="replicate=True"):
        ShardSpec(partition=("row",), mesh_axes=("tp",), replicate=True)


# --- DistTensor -----------------------------------------------------------------------------


def _position(mesh: Mesh, axes: tuple[str, ...], coords: dict[str, int]) -> int:
    """Which block of a dim split over ``axes`` (major to minor) a rank holds."""
    position = 0
    for axis in axes:
        position = position * mesh.axis_size(axis) + coords[axis]
    return position


def _assemble(
    pieces: dict[tuple[int, ...], torch.Tensor], counts: tuple[int, ...], dim: int = 0
) -> torch.Tensor:
    """Concatenate blocks (keyed by block position) back into the tensor they tile."""
    if dim == len(counts):
        return pieces[()]
    parts = []
    for i in range(counts[dim]):
        rest = {key[1:]: piece for key, piece in pieces.items() if key[0] == i}
        parts.append(_assemble(rest, counts, dim + 1))
    return torch.cat(parts, dim=dim)


@st.composite
def layouts(draw: st.DrawFn) -> tuple[tuple[int, ...], ShardSpec]:
    """A random shape and a random ShardSpec over MESH (dp=2, tp=4) that fits it."""
    rank = draw(st.integers(1, 3))
    owner = {axis: draw(st.sampled_from([None, *range(rank)])) for axis in MESH.axis_names}
    dims: list[list[str]] = [[] for _ in range(rank)]
    for axis in draw(st.permutations(MESH.axis_names)):  # a random major-to-minor order
        if owner[axis] is not None:
            dims[owner[axis]].append(axis)
    shape = tuple(prod(MESH.axis_size(a) for a in d) * draw(st.integers(1, 3)) for d in dims)
    split = [(d, axes) for d, axes in enumerate(dims) if axes]
    if draw(st.booleans()):  # a tuple of axes per dim
        spec = ShardSpec(partition=[d for d, _ in split], mesh_axes=[tuple(a) for _, a in split])
    else:  # the same dim listed once per axis
        flat = [(d, a) for d, axes in split for a in axes]
        spec = ShardSpec(partition=[d for d, _ in flat], mesh_axes=[a for _, a in flat])
    return shape, spec


@given(layouts(), st.integers(0, 2**31 - 1))
def test_local_pieces_reassemble_the_global_tensor(
    layout: tuple[tuple[int, ...], ShardSpec], seed: int
) -> None:
    shape, spec = layout
    data = torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    x = dist.tensor(data, spec, mesh=MESH)
    local_shape = x.sharding.local_shape(MESH, shape)
    counts = tuple(x.sharding.shards(MESH, d) for d in range(len(shape)))
    pieces: dict[tuple[int, ...], torch.Tensor] = {}
    for rank in range(MESH.size):
        coords = MESH.coords(rank)
        key = tuple(_position(MESH, axes, coords) for axes in x.sharding.dims)
        piece = x.local(rank)
        assert tuple(piece.shape) == local_shape
        if key in pieces:  # ranks that differ only along unused axes hold the same block
            assert torch.equal(pieces[key], piece)
        pieces[key] = piece
    assert len(pieces) == prod(counts)
    assert torch.equal(_assemble(pieces, counts), data)


def test_local_of_a_known_layout() -> None:
    data = torch.arange(8 * 4).reshape(8, 4)
    x = dist.tensor(data, ShardSpec(("row", "col"), (("dp", "tp"), ())), mesh=MESH)
    assert x.sharding == Sharding((("dp", "tp"), ()))
    assert torch.equal(x.local(0), data[0:1])
    assert torch.equal(x.local(5), data[5:6])  # dp=1, tp=1: block 1 * 4 + 1
    y = dist.tensor(data, ShardSpec(("row", "row"), ("tp", "dp")), mesh=MESH)
    assert torch.equal(y.local(5), data[3:4])  # tp=1, dp=1: block 1 * 2 + 1


def test_dist_tensor_constructors() -> None:
    zeros = dist.tensor((8, 16), ShardSpec(("col",), ("tp",)), mesh=MESH)
    assert isinstance(zeros, DistTensor)
    assert zeros.shape == (8, 16) and zeros.dtype == torch.float32
    assert tuple(zeros.local(3).shape) == (8, 4)
    assert dist.tensor(shape=(4, 4), mesh=MESH, dtype="f16").dtype == torch.float16
    from_numpy = dist.tensor(np.ones((2, 8)), ShardSpec(("col",), ("dp",)), mesh=MESH)
    assert from_numpy.dtype == torch.float64 and tuple(from_numpy.local(7).shape) == (2, 4)
    replicated = dist.tensor([[1.0, 2.0]], mesh=MESH)
    assert replicated.sharding.is_replicated
    assert all(torch.equal(replicated.local(r), replicated.data) for r in range(MESH.size))
    assert "sharding=[[], [tp]]" in repr(zeros)


def test_dist_tensor_errors() -> None:
    with pytest.raises(ShardingError, match="needs mesh="):
        dist.tensor((8, 8), ShardSpec(("row",), ("tp",)))
    with pytest.raises(ShardingError, match="dim 0 of size 6 is not divisible by mesh axes tp=4"):
        dist.tensor((6, 8), ShardSpec(("row",), ("tp",)), mesh=MESH)
    with pytest.raises(ShardingError, match="data or a shape"):
        dist.tensor(mesh=MESH)
    with pytest.raises(ShardingError, match="data or a shape"):
        dist.tensor((2, 2), mesh=MESH, shape=(2, 2))


def test_mesh_from_a_mapping_of_axis_sizes() -> None:
    mesh = dist.mesh({"dp": 2, "tp": 4})
    assert mesh.axis_names == ("dp", "tp") and mesh.size == 8
    assert mesh == dist.Mesh(axes=["dp", "tp"], shape=(2, 4))
    with pytest.raises(MeshError, match="not both"):
        dist.mesh({"dp": 2}, shape=(2,))
