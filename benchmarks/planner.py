"""The planner against published large training runs: for each run, the planner's
prediction for the published configuration (throughput, against the run's reported
throughput) and the planner's own choice for the same model, GPUs, batch, sequence and
precision (the search fixes the run's precision: FP8 is priced at twice the BF16 rate).

Throughput is compared as tokens per second per GPU, which does not depend on how a
paper counts FLOPs; both columns are also shown as MFU in this planner's convention
(:meth:`tessera.plan.models.ModelSpec.flops_per_token`: 6 per active weight, causal
attention at half, no recomputation) against the BF16 dense peak. Each published number
is converted to tokens/s with the paper's own FLOP count:

- Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters
  Using Megatron-LM" (SC21), Table 1: GPT, A100 80GB (Selene), seq 2048, vocab 51200,
  achieved teraFLOP/s per GPU counted as ``96·B·s·l·h²·(1 + s/6h + V/16lh)`` per
  iteration (their §5.1 / appendix: four passes, activation recomputation included), so
  the runs recompute every layer (``remat=full``) without sequence parallelism.
- Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
  Models" (MLSys 2023), abstract: the 530B GPT on 2240 A100 reaches 54.2% MFU with
  sequence parallelism and selective recomputation, MFU counted as
  ``72·B·s·l·h²·(1 + s/6h + V/12lh)``.
- Llama Team 2024, "The Llama 3 Herd of Models", Table 4: 405B on H100, 16M tokens per
  batch, BF16 MFU and TFLOPs/GPU (the FLOP count taken as this planner's; the paper does
  not give its formula in the table).
- DeepSeek-AI 2024, "DeepSeek-V3 Technical Report": 2048 H800 (§3.1), 16-way pipeline
  (DualPipe), 64-way expert parallelism over 8 nodes, ZeRO-1 data parallelism, no tensor
  parallelism (§3.2), FP8 mixed precision (§3.3), sequence 4096 and batch 15360
  (§4.2), 180K H800 GPU hours per trillion tokens (§1, Table 1).

Configurations the papers leave open are assumptions, marked in ``ASSUMED``.

For each run a second table explains where the planner's own pick gains on the
published configuration: the predicted step of each split into compute, recomputation,
exposed communication, pipeline bubble, data-parallel reduction and optimizer
(:data:`tessera.plan.estimate.BREAKDOWN`), and the memory headroom each leaves.

A third table checks the simulator against the published ablations that compare
strategies at a fixed GPU count (Narayanan et al. 2021, §5.4, 64 A100 GPUs, micro-batch
1, activation recomputation): Figure 13 (tensor × pipeline, the 162.2B GPT: 32 layers,
hidden 20480, 128 heads; best at tensor 8 × pipeline 8, tensor parallelism up to the
server's 8 GPUs), Figure 14 (pipeline × data, the 5.9B GPT: 32 layers, hidden 3840,
32 heads; throughput falls as the pipeline grows) and Figure 15 (tensor × data, the
same 5.9B GPT; throughput falls as tensor parallelism grows). The check is the order
the paper reports, not its absolute numbers.

    python benchmarks/planner.py              # all three tables (markdown)
    python benchmarks/planner.py --no-search  # published configurations only (seconds)
    python benchmarks/planner.py --ablations  # the ablation table only
    python benchmarks/planner.py --moe-costs  # DeepSeek-V3's plan, MoE techniques on and off
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import sys
import time
from dataclasses import dataclass

from tessera.plan.estimate import BREAKDOWN, Estimate, estimate
from tessera.plan.models import PRESETS, ModelSpec
from tessera.plan.search import search
from tessera.plan.strategy import Strategy, cluster_topology


@dataclass(frozen=True)
class Run:
    label: str
    model: ModelSpec
    cluster: str
    strategy: Strategy
    global_batch: int
    seq: int
    tokens_per_gpu_s: float  # published throughput, converted
    published: str  # the number as the paper gives it
    assumed: str = ""


def megatron_hfu_tokens(tflops: float, m: ModelSpec, seq: int) -> float:
    """Tokens/s per GPU of a Narayanan et al. 2021 teraFLOP/s figure (recompute counted)."""
    n, h, v = m.layers, m.hidden, m.vocab
    per_token = 96 * n * h * h * (1 + seq / (6 * h) + v / (16 * n * h))
    return tflops * 1e12 / per_token


def korthikanti_mfu_tokens(mfu: float, peak: float, m: ModelSpec, seq: int) -> float:
    """Tokens/s per GPU of a Korthikanti et al. 2022 MFU (no recompute counted)."""
    n, h, v = m.layers, m.hidden, m.vocab
    per_token = 72 * n * h * h * (1 + seq / (6 * h) + v / (12 * n * h))
    return mfu * peak / per_token


def own_tokens(tflops: float, m: ModelSpec, seq: int) -> float:
    return tflops * 1e12 / m.flops_per_token(seq)


def gpt(name: str, layers: int, hidden: int, heads: int) -> ModelSpec:
    return ModelSpec(name, layers, hidden, heads, heads, 4 * hidden, 51200, seq=2048,
                     mlp="gelu", tied_embeddings=True)  # fmt: skip


A100, H100 = 312e12, 989e12
MEGATRON = [  # (size, heads, hidden, layers, pp, GPUs, batch, teraFLOP/s per GPU, % peak)
    ("18.4B", 48, 6144, 40, 1, 256, 1024, 135, 43),
    ("39.1B", 64, 8192, 48, 2, 512, 1536, 138, 44),
    ("76.1B", 80, 10240, 60, 4, 1024, 1792, 140, 45),
    ("145.6B", 96, 12288, 80, 8, 1536, 2304, 148, 47),
    ("310.1B", 128, 16384, 96, 16, 1920, 2160, 155, 50),
]


def runs() -> list[Run]:
    out = []
    for size, heads, hidden, layers, pp, gpus, batch, tflops, percent in MEGATRON:
        m = gpt(f"gpt-{size.lower()}", layers, hidden, heads)
        schedule = ("interleaved", 2) if pp > 1 else ("1f1b", 1)
        s = Strategy(dp=gpus // (8 * pp), tp=8, pp=pp, zero=0, schedule=schedule[0],
                     virtual=schedule[1], remat="full", sp=False)  # fmt: skip
        out.append(Run(
            f"Megatron GPT {size} (Narayanan 2021, Table 1)", m, "dgx_a100", s, batch, 2048,
            megatron_hfu_tokens(tflops, m, 2048), f"{tflops} TFLOP/s/GPU, {percent}% HFU",
            "interleaved x2 when pp > 1, micro-batch 1, no ZeRO",
        ))  # fmt: skip
    m530 = gpt("gpt-530b", 105, 20480, 128)
    out.append(Run(
        "GPT 530B, SP + selective recompute (Korthikanti 2022)", m530, "dgx_a100",
        Strategy(dp=8, tp=8, pp=35, zero=0, schedule="1f1b", sp=True), 2240, 2048,
        korthikanti_mfu_tokens(0.542, A100, m530, 2048), "54.2% MFU",
        "global batch 2240 (280 per 280-GPU replica), 1F1B, micro-batch 1",
    ))  # fmt: skip
    llama = PRESETS["llama3-405b"]
    for gpus, dp, cp, seq, tflops, mfu in ((8192, 64, 1, 8192, 430, 43),
                                            (16384, 128, 1, 8192, 400, 41),
                                            (16384, 8, 16, 131072, 380, 38)):  # fmt: skip
        s = Strategy(dp=dp, tp=8, pp=16, cp=cp, zero=1, schedule="interleaved", virtual=2)
        out.append(Run(
            f"Llama 3 405B, {gpus} GPUs, seq {seq} (Table 4)", llama, "dgx_h100", s,
            16 * 2**20 // seq, seq, own_tokens(tflops, llama, seq),
            f"{tflops} TFLOP/s/GPU, {mfu}% MFU",
            "ZeRO-1, interleaved x2, micro-batch 1, sequence parallel",
        ))  # fmt: skip
    v3 = PRESETS["deepseek-v3"]
    out.append(Run(
        "DeepSeek-V3 671B, 2048 H800 (tech report)", v3, "dgx_h800",
        Strategy(dp=128, tp=1, pp=16, ep=64, zero=1, schedule="zb-h1", precision="fp8",
                 moe_overlap=True),
        15360, 4096, 1e12 / (180e3 * 3600), "180K GPU-hours per 1T tokens",
        "DualPipe priced as ZB-H1 with its all-to-alls overlapped (moe_overlap); node-limited "
        "routing (4 nodes); MLA as GQA; MTP module left out; no recomputation",
    ))  # fmt: skip
    return out


def mfu(m: ModelSpec, seq: int, tokens_per_gpu_s: float, peak: float) -> float:
    return tokens_per_gpu_s * m.flops_per_token(seq) / peak


SPLITS = ((2, 32), (4, 16), (8, 8), (16, 4), (32, 2))  # the figures' x axis on 64 GPUs


@dataclass(frozen=True)
class Ablation:
    label: str
    model: ModelSpec
    batches: tuple[int, ...]
    strategies: tuple[tuple[str, Strategy], ...]  # (the figure's label, the strategy)
    expected: str  # the order the paper reports: "peak at <label>" or "decreasing"


def ablations() -> list[Ablation]:
    """Narayanan et al. 2021, §5.4, Figures 13–15: 64 A100 GPUs (8 DGX A100 servers)."""
    # the 2021 runs had no sequence parallelism (Korthikanti et al. 2022)
    full = {"remat": "full", "micro_batch": 1, "zero": 0, "sp": False}
    big = gpt("gpt-162.2b", 32, 20480, 128)
    small = gpt("gpt-5.9b", 32, 3840, 32)
    return [
        Ablation(
            "Fig. 13: tensor x pipeline, 162.2B GPT", big, (32, 128),
            tuple((f"t{t} p{p}", Strategy(tp=t, pp=p, schedule="1f1b", **full)) for t, p in SPLITS),
            "peak at t8 p8",
        ),
        Ablation(
            "Fig. 14: pipeline x data, 5.9B GPT", small, (128, 512),
            tuple((f"p{p} d{d}", Strategy(dp=d, pp=p, schedule="1f1b", **full)) for p, d in SPLITS),
            "decreasing",
        ),
        Ablation(
            "Fig. 15: tensor x data, 5.9B GPT", small, (128, 512),
            tuple((f"t{t} d{d}", Strategy(dp=d, tp=t, **full)) for t, d in SPLITS),
            "decreasing",
        ),
    ]  # fmt: skip


def ablation_order_holds(expected: str, labels: list[str], throughput: list[float]) -> bool:
    """Whether predicted throughputs show the order the paper reports."""
    if expected == "decreasing":
        return all(a > b for a, b in itertools.pairwise(throughput))
    peak = expected.removeprefix("peak at ")
    return labels[throughput.index(max(throughput))] == peak


def print_ablations() -> list[bool]:
    """The ablation table; one verdict per figure and batch size."""
    print("| published ablation (Narayanan 2021, 64 A100) | batch | "
          + " | ".join(f"split {i + 1}" for i in range(len(SPLITS)))
          + " | paper's order | simulated order holds |")  # fmt: skip
    print("|---|---:|" + "---:|" * len(SPLITS) + "---|---|")
    verdicts = []
    topology = cluster_topology("dgx_a100", 64)
    for ablation in ablations():
        for batch in ablation.batches:
            labels = [label for label, _ in ablation.strategies]
            cells, throughput = [], []
            for label, s in ablation.strategies:
                e = estimate(ablation.model, s, topology, batch, 2048)
                per_gpu = e.tokens_per_s / s.gpus
                throughput.append(per_gpu)
                cells.append(f"{label}: {per_gpu:,.0f}{'' if e.memory.fits else '*'}")
            holds = ablation_order_holds(ablation.expected, labels, throughput)
            verdicts.append(holds)
            print(f"| {ablation.label} | {batch} | " + " | ".join(cells)
                  + f" | {ablation.expected} | {'yes' if holds else 'NO'} |")  # fmt: skip
            sys.stdout.flush()
    print(
        "\ncells: predicted tokens/s per GPU; * the plan does not fit in 80 GB by the "
        "planner's memory model (priced anyway)"
    )
    return verdicts


def _seconds(parts: dict[str, float]) -> str:
    return " | ".join(f"{parts[k]:.2f}" for k in BREAKDOWN)


def print_explanations(pairs: list[tuple[str, Estimate, Estimate]]) -> None:
    """Where each pick gains: the published and the picked step, part by part."""
    print("| run | plan | " + " | ".join(f"{k} s" for k in BREAKDOWN)
          + " | step s | headroom GB | pick gains most on |")  # fmt: skip
    print("|---|---|" + "---:|" * (len(BREAKDOWN) + 2) + "---|")
    for label, published, pick in pairs:
        gains = sorted(
            ((published.breakdown[k] - pick.breakdown[k], k) for k in BREAKDOWN), reverse=True
        )
        summary = ", ".join(f"{k} {g:+.2f} s" for g, k in gains[:2] if g > 0) or "—"
        for which, e in (("published", published), ("pick", pick)):
            print(f"| {label if which == 'published' else ''} | {which}: {e.strategy.label()} "
                  f"| {_seconds(e.breakdown)} | {e.step_s:.2f} | {e.headroom_bytes / 1e9:.0f} "
                  f"| {summary if which == 'pick' else ''} |")  # fmt: skip


def print_moe_costs() -> None:
    """DeepSeek-V3's published plan priced with each of its expert-parallel techniques on or
    off: node-limited routing, the DualPipe overlap of the all-to-alls, FP8 against BF16."""
    run = next(r for r in runs() if r.model.name == "deepseek-v3")
    topology = cluster_topology(run.cluster, run.strategy.gpus)
    print("| precision | all-to-alls | routing | a2a per pass ms | "
          + " | ".join(f"{k} s" for k in BREAKDOWN) + " | tok/s/GPU | vs published |")  # fmt: skip
    print("|---|---|---|---:|" + "---:|" * (len(BREAKDOWN) + 2))
    for precision in ("fp8", "bf16"):
        for overlap in (False, True):
            for groups in (0, run.model.route_groups):
                model = dataclasses.replace(run.model, route_groups=groups)
                s = dataclasses.replace(run.strategy, precision=precision, moe_overlap=overlap)
                e = estimate(model, s, topology, run.global_batch, run.seq)
                tokens = e.tokens_per_s / s.gpus
                print(f"| {precision} | {'overlapped' if overlap else 'exposed'} "
                      f"| {f'at most {groups} nodes' if groups else 'top-k copies'} "
                      f"| {e.parts['all_to_all'] * 1e3:.2f} | {_seconds(e.breakdown)} "
                      f"| {tokens:,.0f} | {tokens / run.tokens_per_gpu_s - 1:+.0%} |")  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    args = argparse.ArgumentParser()
    args.add_argument("--no-search", action="store_true", help="skip the planner's own choice")
    args.add_argument("--ablations", action="store_true", help="only the ablation table")
    args.add_argument("--moe-costs", action="store_true",
                      help="only DeepSeek-V3's plan with each MoE technique on and off")  # fmt: skip
    options = args.parse_args(argv)
    started = time.time()
    if options.moe_costs:
        print_moe_costs()
        return
    if options.ablations:
        verdicts = print_ablations()
        print(f"\n{sum(verdicts)} of {len(verdicts)} orders hold ({time.time() - started:.0f} s)")
        return
    pairs: list[tuple[str, Estimate, Estimate]] = []
    print("| run | GPUs | published config | published | published tok/s/GPU (MFU) "
          "| predicted tok/s/GPU (MFU) | error | memory GB | planner's choice | its tok/s/GPU (MFU) |")  # fmt: skip
    print("|---|---:|---|---|---:|---:|---:|---:|---|---:|")
    errors = []
    for run in runs():
        s = run.strategy
        topology = cluster_topology(run.cluster, s.gpus)
        peak = topology.device.matmul_flops["bf16"]
        result = estimate(run.model, s, topology, run.global_batch, run.seq)
        predicted = result.tokens_per_s / s.gpus
        error = predicted / run.tokens_per_gpu_s - 1
        errors.append((run.label, error))
        fits = "" if result.memory.fits else " (does not fit)"
        own = "—"
        if not options.no_search:
            fix = {"precision": s.precision}  # FP8 is priced at twice BF16: compare like with like
            found = search(
                run.model, topology, s.gpus, run.global_batch, run.seq, finalists=6, fix=fix
            )
            if found.best is not None:
                b = found.best
                pairs.append((run.label, result, b))
                t = b.tokens_per_s / s.gpus
                own = (f"{b.strategy.label()} | {t:,.0f} "
                       f"({mfu(run.model, run.seq, t, peak):.1%})")  # fmt: skip
            else:
                own = "none fits | —"
        else:
            own = "— | —"
        print(
            f"| {run.label} | {s.gpus} | {s.label()} | {run.published} "
            f"| {run.tokens_per_gpu_s:,.0f} ({mfu(run.model, run.seq, run.tokens_per_gpu_s, peak):.1%}) "
            f"| {predicted:,.0f} ({mfu(run.model, run.seq, predicted, peak):.1%}) "
            f"| {error:+.0%} | {result.memory.total / 1e9:.0f}{fits} | {own} |"
        )  # fmt: skip
        sys.stdout.flush()
    mean = sum(abs(e) for _, e in errors) / len(errors)
    print(
        f"\nmean |error| {mean:.0%}; ({time.time() - started:.0f} s; simulated, nothing ran on a GPU)"
    )
    print("assumed: " + "; ".join(f"{r.label}: {r.assumed}" for r in runs() if r.assumed))
    if pairs:
        print(
            "\nWhere each pick gains (seconds per step on the busiest rank; headroom: "
            "usable memory left, 90% of HBM):\n"
        )
        print_explanations(pairs)
    print()
    verdicts = print_ablations()
    print(
        f"\n{sum(verdicts)} of {len(verdicts)} orders hold ({time.time() - started:.0f} s in all)"
    )


if __name__ == "__main__":
    main()
