"""Run under ``tessera run -n 4``: ``dist.shard_map`` regions on a 2 x 2 (dp x tp) mesh,
one process per rank over gloo: a Megatron MLP with its explicit tp all-reduce followed
by a ppermute over dp, and its gradient (the per-rank backward region), each checked
against torch eager in float64 (tolerance 1e-10), then ``rank R OK``."""

from __future__ import annotations

import os

import torch

import tessera as ts
from tessera import dist, op

RANK = int(os.environ["RANK"])
torch.set_num_threads(1)

mesh = dist.mesh({"dp": 2, "tp": 2})
S = dist.ShardSpec
batch = S(partition=(0,), mesh_axes=("dp",))
cols, rows = S(partition=(1,), mesh_axes=("tp",)), S(partition=(0,), mesh_axes=("tp",))


def body(x, w1, w2):
    h = dist.all_reduce(op.gelu(x @ w1) @ w2, "tp")
    return dist.ppermute(h, "dp", perm=[(0, 1), (1, 0)])  # the dp halves swap


region = dist.shard_map(body, mesh, in_specs=(batch, cols, rows), out_specs=batch)
g = torch.Generator().manual_seed(0)
x, w1, w2, c = (
    torch.randn(*s, generator=g, dtype=torch.float64)
    for s in [(8, 16), (16, 32), (32, 16), (8, 16)]
)


def reference(x, w1, w2):
    y = torch.nn.functional.gelu(x @ w1) @ w2
    return torch.cat([y[4:], y[:4]])


y = ts.jit(region, mesh=mesh)(x, w1, w2).full()
torch.testing.assert_close(y, reference(x, w1, w2), rtol=1e-10, atol=1e-10)
grads = ts.jit(ts.grad(lambda *a: (region(*a) * c).sum(), argnums=(0, 1, 2)), mesh=mesh)(x, w1, w2)
leaves = [t.clone().requires_grad_() for t in (x, w1, w2)]
(reference(*leaves) * c).sum().backward()
for got, leaf in zip(grads, leaves, strict=True):
    torch.testing.assert_close(got.full(), leaf.grad, rtol=1e-10, atol=1e-10)
print(f"rank {RANK}: shard_map forward and gradient match torch eager")
print(f"rank {RANK} OK")
