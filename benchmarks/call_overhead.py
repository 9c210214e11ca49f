"""Tessera's own cost per call of a compiled function, without the kernel launch.

    python benchmarks/call_overhead.py

The Triton launch is replaced by a no-op, so the time printed is what the jit call path
(signature, argument conversion, schedule runner, kernel arguments and outputs) adds
before any kernel runs. Runs on a CPU; prints a table.
"""

from __future__ import annotations

import time

import torch

import tessera as ts
from tessera import op
from tessera.backends.triton import runtime

CASES = {
    "softmax [64, 256]": (lambda x: op.softmax(x, axis=-1), (torch.randn(64, 256),)),
    "gelu(x @ w + b)": (
        lambda x, w, b: op.gelu(x @ w + b),
        (torch.randn(64, 64), torch.randn(64, 64), torch.randn(64)),
    ),
}


def main(calls: int = 500) -> None:
    runtime.CompiledKernel.launch = lambda self, args: None  # type: ignore[method-assign]
    print("| program | kernels | µs per call (launch excluded) |\n|---|---:|---:|")
    for name, (fn, args) in CASES.items():
        f = ts.jit(fn, kernels="triton")
        f(*args)  # trace and compile
        kernels = len(f.lower(*args).triton_source())
        start = time.perf_counter()
        for _ in range(calls):
            f(*args)
        print(f"| {name} | {kernels} | {(time.perf_counter() - start) / calls * 1e6:.0f} |")


if __name__ == "__main__":
    main()
