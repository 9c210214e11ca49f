"""Run under ``tessera run -n 2``: context-parallel attention (the sequence split over
cp = 2, causal) forward and ``ts.grad`` through the generated Triton kernels, one rank
per process: each rank all-gathers k and v over gloo and computes its queries at its
own offset (read from its position along cp). Every rank checks ``.full()`` of the
output and gradients against torch autograd in float64 (1e-10), then prints
``rank R OK``.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

import tessera as ts
from tessera import dist, op

RANK = int(os.environ["RANK"])


def loss(q, k, v, w):
    return op.sum(op.attention(q, k, v, causal=True) * w)


def main() -> None:
    g = torch.Generator().manual_seed(0)
    q, k, v, w = (torch.randn(1, 2, 40, 8, generator=g, dtype=torch.float64) for _ in range(4))
    mesh = dist.mesh({"cp": 2})
    seq = dist.ShardSpec(partition=(2,), mesh_axes=("cp",))
    forward = ts.jit(
        lambda q, k, v: op.attention(q, k, v, causal=True),
        mesh=mesh,
        in_shardings=(seq,) * 3,
        kernels="triton",
    )
    step = ts.jit(
        ts.grad(loss, argnums=(0, 1, 2)), mesh=mesh, in_shardings=(seq,) * 4, kernels="triton"
    )
    out = forward(q, k, v).full()
    grads = [g.full() for g in step(q, k, v, w)]
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    want = F.scaled_dot_product_attention(*leaves, is_causal=True)
    (want * w).sum().backward()
    for got, expected, name in zip(
        [out, *grads],
        [want.detach(), *(t.grad for t in leaves)],
        ("out", "dq", "dk", "dv"),
        strict=True,
    ):
        torch.testing.assert_close(
            got, expected, rtol=1e-10, atol=1e-10, msg=lambda m, name=name: f"{name}: {m}"
        )
    kinds = sorted(c.kind for c in step.lower(q, k, v, w).collectives())
    assert kinds == ["all_gather", "all_gather", "reduce_scatter", "reduce_scatter"], kinds
    print(f"rank {RANK} OK", flush=True)


if __name__ == "__main__":
    main()
