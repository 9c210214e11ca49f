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

A third table compares the ZeRO stages (no recomputation) on the same dp × tp mesh: the
per-rank peak, the model states ``step.memory(...).model_states`` counts (parameters,
gradients, optimizer state as stored), the bytes the dp collectives move per rank and
the simulated step time. Without recomputation the peak is at the forward's end (every
activation kept, no gradient yet), so it holds the stored parameters and optimizer
state, not the gradients the model states count. ZeRO-3 gathers each parameter for its
layer's forward and again for its backward, one all-gather ahead, so its peak holds
about two layers' whole parameters, not the model's.

    python benchmarks/memory.py                         # 8, 16 and 32 layers
    python benchmarks/memory.py --layers 8 --dim 128    # smaller, faster
    python benchmarks/memory.py --tables zero           # only the ZeRO table
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
from comm_volume import received

from tessera import dist, numerics, schedule
from tessera.backends.collective_info import collectives
from tessera.program import Lowered

POLICIES = ("everything", "matmuls", "nothing")
TABLES = ("remat", "pipeline", "zero")


def lowered_step(layers: int, remat: str, zero: int, args: argparse.Namespace) -> Lowered:
    """The GPT step on the dp × tp mesh, lowered (its stages compile when read; nothing runs)."""
    mesh = dist.Mesh(axes=["dp", "tp"], shape=(args.dp, args.tp))
    params = train_gpt.init_params(args.vocab, args.seq, args.dim, layers)
    options = SimpleNamespace(lr=1e-3, zero=zero, heads=args.heads, layers=layers, remat=remat)
    step = train_gpt.make_step(mesh, params, options)  # type: ignore[arg-type]
    tokens = torch.randint(0, args.vocab, (args.batch, args.seq))
    return step.lower(step.init(params), tokens, tokens)


def measure(layers: int, remat: str, args: argparse.Namespace) -> tuple[int, float, float]:
    """Per-rank peak bytes and simulated step seconds (fast, deterministic numerics)."""
    lowered = lowered_step(layers, remat, args.zero, args)
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


def measure_zero(layers: int, zero: int, args: argparse.Namespace) -> dict[str, float]:
    """Per-rank peak and model-state bytes, dp-collective bytes per rank and simulated
    step seconds of the step under ZeRO stage ``zero``."""
    lowered = lowered_step(layers, "everything", zero, args)
    memory = lowered.memory()
    states = memory.model_states
    assert states is not None
    moved = received([i for i in collectives(lowered.module_at("schedule")) if "dp" in i.mesh_axes])
    return {
        "peak": memory.peak_bytes,
        "states": states.params + states.grads + states.optimizer_state,
        "moved": moved,
        "step": lowered.simulate().step_time_s,
    }


def zero_table(args: argparse.Namespace) -> None:
    print(
        f"\nZeRO stages: dp × tp = {args.dp} × {args.tp}, no recomputation; dp bytes: "
        f"received per rank by the schedule's dp collectives"
    )
    print("| layers | zero | peak MiB/rank | model states MiB/rank | dp MiB moved/rank "
          "| step ms (sim.) |")
    print("|---:|---:|---:|---:|---:|---:|")
    for layers in args.layers:
        for zero in (0, 1, 2, 3):
            row = measure_zero(layers, zero, args)
            print(
                f"| {layers} | {zero} | {row['peak'] / 2**20:.1f} | {row['states'] / 2**20:.1f} "
                f"| {row['moved'] / 2**20:.2f} | {row['step'] * 1e3:.3f} |",
                flush=True,
            )


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
    parser.add_argument(
        "--tables", nargs="+", choices=TABLES, default=list(TABLES), help="which tables to print"
    )
    args = parser.parse_args()
    started = time.time()
    if "remat" in args.tables:
        remat_table(args)
    if "pipeline" in args.tables:
        pipeline_table(args)
    if "zero" in args.tables:
        zero_table(args)
    print(f"\n({time.time() - started:.0f} s; compiled and simulated, nothing ran)")


def remat_table(args: argparse.Namespace) -> None:
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


def pipeline_table(args: argparse.Namespace) -> None:
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


if __name__ == "__main__":
    main()
