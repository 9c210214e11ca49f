"""A float64 torch reference of a mixture-of-experts layer that chooses and routes by
plain loops (the top k of each token's scores, the lower expert index winning a tie;
first choices first, tokens in order, a counter per expert; over capacity dropped) and
computes each kept choice's expert token by token: differentiable by ``torch.autograd``,
independent of ``graph.top_k``'s and ``graph.moe_route``'s vectorised references."""

from __future__ import annotations

import torch


def loop_top_k(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` highest of ``scores [..., E]``, highest first, the lower index first
    among equal scores, by sorting each row's ``(-score, index)`` pairs in Python:
    ``(values, indices)``, the values differentiable."""
    rows = scores.detach().reshape(-1, scores.shape[-1]).tolist()
    chosen = [sorted(range(len(row)), key=lambda e, row=row: (-row[e], e))[:k] for row in rows]
    indices = torch.tensor(chosen, dtype=torch.long).reshape(*scores.shape[:-1], k)
    return torch.gather(scores, -1, indices), indices


def loop_route(
    choices: torch.Tensor, experts: int, capacity: int
) -> dict[tuple[int, int, int], tuple[int, int]]:
    """(g, t, j) -> (expert, position) of every kept choice, by a counter per expert."""
    kept = {}
    g_size, t_size, k_size = choices.shape
    for g in range(g_size):
        count = [0] * experts
        for j in range(k_size):
            for t in range(t_size):
                e = int(choices[g, t, j])
                if count[e] < capacity:
                    kept[(g, t, j)] = (e, count[e])
                    count[e] += 1
    return kept


def reference_moe(
    x: torch.Tensor,
    wr: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    k: int,
    capacity: int,
    score: str = "softmax",
) -> torch.Tensor:
    """The MoE layer token by token: ``sum_j w_j * relu(x w1[e_j]) w2[e_j]`` over the
    kept choices, with the router's top-k (renormalised) weights."""
    logits = x @ wr
    scores = torch.softmax(logits, -1) if score == "softmax" else torch.sigmoid(logits)
    top, chosen = loop_top_k(scores, k)
    weights = top / top.sum(-1, keepdim=True)
    kept = loop_route(chosen, wr.shape[1], capacity)
    rows = []
    for g in range(x.shape[0]):
        for t in range(x.shape[1]):
            out = torch.zeros(x.shape[-1], dtype=x.dtype)
            for j in range(k):
                if (g, t, j) in kept:
                    e, _ = kept[(g, t, j)]
                    out = out + weights[g, t, j] * (torch.relu(x[g, t] @ w1[e]) @ w2[e])
            rows.append(out)
    return torch.stack(rows).reshape(x.shape)
