"""Run under ``tessera run -n 4``: vocab-parallel programs on a 2 x 2 (dp x tp) mesh, one
process per rank (gloo). Every rank checks ``.full()`` of the embedding lookup and its
gradient, the cross-entropy and its gradient (the table and logits split over tp on the
vocabulary; ``graph.axis_index`` is each process's own position) against the virtual
mesh and torch eager in float64, then prints ``rank R OK``.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.nn.functional as F

import tessera as ts
from tessera import dist, op

RANK, WORLD = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
TOL = {"rtol": 1e-10, "atol": 1e-10}
MESH = dist.Mesh(axes=["dp", "tp"], shape=(2, 2))
VOCAB_TP = dist.ShardSpec(partition=(0,), mesh_axes=("tp",))
ROWS_DP = dist.ShardSpec(partition=(0,), mesh_axes=("dp",))
LOGITS = dist.ShardSpec(partition=(0, 1), mesh_axes=("dp", "tp"))
V, C, N = 32, 8, 8


def virtual(fn: Any, *args: Any) -> Any:
    """``fn(*args)`` on the virtual mesh (all ranks in this process)."""
    os.environ["TESSERA_BACKEND"] = "virtual"
    try:
        return fn(*args)
    finally:
        del os.environ["TESSERA_BACKEND"]


def check(
    name: str, compiled: Any, args: tuple[Any, ...], eager: torch.Tensor, kinds: set[str]
) -> None:
    """``compiled``'s result on this rank's process, gathered, against the virtual mesh's
    and torch's; the run executed only collectives of ``kinds``."""
    oracle = virtual(compiled, *args)
    got = compiled(*args)
    result = got[-1] if isinstance(got, tuple) else got
    oracle = oracle[-1] if isinstance(oracle, tuple) else oracle
    run = compiled.lower(*args).last_run
    assert run is not None and {c.kind for c in run.collectives} <= kinds, (name, run.collectives)
    full = result.full()
    torch.testing.assert_close(full, oracle, **TOL, msg=lambda m: f"{name} vs virtual: {m}")
    torch.testing.assert_close(full, eager, **TOL, msg=lambda m: f"{name} vs eager: {m}")
    print(
        f"rank {RANK}: {name}: max error vs eager {(full - eager).abs().max().item():.1e}",
        flush=True,
    )


def main() -> None:
    if WORLD != 4:
        raise SystemExit(f"run with 4 ranks, not {WORLD}")
    g = torch.Generator().manual_seed(0)
    table = torch.randn(V, C, dtype=torch.float64, generator=g)
    ids = torch.tensor([0, V - 1, -1, -V, 15, 16, 7, 24])  # both ends of both tp slices
    weights = torch.randn(N, C, dtype=torch.float64, generator=g)
    logits = 3 * torch.randn(N, V, dtype=torch.float64, generator=g)
    labels = torch.tensor([0, V - 1, 15, 16, 3, 20, 31, 8])

    lookup = ts.jit(lambda t, i: op.embedding(i, t), mesh=MESH, in_shardings=(VOCAB_TP, ROWS_DP))
    check("vocab-parallel lookup", lookup, (table, ids), table[ids], {"all_reduce"})

    def lookup_loss(t: Any, i: Any, w: Any) -> Any:
        return op.sum(op.embedding(i, t) * w)

    grad = ts.jit(
        ts.grad(lookup_loss),
        mesh=MESH,
        in_shardings=(VOCAB_TP, ROWS_DP, ROWS_DP),
        out_shardings=VOCAB_TP,
    )
    eager = table.clone().requires_grad_()
    (eager[ids] * weights).sum().backward()
    collectives = grad.lower(table, ids, weights).collectives()
    assert all(c.mesh_axes != ("tp",) for c in collectives), collectives  # no table over tp
    check(
        "vocab-parallel lookup gradient",
        grad,
        (table, ids, weights),
        eager.grad,
        {c.kind for c in collectives},
    )

    ce = ts.jit(lambda x, y: op.cross_entropy(x, y), mesh=MESH, in_shardings=(LOGITS, ROWS_DP))
    check(
        "vocab-parallel cross-entropy",
        ce,
        (logits, labels),
        F.cross_entropy(logits, labels),
        {"all_reduce"},
    )

    ce_grad = ts.jit(
        ts.grad(lambda x, y: op.cross_entropy(x, y)),
        mesh=MESH,
        in_shardings=(LOGITS, ROWS_DP),
        out_shardings=LOGITS,
    )
    eager = logits.clone().requires_grad_()
    F.cross_entropy(eager, labels).backward()
    check(
        "vocab-parallel cross-entropy gradient",
        ce_grad,
        (logits, labels),
        eager.grad,
        {"all_reduce"},
    )
    print(f"rank {RANK} OK", flush=True)


if __name__ == "__main__":
    main()
