"""The sharding cost's overlap credit (issue 32, item 1), on one program: the weight
gradients of a two-matmul MLP (hidden 1024, FFN 4096, f32) with the tokens split over
dp = 2, compiled with the credit (what Tessera does) and with every move priced exposed
(the credit set to zero), for several token counts. Each row: the collectives each
choice makes, and the step time of the scheduled program simulated on one DGX H100
(``Lowered.simulate``; meta tensors, nothing runs).

    python benchmarks/overlap_credit.py [--tokens 256 1024 1536]
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

import torch

import tessera as ts
from tessera import dist, op
from tessera.analysis import op_sharding
from tessera.topology import load_topology

HIDDEN, FFN = 1024, 4096


@contextmanager
def exposed_moves() -> Iterator[None]:
    """Every move priced exposed: the overlap credit zero (and the choices cache cleared
    before and after, as it holds choices made with the credit; the program cache off, as
    its key does not know of the patch: a credited program would be read back)."""
    credit = op_sharding._Pricing.__dict__["overlap"]
    cache = os.environ.get("TESSERA_PROGRAM_CACHE")
    op_sharding._Pricing.overlap = 0.0  # type: ignore[assignment]
    op_sharding._CHOICES.clear()
    os.environ["TESSERA_PROGRAM_CACHE"] = "0"
    try:
        yield
    finally:
        op_sharding._Pricing.overlap = credit  # type: ignore[method-assign]
        op_sharding._CHOICES.clear()
        if cache is None:
            del os.environ["TESSERA_PROGRAM_CACHE"]
        else:
            os.environ["TESSERA_PROGRAM_CACHE"] = cache


def weight_gradients(tokens: int) -> ts.Lowered:
    rows, whole = dist.ShardSpec(partition=(0,), mesh_axes=("dp",)), dist.ShardSpec()

    def loss(w1: torch.Tensor, w2: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return op.sum((op.gelu(x @ w1) @ w2) ** 2)

    grads = ts.jit(
        ts.grad(loss, argnums=(0, 1)),
        mesh=dist.Mesh(axes=["dp"], shape=(2,)),
        in_shardings=(whole, whole, rows),
        out_shardings=(whole, whole),
    )
    shapes = ((HIDDEN, FFN), (FFN, HIDDEN), (tokens, HIDDEN))
    return grads.lower(*(torch.empty(s, device="meta") for s in shapes))


def describe(lowered: ts.Lowered) -> str:
    counts = Counter(c.kind for c in lowered.collectives())
    return ", ".join(f"{kind}×{n}" for kind, n in sorted(counts.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[256, 1024, 1536])
    args = parser.parse_args()
    machine = load_topology("dgx_h100")
    print("| tokens | moves priced | collectives | simulated step (µs) | exposed comm (µs) |")
    print("|---:|---|---|---:|---:|")
    for tokens in args.tokens:
        for label, pricing in (("with the credit", nullcontext), ("exposed", exposed_moves)):
            with pricing():  # stages compile lazily: simulate inside
                lowered = weight_gradients(tokens)
                run = lowered.simulate(machine)
                moves = describe(lowered)
            exposed = run.step_time_s - run.compute_only_s
            print(
                f"| {tokens} | {label} | {moves} | {run.step_time_s * 1e6:.1f} "
                f"| {exposed * 1e6:.1f} |"
            )
    print(
        f"\ndate {datetime.date.today().isoformat()}; torch {torch.__version__}, python "
        f"{platform.python_version()}; simulated on {machine.name}; nothing ran on a GPU"
    )


if __name__ == "__main__":
    main()
