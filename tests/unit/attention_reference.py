"""Shared by the context-parallel tests: random float64 q, k, v (and weights), torch's
attention with grouped-query heads as the reference, its gradients, and shard specs."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tessera import dist

TOLERANCE = 1e-10


def inputs(
    shape: tuple[int, ...], count: int, seed: int = 0, kv_heads: int | None = None
) -> list[torch.Tensor]:
    """``count`` float64 tensors of ``shape``; the 2nd and 3rd (k, v) with ``kv_heads``
    heads if given."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(count):
        s = list(shape)
        if kv_heads is not None and i in (1, 2):
            s[1] = kv_heads
        out.append(torch.randn(s, generator=g, dtype=torch.float64))
    return out


def torch_attention(q, k, v, causal):
    if k.shape[1] != q.shape[1]:
        k, v = (t.repeat_interleave(q.shape[1] // t.shape[1], dim=1) for t in (k, v))
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def torch_grads(q, k, v, w, causal):
    """dq, dk, dv of ``sum(attention(q, k, v) * w)`` by torch autograd."""
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    (torch_attention(*leaves, causal) * w).sum().backward()
    return [t.grad for t in leaves]


def close(got, want, tolerance=TOLERANCE):
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g.double(), w.double(), rtol=tolerance, atol=tolerance)


def spec(*axes_by_dim: tuple[int, str]) -> dist.ShardSpec:
    """``spec((2, "cp"))``: dim 2 split over cp."""
    return dist.ShardSpec(
        partition=tuple(d for d, _ in axes_by_dim), mesh_axes=tuple(a for _, a in axes_by_dim)
    )
