"""Resharding: the collectives that take a tensor from one sharding to another.

``plan_reshard`` gives the steps, in order:

1. axes newly split on a dim and not in use elsewhere (nor partial) are taken by
   ``all_slice`` (a free local slice, done first so later steps move less data; a rank
   may slice its own partial term);
2. partial axes are resolved: ``reduce_scatter`` when the target splits a dim over the
   axis and the kind is linear (sum, mean: the result is then already split), else
   ``all_reduce`` (one over all the axes
   of a reduction kind: a ring over dp × tp moves 2(n-1)/n of the data once, not per axis);
3. an axis that moves from one dim to another is an ``all_to_all``;
4. axes no longer split are gathered (``all_gather``, minor axes first);
5. the remaining new splits are ``all_slice``.

``reshard_cost`` prices a plan in bytes received per device under ring algorithms (the
beta term of an alpha-beta model; the alpha term breaks ties by counting collectives).
``step_collective`` builds a step's collective op (for insert-collectives, in global
types, and shard-partition, in local ones).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from math import prod
from typing import NamedTuple

from xdsl.ir import SSAValue

from tessera.errors import ShardingError
from tessera.ir import graph
from tessera.ir.reduction_kinds import KINDS
from tessera.ir.sharding import AxisSizes, MeshLike, Sharding


@dataclass(frozen=True)
class ReshardStep:
    kind: str  # all_reduce, reduce_scatter, all_slice, all_to_all, all_gather
    axes: tuple[str, ...]
    dim: int | None = None  # gathered / sliced / scattered dim; all_to_all's split_dim
    concat_dim: int | None = None  # all_to_all: the dim the split leaves
    reduction: str | None = None  # all_reduce / reduce_scatter kind


def plan_reshard(src: Sharding, dst: Sharding) -> list[ReshardStep]:
    """The collectives that turn ``src`` into ``dst`` (see the module docstring)."""
    if src.rank != dst.rank:
        raise ShardingError(f"cannot reshard between ranks {src.rank} and {dst.rank}")
    missing = set(dst.partial_axes) - set(src.partial_axes)
    if missing:
        raise ShardingError(f"cannot make a value partial over {sorted(missing)} by resharding")
    steps: list[ReshardStep] = []
    dims = [list(d) for d in src.dims]
    kinds = dict(src.partial)
    # 1. free slices first, of axes not in use and not partial (a rank may slice its own
    #    partial term along another axis): they shrink what the reductions move
    in_use = {a for d in dims for a in d} | set(src.partial_axes)
    for dim, axes in enumerate(dst.dims):
        while (axis := _next_new_axis(dims[dim], axes)) is not None and axis not in in_use:
            steps.append(ReshardStep("all_slice", (axis,), dim=dim))
            dims[dim].append(axis)
            in_use.add(axis)
    # 2. resolve partial axes; those of one kind left for all-reduce go in one collective
    reduce: dict[str, list[str]] = {}
    for axis, kind in src.partial:
        if axis in dst.partial_axes:
            continue
        target = _appendable_dim(dims, dst, axis)
        if target is not None and KINDS[kind].linear:
            steps.append(ReshardStep("reduce_scatter", (axis,), dim=target, reduction=kind))
            dims[target].append(axis)
        else:
            reduce.setdefault(kinds[axis], []).append(axis)
    for kind, axes in reduce.items():
        steps.append(ReshardStep("all_reduce", tuple(axes), reduction=kind))
    # 3./4. remove axes that are not in their target position, minor first
    for dim in range(len(dims)):
        while not _is_prefix(dims[dim], dst.dims[dim]):
            axis = dims[dim].pop()
            target = _appendable_dim(dims, dst, axis)
            if target is not None and target != dim:
                steps.append(ReshardStep("all_to_all", (axis,), dim=target, concat_dim=dim))
                dims[target].append(axis)
            else:
                steps.append(ReshardStep("all_gather", (axis,), dim=dim))
    # 5. remaining slices
    for dim, axes in enumerate(dst.dims):
        while (axis := _next_new_axis(dims[dim], axes)) is not None:
            steps.append(ReshardStep("all_slice", (axis,), dim=dim))
            dims[dim].append(axis)
    if tuple(tuple(d) for d in dims) != dst.dims:
        raise ShardingError(f"internal error: resharding {src} to {dst} ended at {dims}")
    return steps


def _is_prefix(current: Sequence[str], target: Sequence[str]) -> bool:
    return list(target[: len(current)]) == list(current)


def _next_new_axis(current: Sequence[str], target: Sequence[str]) -> str | None:
    """The next axis to append to ``current`` on the way to ``target``, if that is all."""
    if _is_prefix(current, target) and len(current) < len(target):
        return target[len(current)]
    return None


def _appendable_dim(dims: Sequence[Sequence[str]], dst: Sharding, axis: str) -> int | None:
    for dim, axes in enumerate(dst.dims):
        if _next_new_axis(dims[dim], axes) == axis:
            return dim
    return None


# Bytes received per device for a collective over n ranks on a local operand of L bytes.
_RING_FACTORS = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "all_gather": lambda n: float(n - 1),
    "all_slice": lambda n: 0.0,
}
ALPHA_BYTES = 1.0  # tie-breaker: each communicating collective costs as much as one byte


def reshard_cost(
    src: Sharding, dst: Sharding, shape: Sequence[int], itemsize: int, mesh: MeshLike
) -> float:
    """Bytes received per device by :func:`plan_reshard` (plus a tiny per-collective term)."""
    if src == dst:
        return 0.0
    axes = {a for s in (src, dst) for d in s.dims for a in d} | set(src.partial_axes)
    sizes = tuple(sorted((a, mesh.axis_size(a)) for a in axes))
    return _reshard_cost(src, dst, tuple(shape), itemsize, sizes)


class ReshardMove(NamedTuple):
    """One communicating step of a reshard plan, as the cost models read it."""

    kind: str  # all_reduce | all_gather | reduce_scatter | all_to_all
    axes: tuple[str, ...]
    nbytes: float  # the collective's size S, as ``tessera.perf.collective_cost`` reads it
    received: float  # the bytes a device receives by it under ring algorithms


def reshard_moves(
    src: Sharding, dst: Sharding, shape: Sequence[int], itemsize: int, mesh: MeshLike
) -> tuple[ReshardMove, ...]:
    """The communicating steps of :func:`plan_reshard` (their ``received`` bytes are
    what :func:`reshard_cost` sums)."""
    if src == dst:
        return ()
    axes = {a for s in (src, dst) for d in s.dims for a in d} | set(src.partial_axes)
    sizes = tuple(sorted((a, mesh.axis_size(a)) for a in axes))
    return _reshard_moves(src, dst, tuple(shape), itemsize, sizes)


@lru_cache(maxsize=65536)
def _reshard_moves(
    src: Sharding,
    dst: Sharding,
    shape: tuple[int, ...],
    itemsize: int,
    sizes: tuple[tuple[str, int], ...],
) -> tuple[ReshardMove, ...]:
    mesh = AxisSizes(sizes)
    moves = []
    sharding = src
    for step in plan_reshard(src, dst):
        n = prod(mesh.axis_size(a) for a in step.axes)
        local = prod(sharding.local_shape(mesh, shape)) * itemsize
        if step.kind != "all_slice":
            size = local * n if step.kind == "all_gather" else local  # the gathered result
            moves.append(
                ReshardMove(step.kind, step.axes, size, _RING_FACTORS[step.kind](n) * local)
            )
        sharding = apply_step(sharding, step)
    return tuple(moves)


@lru_cache(maxsize=65536)
def _reshard_cost(
    src: Sharding,
    dst: Sharding,
    shape: tuple[int, ...],
    itemsize: int,
    sizes: tuple[tuple[str, int], ...],
) -> float:
    """:func:`reshard_cost` on the sizes of the axes involved (cached: identical layers
    ask the same questions)."""
    mesh = AxisSizes(sizes)
    cost = 0.0
    sharding = src
    for step in plan_reshard(src, dst):
        n = prod(mesh.axis_size(a) for a in step.axes)
        local = prod(sharding.local_shape(mesh, shape)) * itemsize
        if step.kind != "all_slice":
            cost += _RING_FACTORS[step.kind](n) * local + ALPHA_BYTES
        sharding = apply_step(sharding, step)
    return cost


def apply_step(sharding: Sharding, step: ReshardStep) -> Sharding:
    """The sharding after one reshard step."""
    dims = [list(d) for d in sharding.dims]
    partial = list(sharding.partial)
    if step.kind in ("all_reduce", "reduce_scatter"):
        partial = [(a, k) for a, k in partial if a not in step.axes]
    if step.kind in ("reduce_scatter", "all_slice"):
        dims[step.dim].extend(step.axes)
    if step.kind == "all_gather":
        dims[step.dim] = [a for a in dims[step.dim] if a not in step.axes]
    if step.kind == "all_to_all":
        dims[step.concat_dim] = [a for a in dims[step.concat_dim] if a not in step.axes]
        dims[step.dim].extend(step.axes)
    return Sharding(tuple(tuple(d) for d in dims), tuple(partial))


_STEP_OPS: dict[str, type[graph.GraphOp]] = {
    "all_reduce": graph.AllReduceOp,
    "reduce_scatter": graph.ReduceScatterOp,
    "all_slice": graph.AllSliceOp,
    "all_to_all": graph.AllToAllOp,
    "all_gather": graph.AllGatherOp,
}


def step_collective(
    step: ReshardStep, value: SSAValue, group_size: int | None = None
) -> graph.GraphOp:
    """The collective op of one reshard step on ``value`` (built, not inserted): in global
    types, or with ``group_size`` (the ranks over ``step.axes``) in local (per-rank) ones."""
    attrs: dict[str, object] = {"axes": step.axes}
    if step.kind == "all_to_all":
        attrs |= {"split_dim": step.dim, "concat_dim": step.concat_dim}
    elif step.dim is not None:
        attrs["dim"] = step.dim
    if step.reduction is not None:
        attrs["kind"] = step.reduction
    if group_size is not None:
        attrs["group_size"] = group_size
    return graph.build(_STEP_OPS[step.kind], [value], **attrs)
