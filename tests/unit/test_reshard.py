"""``plan_reshard`` run on real data, and ``reshard_cost`` against hand-computed bytes.

For random pairs of shardings over a small mesh, every rank starts with its local piece
of a random global tensor (for a partial source, a random term: the terms of a group
reduce to the piece), each ReshardStep is applied with the per-rank semantics of its
collective, and every rank must end with exactly its piece of the target layout. The
simulator also checks each step is a valid collective: an all_reduce only over axes
the value is partial over, a gather or all_to_all only of a dim's minor split axis
(anything else is not a contiguous block of one group), a slice only of a free axis.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import prod

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera.errors import ShardingError
from tessera.ir.mesh import Mesh
from tessera.ir.sharding import Sharding
from tessera.transforms.reshard import (
    ALPHA_BYTES,
    ReshardStep,
    apply_step,
    plan_reshard,
    reshard_cost,
)

Pieces = dict[int, np.ndarray]

REDUCE = {
    "sum": lambda xs: np.sum(xs, axis=0),
    "mean": lambda xs: np.mean(xs, axis=0),
    "max": lambda xs: np.max(xs, axis=0),
    "min": lambda xs: np.min(xs, axis=0),
}


# --- layouts on real data ---------------------------------------------------------------------


def _index_along(mesh: Mesh, axes: Sequence[str], rank: int) -> int:
    """A rank's index along ``axes`` (major first): its block among ``prod(sizes)``."""
    coords = mesh.coords(rank)
    index = 0
    for axis in axes:
        index = index * mesh.axis_size(axis) + coords[axis]
    return index


def _block(mesh: Mesh, sharding: Sharding, data: np.ndarray, rank: int) -> np.ndarray:
    """The piece of the global ``data`` that ``rank`` holds under ``sharding`` (no partial)."""
    index = []
    for size, axes in zip(data.shape, sharding.dims, strict=True):
        step = size // prod(mesh.axis_size(a) for a in axes)
        position = _index_along(mesh, axes, rank)
        index.append(slice(position * step, (position + 1) * step))
    return data[tuple(index)]


def _distribute(
    mesh: Mesh, sharding: Sharding, data: np.ndarray, rng: np.random.Generator
) -> Pieces:
    """Per-rank pieces; over partial axes each rank holds a random term of its piece."""
    pieces = {rank: _block(mesh, sharding, data, rank).copy() for rank in range(mesh.size)}
    if not sharding.partial:
        return pieces
    (kind,) = {k for _, k in sharding.partial}
    for group in mesh.groups(sharding.partial_axes):
        block, n = pieces[group[0]], len(group)
        if kind in ("sum", "mean"):
            terms = rng.standard_normal((n, *block.shape))
            terms[-1] = block * (n if kind == "mean" else 1) - terms[:-1].sum(axis=0)
        else:  # max / min: every term on the right side of the value, one term equal to it
            gap = np.abs(rng.standard_normal((n, *block.shape)))
            exact = rng.integers(n, size=(1, *block.shape))
            np.put_along_axis(gap, exact, 0.0, axis=0)
            terms = block - gap if kind == "max" else block + gap
        for rank, term in zip(group, terms, strict=True):
            pieces[rank] = term
    return pieces


def _apply(
    mesh: Mesh, sharding: Sharding, pieces: Pieces, step: ReshardStep
) -> tuple[Sharding, Pieces]:
    """One collective with per-rank semantics; checks it is a valid collective first."""
    dims = [list(d) for d in sharding.dims]
    partial = dict(sharding.partial)
    axes = list(step.axes)
    n = prod(mesh.axis_size(a) for a in axes)
    in_use = set(sharding.split_axes) | set(partial)
    if step.kind in ("all_reduce", "reduce_scatter"):
        assert all(partial.get(a) == step.reduction for a in axes), f"{step} on {sharding}"
    if step.kind == "all_slice":
        assert not in_use & set(axes), f"{step} slices an axis in use in {sharding}"
    if step.kind == "reduce_scatter":
        assert not set(sharding.split_axes) & set(axes), f"{step} on {sharding}"
    if step.kind == "all_gather":
        assert dims[step.dim][-len(axes) :] == axes, (
            f"{step} gathers a non-minor axis of {sharding}"
        )
    if step.kind == "all_to_all":
        assert dims[step.concat_dim][-len(axes) :] == axes, (
            f"{step} moves a non-minor axis of {sharding}"
        )
        assert not in_use - set(dims[step.concat_dim]) & set(axes), f"{step} on {sharding}"
    result: Pieces = {}
    for group in mesh.groups(axes):
        assert [_index_along(mesh, axes, r) for r in group] == list(range(n))
        members = [pieces[r] for r in group]
        for i, rank in enumerate(group):
            if step.kind == "all_reduce":
                result[rank] = REDUCE[step.reduction](np.stack(members))
            elif step.kind == "reduce_scatter":
                result[rank] = np.split(
                    REDUCE[step.reduction](np.stack(members)), n, axis=step.dim
                )[i]
            elif step.kind == "all_slice":
                result[rank] = np.split(pieces[rank], n, axis=step.dim)[i]
            elif step.kind == "all_gather":
                result[rank] = np.concatenate(members, axis=step.dim)
            elif step.kind == "all_to_all":
                received = [np.split(piece, n, axis=step.dim)[i] for piece in members]
                result[rank] = np.concatenate(received, axis=step.concat_dim)
            else:
                raise AssertionError(f"unknown reshard step {step}")
    if step.kind in ("all_reduce", "reduce_scatter"):
        for axis in axes:
            del partial[axis]
    if step.kind in ("reduce_scatter", "all_slice"):
        dims[step.dim] += axes
    elif step.kind == "all_gather":
        del dims[step.dim][-len(axes) :]
    elif step.kind == "all_to_all":
        del dims[step.concat_dim][-len(axes) :]
        dims[step.dim] += axes
    after = Sharding(tuple(tuple(d) for d in dims), tuple(partial.items()))
    assert after == apply_step(sharding, step), f"apply_step disagrees after {step}"
    return after, result


