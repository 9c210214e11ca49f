"""Tessera's own cost per call of a compiled function, without the kernel launch.

    python benchmarks/call_overhead.py [--calls N] [--repeats R]

Two tables, on a CPU:

1. Triton kernels with ``CompiledKernel.launch`` replaced by a no-op: the host time the
   jit call path (signature, argument conversion, launch plan, kernel arguments and
   outputs) adds before any kernel runs, per call, and a least-squares fit of it over
   the programs' kernel counts: µs per kernel (slope) and fixed µs per call (intercept).
2. The reference runner (``kernels="reference"``: the torch reference of every op) on a
   jitted GPT-like forward, against the same ops run eagerly in torch.

Each time is the best of ``--repeats`` runs of ``--calls`` calls (the machine is noisy);
torch runs on ``--threads`` threads (1 by default: on a shared 2-core VM, torch's
intra-op threads spin against other processes and make times erratic).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
import comm_volume

import tessera as ts
from tessera import op
from tessera.backends.triton import runtime
from tessera.ir import schedule

GPT = (2, 32, 64, 4)  # (batch, seq, dim, heads) of the stubbed-launch GPT forwards
GPT_TORCH = (4, 64, 256, 4)  # of the reference-runner vs eager torch comparison


def gpt(params: list[dict[str, Any]], x: Any, heads: int) -> Any:
    """Pre-LN transformer layers (``comm_volume.transformer_layer``), one per ``params``."""
    for p in params:
        x = comm_volume.transformer_layer(x, p, heads)
    return x


def torch_layer(x: torch.Tensor, p: dict[str, torch.Tensor], heads: int) -> torch.Tensor:
    """``comm_volume.transformer_layer`` op for op in eager torch."""
    batch, seq, dim = x.shape
    f = torch.nn.functional

    def split_heads(t: torch.Tensor) -> torch.Tensor:
        return t.reshape(batch, seq, heads, dim // heads).permute(0, 2, 1, 3)

    h = f.layer_norm(x, (dim,), p["ln1_w"], p["ln1_b"])
    q, k, v = (split_heads(h @ p[name]) for name in ("wq", "wk", "wv"))
    scores = (q @ k.permute(0, 1, 3, 2)) * (1.0 / (dim // heads) ** 0.5)
    causal = torch.ones(seq, seq, dtype=torch.bool).tril()
    attention = torch.softmax(torch.where(causal, scores, -1e9), dim=-1) @ v
    x = x + attention.permute(0, 2, 1, 3).reshape(batch, seq, dim) @ p["wo"]
    h = f.layer_norm(x, (dim,), p["ln2_w"], p["ln2_b"])
    return x + f.gelu(h @ p["w1"]) @ p["w2"]


def torch_gpt(params: list[dict[str, torch.Tensor]], x: torch.Tensor, heads: int) -> torch.Tensor:
    for p in params:
        x = torch_layer(x, p, heads)
    return x


def gpt_inputs(layers: int, dims: tuple[int, int, int, int]) -> tuple[Any, ...]:
    batch, seq, dim, heads = dims
    x, _ = comm_volume.layer_inputs(batch, seq, dim)
    params = [comm_volume.layer_inputs(batch, seq, dim)[1] for _ in range(layers)]
    return params, x, heads


def cases() -> dict[str, tuple[Callable[..., Any], tuple[Any, ...], tuple[int, ...]]]:
    """name -> (function, arguments, static_argnums)."""
    x = torch.randn(64, 64)
    w1, w2, b1, b2 = torch.randn(64, 256), torch.randn(256, 64), torch.randn(256), torch.randn(64)
    return {
        "softmax [64, 256]": (lambda x: op.softmax(x, axis=-1), (torch.randn(64, 256),), ()),
        "gelu(x @ w + b)": (
            lambda x, w, b: op.gelu(x @ w + b),
            (x, torch.randn(64, 64), torch.randn(64)),
            (),
        ),
        "MLP 64-256-64": (
            lambda x, w1, b1, w2, b2: op.gelu(x @ w1 + b1) @ w2 + b2,
            (x, w1, b1, w2, b2),
            (),
        ),
        "GPT forward, 2 layers": (gpt, gpt_inputs(2, GPT), (2,)),
        "GPT forward, 8 layers": (gpt, gpt_inputs(8, GPT), (2,)),
    }


def seconds_per_call(fn: Callable[[], Any], calls: int, repeats: int) -> float:
    """The best of ``repeats`` mean times of ``calls`` calls of ``fn``."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls)
    return best


def kernel_count(lowered: Any) -> int:
    """``schedule.kernel`` ops a call runs (views included)."""
    return sum(isinstance(o, schedule.KernelOp) for o in lowered.module_at("schedule").walk())


def stubbed_launch(calls: int, repeats: int) -> None:
    launch = runtime.CompiledKernel.launch
    runtime.CompiledKernel.launch = lambda self, args: None  # type: ignore[method-assign]
    try:
        print("Triton kernels, launch stubbed (CPU tensors)\n")
        print("| program | kernels | µs per call | µs per kernel |\n|---|---:|---:|---:|")
        points = []
        for name, (fn, args, static) in cases().items():
            f = ts.jit(fn, kernels="triton", static_argnums=static)
            f(*args)  # trace and compile
            kernels = kernel_count(f.lower(*args))
            micros = seconds_per_call(lambda f=f, args=args: f(*args), calls, repeats) * 1e6
            points.append((kernels, micros))
            print(f"| {name} | {kernels} | {micros:.0f} | {micros / kernels:.1f} |")
        slope, intercept = np.polyfit(*zip(*points, strict=True), 1)
        print(f"\nfit: {slope:.1f} µs per kernel + {intercept:.0f} µs per call")
    finally:
        runtime.CompiledKernel.launch = launch  # type: ignore[method-assign]


def reference_vs_torch(calls: int, repeats: int) -> None:
    print(f"\nReference runner vs eager torch, GPT forward (B, T, C, heads) = {GPT_TORCH}\n")
    print("| layers | eager torch µs | Tessera reference µs | ratio |\n|---:|---:|---:|---:|")
    for layers in (2, 8):
        args = gpt_inputs(layers, GPT_TORCH)
        f = ts.jit(gpt, kernels="reference", static_argnums=(2,))
        got, want = f(*args), torch_gpt(*args)
        assert torch.allclose(got, want, rtol=1e-4, atol=1e-4), (got - want).abs().max()
        eager = seconds_per_call(lambda args=args: torch_gpt(*args), calls, repeats) * 1e6
        tessera = seconds_per_call(lambda f=f, args=args: f(*args), calls, repeats) * 1e6
        print(f"| {layers} | {eager:.0f} | {tessera:.0f} | {tessera / eager:.2f}× |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    options = parser.parse_args()
    torch.set_num_threads(options.threads)
    stubbed_launch(options.calls, options.repeats)
    reference_vs_torch(max(options.calls // 10, 5), options.repeats)


if __name__ == "__main__":
    main()
