"""The planner against published large training runs: for each, the planner's prediction
for the published configuration (MFU, against the run's reported MFU) and its error.

Sources (configurations and MFU as published; cited from the papers, tables named):
- Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters
  Using Megatron-LM", Table 1 (GPT, A100 80GB, seq 2048, vocab 51200; % of peak 312 TFLOPS);
- Llama Team 2024, "The Llama 3 Herd of Models", Table 4 (405B on H100, seq 8192, 16M
  tokens per batch; BF16 MFU).

    python benchmarks/planner.py
"""

from __future__ import annotations

import time

from tessera.plan.estimate import estimate
from tessera.plan.models import ModelSpec
from tessera.plan.strategy import Strategy, cluster_topology

GPT = dict(vocab=51200, seq=2048, mlp="gelu", tied_embeddings=True)
RUNS = [
    # (label, model, cluster, strategy, global batch, seq, published MFU)
    ("Megatron GPT 18.4B (Table 1)", ModelSpec("gpt-18.4b", 40, 6144, 48, 48, 24576, **GPT),
     "dgx_a100", Strategy(dp=32, tp=8, pp=1, zero=0), 1024, 2048, 0.43),
    ("Megatron GPT 39.1B (Table 1)", ModelSpec("gpt-39.1b", 48, 8192, 64, 64, 32768, **GPT),
     "dgx_a100", Strategy(dp=32, tp=8, pp=2, zero=0, schedule="interleaved", virtual=2), 1536, 2048, 0.44),
    ("Megatron GPT 145.6B (Table 1)", ModelSpec("gpt-145.6b", 80, 12288, 96, 96, 49152, **GPT),
     "dgx_a100", Strategy(dp=24, tp=8, pp=8, zero=0, schedule="interleaved", virtual=2), 2304, 2048, 0.47),
    ("Llama 3 405B, 8192 GPUs (Table 4)", "llama3-405b", "dgx_h100",
     Strategy(dp=64, tp=8, pp=16, zero=1, schedule="interleaved", virtual=2), 2048, 8192, 0.43),
    ("Llama 3 405B, 16384 GPUs (Table 4)", "llama3-405b", "dgx_h100",
     Strategy(dp=128, tp=8, pp=16, zero=1, schedule="interleaved", virtual=2), 2048, 8192, 0.41),
]  # fmt: skip


def main() -> None:
    from tessera.plan.models import PRESETS

    started = time.time()
    print("| run | GPUs | published config | published MFU | predicted MFU | error | memory GB |")
    print("|---|---:|---|---:|---:|---:|---:|")
    for label, model, cluster, s, batch, seq, published in RUNS:
        spec = PRESETS[model] if isinstance(model, str) else model
        result = estimate(spec, s, cluster_topology(cluster, s.gpus), batch, seq)
        error = (result.mfu - published) / published
        print(f"| {label} | {s.gpus} | {s.label()} | {published:.0%} | {result.mfu:.1%} "
              f"| {error:+.0%} | {result.memory.total / 1e9:.0f} |")  # fmt: skip
    print(f"\n({time.time() - started:.0f} s; simulated, nothing ran on a GPU)")


if __name__ == "__main__":
    main()