def _check(
    mesh: Mesh, sharding: Sharding, pieces: Pieces, data: np.ndarray, exact: bool = True
) -> None:
    """Every rank holds its piece of ``data`` (its groups' terms reduce to it, if partial).

    Pieces that only moved are compared exactly; reduced ones to rounding (``exact=False``).
    """
    expected = {rank: _block(mesh, sharding, data, rank) for rank in range(mesh.size)}
    if sharding.partial:
        (kind,) = {k for _, k in sharding.partial}
        for group in mesh.groups(sharding.partial_axes):
            total = REDUCE[kind](np.stack([pieces[r] for r in group]))
            for rank in group:
                np.testing.assert_allclose(total, expected[rank], rtol=1e-12, atol=1e-12)
        return
    for rank in range(mesh.size):
        if exact:
            np.testing.assert_array_equal(pieces[rank], expected[rank], err_msg=f"rank {rank}")
        else:
            np.testing.assert_allclose(
                pieces[rank], expected[rank], rtol=1e-12, atol=1e-12, err_msg=f"rank {rank}"
            )


# --- random pairs -----------------------------------------------------------------------------

MESHES = [Mesh(["x", "y"], (2, 2)), Mesh(["x", "y"], (2, 3)), Mesh(["x", "y"], (3, 2))]


def _sharding(
    rank: int, roles: dict[str, int | str | None], order: Sequence[str], kind: str
) -> Sharding:
    """``roles`` maps each mesh axis to a dim it splits, "partial" or None; ``order`` ranks
    axes on one dim (major first)."""
    dims = tuple(tuple(a for a in order if roles[a] == d) for d in range(rank))
    return Sharding(dims, tuple((a, kind) for a in order if roles[a] == "partial"))


@st.composite
def reshard_cases(draw: st.DrawFn) -> tuple[Mesh, tuple[int, ...], Sharding, Sharding]:
    mesh = draw(st.sampled_from(MESHES))
    rank = draw(st.integers(1, 3))
    shape = tuple(mesh.size * draw(st.integers(1, 2)) for _ in range(rank))
    kind = draw(st.sampled_from(["sum", "sum", "mean", "max", "min"]))
    axes = mesh.axis_names
    src_roles = {a: draw(st.sampled_from([None, "partial", *range(rank)])) for a in axes}
    dst_roles = {
        a: draw(
            st.sampled_from(
                [None, *range(rank), *(["partial"] if src_roles[a] == "partial" else [])]
            )
        )
        for a in axes
    }
    src = _sharding(rank, src_roles, draw(st.permutations(axes)), kind)
    dst = _sharding(rank, dst_roles, draw(st.permutations(axes)), kind)
    return mesh, shape, src, dst


@settings(max_examples=300)
@given(reshard_cases(), st.integers(0, 2**32 - 1))
def test_plan_moves_every_rank_to_its_target_piece(
    case: tuple[Mesh, tuple[int, ...], Sharding, Sharding], seed: int
) -> None:
    mesh, shape, src, dst = case
    rng = np.random.default_rng(seed)
    data = rng.standard_normal(shape)
    pieces = _distribute(mesh, src, data, rng)
    _check(mesh, src, pieces, data)  # the simulator's own starting point is right
    sharding = src
    for step in plan_reshard(src, dst):
        sharding, pieces = _apply(mesh, sharding, pieces, step)
    assert sharding.dims == dst.dims and dict(sharding.partial) == dict(dst.partial)
    _check(mesh, dst, pieces, data, exact=not src.partial)
    assert reshard_cost(src, dst, shape, 8, mesh) >= 0.0


