"""Measures the device baselines Tessera's kernels and cost model are judged against.

Prints a table and optionally writes JSON (``--json path``): bf16 matmul TFLOP/s through
torch (cuBLAS) for square and LLM-projection shapes, device-to-device copy bandwidth,
and torch's softmax / layer_norm / rms_norm bandwidth. Needs CUDA; exits 0 with a note
when there is none. Timing: CUDA events, warm-up, median of repeats.

    python benchmarks/device_baselines.py --json benchmarks/measured/h100.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
from collections.abc import Callable

import torch


def time_ms(fn: Callable[[], object], repeats: int = 20, warmup: int = 5) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def matmul_rows() -> list[dict[str, object]]:
    shapes = [(n, n, n) for n in (1024, 2048, 4096, 8192)]
    shapes += [(8192, 4096, 4096), (8192, 11008, 4096), (8192, 4096, 11008), (16384, 8192, 8192)]
    rows = []
    for m, n, k in shapes:
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        ms = time_ms(lambda a=a, b=b: a @ b)
        rows.append(
            {
                "op": "matmul bf16",
                "shape": f"{m}x{n}x{k}",
                "ms": ms,
                "tflops": 2 * m * n * k / ms / 1e9,
            }
        )
    return rows


def bandwidth_rows() -> list[dict[str, object]]:
    rows = []
    for rows_, cols in ((8192, 8192), (32768, 4096)):
        x = torch.randn(rows_, cols, device="cuda", dtype=torch.bfloat16)
        out = torch.empty_like(x)
        nbytes = 2 * x.numel() * x.element_size()  # read + write
        cases = {
            "copy d2d": lambda x=x, out=out: out.copy_(x),
            "softmax": lambda x=x: torch.softmax(x, dim=-1),
            "layer_norm": lambda x=x: torch.nn.functional.layer_norm(x, (x.shape[-1],)),
            "rms_norm": lambda x=x: torch.nn.functional.rms_norm(x, (x.shape[-1],)),
            "gelu(x*2+1)": lambda x=x: torch.nn.functional.gelu(x * 2 + 1),
        }
        for name, fn in cases.items():
            ms = time_ms(fn)
            rows.append(
                {
                    "op": f"{name} bf16",
                    "shape": f"{rows_}x{cols}",
                    "ms": ms,
                    "gbps": nbytes / ms / 1e6,
                }
            )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the measurements to this file")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: nothing measured")
        return 0
    rows = matmul_rows() + bandwidth_rows()
    print("| op | shape | ms | TFLOP/s | GB/s |\n|---|---|---:|---:|---:|")
    for r in rows:
        tf = f"{r['tflops']:.1f}" if "tflops" in r else ""
        gb = f"{r['gbps']:.0f}" if "gbps" in r else ""
        print(f"| {r['op']} | {r['shape']} | {r['ms']:.3f} | {tf} | {gb} |")
    meta = {
        "device": torch.cuda.get_device_name(),
        "date": datetime.date.today().isoformat(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }
    print(json.dumps(meta))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**meta, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
