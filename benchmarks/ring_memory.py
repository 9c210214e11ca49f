"""Per-rank memory of context-parallel attention: ring against all-gather, as cp grows.

A grad step (forward and backward: dq, dk, dv of ``sum(attention(q, k, v) * w)``) on
float32 ``[1, 2, 512, 16]`` inputs split over cp along the sequence, compiled (not run)
with ``schedule.options(context_parallel=...)``. Printed per method, causal or not (and
causal with the sequence stored in zig-zag order over cp by the data loader,
``zigzag=cp``, or in natural order, which the ring moves to the zig-zag split), and
cp: the memory plan's per-rank arena peak (``lowered.memory().peak_bytes``), the
arguments' share of it (q, k, v, w: caller-owned, live throughout, 1/cp each), the
activation bytes (peak less arguments) and activation · cp / activation at cp = 1 (1.00
would be exact 1/cp scaling with no fixed overhead). The same numbers are asserted by
``tests/unit/test_ring_attention.py::test_per_rank_activation_memory_falls_as_one_over_cp``.

    python benchmarks/ring_memory.py
"""

from __future__ import annotations

import time

import torch

import tessera as ts
from tessera import dist, op, schedule

SHAPE = (1, 2, 512, 16)


def activation(method: str, causal: bool, cp: int, zigzag: bool = False) -> tuple[int, int]:
    q, k, v, w = (torch.randn(SHAPE) for _ in range(4))
    order = cp if zigzag and cp > 1 else None

    def loss(q, k, v, w):
        return op.sum(op.attention(q, k, v, causal=causal, zigzag=order) * w)

    layout = dist.ShardSpec(partition=(2,), mesh_axes=("cp",))
    with schedule.options(context_parallel=method):
        step = ts.jit(
            ts.grad(loss, argnums=(0, 1, 2)), mesh=dist.mesh({"cp": cp}), in_shardings=(layout,) * 4
        )
        peak = step.lower(q, k, v, w).memory().peak_bytes
    arguments = sum(t.numel() * t.element_size() for t in (q, k, v, w)) // cp
    return peak, arguments


def main() -> None:
    started = time.time()
    print(
        "| method | causal | order | cp | peak bytes | arguments | activation | activation·cp / cp=1 |"
    )
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for causal, zigzag in ((False, False), (True, True), (True, False)):
        alone = None
        order = "zig-zag stored" if zigzag else "natural"
        for method in ("ring", "all_gather"):
            for cp in (1, 2, 4, 8):
                peak, arguments = activation(method, causal, cp, zigzag)
                act = peak - arguments
                alone = act if alone is None else alone
                print(f"| {method} | {causal} | {order} | {cp} | {peak} | {arguments} | {act} "
                      f"| {act * cp / alone:.2f} |")  # fmt: skip
    print(f"\n({time.time() - started:.0f} s; compiled only)")


if __name__ == "__main__":
    main()