@given(reshard_cases())
def test_plan_to_itself_is_empty(case: tuple[Mesh, tuple[int, ...], Sharding, Sharding]) -> None:
    mesh, shape, src, _ = case
    assert plan_reshard(src, src) == []
    assert reshard_cost(src, src, shape, 4, mesh) == 0.0


def test_plans_for_the_named_cases() -> None:
    rep = Sharding(((), ()))
    rows, cols = Sharding((("y",), ())), Sharding(((), ("y",)))
    partial = Sharding(((), ()), (("y", "sum"),))
    assert plan_reshard(partial, rep) == [ReshardStep("all_reduce", ("y",), reduction="sum")]
    assert plan_reshard(partial, cols) == [
        ReshardStep("reduce_scatter", ("y",), dim=1, reduction="sum")
    ]
    assert plan_reshard(rows, rep) == [ReshardStep("all_gather", ("y",), dim=0)]
    assert plan_reshard(rep, rows) == [ReshardStep("all_slice", ("y",), dim=0)]
    assert plan_reshard(rows, cols) == [ReshardStep("all_to_all", ("y",), dim=1, concat_dim=0)]
    # a max partial cannot be scattered by a sum: all_reduce it, then slice for free
    partial_max = Sharding(((), ()), (("y", "max"),))
    assert plan_reshard(partial_max, cols) == [
        ReshardStep("all_reduce", ("y",), reduction="max"),
        ReshardStep("all_slice", ("y",), dim=1),
    ]


def test_plan_errors() -> None:
    with pytest.raises(ShardingError, match="ranks 2 and 1"):
        plan_reshard(Sharding(((), ())), Sharding(((),)))
    with pytest.raises(ShardingError, match=r"cannot make a value partial over \['y'\]"):
        plan_reshard(Sharding(((),)), Sharding(((),), (("y", "sum"),)))


# --- costs ------------------------------------------------------------------------------------

TP = Mesh(["tp"], (4,))
DP_TP = Mesh(["dp", "tp"], (2, 4))
SHAPE, F32 = (8, 16), 4  # 512 bytes in all


@pytest.mark.parametrize(
    ("src", "dst", "expected"),
    [
        # all_reduce of a whole partial tensor: 2 (n - 1) / n * L, L = 512
        (Sharding(((), ()), (("tp", "sum"),)), Sharding(((), ())), 2 * 3 / 4 * 512 + ALPHA_BYTES),
        # all_gather of 128-byte pieces: (n - 1) * L
        (Sharding((("tp",), ())), Sharding(((), ())), 3 * 128 + ALPHA_BYTES),
        # reduce_scatter of a whole partial tensor: (n - 1) / n * L
        (Sharding(((), ()), (("tp", "sum"),)), Sharding((("tp",), ())), 3 / 4 * 512 + ALPHA_BYTES),
        # all_to_all of 128-byte pieces: (n - 1) / n * L
        (Sharding((("tp",), ())), Sharding(((), ("tp",))), 3 / 4 * 128 + ALPHA_BYTES),
        # slices are local and free
        (Sharding(((), ())), Sharding((("tp",), ())), 0.0),
        (Sharding(((), ())), Sharding(((), ("tp",))), 0.0),
    ],
)
def test_reshard_cost_one_collective(src: Sharding, dst: Sharding, expected: float) -> None:
    assert reshard_cost(src, dst, SHAPE, F32, TP) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("src", "dst", "expected"),
    [
        # free slices of both axes, major first, in one dim or two
        (Sharding(((), ())), Sharding((("dp", "tp"), ())), 0.0),
        (Sharding((("dp",), ())), Sharding((("dp",), ("tp",))), 0.0),
        # reduce_scatter over tp of 256-byte dp pieces (192), then gather dp of the 64-byte result
        (
            Sharding((("dp",), ()), (("tp", "sum"),)),
            Sharding(((), ("tp",))),
            3 / 4 * 256 + ALPHA_BYTES + 1 * 64 + ALPHA_BYTES,
        ),
        # all_reduce over dp of 128-byte tp pieces: n = 2
        (
            Sharding((("tp",), ()), (("dp", "sum"),)),
            Sharding((("tp",), ())),
            2 * 1 / 2 * 128 + ALPHA_BYTES,
        ),
        # gather both axes of a dim: tp (minor) on 64-byte pieces, then dp on 256-byte ones
        (
            Sharding((("dp", "tp"), ())),
            Sharding(((), ())),
            3 * 64 + ALPHA_BYTES + 1 * 256 + ALPHA_BYTES,
        ),
    ],
)
def test_reshard_cost_sums_its_steps(src: Sharding, dst: Sharding, expected: float) -> None:
    assert reshard_cost(src, dst, SHAPE, F32, DP_TP) == pytest.approx(expected)


def test_reshard_cost_prefers_slicing_to_gathering() -> None:
    split = Sharding((("tp",), ()))
    assert reshard_cost(Sharding(((), ())), split, SHAPE, F32, TP) < reshard_cost(
        split, Sharding(((), ())), SHAPE, F32, TP
    )
