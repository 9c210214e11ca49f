"""Mixture-of-experts layers for traced code: routing, dispatch, combine and the router losses.

Tokens come in groups ``[G, T, H]`` (a batch row each, GShard's groups); each group
routes on its own with a static capacity per expert, so shapes never depend on the
data::

    weights, experts, scores = op.router(x @ w_router, k=2)         # [G, T, K] each
    routing = op.route(experts, num_experts=8, capacity=op.expert_capacity(T, 8, 2, 1.25))
    xe = op.dispatch(x, routing)                                     # [G, E, C, H]
    ye = op.silu(xe @ w1) @ w2                                       # experts [E, H, F], [E, F, H]
    y = op.combine(ye, routing, weights)                             # [G, T, H]

``route``, ``dispatch`` and ``combine`` bind ``graph.moe_route`` / ``moe_dispatch`` /
``moe_combine``; the router and the losses are compositions of other ops. With the
groups split over ``dp × ep`` and the expert weights over ``ep`` along ``E``, the
compiler inserts the dispatch and combine all-to-alls (expert parallelism).

``moe_block`` composes dispatch, experts, an optional *shared expert* (an MLP every
token goes through, DeepSeek-MoE's and Qwen-MoE's) and combine, traced in the order that
lets the shared expert's matmuls run while the combine all-to-all is in flight::

    y = op.moe_block(x, routing, weights,
                     experts=lambda xe: op.silu(xe @ w1) @ w2,
                     shared=lambda x: op.silu(x @ s1) @ s2)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from tessera.errors import ShapeError
from tessera.frontend.tracer import Tensor, current_trace, user_location
from tessera.ir import graph
from tessera.op.composites import logsumexp, one_hot
from tessera.op.primitives import (
    Operand,
    _integer,
    _tensors,
    add,
    astype,
    divide,
    mean,
    multiply,
    reshape,
    sigmoid,
    softmax,
    sum,
    top_k,
)

SCORES = ("softmax", "sigmoid")


@dataclass(frozen=True)
class Routing:
    """Where each token's choices went: ``slots [G, T, K]`` and ``sources [G, E, C]``
    (see ``graph.moe_route``)."""

    slots: Tensor
    sources: Tensor
    num_experts: int
    capacity: int


def expert_capacity(tokens: int, num_experts: int, k: int, capacity_factor: float | None) -> int:
    """Slots per expert for a group of ``tokens``: ``ceil(tokens * k * factor /
    num_experts)`` (Switch, GShard), at most ``tokens``; ``None`` is dropless: ``tokens``,
    the most one expert can be chosen by (a token chooses an expert once)."""
    if capacity_factor is None:
        return tokens
    if capacity_factor <= 0:
        raise ShapeError(
            f"capacity_factor must be positive, found {capacity_factor}, at {user_location()}"
        )
    return max(1, min(tokens, math.ceil(tokens * k * capacity_factor / num_experts)))


def router(
    logits: Operand, k: int, score: str = "softmax", normalize: bool = True
) -> tuple[Tensor, Tensor, Tensor]:
    """Top-``k`` routing of ``logits [..., E]``: ``(weights, experts, scores)``.

    ``scores`` are ``softmax`` (Mixtral, Switch) or ``sigmoid`` (DeepSeek-V3) of the
    logits; ``experts`` the i32 indices of the ``k`` highest, ``weights`` their scores,
    renormalised to sum to one per token with ``normalize``."""
    (tensor,) = _tensors(logits)
    if score not in SCORES:
        raise ShapeError(
            f"router: score must be one of {SCORES}, found {score!r}, at {user_location()}"
        )
    scores = softmax(tensor, axis=-1) if score == "softmax" else sigmoid(tensor)
    weights, experts = top_k(scores, k)
    if normalize:
        weights = divide(weights, sum(weights, axis=-1, keepdims=True))
    return weights, experts, scores


def route(experts: Operand, num_experts: int, capacity: int) -> Routing:
    """Slots for the expert choices ``experts [G, T, K]`` (integers in ``[0,
    num_experts)``): first choices first, tokens in order, over ``capacity`` dropped."""
    (choices,) = _tensors(experts)
    num_experts = _integer(num_experts, "route: num_experts")
    capacity = _integer(capacity, "route: capacity")
    slots, sources = current_trace().bind(
        graph.MoeRouteOp, [choices], experts=num_experts, capacity=capacity
    )
    return Routing(slots, sources, num_experts, capacity)


def dispatch(x: Operand, routing: Routing) -> Tensor:
    """The tokens ``x [G, T, H]`` in their experts' slots: ``[G, E, C, H]`` (zeros where
    a slot is empty)."""
    (tensor,) = _tensors(x)
    (result,) = current_trace().bind(graph.MoeDispatchOp, [tensor, routing.slots, routing.sources])
    return result


def combine(expert_outputs: Operand, routing: Routing, weights: Operand) -> Tensor:
    """``y[g, t] = sum_j weights[g, t, j] * expert_outputs[g, slot of (t, j)]``: the
    experts' outputs ``[G, E, C, H]`` back to the tokens ``[G, T, H]`` (a dropped choice
    adds nothing)."""
    (outputs,) = _tensors(expert_outputs)
    (rows,) = current_trace().bind(graph.MoeCombineOp, [outputs, routing.slots, routing.sources])
    (w,) = _tensors(weights)
    w = astype(w, outputs.dtype)
    return sum(multiply(rows, reshape(w, (*w.shape, 1))), axis=2)


def moe_block(
    x: Operand,
    routing: Routing,
    weights: Operand,
    experts: Callable[[Tensor], Tensor],
    shared: Callable[[Tensor], Tensor] | None = None,
) -> Tensor:
    """``combine(experts(dispatch(x))) + shared(x)`` for tokens ``x [G, T, H]``:
    ``experts`` maps the dispatched slots ``[G, E, C, H]`` to the experts' outputs
    (same shape), ``shared`` (optional) maps ``x`` to ``[G, T, H]``.

    The shared expert is traced after the routed experts and before ``combine``: under
    expert parallelism its kernels sit between the start of the combine all-to-all
    (which ``overlap-comm`` hoists to the experts' output) and its wait (sunk to
    ``combine``), so they hide the transfer. Same values in any order."""
    (tokens,) = _tensors(x)
    outputs = experts(dispatch(tokens, routing))
    common = shared(tokens) if shared is not None else None
    y = combine(outputs, routing, weights)
    return y if common is None else add(y, common)


def load_balancing_loss(scores: Operand, experts: Operand) -> Tensor:
    """Switch's auxiliary loss ``E * sum_e f_e * P_e``: ``f_e`` the fraction of choices
    routed to expert ``e`` (over tokens and the ``k`` choices), ``P_e`` the mean score
    of ``e`` (differentiable); 1 for uniform routing."""
    (probabilities,) = _tensors(scores)
    (choices,) = _tensors(experts)
    num_experts = probabilities.shape[-1]
    lead = tuple(range(choices.ndim))
    fraction = mean(one_hot(choices, num_experts, probabilities.dtype), axis=lead)
    mean_score = mean(probabilities, axis=tuple(range(probabilities.ndim - 1)))
    return multiply(sum(multiply(fraction, mean_score)), float(num_experts))


def router_z_loss(logits: Operand) -> Tensor:
    """ST-MoE's router z-loss: the mean over tokens of ``logsumexp(logits)²``."""
    (tensor,) = _tensors(logits)
    z = logsumexp(tensor, axis=-1)
    return mean(multiply(z, z))


__all__ = [
    "Routing",
    "combine",
    "dispatch",
    "expert_capacity",
    "load_balancing_loss",
    "moe_block",
    "route",
    "router",
    "router_z_loss",
]
