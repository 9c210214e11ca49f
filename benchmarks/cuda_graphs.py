"""CUDA graphs against plain dispatch on launch-bound programs: time per call.

    python benchmarks/cuda_graphs.py [--layers 8 --width 256 --batch 32 --calls 200]
    python benchmarks/cuda_graphs.py --tiny      # a CPU smoke run (both run plainly)

Two small programs whose kernels take microseconds, so a call costs what issuing it
costs: a residual MLP forward (``--layers`` of ``layer_norm(x + gelu(x @ w))``) and an SGD
training step of it. Each runs compiled with ``ts.jit(kernels="triton")`` plainly and with
``cuda_graphs=True`` (captured at the second call: :mod:`tessera.backends.cuda_graphs`).
After warm-up calls, ``--calls`` calls are issued back to back: "host" is the time to
issue them per call (before synchronizing), "wall" includes the final synchronize. Where
a program is not captured (no CUDA), the reason is printed. Prints one markdown table.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch

import tessera as ts
from tessera import graph, op
from tessera.backends.cuda_graphs import CudaGraphWarning
from tessera.ir import schedule


def mlp(params: list[Any], x: Any) -> Any:
    for w in params:
        x = op.layer_norm(x + op.gelu(x @ w))
    return x


def sgd_step(params: list[Any], x: Any, y: Any) -> Any:
    loss = op.mean((mlp(params, x) - y) ** 2)
    grads = graph.backward(loss, params)
    return [p - 0.01 * g for p, g in zip(params, grads, strict=True)], loss


def time_calls(
    f: Callable[..., Any], args: Sequence[Any], calls: int, cuda: bool
) -> tuple[float, float]:
    """Microseconds per call: to issue ``calls`` calls, and until they finished."""
    synchronize = torch.cuda.synchronize if cuda else lambda: None
    synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        f(*args)
    issued = time.perf_counter() - start
    synchronize()
    done = time.perf_counter() - start
    return issued / calls * 1e6, done / calls * 1e6


def kernel_count(lowered: Any) -> int:
    module = lowered.module_at("schedule")
    return sum(isinstance(o, schedule.KernelOp) for o in module.walk())


def compare(
    name: str, fn: Callable[..., Any], args: Sequence[Any], calls: int, cuda: bool
) -> dict[str, Any]:
    plain = ts.jit(fn, kernels="triton")
    graphed = ts.jit(fn, kernels="triton", cuda_graphs=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", CudaGraphWarning)
        for _ in range(2):  # compile and tune; the graphed program captures at its second call
            plain(*args)
            graphed(*args)
    lowered = graphed.lower(*args)
    reasons = [str(w.message).split("CUDA graph: ", 1)[-1] for w in caught]
    plain_host, plain_wall = time_calls(plain, args, calls, cuda)
    graph_host, graph_wall = time_calls(graphed, args, calls, cuda)
    return {
        "program": name,
        "kernels": kernel_count(lowered),
        "plain": (plain_host, plain_wall),
        "graph": (graph_host, graph_wall),
        "captured": "yes" if lowered.graphs.captures else f"no: {'; '.join(reasons)}",
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--tiny", action="store_true", help="2 tiny layers on the CPU")
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available() and not args.tiny
    if args.tiny:
        args.layers, args.width, args.batch, args.calls = 2, 16, 4, 2
    device = "cuda" if cuda else "cpu"
    g = torch.Generator().manual_seed(0)
    params = [
        (torch.randn(args.width, args.width, generator=g) / args.width**0.5).to(device)
        for _ in range(args.layers)
    ]
    x = torch.randn(args.batch, args.width, generator=g).to(device)
    y = torch.randn(args.batch, args.width, generator=g).to(device)
    rows = [
        compare("MLP forward", mlp, [params, x], args.calls, cuda),
        compare("MLP SGD step", sgd_step, [params, x, y], args.calls, cuda),
    ]
    where = torch.cuda.get_device_name() if cuda else "CPU (Triton's interpreter)"
    print(
        f"CUDA graphs vs plain dispatch on {where}: {args.layers} layers, width {args.width}, "
        f"batch {args.batch}, {args.calls} calls"
    )
    print(
        "| program | kernels | plain host µs/call | graph host µs/call | plain wall µs/call "
        "| graph wall µs/call | wall speedup | captured |\n|---|---:|---:|---:|---:|---:|---:|---|"
    )
    for r in rows:
        (ph, pw), (gh, gw) = r["plain"], r["graph"]
        print(
            f"| {r['program']} | {r['kernels']} | {ph:.0f} | {gh:.0f} | {pw:.0f} | {gw:.0f} | "
            f"{pw / gw:.2f}x | {r['captured']} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
