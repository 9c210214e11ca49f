"""Mixture-of-experts routing: ``graph.moe_route``, ``graph.moe_dispatch``, ``graph.moe_combine``.

Tokens come in groups (``G``, GShard's groups: a batch row), each with its own
capacity ``C`` per expert, so every shape is static and a group's routing never depends
on another group's. ``moe_route`` turns each token's expert choices ``[G, T, K]`` into
slots (Switch/GShard: first choices first, tokens in order, dropped over capacity);
``moe_dispatch`` gathers the tokens into ``[G, E, C, H]``, ``moe_combine`` gathers the
experts' outputs back into one row per choice ``[G, T, K, H]`` (the router's weights
are applied by the caller, so their gradient is an ordinary product's). Dispatch and
combine are linear and each other's transpose: the VJP of one is the other.

Sharding: the group dim is parallel, the hidden dim of dispatch and combine too; the
tokens, choices, experts and slots of a group are needed whole (``REPLICATED``). With
tokens split over ``dp × ep`` by group and expert weights ``[E, ...]`` split over ``ep``,
the expert matmul wants ``[G, E, C, H]`` split over ``ep`` along ``E``: the sharding
passes move ``ep`` from the group dim to the expert dim with an all-to-all after
dispatch (and back before combine) — expert parallelism as GShard's einsums do it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from xdsl.dialects.builtin import i32
from xdsl.ir import SSAValue

from tessera.errors import ExecutionError
from tessera.ir import graph
from tessera.ir.abstract import AbstractTensor, aval
from tessera.ir.grad_builder import GradBuilder
from tessera.ir.sharding_rules import FactorKind, RuleBuilder, ShardingRule
from tessera.opdefs.registry import NOT_LINEAR, Cotangents, Fusion, IndexMap, bound, register
from tessera.opdefs.top_k import HOST_TILE

if TYPE_CHECKING:
    from tessera.opdefs.registry import Index, TileEvaluator

# --- sharding ---------------------------------------------------------------------------


def _routing_dims(
    b: RuleBuilder, slots: AbstractTensor, sources: AbstractTensor
) -> tuple[int, tuple[int, int, int], tuple[int, int, int]]:
    """The group factor and the dims of slots ``[G, T, K]`` and sources ``[G, E, C]``."""
    g, t, k = slots.shape
    group = b.new(g)
    tokens, choices = b.new(t, FactorKind.REPLICATED), b.new(k, FactorKind.REPLICATED)
    experts = b.new(sources.shape[1], FactorKind.REPLICATED)
    capacity = b.new(sources.shape[2], FactorKind.REPLICATED)
    return group, (group, tokens, choices), (group, experts, capacity)


def _route_sharding(
    operands: list[AbstractTensor], results: list[AbstractTensor], attrs: dict[str, Any]
) -> ShardingRule:
    """Groups parallel; a group's tokens, choices, experts and slots whole."""
    b = RuleBuilder()
    _, slot_dims, source_dims = _routing_dims(b, results[0], results[1])
    return b.rule([slot_dims], [slot_dims, source_dims])


def _dispatch_sharding(
    operands: list[AbstractTensor], results: list[AbstractTensor], attrs: dict[str, Any]
) -> ShardingRule:
    """``(g, t[, k], h), (g, t, k), (g, e, c) -> (g, e, c, h)``: g and h parallel."""
    x, slots, sources = operands
    b = RuleBuilder()
    _, slot_dims, source_dims = _routing_dims(b, slots, sources)
    hidden = b.new(x.shape[-1])
    x_dims = (*slot_dims[: x.rank - 1], hidden)
    return b.rule([x_dims, slot_dims, source_dims], [(*source_dims, hidden)])


