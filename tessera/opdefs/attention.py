"""``graph.attention`` and ``graph.attention_backward``: attention as one op, forward and backward.

``attention(q, k, v[, q0, k0]) -> (o, lse)`` is ``softmax(scale · q kᵀ) v`` over the keys
with its per-row log-sum-exp; ``attention_backward(q, k, v, do, lse, delta[, q0, k0])
-> (dq, dk, dv)`` its gradients (FlashAttention-2: the probabilities are recomputed from
``lse``; ``delta = rowsum(do * o)`` comes precomputed, by the VJP). Both are one kernel
each (``codegen.attention``), so no ``[Tq, Tk]`` tensor ever exists.

Sharding: batch and head dims are parallel (heads over tp move nothing; with grouped
k/v heads the factor has k's head count); the query rows are parallel in the forward and
a reduction in the backward (dq keeps them, dk and dv sum over them); the key sequence
is a ``CONTEXT`` factor: with q, k and v split over a mesh axis ``cp`` along the
sequence, each rank keeps its queries, and ``shard-partition`` all-gathers k and v for
the op (Llama 3's context parallelism) and reduce-scatters dk and dv, adding each rank's
query offset to the causal positions (``ShardingRule.positions``). The head dims are
needed whole. With ``zigzag = n`` (the sequence stored in zig-zag order,
:mod:`tessera.ir.zigzag`) the causal mask compares true positions; ``shard-partition``
runs it as a ring with no relayout, or ``unzigzag-attention`` rewrites it into
natural-order calls.

Segment ids (a key padding mask becomes ids) split with q's batch and rows and k's
batch and keys; under context parallelism all-gathered with k and v, or the key ids go
round the ring with them. A window takes the causal positions (true ones under
``zigzag``, whose segment ids are stored like the tokens).

References compute in f32 (f64 for f64 inputs) and round once, as the kernels do.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from tessera.errors import TesseraError
from tessera.ir import graph
from tessera.ir.abstract import AbstractTensor, aval
from tessera.ir.grad_builder import GradBuilder
from tessera.ir.sharding_rules import FactorKind, Rule, RuleBuilder, ShardingRule
from tessera.ir.zigzag import zigzag_order
from tessera.opdefs.registry import NOT_LINEAR, Cotangents, Fusion, Kernel, bound, register

FORWARD_OPERANDS = 3  # q, k, v; then the optional positions q0, k0
BACKWARD_OPERANDS = 6  # q, k, v, do, lse, delta; then the optional positions


# --- sharding ---------------------------------------------------------------------------


def _rule(backward: bool) -> Rule:
    def rule(
        operands: list[AbstractTensor], results: list[AbstractTensor], attrs: dict[str, Any]
    ) -> ShardingRule:
        q, k, v = operands[:3]
        b = RuleBuilder()
        batch = tuple(b.new(s) for s in k.shape[:-2])  # q's heads: k's head count (grouped)
        rows = b.new(q.shape[-2], FactorKind.REDUCTION if backward else FactorKind.PARALLEL)
        keys = b.new(k.shape[-2], FactorKind.CONTEXT)
        head = b.new(q.shape[-1], FactorKind.REPLICATED)
        value_head = b.new(v.shape[-1], FactorKind.REPLICATED)
        q_dims, k_dims = (*batch, rows, head), (*batch, keys, head)
        v_dims, o_dims, row_dims = (*batch, keys, value_head), (*batch, rows, value_head), (*batch, rows)
        first = BACKWARD_OPERANDS if backward else FORWARD_OPERANDS
        segments: list[tuple[int, ...]] = []
        if attrs.get("segments"):  # [batch, Tq] and [batch, Tk]: q's dims before the heads
            outer = batch[:-1] if q.rank > 2 else batch
            segments = [(*outer, rows), (*outer, keys)]
        extra = [*segments, *[()] * (len(operands) - first - len(segments))]
        if backward:
            dims = [q_dims, k_dims, v_dims, o_dims, row_dims, row_dims, *extra]
            out = [q_dims, k_dims, v_dims]
        else:
            dims, out = [q_dims, k_dims, v_dims, *extra], [o_dims, row_dims]
        at = first + len(segments)
        positions = ((rows, at), (keys, at + 1)) if by_position(attrs) else ()
        return b.rule(dims, out, "sum", positions)

    rule.__doc__ = (
        "Batch and heads parallel, query rows "
        + ("a reduction (dk, dv sum over them)" if backward else "parallel")
        + ", keys a context factor, head dims whole."
    )
    return rule


# --- reference semantics ------------------------------------------------------------------


def by_position(attrs: dict[str, Any]) -> bool:
    """Whether the op masks by position (causal or a sliding window): it then takes the
    position offsets."""
    return bool(attrs["causal"] or attrs.get("window"))


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _grouped(t: torch.Tensor, heads: int) -> torch.Tensor:
    """k or v with each head repeated for its group of query heads."""
    if t.dim() < 3 or t.shape[-3] == heads or t.shape[-3] == 0:
        return t
    return t.repeat_interleave(heads // t.shape[-3], dim=-3)


def _scores(
    op: graph.GraphOp, q: torch.Tensor, k: torch.Tensor, extra: tuple[torch.Tensor, ...]
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``scale · q kᵀ`` (soft-capped), -inf where a mask hides a key; and with a soft cap
    the derivative of the capped scores by the uncapped ones."""
    attrs = op.attrs()
    scores = q @ k.transpose(-1, -2) * attrs["scale"]
    slope = None
    if attrs.get("softcap"):
        cap = attrs["softcap"]
        scores = torch.tanh(scores / cap)
        slope = 1 - scores * scores
        scores = scores * cap
    segments, positions = (extra[:2], extra[2:]) if attrs.get("segments") else ((), extra)
    hidden = torch.zeros(scores.shape[-2:], dtype=torch.bool)
    if by_position(attrs):
        q0, k0 = (int(p) for p in positions) if positions else (0, 0)
        rows = _true_positions(q.shape[-2], attrs.get("zigzag", 0))[:, None] + q0
        cols = _true_positions(k.shape[-2], attrs.get("zigzag", 0))[None, :] + k0
        if attrs["causal"]:
            hidden = hidden | (rows < cols)
        if attrs.get("window"):
            hidden = hidden | ((rows - cols).abs() >= attrs["window"])
    if segments:
        q_ids, k_ids = segments
        differ = q_ids[..., :, None] != k_ids[..., None, :]  # [batch, Tq, Tk]
        hidden = hidden | (differ[..., None, :, :] if q.dim() > 2 else differ)
    return scores.masked_fill(hidden, float("-inf")), slope


