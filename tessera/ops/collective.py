"""Collectives over mesh axes and the sharding constraint ``graph.shard``.

Before shard-partition, types are global and a collective is a layout transition: the
global value is unchanged (its reference and VJP are the identity), only how it lies over
the mesh changes (its :class:`LayoutTransition`). A constraint states the layout its
value must have. Communicating collectives become ``schedule.start`` / ``schedule.wait``
pairs; ``all_slice`` communicates nothing (each rank keeps its slice), so kernels
evaluate it like a layout op, at this rank's offset.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from xdsl.dialects.func import FuncOp
from xdsl.ir import SSAValue

from tessera.errors import TesseraError
from tessera.ir import graph
from tessera.ir.abstract import aval
from tessera.ir.grad_builder import GradBuilder
from tessera.ir.sharding import Sharding
from tessera.ops.registry import (
    Cotangents,
    Fusion,
    IndexMap,
    LayoutTransition,
    NotApplicable,
    Tile,
    register,
)

if TYPE_CHECKING:
    from tessera.codegen.evaluate import Evaluator, Index

Dims = list[list[str]]

NO_PARTIAL_PASSTHROUGH = NotApplicable(
    "a layout transition: insert-collectives reshards its operand to the layout it states"
)
ASYNC = NotApplicable("communicates: lowered to a schedule.start / schedule.wait pair")


def _identity_vjp(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
    """In the global view a collective or a sharding constraint leaves the value as is,
    so the cotangent passes through unchanged (the sharding passes add the collectives
    the backward program needs when it is partitioned)."""
    function = op.parent_op()
    while function is not None and not isinstance(function, FuncOp):
        function = function.parent_op()
    if function is not None and graph.PARTITIONED in function.attributes:
        raise TesseraError(
            f"{op.name} in a partitioned (per-rank) function is not differentiable; "
            "differentiate the program before shard-partition"
        )
    ct = cts[0]
    if ct is None or not aval(op.operands[0]).dtype.is_float:
        return [None]
    return [ct]


def _identity_reference(op: graph.GraphOp, x: torch.Tensor) -> torch.Tensor:
    """In the global view a collective or sharding constraint leaves the value as is."""
    return x


def _transition(edit: Callable[[graph.CollectiveOp, Dims], None]) -> LayoutTransition:
    """The layout a collective leaves: partial axes among its ``axes`` are resolved, then
    ``edit`` moves the splits of the dims."""

    def after(op: graph.CollectiveOp, source: Sharding) -> Sharding:
        axes = set(op.attrs()["axes"])
        dims = [list(d) for d in source.dims]
        partial = [(a, k) for a, k in source.partial if a not in axes]
        if isinstance(op, graph.BroadcastOp):  # every rank takes one rank's terms
            partial = list(source.partial)
        edit(op, dims)
        return Sharding(tuple(tuple(d) for d in dims), tuple(partial))

    return LayoutTransition(after)


def _keep_dims(op: graph.CollectiveOp, dims: Dims) -> None:
    """all_reduce and broadcast leave every dim's split as it is."""


def _gather_dim(op: graph.CollectiveOp, dims: Dims) -> None:
    attrs = op.attrs()
    dims[attrs["dim"]] = [a for a in dims[attrs["dim"]] if a not in attrs["axes"]]


def _split_dim(op: graph.CollectiveOp, dims: Dims) -> None:
    attrs = op.attrs()
    dims[attrs["dim"]] += [a for a in attrs["axes"] if a not in dims[attrs["dim"]]]


def _move_split(op: graph.CollectiveOp, dims: Dims) -> None:
    attrs = op.attrs()
    dims[attrs["concat_dim"]] = [a for a in dims[attrs["concat_dim"]] if a not in attrs["axes"]]
    dims[attrs["split_dim"]] += list(attrs["axes"])


def _all_slice_tile(
    ev: Evaluator, op: graph.AllSliceOp, value: SSAValue, index: Index
) -> SSAValue:
    """This rank's slice: the index shifted by the rank's offset along ``dim``."""
    attrs = op.attrs()
    dim, chunk = attrs["dim"], aval(value).shape[attrs["dim"]]
    start = ev.b.mul(ev.positions[tuple(attrs["axes"])], ev.b.index(chunk))
    inner = list(index)
    inner[dim] = start if inner[dim] is None else ev.b.add(inner[dim], start)
    return ev.at(op.input, tuple(inner))


def _register(op_type: type[graph.CollectiveOp], edit: Callable[..., None], tile: Tile) -> None:
    register(
        op_type,
        sharding=_transition(edit),
        partial=NO_PARTIAL_PASSTHROUGH,
        vjp=_identity_vjp,
        reference=_identity_reference,
        tile=tile,
        fusion=Fusion.LAYOUT if isinstance(tile, IndexMap) else Fusion.COLLECTIVE,
    )


_register(graph.AllReduceOp, _keep_dims, ASYNC)
_register(graph.BroadcastOp, _keep_dims, ASYNC)
_register(graph.AllGatherOp, _gather_dim, ASYNC)
_register(graph.ReduceScatterOp, _split_dim, ASYNC)
_register(graph.AllToAllOp, _move_split, ASYNC)
_register(graph.AllSliceOp, _split_dim, IndexMap(_all_slice_tile))

register(
    graph.ShardOp,
    sharding=LayoutTransition(lambda op, source: op.sharding.sharding),
    partial=NO_PARTIAL_PASSTHROUGH,
    vjp=_identity_vjp,
    reference=_identity_reference,
    tile=NotApplicable("a constraint: insert-collectives replaces it before kernels exist"),
    fusion=Fusion.CONSTRAINT,
)
