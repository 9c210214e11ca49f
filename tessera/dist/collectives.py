"""Sharding constraints and explicit collectives inside ``@ts.jit`` code.

Traced code sees global tensors, so an explicit collective states a layout: after
``dist.all_reduce(x, axis="tp")`` the value is no longer partial over ``tp``; after
``dist.all_gather(x, axis="tp", dim=1)`` dim 1 is whole. The global value never
changes; the sharding passes turn these into communication where the layout needs it.
Inside a ``dist.shard_map`` body they are per-rank collectives instead (see
:mod:`tessera.dist.per_rank`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tessera.dist import per_rank
from tessera.dist.shard_spec import ShardSpec
from tessera.errors import ShardingError, TraceError
from tessera.frontend.tracer import Tensor, current_trace, user_location
from tessera.ir import graph
from tessera.ir.mesh import Mesh
from tessera.ir.shape_rules import normalize_axis
from tessera.ir.sharding import Sharding, ShardingAttr

MESH_SYMBOL = "mesh"


def _mesh(what: str) -> Mesh:
    mesh = current_trace().mesh
    if mesh is None:
        raise TraceError(f"{what} needs a device mesh: use ts.jit(fn, mesh=...), at {user_location()}")
    return mesh


def _axes(what: str, axis: str | Sequence[str]) -> tuple[str, ...]:
    return per_rank.checked_axes(_mesh(what), what, axis)


def _bind(op_type: type[graph.GraphOp], x: Tensor, **attrs: Any) -> Tensor:
    return per_rank.bind_unary(op_type, op_type.name, x, **attrs)


def shard(x: Tensor, spec: ShardSpec | Sharding) -> Tensor:
    """Constrains ``x`` to the layout ``spec`` at this point (JAX's sharding constraint)."""
    if per_rank.in_manual_region():
        raise TraceError(
            f"dist.shard states a global layout; inside a dist.shard_map body values are "
            f"per-rank blocks (state layouts in in_specs / out_specs), at {user_location()}"
        )
    mesh = _mesh("dist.shard")
    if not isinstance(spec, (ShardSpec, Sharding)):
        raise ShardingError(
            f"dist.shard takes a dist.ShardSpec, found {type(spec).__name__} {spec!r}, "
            f"at {user_location()}"
        )
    sharding = spec.to_sharding(mesh, x.shape, f"dist.shard at {user_location()}") if isinstance(spec, ShardSpec) else spec
    if isinstance(spec, Sharding):
        spec.validate(mesh, x.shape, f"dist.shard at {user_location()}")
    return _bind(graph.ShardOp, x, sharding=ShardingAttr.get(MESH_SYMBOL, sharding))


def shard_unread(values: Sequence[Any], specs: Sequence[ShardSpec | Sharding | None]) -> list[Any]:
    """``dist.shard(x, spec)`` of each traced tensor ``x`` of ``values`` whose spec is not
    None, for values the traced code reads no more (a step's outputs, the gradients the
    optimizer reads constrained): an unread, unconstrained result of a region call is
    constrained by the call (``graph.result_shardings``, what ``canonicalize`` would fold
    the ``graph.shard`` into; a scan's stacked result when the layout keeps dim 0 whole)
    and returned as is, with no op; each call's constraints are set at once."""
    found: list[Any] = []
    folded: dict[graph.CallOp | graph.ScanOp, list[ShardingAttr | None]] = {}
    functions = current_trace().functions.functions
    for x, spec in zip(values, specs, strict=True):
        if spec is None or not isinstance(x, Tensor):
            found.append(x)
            continue
        value = x.value
        call = value.owner
        caller = isinstance(call, graph.CallOp | graph.ScanOp)
        index = value.index if caller else 0  # type: ignore[attr-defined]
        if caller and call not in folded:
            callee = functions.get(call.callee_name)  # type: ignore[union-attr]
            if callee is not None and graph.MANUAL not in callee.attributes:
                folded[call] = call.result_constraint_attrs()  # type: ignore[union-attr]
        attrs = folded.get(call)  # type: ignore[call-overload]
        if attrs is None or value.uses or per_rank.in_manual_region():
            found.append(shard(x, spec))
            continue
        mesh = _mesh("dist.shard")
        where = f"dist.shard at {user_location()}"
        if isinstance(spec, ShardSpec):
            sharding = spec.to_sharding(mesh, x.shape, where)
        else:
            spec.validate(mesh, x.shape, where)
            sharding = spec
        if attrs[index] is not None and attrs[index].sharding == sharding:
            found.append(x)  # constrained so already
            continue
        if attrs[index] is not None or (
            isinstance(call, graph.ScanOp) and not graph.scan_constrainable(call, index, sharding)
        ):
            found.append(shard(x, spec))
            continue
        attrs[index] = ShardingAttr.get(MESH_SYMBOL, sharding)
        found.append(x)
    for call, attrs in folded.items():
        call.set_result_constraints(attrs)
    return found


def all_reduce(x: Tensor, axis: str | Sequence[str], op: str = "sum") -> Tensor:
    """Resolves ``x``'s partial values over ``axis``; ``op`` is their reduction kind
    (a key of ``tessera.ir.reduction_kinds.KINDS``: sum, mean, max, min, prod)."""
    if per_rank.in_manual_region():
        return per_rank.all_reduce(x, axis, op)
    return _bind(graph.AllReduceOp, x, axes=_axes("dist.all_reduce", axis), kind=op)


def all_gather(x: Tensor, axis: str | Sequence[str], dim: int = 0) -> Tensor:
    """Makes dim ``dim`` whole on every rank of ``axis``."""
    if per_rank.in_manual_region():
        return per_rank.all_gather(x, axis, dim)
    return _bind(graph.AllGatherOp, x, axes=_axes("dist.all_gather", axis), dim=normalize_axis(dim, x.ndim))


def reduce_scatter(x: Tensor, axis: str | Sequence[str], dim: int = 0, op: str = "sum") -> Tensor:
    """Resolves partial sums over ``axis`` into a split of dim ``dim`` over it."""
    if per_rank.in_manual_region():
        return per_rank.reduce_scatter(x, axis, dim, op)
    axes = _axes("dist.reduce_scatter", axis)
    return _bind(graph.ReduceScatterOp, x, axes=axes, dim=normalize_axis(dim, x.ndim), kind=op)


def all_to_all(x: Tensor, axis: str | Sequence[str], split_dim: int, concat_dim: int) -> Tensor:
    """Moves the split over ``axis`` from ``concat_dim`` to ``split_dim``."""
    if per_rank.in_manual_region():
        return per_rank.all_to_all(x, axis, split_dim, concat_dim)
    axes = _axes("dist.all_to_all", axis)
    return _bind(
        graph.AllToAllOp, x, axes=axes,
        split_dim=normalize_axis(split_dim, x.ndim), concat_dim=normalize_axis(concat_dim, x.ndim),
    )  # fmt: skip


def broadcast(x: Tensor, axis: str | Sequence[str], src: int = 0) -> Tensor:
    """Every rank along ``axis`` takes the value of the rank at index ``src``."""
    if per_rank.in_manual_region():
        return per_rank.broadcast(x, axis, src)
    axes = _axes("dist.broadcast", axis)
    size = 1
    for name in axes:
        size *= _mesh("dist.broadcast").axis_size(name)
    if not 0 <= src < size:
        raise ShardingError(f"dist.broadcast: src {src} is out of range for {size} ranks, at {user_location()}")
    return _bind(graph.BroadcastOp, x, axes=axes, src=src)
