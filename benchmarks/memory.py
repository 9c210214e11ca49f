"""Per-rank peak memory of a GPT training step with and without activation checkpointing,
and the simulated step-time cost of the recomputation and of the deterministic numerics.

The step is ``examples/train_gpt.py``'s (pre-LN blocks with causal attention, each a
``graph.checkpoint`` block; tied embedding; AdamW; Megatron layouts over tp, the batch
over dp) on a virtual dp × tp mesh, compiled to its schedule; nothing runs. For each
layer count and remat policy (``everything``: nothing recomputed; ``matmuls``: matmul and
attention results kept; ``nothing``: only each block's input kept) it prints the memory
plan's per-rank peak (``step.memory(...).peak_bytes``: parameters, gradients, optimizer
state, activations and temporaries placed in one arena by ``plan-memory``) and the step
time ``tessera.perf`` simulates on DGX H100s, in the fast numerics and in the
deterministic one (every sum over ranks an all-gather and an ordered sum:
``tessera.numerics``).

A second table pipelines the same step over ``pp`` = 2 (``--pp``; ZeRO off, as
pipelining requires) with 4 microbatches under GPipe and 1F1B: the per-rank peak of
``step.memory(...)`` for a pipelined step (each stage program's memory plan plus what the
runtime keeps between programs, replayed over the schedule's action lists) and the bytes
of kept stage outputs (residuals) at most, on the worst pipeline rank.

    python benchmarks/memory.py                         # 8, 16 and 32 layers
    python benchmarks/memory.py --layers 8 --dim 128    # smaller, faster
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "examples"))
import train_gpt

from tessera import dist, numerics, schedule

POLICIES = ("everything", "matmuls", "nothing")


def measure(layers: int, remat: str, args: argparse.Namespace) -> tuple[int, float, float]:
    """Per-rank peak bytes and simulated step seconds (fast, deterministic numerics)."""
    mesh = dist.Mesh(axes=["dp", "tp"], shape=(args.dp, args.tp))
    params = train_gpt.init_params(args.vocab, args.seq, args.dim, layers)
    options = SimpleNamespace(lr=1e-3, zero=args.zero, heads=args.heads, layers=layers, remat=remat)
    step = train_gpt.make_step(mesh, params, options)  # type: ignore[arg-type]
    state = step.init(params)
    tokens = torch.randint(0, args.vocab, (args.batch, args.seq))
    lowered = step.lower(state, tokens, tokens)
    with numerics.mode_of("deterministic"):
        ordered = lowered.simulate().step_time_s
    return lowered.memory().peak_bytes, lowered.simulate().step_time_s, ordered


def measure_pipelined(
    layers: int, remat: str, kind: str, args: argparse.Namespace
) -> tuple[int, int]:
    """Per-rank peak bytes and most kept residual bytes (worst pipeline rank)."""
    mesh = dist.Mesh(axes=["pp", "dp", "tp"], shape=(args.pp, args.dp, args.tp))
    params = train_gpt.init_params(args.vocab, args.seq, args.dim, layers)
    options = SimpleNamespace(lr=1e-3, zero=0, heads=args.heads, layers=layers, remat=remat)
    step = train_gpt.make_step(mesh, params, options)  # type: ignore[arg-type]
    state = step.init(params)
    tokens = torch.randint(0, args.vocab, (args.batch, args.seq))
    with schedule.options(pipeline_microbatches=args.microbatches, pipeline_schedule=kind):
        memory = step.memory(state, tokens, tokens)
    return memory.peak_bytes, max(r.saved_bytes for r in memory.ranks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[8, 16, 32])
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--dp", type=int, default=2)
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--zero", type=int, default=1)
    parser.add_argument("--pp", type=int, default=2)
    parser.add_argument("--microbatches", type=int, default=4)
    args = parser.parse_args()
    started = time.time()
    print(
        f"GPT training step (AdamW, ZeRO-{args.zero}), dp × tp = {args.dp} × {args.tp}, "
        f"(B, T, C, heads, vocab) = ({args.batch}, {args.seq}, {args.dim}, {args.heads}, "
        f"{args.vocab}), float32; simulated on DGX H100"
    )
    print(
        "| layers | remat | peak MiB/rank | vs everything | step ms (sim.) | recompute cost "
        "| deterministic step ms (sim.) | deterministic cost |"
    )
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    for layers in args.layers:
        base = measure(layers, "everything", args)
        for remat in POLICIES:
            peak, step_s, ordered_s = (
                base if remat == "everything" else measure(layers, remat, args)
            )
            print(
                f"| {layers} | {remat} | {peak / 2**20:.1f} | {peak / base[0]:.2f} "
                f"| {step_s * 1e3:.3f} | {step_s / base[1] - 1:+.1%} "
                f"| {ordered_s * 1e3:.3f} | {ordered_s / step_s - 1:+.1%} |",
                flush=True,
            )
    print(
        f"\nPipelined: pp × dp × tp = {args.pp} × {args.dp} × {args.tp}, "
        f"{args.microbatches} microbatches, ZeRO off"
    )
    print("| layers | schedule | remat | peak MiB/rank | kept residuals MiB/rank |")
    print("|---:|---|---|---:|---:|")
    for layers in args.layers:
        for kind in ("gpipe", "1f1b"):
            for remat in ("everything", "nothing"):
                peak, saved = measure_pipelined(layers, remat, kind, args)
                print(
                    f"| {layers} | {kind} | {remat} | {peak / 2**20:.1f} | {saved / 2**20:.1f} |",
                    flush=True,
                )
    print(f"\n({time.time() - started:.0f} s; compiled and simulated, nothing ran)")


if __name__ == "__main__":
    main()
