"""Pipeline schedules, simulated: bubble fraction and activation peaks against theory.

Builds every schedule of ``tessera.transforms.pipeline_schedules`` (GPipe, 1F1B, Megatron's
interleaved 1F1B, ZB-H1) for p ∈ {2, 4, 8} ranks and m ∈ {4, 8, 16, 32, 64} microbatches
(interleaved: v ∈ {2, 4} chunks, m a multiple of p) and runs the action lists in
``tessera.perf.pipeline_simulate`` with F = B = W = 1 per stage (a full backward = 2) and
free transfers. Printed:

1. per case, the simulated bubble fraction (idle share of all ranks' time) next to
   ``tessera.pipeline.theory.bubble_fraction``, and the peak activations held (rank 0, and
   the largest over ranks) next to ``theory.peak_activations``;
2. the bubble fraction by kind × (p, m), and the peaks per rank for m = 32, condensed;
3. the same schedules with a 0.05 point-to-point latency per transfer, for p ∈ {4, 8},
   m ∈ {8, 32, 64}, and the latency's cost (makespan − makespan with free transfers, in
   units of the latency): a rank's layers take F = B = W = 1, so an interleaved chunk
   takes 1/v (and crosses v times as many links). Nothing runs on a device.

    python benchmarks/pipeline.py [--json results.json]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from tessera.perf.pipeline_simulate import simulate_pipeline
from tessera.pipeline import theory
from tessera.transforms.pipeline_schedules import SCHEDULE_KINDS, pipeline_schedule

RANKS = (2, 4, 8)
MICROBATCHES = (4, 8, 16, 32, 64)
LATENCY = 0.05


def label(kind: str, v: int) -> str:
    return f"{kind} v={v}" if kind == "interleaved" else kind


def cases() -> list[tuple[str, int, int, int]]:
    out = []
    for kind in SCHEDULE_KINDS:
        for p in RANKS:
            for m in MICROBATCHES:
                if kind != "interleaved":
                    out.append((kind, p, m, 1))
                elif m % p == 0:
                    out += [(kind, p, m, v) for v in (2, 4)]
    return out


def equal_times(kind: str, p: int, m: int, v: int) -> dict[str, Any]:
    sim = simulate_pipeline(pipeline_schedule(kind, p, m, v), 1.0, 1.0, 1.0)
    peaks = [theory.peak_activations(kind, p, m, r, v) for r in range(p)]
    return {
        "kind": kind,
        "ranks": p,
        "microbatches": m,
        "virtual": v,
        "makespan": sim.makespan_s,
        "bubble": sim.bubble_fraction,
        "bubble_theory": theory.bubble_fraction(kind, p, m, v),
        "peak": list(sim.peak_activations),
        "peak_theory": peaks,
    }


def with_latency(kind: str, p: int, m: int, v: int) -> dict[str, Any]:
    chunk = 1.0 / v
    actions = pipeline_schedule(kind, p, m, v)
    sim = simulate_pipeline(actions, chunk, chunk, chunk, LATENCY)
    free = simulate_pipeline(actions, chunk, chunk, chunk)
    return {
        "kind": kind,
        "ranks": p,
        "microbatches": m,
        "virtual": v,
        "p2p": LATENCY,
        "makespan": sim.makespan_s,
        "latency_cost": (sim.makespan_s - free.makespan_s) / LATENCY,
        "bubble": sim.bubble_fraction,
        "bubble_theory": theory.bubble_fraction(kind, p, m, v),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write every row here")
    args = parser.parse_args()
    started = time.time()

    rows = [equal_times(*case) for case in cases()]
    print("F = B = W = 1 per stage, free transfers\n")
    print("| schedule | p | m | bubble (sim) | bubble (theory) | peak rank 0 (sim / theory) "
          "| peak max (sim / theory) |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|")
    worst = 0.0
    for r in rows:
        worst = max(worst, abs(r["bubble"] - r["bubble_theory"]))
        print(
            f"| {label(r['kind'], r['virtual'])} | {r['ranks']} | {r['microbatches']} "
            f"| {r['bubble']:.4f} | {r['bubble_theory']:.4f} "
            f"| {r['peak'][0]} / {r['peak_theory'][0]} "
            f"| {max(r['peak'])} / {max(r['peak_theory'])} |"
        )
    mismatched = sum(r["peak"] != r["peak_theory"] for r in rows)
    print(f"\nlargest |sim − theory| bubble: {worst:.1e}; rows whose peaks differ: {mismatched}\n")

    print("Bubble fraction (simulated), by (p, m)\n")
    columns = [(p, m) for p in (4, 8) for m in MICROBATCHES if m >= p]
    print("| schedule | " + " | ".join(f"p={p} m={m}" for p, m in columns) + " |")
    print("|---|" + "---:|" * len(columns))
    by_case = {(r["kind"], r["virtual"], r["ranks"], r["microbatches"]): r for r in rows}
    for kind in SCHEDULE_KINDS:
        for v in (2, 4) if kind == "interleaved" else (1,):
            cells = [by_case[(kind, v, p, m)]["bubble"] for p, m in columns]
            print(f"| {label(kind, v)} | " + " | ".join(f"{c:.3f}" for c in cells) + " |")

    print("\nPeak activations per rank (simulated; theory agrees in every row above)\n")
    print("| schedule | p=4 m=32, ranks 0..3 | p=8 m=32, ranks 0..7 |")
    print("|---|---|---|")
    for kind in SCHEDULE_KINDS:
        for v in (2, 4) if kind == "interleaved" else (1,):
            cells = [" ".join(map(str, by_case[(kind, v, p, 32)]["peak"])) for p in (4, 8)]
            print(f"| {label(kind, v)} | " + " | ".join(cells) + " |")

    latency_rows = [
        with_latency(kind, p, m, v)
        for kind in SCHEDULE_KINDS
        for v in ((2, 4) if kind == "interleaved" else (1,))
        for p in (4, 8)
        for m in (8, 32, 64)
    ]
    print(f"\nF = B = W = 1 per rank's layers (1/v per interleaved chunk), p2p {LATENCY}\n")
    print("| schedule | p | m | makespan | vs 1F1B | latency cost (× p2p) | bubble (sim) "
          "| bubble (theory, free p2p) |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    one_f = {(r["ranks"], r["microbatches"]): r["makespan"] for r in latency_rows
             if r["kind"] == "1f1b"}  # fmt: skip
    for r in latency_rows:
        speedup = one_f[(r["ranks"], r["microbatches"])] / r["makespan"]
        print(
            f"| {label(r['kind'], r['virtual'])} | {r['ranks']} | {r['microbatches']} "
            f"| {r['makespan']:.2f} | {speedup:.3f}× | {r['latency_cost']:.1f} | {r['bubble']:.4f} "
            f"| {r['bubble_theory']:.4f} |"
        )

    print(f"\n({time.time() - started:.1f} s; simulated, nothing ran on a device)")
    if args.json:
        args.json.write_text(json.dumps({"equal": rows, "latency": latency_rows}, indent=1))


if __name__ == "__main__":
    main()
