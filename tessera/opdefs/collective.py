"""Collectives over mesh axes and the sharding constraint ``graph.shard``.

Before shard-partition, types are global and a collective is a layout transition: the
global value is unchanged (its reference and VJP are the identity), only how it lies over
the mesh changes (its :class:`LayoutTransition`). A constraint states the layout its
value must have. In a partitioned (per-rank) program a collective's semantics are its
:class:`CollectiveReference`'s ``group``: every member's result from every member's
operand (the virtual mesh and the schedule runner compute collectives with it).
Communicating collectives become ``schedule.start`` / ``schedule.wait`` pairs;
``all_slice`` communicates nothing (each rank keeps its slice), so kernels evaluate it
like a layout op, at this rank's offset. ``collective_permute`` moves one rank's block
to another (XLA's source-target pairs; ranks that are no target receive zeros): it
exists only in partitioned programs, where ``shard-partition`` builds block moves of it
(:mod:`tessera.transforms.block_moves`); on a global value it has no meaning.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from xdsl.dialects.func import FuncOp
from xdsl.ir import SSAValue

from tessera import numerics
from tessera.errors import ExecutionError, ShardingError, TesseraError
from tessera.ir import graph
from tessera.ir.abstract import aval
from tessera.ir.grad_builder import GradBuilder
from tessera.ir.reduction_kinds import KINDS, NAMES
from tessera.ir.sharding import Sharding
from tessera.opdefs.registry import (
    Cotangents,
    Fusion,
    IndexMap,
    LayoutTransition,
    NotApplicable,
    RankIndexMap,
    Tile,
    op_def,
    register,
)

if TYPE_CHECKING:
    from tessera.opdefs.registry import Index, TileEvaluator

Dims = list[list[str]]
Values = list[torch.Tensor]  # one tensor per member of a rank group, in group order
GroupFn = Callable[[Any, Values], Values]

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
    """In the global view a sharding constraint leaves the value as is."""
    return x


@dataclass(frozen=True)
class CollectiveReference:
    """A collective's torch semantics: on the global value (calling it, as every op's
    reference is called; the identity for a layout transition) and ``group(op, xs)``,
    every group member's result from every member's operand (``op`` is the graph op or
    a ``schedule.start``)."""

    group: GroupFn
    global_view: Callable[[graph.GraphOp, torch.Tensor], torch.Tensor] = _identity_reference

    def __call__(self, op: graph.GraphOp, x: torch.Tensor) -> torch.Tensor:
        return self.global_view(op, x)


def on_group(op: Any) -> GroupFn:
    """The per-rank group semantics of a collective op (or op class)."""
    reference = op_def(op).reference
    assert isinstance(reference, CollectiveReference), f"{op.name} is not a collective"
    return reference.group


_LOW_PRECISION = (torch.float16, torch.bfloat16)


def ordered_reduce(values: Sequence[torch.Tensor], dtype: torch.dtype, kind: str) -> torch.Tensor:
    """``((v0 ∘ v1) ∘ v2) ∘ …`` in ``dtype``, ``∘`` combining terms of ``kind`` (a mean's
    are added): the deterministic numerics' fixed order."""
    combine = KINDS[KINDS[kind].combine]
    total = values[0].to(dtype).clone()
    for value in values[1:]:
        total = combine.torch_reduce(torch.stack([total, value.to(dtype)]), (0,), False)
        total = total.to(dtype)  # torch sums and multiplies int32 in int64
    return total


def accumulation_dtype(kind: str, dtype: torch.dtype) -> torch.dtype:
    """The dtype terms of ``kind`` combine in: f32 for f16/bf16 terms of a kind that rounds."""
    return torch.float32 if KINDS[kind].rounds and dtype in _LOW_PRECISION else dtype


def finish_reduce(total: torch.Tensor, kind: str, size: int, dtype: torch.dtype) -> torch.Tensor:
    """The result from the combined terms of ``size`` ranks: a mean divides by ``size``
    (integers round down); then one rounding to ``dtype``."""
    if KINDS[kind].averages:
        exact = total.is_floating_point() or total.is_complex()
        total = total / size if exact else torch.div(total, size, rounding_mode="floor")
    return total.to(dtype)