def _true_positions(length: int, zigzag: int) -> torch.Tensor:
    """The true position of each stored token (``zigzag``: ranks of a zig-zag order)."""
    if not zigzag:
        return torch.arange(length)
    return torch.from_numpy(zigzag_order(length, zigzag))


def _probabilities(scores: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """``exp(scores - lse)``: 0 in a row that sees no key (``lse = -inf``)."""
    shift = torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)
    return torch.exp(scores - shift[..., None])


@bound
def _attention_reference(op: graph.AttentionOp) -> Callable[..., tuple[torch.Tensor, ...]]:
    """``softmax(scale · q kᵀ) v`` and the log-sum-exp, from the scores in full."""

    def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *extra: torch.Tensor) -> Any:
        compute = _compute_dtype(q)
        heads = q.shape[-3] if q.dim() > 2 else 0
        qc, kc, vc = (t.to(compute) for t in (q, _grouped(k, heads), _grouped(v, heads)))
        scores, _ = _scores(op, qc, kc, extra)
        lse = torch.logsumexp(scores, dim=-1)  # -inf for a row that sees no key
        return (_probabilities(scores, lse) @ vc).to(q.dtype), lse

    return run


def _ungrouped(grad: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The gradient of grouped k or v: each head's group of query heads summed."""
    if grad.shape == like.shape:
        return grad
    groups = grad.shape[-3] // like.shape[-3]
    return grad.reshape(*like.shape[:-2], groups, *like.shape[-2:]).sum(-3)


@bound
def _attention_backward_reference(
    op: graph.AttentionBackwardOp,
) -> Callable[..., tuple[torch.Tensor, ...]]:
    """With ``p = exp(scale · q kᵀ - lse)`` (masked): ``dv = pᵀ do``, ``ds = p (do vᵀ -
    delta)`` (times the soft cap's slope), ``dq = scale · ds k``, ``dk = scale · dsᵀ q``."""
    scale = op.attrs()["scale"]

    def run(
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        do: torch.Tensor,
        lse: torch.Tensor,
        delta: torch.Tensor,
        *extra: torch.Tensor,
    ) -> Any:
        compute = _compute_dtype(q)
        heads = q.shape[-3] if q.dim() > 2 else 0
        qc, kc, vc = (t.to(compute) for t in (q, _grouped(k, heads), _grouped(v, heads)))
        doc = do.to(compute)
        scores, slope = _scores(op, qc, kc, extra)
        p = _probabilities(scores, lse.to(compute))
        ds = p * (doc @ vc.transpose(-1, -2) - delta.to(compute)[..., None])
        if slope is not None:
            ds = ds * slope
        dq = ds @ kc * scale
        dk = _ungrouped(ds.transpose(-1, -2) @ qc * scale, k)
        dv = _ungrouped(p.transpose(-1, -2) @ doc, v)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)

    return run


# --- gradients ------------------------------------------------------------------------------


def _attention_vjp(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
    """``attention_backward`` with ``delta = rowsum(do * o) - dlse``: the log-sum-exp's
    cotangent enters as ``ds = p (dp - delta)`` does (``d lse_i / d s_ij = p_ij``)."""
    d_out, d_lse = cts
    extra = list(op.operands[FORWARD_OPERANDS:])  # segment ids, positions
    if d_out is None and d_lse is None:
        return [None] * len(op.operands)
    out, lse = op.results
    if d_out is None:
        d_out = b.zeros_like(out)
    rows = aval(out).rank - 1
    delta = b.sum(b.mul(b.cast(d_out, lse), b.cast(out, lse)), [rows])
    if d_lse is not None:
        delta = b.sub(delta, d_lse)
    attrs = op.attrs()
    q, k, v = op.operands[:FORWARD_OPERANDS]
    dq, dk, dv = b.ops(graph.AttentionBackwardOp, q, k, v, d_out, lse, delta, *extra, **attrs)
    return [dq, dk, dv, *[None] * len(extra)]


def _no_second_derivative(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
    """Second derivatives of attention are not implemented."""
    raise TesseraError(
        "graph.attention_backward is not differentiable: second derivatives of attention "
        "are not implemented"
    )


register(
    graph.AttentionOp,
    sharding=_rule(backward=False),
    partial=NOT_LINEAR,
    vjp=_attention_vjp,
    reference=_attention_reference,
    tile=Kernel("attention"),
    fusion=Fusion.ATTENTION,
)
register(
    graph.AttentionBackwardOp,
    sharding=_rule(backward=True),
    partial=NOT_LINEAR,
    vjp=_no_second_derivative,
    reference=_attention_backward_reference,
    tile=Kernel("attention_backward"),
    fusion=Fusion.ATTENTION,
)
