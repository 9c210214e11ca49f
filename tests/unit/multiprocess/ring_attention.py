"""Run under ``tessera run -n 4``: ring attention (the sequence split over cp = 4,
causal, ``schedule.options(context_parallel="ring")``) forward and ``ts.grad``, one rank
per process: the zig-zag relayout and the k/v (and dk/dv) blocks pass round the ring as
gloo send/recv pairs, each rank computing its blocks at its own positions. Then the same
with the inputs stored in zig-zag order (``dist.zigzag_order(T, 4)``, ``zigzag=4``): no
relayout, every permute a ring shift from rank i to i + 1. Every rank checks ``.full()``
of the outputs and gradients against torch autograd in float64 (1e-10; for the stored
order, torch on the natural-order inputs, stored the same way), then prints ``rank R OK``.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

import tessera as ts
from tessera import dist, op, schedule

RANK = int(os.environ["RANK"])
CP = 4


def loss(q, k, v, w):
    return op.sum(op.attention(q, k, v, causal=True) * w)


def stored_loss(q, k, v, w):
    return op.sum(op.attention(q, k, v, causal=True, zigzag=CP) * w)


def main() -> None:
    g = torch.Generator().manual_seed(0)
    q, k, v, w = (torch.randn(1, 2, 32, 8, generator=g, dtype=torch.float64) for _ in range(4))
    mesh = dist.mesh({"cp": CP})
    seq = dist.ShardSpec(partition=(2,), mesh_axes=("cp",))
    with schedule.options(context_parallel="ring"):
        run(q, k, v, w, mesh, seq)
        run_stored_zigzag(q, k, v, w, mesh, seq)
    print(f"rank {RANK} OK", flush=True)


def torch_reference(q, k, v, w) -> list[torch.Tensor]:
    """out, dq, dk, dv of causal attention (``sum(out * w)``) by torch autograd."""
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    want = F.scaled_dot_product_attention(*leaves, is_causal=True)
    (want * w).sum().backward()
    return [want.detach(), *(t.grad for t in leaves)]


def check(got, expected, what: str) -> None:
    for g, e, name in zip(got, expected, ("out", "dq", "dk", "dv"), strict=True):
        torch.testing.assert_close(
            g, e, rtol=1e-10, atol=1e-10, msg=lambda m, name=name: f"{what} {name}: {m}"
        )


def run(q, k, v, w, mesh, seq) -> None:
    forward = ts.jit(
        lambda q, k, v: op.attention(q, k, v, causal=True),
        mesh=mesh,
        in_shardings=(seq,) * 3,
        kernels="reference",
    )
    step = ts.jit(
        ts.grad(loss, argnums=(0, 1, 2)), mesh=mesh, in_shardings=(seq,) * 4, kernels="reference"
    )
    out = forward(q, k, v).full()
    grads = [g.full() for g in step(q, k, v, w)]
    check([out, *grads], torch_reference(q, k, v, w), "natural order")
    permutes = step.lower(q, k, v, w).collectives()
    assert {c.kind for c in permutes} == {"collective_permute"}, permutes
    assert any(set(c.pairs) != RING for c in permutes)  # the relayout into zig-zag and back


RING = {(i, (i + 1) % CP) for i in range(CP)}


def run_stored_zigzag(q, k, v, w, mesh, seq) -> None:
    """q, k, v (and w) stored in zig-zag order over cp, ``zigzag=CP``: the results and
    gradients are torch's on the natural order, stored the same way; the ring moves only
    k and v (and dk, dv) blocks, each rank's pair of chunks staying put."""
    order = torch.from_numpy(dist.zigzag_order(q.shape[2], CP))
    stored = [t[:, :, order] for t in (q, k, v, w)]
    forward = ts.jit(
        lambda q, k, v: op.attention(q, k, v, causal=True, zigzag=CP),
        mesh=mesh,
        in_shardings=(seq,) * 3,
        kernels="reference",
    )
    step = ts.jit(
        ts.grad(stored_loss, argnums=(0, 1, 2)),
        mesh=mesh,
        in_shardings=(seq,) * 4,
        kernels="reference",
    )
    out = forward(*stored[:3]).full()
    grads = [g.full() for g in step(*stored)]
    expected = [t[:, :, order] for t in torch_reference(q, k, v, w)]
    check([out, *grads], expected, "zig-zag order")
    for lowered in (forward.lower(*stored[:3]), step.lower(*stored)):
        permutes = lowered.collectives()
        assert permutes and all(
            c.kind == "collective_permute" and set(c.pairs) == RING for c in permutes
        ), permutes


if __name__ == "__main__":
    main()