def reduce_pieces(values: Sequence[torch.Tensor], kind: str) -> torch.Tensor:
    """The ``kind`` reduction (a key of ``KINDS``) of same-shaped tensors, in their
    dtype; f16/bf16 terms of a kind that rounds combine in f32 and round once."""
    if kind not in KINDS:
        raise ShardingError(f"reduction kind must be one of {NAMES}, found {kind!r}")
    stacked = torch.stack(list(values))
    dtype = stacked.dtype
    accumulate = accumulation_dtype(kind, dtype)
    if KINDS[kind].rounds and numerics.deterministic():
        total = ordered_reduce(values, accumulate, kind)
    else:
        total = KINDS[KINDS[kind].combine].torch_reduce(stacked.to(accumulate), (0,), False)
    return finish_reduce(total, kind, len(values), dtype)


def _all_reduce_group(op: Any, xs: Values) -> Values:
    return [reduce_pieces(xs, op.attrs()["kind"])] * len(xs)


def _all_gather_group(op: Any, xs: Values) -> Values:
    return [torch.cat(xs, op.attrs()["dim"])] * len(xs)


def _all_slice_group(op: Any, xs: Values) -> Values:
    return [x.chunk(len(xs), op.attrs()["dim"])[p] for p, x in enumerate(xs)]


def _reduce_scatter_group(op: Any, xs: Values) -> Values:
    attrs = op.attrs()
    return list(reduce_pieces(xs, attrs["kind"]).chunk(len(xs), attrs["dim"]))


def _all_to_all_group(op: Any, xs: Values) -> Values:
    attrs = op.attrs()
    chunks = [x.chunk(len(xs), attrs["split_dim"]) for x in xs]  # chunks[sender][receiver]
    return [torch.cat([c[p] for c in chunks], attrs["concat_dim"]) for p in range(len(xs))]


def _broadcast_group(op: Any, xs: Values) -> Values:
    src = op.attrs()["src"]
    if not 0 <= src < len(xs):
        raise ExecutionError(
            f"{op.name}: source index {src} is outside the group of {len(xs)} ranks"
        )
    return [xs[src]] * len(xs)


def _collective_permute_group(op: Any, xs: Values) -> Values:
    """Each pair's target takes its source's value; ranks that are no target get zeros."""
    received = [torch.zeros_like(x) for x in xs]
    for source, target in op.attrs()["pairs"]:
        received[target] = xs[source]
    return received


def _per_rank_only(op: graph.GraphOp, x: torch.Tensor) -> torch.Tensor:
    raise ExecutionError(
        f"{op.name} moves blocks between ranks: it has per-rank semantics only (in a "
        "partitioned function), not on a global value"
    )


def _collective_permute_vjp(
    b: GradBuilder, op: graph.CollectivePermuteOp, cts: Cotangents
) -> Cotangents:
    """The inverse permutation: each source gets its target's cotangent (a rank that is
    no source sent nothing, so its cotangent is zero)."""
    ct = cts[0]
    if ct is None or not aval(op.input).dtype.is_float:
        return [None]
    inverse = [[target, source] for source, target in op.source_target_pairs()]
    return [b.op(graph.CollectivePermuteOp, ct, axes=op.attrs()["axes"], pairs=inverse)]


