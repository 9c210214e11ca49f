"""A Megatron-style MLP run by several processes, one rank each.

    tessera run -n 4 examples/distributed_mlp.py

With 4 ranks the mesh is 2 x 2 (dp x tp): the batch is split over ``dp``, ``w1`` by
columns and ``w2`` by rows over ``tp``; with N other than 4 it is a 1-D ``tp`` mesh of N.
Every process traces the same program, takes its piece of the inputs, runs its rank
(collectives through torch.distributed: gloo on CPU) and prints its coordinates, wall
time and the collectives it executed; ``.full()`` gathers the global result, which rank 0
checks against torch eager. Without a launcher it runs all ranks on the virtual mesh.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

import tessera as ts
from tessera import dist, op


def mlp(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    return op.gelu(x @ w1) @ w2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=256)
    args = parser.parse_args()

    ranks = int(os.environ.get("WORLD_SIZE", "4"))
    mesh = (
        dist.Mesh(axes=["dp", "tp"], shape=(2, 2))
        if ranks == 4
        else dist.Mesh(axes=["tp"], shape=(ranks,))
    )
    batch_split = (
        dist.ShardSpec(partition=(0,), mesh_axes=("dp",)) if "dp" in mesh.axis_names else None
    )
    column_split = dist.ShardSpec(partition=("col",), mesh_axes=("tp",))
    row_split = dist.ShardSpec(partition=("row",), mesh_axes=("tp",))
    sharded_mlp = ts.jit(mlp, mesh=mesh, in_shardings=(batch_split, column_split, row_split))

    generator = torch.Generator().manual_seed(0)  # every rank builds the same global inputs
    x = torch.randn(args.batch, args.dim, generator=generator)
    w1 = torch.randn(args.dim, args.hidden, generator=generator) / args.dim**0.5
    w2 = torch.randn(args.hidden, args.dim, generator=generator) / args.hidden**0.5

    result = sharded_mlp(x, w1, w2)
    expected = torch.nn.functional.gelu(x @ w1) @ w2
    first = sharded_mlp.lower(x, w1, w2).last_run  # the first call also creates process groups
    result = sharded_mlp(x, w1, w2)
    run = sharded_mlp.lower(x, w1, w2).last_run
    if (
        run is None or first is None
    ):  # not launched: the virtual mesh ran every rank and returned the global value
        torch.testing.assert_close(result, expected, rtol=1e-5, atol=1e-5)
        print(f"virtual mesh {mesh}: OK")
        return
    executed = ", ".join(
        f"{c.kind}[{','.join(c.mesh_axes)}] {c.dtype}{list(c.shape)}" for c in run.collectives
    )
    line = (
        f"rank {run.rank} {run.coords}: local result {list(result.local.shape)} of "
        f"{list(result.shape)}, {run.seconds * 1e3:.2f} ms (first call {first.seconds * 1e3:.2f} ms), "
        f"collectives: {executed or 'none'}\n"
    )
    sys.stdout.write(line)  # one write, so that the ranks' lines do not interleave
    sys.stdout.flush()
    full = result.full()  # a collective: every rank gathers the global value
    if run.rank == 0:
        error = (full - expected).abs().max().item()
        print(f"{mesh}: max abs error of .full() vs torch eager: {error:.2e}")
        torch.testing.assert_close(full, expected, rtol=1e-5, atol=1e-5)
        print("OK")


if __name__ == "__main__":
    main()
