"""Ring attention written per rank (``dist.shard_map`` + ``dist.ppermute``) against the
automatic ring: bytes moved and simulated step time.

The hand-written ring is ``ring_attention`` of ``examples/manual_regions.py`` (each
rank's query block against every k/v block as they pass round the cp ring, the next
block's permute started before this one's computation, merged by the online softmax;
causal: contiguous blocks, the masked ones computed and discarded). The automatic ring
is ``op.attention`` on q, k, v split over cp along the sequence, compiled with
``schedule.options(context_parallel="ring")`` (causal: the sequence stored in zig-zag
order, ``zigzag=cp``, so that it too moves only k and v). Forward only, float32
``[1, 8, T, 64]``, compiled (not run); bytes are the compiled programs' collectives per
rank (``lowered.collectives()``), times ``lowered.simulate()`` on the default machine
of the mesh (DGX H100 nodes).

    python benchmarks/manual_ring.py
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

import tessera as ts
from tessera import dist, op, schedule

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from manual_regions import ring_attention

HEADS, DIM = 8, 64


def programs(cp: int, causal: bool) -> dict[str, ts.JitFunction]:
    mesh = dist.mesh({"cp": cp})
    seq = dist.ShardSpec(partition=(2,), mesh_axes=("cp",))
    manual = ts.jit(
        dist.shard_map(
            lambda q, k, v: ring_attention(q, k, v, causal), mesh, in_specs=seq, out_specs=seq
        ),
        mesh=mesh,
    )
    with schedule.options(context_parallel="ring"):
        automatic = ts.jit(
            lambda q, k, v: op.attention(q, k, v, causal=causal, zigzag=cp if causal else None),
            mesh=mesh,
            in_shardings=(seq, seq, seq),
        )
    return {"hand-written": manual, "automatic": automatic}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cp", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--seq", type=int, nargs="+", default=[8192, 32768])
    args = parser.parse_args()
    torch.set_num_threads(1)
    started = time.time()
    print(
        "| causal | cp | T | ring | collectives | bytes per rank | step µs (simulated) "
        "| compute only µs | exposed fraction |"
    )
    print("|---|---:|---:|---|---:|---:|---:|---:|---:|")
    for causal in (False, True):
        for cp in args.cp:
            for seq in args.seq:
                q = torch.empty(1, HEADS, seq, DIM)
                for name, f in programs(cp, causal).items():
                    with schedule.options(context_parallel="ring"):
                        lowered = f.lower(q, q, q)
                    infos = lowered.collectives()
                    sim = lowered.simulate()
                    print(
                        f"| {causal} | {cp} | {seq} | {name} | {len(infos)} "
                        f"| {sum(c.nbytes for c in infos)} | {sim.step_time_s * 1e6:.1f} "
                        f"| {sim.compute_only_s * 1e6:.1f} | {sim.exposed_fraction:.2f} |"
                    )
    print(f"\n({time.time() - started:.0f} s; compiled only)")


if __name__ == "__main__":
    main()
