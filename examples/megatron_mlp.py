"""A Megatron-style tensor-parallel MLP on a 2 x 4 (dp x tp) virtual mesh.

The batch is split over ``dp``; ``w1`` is split by columns and ``w2`` by rows over
``tp`` (Megatron-LM's layout). Tessera propagates the layout to every value, finds that
the second matmul's result is a partial sum over ``tp`` and inserts exactly one
all-reduce, partitions the program into what each of the 8 ranks runs, executes all
ranks on the virtual mesh, and assembles the global result.

    python examples/megatron_mlp.py
"""

from __future__ import annotations

import argparse

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

    mesh = dist.Mesh(axes=["dp", "tp"], shape=(2, 4))
    print(mesh.layout)
    batch_split = dist.ShardSpec(partition=(0,), mesh_axes=("dp",))
    column_split = dist.ShardSpec(partition=("col",), mesh_axes=("tp",))
    row_split = dist.ShardSpec(partition=("row",), mesh_axes=("tp",))
    sharded_mlp = ts.jit(mlp, mesh=mesh, in_shardings=(batch_split, column_split, row_split))

    generator = torch.Generator().manual_seed(0)
    x = torch.randn(args.batch, args.dim, generator=generator)
    w1 = torch.randn(args.dim, args.hidden, generator=generator) / args.dim**0.5
    w2 = torch.randn(args.hidden, args.dim, generator=generator) / args.hidden**0.5

    lowered = sharded_mlp.lower(x, w1, w2)
    print(lowered.as_text("partitioned"))
    for info in lowered.collectives():
        print(
            f"collective: {info.kind} over {list(info.mesh_axes)} ({info.group_size} ranks), "
            f"local shape {list(info.shape)} {info.dtype}, {info.nbytes} bytes"
        )

    result = sharded_mlp(x, w1, w2)
    expected = torch.nn.functional.gelu(x @ w1) @ w2
    error = (result - expected).abs().max().item()
    print(f"max abs error vs torch: {error:.3e} (rtol=1e-5, atol=1e-5)")
    torch.testing.assert_close(result, expected, rtol=1e-5, atol=1e-5)
    print("OK")


if __name__ == "__main__":
    main()