def per_rank_vjp(
    b: GradBuilder, op: graph.GraphOp, ct: SSAValue, varies: frozenset[str]
) -> SSAValue | None:
    """The transpose of a collective in a manual (``dist.shard_map``) body, where each
    rank holds its block and a cotangent is the same along every axis its value is
    (``tessera.ir.manual.varying``: ``varies`` are the axes the operand varies along):

    - all_reduce (sum) over an axis is the identity on its invariant cotangent, times the
      axis size where the operand was itself the same on every rank (it counted once per
      rank): an all_reduce of the cotangent over those axes;
    - all_gather's is this rank's slice of the cotangent (all_slice); reduce_scatter's
      is the all_gather of the cotangent; all_to_all's moves the split back;
    - collective_permute's is the inverse permutation.

    The autodiff pass sums over an axis every cotangent that varies along an axis its
    value does not (the transpose of the implicit broadcast of an invariant value)."""
    if not aval(op.operands[0]).dtype.is_float:
        return None
    attrs = op.attrs()
    axes = tuple(attrs.get("axes", ()))
    x, y = aval(op.operands[0]), aval(op.results[0])
    if isinstance(op, graph.AllReduceOp):
        if attrs["kind"] != "sum":
            raise TesseraError(
                f"{op.name} {{kind = {attrs['kind']}}} in a dist.shard_map body is not "
                f"differentiable yet (only sum is)"
            )
        same = tuple(a for a in axes if a not in varies)
        if not same:
            return ct
        return b.op(graph.AllReduceOp, ct, axes=same, kind="sum")
    if isinstance(op, graph.AllGatherOp):
        dim = attrs["dim"]
        return b.op(graph.AllSliceOp, ct, axes=axes, dim=dim, group_size=y.shape[dim] // max(x.shape[dim], 1))
    if isinstance(op, graph.ReduceScatterOp):
        if attrs["kind"] != "sum":
            raise TesseraError(f"{op.name} {{kind = {attrs['kind']}}} in a dist.shard_map body is not differentiable yet")
        dim = attrs["dim"]
        return b.op(graph.AllGatherOp, ct, axes=axes, dim=dim, group_size=x.shape[dim] // max(y.shape[dim], 1))
    if isinstance(op, graph.AllToAllOp):
        split, concat = attrs["split_dim"], attrs["concat_dim"]
        return b.op(
            graph.AllToAllOp, ct, axes=axes, split_dim=concat, concat_dim=split,
            group_size=x.shape[split] // max(y.shape[split], 1),
        )  # fmt: skip
    if isinstance(op, graph.CollectivePermuteOp):
        (result,) = _collective_permute_vjp(b, op, [ct])
        return result
    raise TesseraError(f"{op.name} in a dist.shard_map body is not differentiable yet")


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
    ev: TileEvaluator, op: graph.AllSliceOp, value: SSAValue, index: Index
) -> SSAValue:
    """This rank's slice: the index shifted by the rank's offset along ``dim``."""
    attrs = op.attrs()
    dim, chunk = attrs["dim"], aval(value).shape[attrs["dim"]]
    start = ev.b.mul(ev.positions[tuple(attrs["axes"])], ev.b.index(chunk))
    inner = list(index)
    inner[dim] = start if inner[dim] is None else ev.b.add(inner[dim], start)
    return ev.at(op.input, tuple(inner))


def _register(
    op_type: type[graph.CollectiveOp], edit: Callable[..., None], group: GroupFn, tile: Tile
) -> None:
    register(
        op_type,
        sharding=_transition(edit),
        partial=NO_PARTIAL_PASSTHROUGH,
        vjp=_identity_vjp,
        reference=CollectiveReference(group),
        tile=tile,
        fusion=Fusion.LAYOUT if isinstance(tile, IndexMap) else Fusion.COLLECTIVE,
    )


_register(graph.AllReduceOp, _keep_dims, _all_reduce_group, ASYNC)
_register(graph.BroadcastOp, _keep_dims, _broadcast_group, ASYNC)
_register(graph.AllGatherOp, _gather_dim, _all_gather_group, ASYNC)
_register(graph.ReduceScatterOp, _split_dim, _reduce_scatter_group, ASYNC)
_register(graph.AllToAllOp, _move_split, _all_to_all_group, ASYNC)
_register(graph.AllSliceOp, _split_dim, _all_slice_group, RankIndexMap(_all_slice_tile))

register(
    graph.CollectivePermuteOp,
    # each rank's block stays the shape it was, and it lies where its layout says
    sharding=LayoutTransition(lambda op, source: source),
    partial=NO_PARTIAL_PASSTHROUGH,
    vjp=_collective_permute_vjp,
    reference=CollectiveReference(_collective_permute_group, _per_rank_only),
    tile=ASYNC,
    fusion=Fusion.COLLECTIVE,
)

register(
    graph.ShardOp,
    sharding=LayoutTransition(lambda op, source: op.sharding.sharding),
    partial=NO_PARTIAL_PASSTHROUGH,
    vjp=_identity_vjp,
    reference=_identity_reference,
    tile=NotApplicable("a constraint: insert-collectives replaces it before kernels exist"),
    fusion=Fusion.CONSTRAINT,
)
