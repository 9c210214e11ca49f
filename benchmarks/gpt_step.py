"""Training steps of ``examples/train_gpt.py``'s GPT on one device: tokens/s and MFU.

    python benchmarks/gpt_step.py [--layers 4 --dim 1024 --heads 16 --seq 1024 --batch 8]
    python benchmarks/gpt_step.py --cuda-graphs     # steps replayed from a CUDA graph
    python benchmarks/gpt_step.py --tiny            # a CPU smoke run (Triton's interpreter)

The model and loss are the example's (``train_gpt.gpt_loss``: pre-LN blocks with causal
attention, a tied embedding), compiled without a mesh into one ``graph.training_step``
(forward, ``graph.backward`` and AdamW; ``--precision bf16`` computes in bf16 with f32
master weights) with Triton kernels. The first ``--warmup`` steps (compiling, autotuning
unless ``TESSERA_AUTOTUNE=0``, capturing) are not timed; then ``--steps`` steps are.
MFU (model FLOPs utilisation) is ``6 N tokens/s / peak``: ``N`` parameters (the tied
embedding counted, as the output projection's matmul; attention's own FLOPs not), the peak the dense bf16 tensor-core rate
of the detected GPU (:data:`PEAK_BF16`; none on a CPU). Prints one markdown table.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import train_gpt

from tessera import graph, optim

# Dense bf16 tensor-core FLOP/s by device name (the first entry the name contains):
# NVIDIA datasheets' figures without sparsity. H200 has H100 SXM's compute.
PEAK_BF16: tuple[tuple[str, float], ...] = (
    ("H100 PCIe", 756e12),
    ("H100 NVL", 835e12),
    ("GH200", 989e12),
    ("H200", 989e12),
    ("H100", 989e12),  # SXM
    ("B200", 2250e12),
    ("A100", 312e12),
)


def peak_bf16(device_name: str) -> float | None:
    """The dense bf16 peak of ``device_name``, or None when it is not in the table."""
    return next((peak for key, peak in PEAK_BF16 if key in device_name), None)


def measure(args: argparse.Namespace, device: str) -> dict[str, Any]:
    params = {
        k: v.to(device)
        for k, v in train_gpt.init_params(args.vocab, args.seq, args.dim, args.layers).items()
    }
    count = sum(p.numel() for p in params.values())

    def gpt(p: Any, tokens: Any, targets: Any) -> Any:
        loss = train_gpt.gpt_loss(p, tokens, targets, args.heads, args.layers)
        return graph.backward(loss), {"loss": loss}

    step = graph.training_step(
        gpt,
        optimizer=optim.AdamW(lr=3e-4, weight_decay=0.0),
        precision=args.precision,
        remat=args.remat,
        kernels="triton",
        cuda_graphs=args.cuda_graphs,
    )
    state = step.init(params)
    g = torch.Generator().manual_seed(0)
    stream = torch.randint(0, args.vocab, (args.batch, args.seq + 1), generator=g).to(device)
    tokens, targets = stream[:, :-1].contiguous(), stream[:, 1:].contiguous()
    synchronize = torch.cuda.synchronize if device == "cuda" else lambda: None
    start = time.perf_counter()
    for _ in range(args.warmup):
        loss = float(step(state, tokens, targets)["loss"])
    first = time.perf_counter() - start
    synchronize()
    start = time.perf_counter()
    for _ in range(args.steps):
        metrics = step(state, tokens, targets)
    synchronize()
    loss = float(metrics["loss"])
    seconds = (time.perf_counter() - start) / args.steps
    tokens_per_s = args.batch * args.seq / seconds
    name = torch.cuda.get_device_name() if device == "cuda" else "CPU"
    peak = peak_bf16(name) if device == "cuda" else None
    return {
        "model": f"{args.layers} layers, dim {args.dim}, {args.heads} heads, vocab {args.vocab}",
        "params": count,
        "tokens": args.batch * args.seq,
        "warmup_s": first,
        "step_ms": seconds * 1e3,
        "tokens_per_s": tokens_per_s,
        "mfu": 6 * count * tokens_per_s / peak if peak else None,
        "peak": peak,
        "device": name,
        "loss": loss,
    }


def _count(n: int) -> str:
    return f"{n / 1e6:.1f} M" if n >= 100_000 else str(n)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--dim", type=int, default=1024)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=32768)
    parser.add_argument("--precision", choices=("f32", "bf16"), default=None)
    parser.add_argument(
        "--remat", default="everything", choices=("everything", "matmuls", "nothing")
    )
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    parser.add_argument("--steps", type=int, default=5, help="timed steps")
    parser.add_argument("--cuda-graphs", action="store_true", help="ts.jit(cuda_graphs=True)")
    parser.add_argument("--tiny", action="store_true", help="a tiny model on the CPU")
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available() and not args.tiny
    if args.tiny:
        args.layers, args.dim, args.heads, args.seq, args.batch, args.vocab = 1, 32, 2, 16, 2, 64
        args.warmup, args.steps = 1, 1
    args.precision = args.precision or ("bf16" if cuda else "f32")
    r = measure(args, "cuda" if cuda else "cpu")
    mfu = f"{100 * r['mfu']:.1f} %" if r["mfu"] is not None else "n/a (no peak for this device)"
    peak = f"{r['peak'] / 1e12:.0f}" if r["peak"] else "n/a"
    graphs = ", CUDA graphs" if args.cuda_graphs else ""
    print(
        f"GPT training step ({args.precision}{graphs}) on {r['device']}, torch {torch.__version__}"
    )
    print(
        "| model | params | tokens/step | warm-up s | step ms | tokens/s | peak bf16 TFLOP/s "
        "| MFU | loss |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|"
    )
    print(
        f"| {r['model']} | {_count(r['params'])} | {r['tokens']} | {r['warmup_s']:.1f} | "
        f"{r['step_ms']:.2f} | {r['tokens_per_s']:.0f} | {peak} | {mfu} | {r['loss']:.3f} |"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