def _combine_sharding(
    operands: list[AbstractTensor], results: list[AbstractTensor], attrs: dict[str, Any]
) -> ShardingRule:
    """``(g, e, c, h), (g, t, k), (g, e, c) -> (g, t, k, h)``: g and h parallel."""
    y, slots, sources = operands
    b = RuleBuilder()
    _, slot_dims, source_dims = _routing_dims(b, slots, sources)
    hidden = b.new(y.shape[-1])
    return b.rule([(*source_dims, hidden), slot_dims, source_dims], [(*slot_dims, hidden)])


# --- reference semantics ------------------------------------------------------------------


def route(choices: torch.Tensor, experts: int, capacity: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The slots and sources of ``choices [G, T, K]`` (see ``graph.MoeRouteOp``)."""
    g, t, k = choices.shape
    if choices.numel() and (int(choices.min()) < 0 or int(choices.max()) >= experts):
        raise ExecutionError(
            f"graph.moe_route: expert choices must be in [0, {experts}), found values in "
            f"[{int(choices.min())}, {int(choices.max())}]"
        )
    order = choices.long().transpose(1, 2).reshape(g, k * t)  # first choices first
    one_hot = torch.nn.functional.one_hot(order, experts)  # [G, K*T, E]
    position = ((one_hot.cumsum(1) - 1) * one_hot).sum(-1)  # each choice's place in its expert
    kept = position < capacity
    flat_slot = torch.where(kept, order * capacity + position, -1)
    slots = flat_slot.reshape(g, k, t).transpose(1, 2).contiguous()
    choice = torch.arange(t * k).reshape(t, k).T.reshape(-1)  # t * K + j, in (j, t) order
    sources = torch.full((g, experts * capacity + 1), -1, dtype=torch.long)
    target = torch.where(kept, flat_slot, experts * capacity)  # dropped: a spare column
    sources.scatter_(1, target, choice.expand(g, -1).clone())
    sources = sources[:, :-1].reshape(g, experts, capacity)
    return slots.to(torch.int32), sources.to(torch.int32)


@bound
def _route_reference(op: graph.MoeRouteOp) -> Callable[[torch.Tensor], tuple[torch.Tensor, ...]]:
    """First choices first, tokens in order, each to its expert's next free slot."""
    attrs = op.attrs()
    return lambda choices: route(choices, attrs["experts"], attrs["capacity"])


def _take_rows(rows: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``rows [G, N, H]`` at ``index [G, ...]`` (-1: a zero row) -> ``[G, ..., H]``."""
    g, _, h = rows.shape
    flat = index.reshape(g, -1).long()
    taken = torch.gather(rows, 1, flat.clamp(min=0)[..., None].expand(-1, -1, h))
    taken = torch.where(flat[..., None] >= 0, taken, torch.zeros((), dtype=rows.dtype))
    return taken.reshape(*index.shape, h)


@bound
def _dispatch_reference(op: graph.MoeDispatchOp) -> Callable[..., torch.Tensor]:
    """Slot ``(e, c)`` takes row ``sources // K`` of ``x [G, T, H]`` (row ``sources`` of
    ``x [G, T, K, H]``), zero when empty."""
    per_choice = aval(op.input).rank == 4

    def run(x: torch.Tensor, slots: torch.Tensor, sources: torch.Tensor) -> torch.Tensor:
        g, h, k = x.shape[0], x.shape[-1], slots.shape[2]
        index = sources.long()
        if not per_choice:
            index = torch.where(index >= 0, index // k, -1)
        return _take_rows(x.reshape(g, -1, h), index)

    return run


@bound
def _combine_reference(op: graph.MoeCombineOp) -> Callable[..., torch.Tensor]:
    """Choice ``(t, j)`` takes the expert row at ``slots[t, j]``, zero when dropped."""

    def run(y: torch.Tensor, slots: torch.Tensor, sources: torch.Tensor) -> torch.Tensor:
        g, h = y.shape[0], y.shape[-1]
        return _take_rows(y.reshape(g, -1, h), slots)

    return run


# --- tile code: gathers with a zero for empty slots ------------------------------------------


def _row_or_zero(
    ev: TileEvaluator, rows: SSAValue, lead: Index, flat: SSAValue, inner: tuple[int, ...], h: Any
) -> SSAValue:
    """``rows[lead..., flat as an index over dims of sizes inner..., h]``, 0 where
    ``flat < 0`` (an empty slot or a dropped choice), like ``_take_rows``."""
    b = ev.b
    flat = b.convert(flat, i32)
    components: list[Any] = []
    rest = flat
    for position, size in enumerate(inner):
        below = 1
        for s in inner[position + 1 :]:
            below *= s
        part = b.div(rest, b.index(below)) if below > 1 else rest
        components.append(None if size == 1 else b.clamp(part, size))
        if below > 1:
            rest = b.rem(rest, b.index(below))
    value = ev.at(rows, (*lead, *components, h))
    return b.select(b.cmp("ge", flat, b.index(0)), value, b.constant(0.0))


def _dispatch_tile(
    ev: TileEvaluator, op: graph.MoeDispatchOp, value: SSAValue, index: Index
) -> SSAValue:
    """Slot ``(g, e, c)`` reads the token ``sources[g, e, c] // K`` (or the choice row
    ``sources`` of ``[G, T, K, H]``), zero when empty."""
    x, slots, sources = op.operands
    g, e, c, h = index
    source = ev.at(sources, (g, e, c))
    t, k = aval(slots).shape[1:]
    if aval(x).rank == 4:
        return _row_or_zero(ev, x, (g,), source, (t, k), h)
    b = ev.b
    flat = b.convert(source, i32)
    token = b.select(b.cmp("ge", flat, b.index(0)), b.div(flat, b.index(k)), b.index(-1))
    return _row_or_zero(ev, x, (g,), token, (t,), h)


def _combine_tile(ev: TileEvaluator, op: graph.MoeCombineOp, value: SSAValue, index: Index) -> SSAValue:
    """Choice ``(g, t, j)`` reads the expert row at slot ``slots[g, t, j]`` of ``[G, E, C,
    H]``, zero when dropped."""
    y, slots, _ = op.operands
    g, t, j, h = index
    _, experts, capacity, _ = aval(y).shape
    return _row_or_zero(ev, y, (g,), ev.at(slots, (g, t, j)), (experts, capacity), h)


# --- gradients ------------------------------------------------------------------------------


def _no_gradient(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
    """Integer routing has no gradient."""
    return [None]


def _dispatch_vjp(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
    """Combine of the cotangent (summed over the choices for ``x [G, T, H]``)."""
    ct = cts[0]
    if ct is None:
        return [None, None, None]
    x, slots, sources = op.operands
    rows = b.op(graph.MoeCombineOp, ct, slots, sources)
    if aval(x).rank == 3:
        rows = b.sum(rows, [2])
    return [rows, None, None]


def _combine_vjp(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
    """Dispatch of the per-choice cotangent ``[G, T, K, H]``."""
    ct = cts[0]
    if ct is None:
        return [None, None, None]
    _, slots, sources = op.operands
    return [b.op(graph.MoeDispatchOp, ct, slots, sources), None, None]


register(
    graph.MoeRouteOp,
    sharding=_route_sharding,
    partial=NOT_LINEAR,
    vjp=_no_gradient,
    reference=_route_reference,
    tile=HOST_TILE,
    fusion=Fusion.HOST,
)
register(
    graph.MoeDispatchOp,
    sharding=_dispatch_sharding,
    partial=(0,),
    vjp=_dispatch_vjp,
    reference=_dispatch_reference,
    tile=IndexMap(_dispatch_tile),
    fusion=Fusion.LAYOUT,
)
register(
    graph.MoeCombineOp,
    sharding=_combine_sharding,
    partial=(0,),
    vjp=_combine_vjp,
    reference=_combine_reference,
    tile=IndexMap(_combine_tile),
    fusion=Fusion.LAYOUT,
)
