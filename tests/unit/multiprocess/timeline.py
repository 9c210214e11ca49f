"""Run under ``tessera run -n 2 timeline.py TRACE``: two Megatron MLPs on a tp=2 mesh
(the second's matmuls can run under the first's all-reduce), lowered with and without
``overlap-comm``. Every rank checks the two schedules give bit-identical results over gloo,
records the overlapped run's timeline, and rank 0 writes all ranks' trace to TRACE."""

from __future__ import annotations

import sys

import torch
import torch.distributed as tdist

import tessera as ts
from tessera import dist, op, perf, schedule

cols = dist.ShardSpec(partition=(1,), mesh_axes=("tp",))
rows = dist.ShardSpec(partition=(0,), mesh_axes=("tp",))


def two_mlps(x, w1, w2, v1, v2):
    return op.gelu(x @ w1) @ w2, op.gelu(x @ v1) @ v2


def main(trace_path: str) -> None:
    mesh = dist.mesh({"tp": 2})
    g = torch.Generator().manual_seed(3)
    args = [
        torch.randn(s, generator=g) for s in ((64, 32), (32, 128), (128, 32), (32, 128), (128, 32))
    ]
    shardings = (dist.ShardSpec(replicate=True), cols, rows, cols, rows)
    with schedule.all_reduce_overlap(False):
        serial = ts.jit(two_mlps, mesh=mesh, in_shardings=shardings)(*args)
    overlapped_fn = ts.jit(two_mlps, mesh=mesh, in_shardings=shardings)
    with perf.record_timeline() as timeline:
        overlapped = overlapped_fn(*args)
    for a, b in zip(serial, overlapped, strict=True):
        assert torch.equal(a.full(), b.full()), "overlap changed the results"
    everyone = timeline.gathered()  # a collective: every rank calls it
    if tdist.get_rank() == 0:
        everyone.save_trace(trace_path)
    print(f"rank {tdist.get_rank()} OK", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
