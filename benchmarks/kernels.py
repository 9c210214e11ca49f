"""Tessera's generated Triton kernels against torch on a GPU (issue 5, item 6).

Each case is a Tessera function built with ``ts.jit``, lowered to the Schedule IR and
to tile kernels, run once through the schedule runner with :class:`TritonKernels`
(which autotunes every kernel's block sizes at its first call on the GPU); then the
generated kernels' launches are timed alone with ``triton.testing.do_bench`` (median,
L2 flushed before each launch) on preallocated inputs and outputs, as is the torch
baseline. Rows print the goal of issue 5 and whether it is met:

- bf16 matmul (square M=N=K and LLM projections) vs ``torch.matmul`` (cuBLAS):
  ≥ 0.9× at sizes ≥ 4096, ≥ 0.7× at 1024–2048;
- softmax, layer_norm, rms_norm and a fused ``gelu(x * a + b)`` in GB/s (one read of
  the input and one write of the output): ≥ 80 % of a device-to-device copy (``x.clone()``);
- attention forward vs ``scaled_dot_product_attention``: ≥ 1× at seq ≥ 4096 (only when
  ``tessera.codegen.attention`` matches the program; else the row says "not available").

One shape per class is also timed end to end as ``f(x)`` (tracing cached, kernels tuned),
to show the Python overhead of a call. Needs CUDA; exits 0 with a note when there is none.

    python benchmarks/kernels.py --json benchmarks/measured/h100_kernels.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

MATMUL_SQUARE = (1024, 2048, 4096, 8192)
MATMUL_LLM = ((8192, 4096, 4096), (8192, 14336, 4096), (8192, 4096, 14336))  # M x N x K
ROWS = ((8192, 4096),)
ATTENTION = [  # batch, heads, head dim, sequence length
    (4, heads, dim, seq) for heads, dim in ((32, 64), (16, 128)) for seq in (1024, 2048, 4096, 8192)
]


def bench_ms(fn: Callable[[], object]) -> float:
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=25, rep=100, return_mode="median"))


@dataclass
class Built:
    """A Tessera function's generated kernels, run once, ready to relaunch."""

    name: str
    outputs: list[torch.Tensor]
    launches: list[tuple[Any, list[Any]]]  # (CompiledKernel, its arguments)
    tunings: list[Any] = field(default_factory=list)  # autotune.Tuning per kernel
    classes: list[str] = field(default_factory=list)

    def launch(self) -> None:
        for compiled, args in self.launches:
            compiled.launch(args)

    def configs(self) -> str:
        return "; ".join(
            _config_text(t.config, c) for t, c in zip(self.tunings, self.classes, strict=True)
        )


def _config_text(config: Any, kind: str) -> str:
    if kind == "matmul":
        return f"{config.block_m}x{config.block_n}x{config.block_k} w{config.num_warps} s{config.num_stages}"
    if kind == "pointwise":
        return f"block {config.block} w{config.num_warps}"
    if kind == "reduction":
        return f"row_elements {config.row_elements} w{config.num_warps}"
    return f"{config.block_m}x{config.block_n} w{config.num_warps} s{config.num_stages}"


def tile_module(lowered: Any) -> Any:
    """The lowered program's schedule with its tile kernels."""
    from xdsl.context import Context

    from tessera.passes.lower_schedule_to_tile import LowerScheduleToTilePass

    try:
        return lowered.module_at("tile")
    except Exception:  # an older ``Lowered`` without the tile stage
        module = lowered.module_at("schedule").clone()
        LowerScheduleToTilePass().apply(Context(), module)
        return module


def build(fn: Callable[..., Any], args: Sequence[torch.Tensor]) -> Built:
    """Traces and lowers ``fn``, runs its kernels once (autotuning them) and keeps their
    launches (the same kernels and argument tensors) for timing."""
    import tessera as ts
    import tessera.dist as dist
    from tessera.backends import launch_plan
    from tessera.backends.triton.runtime import TritonKernels
    from tessera.codegen.kernels import kernel_class

    lowered = ts.jit(fn).lower(*args)
    module = tile_module(lowered)
    runner = TritonKernels(module, autotune=True)
    built = Built(lowered.name, [], [])

    def recording(kernel: Any, inputs: Sequence[torch.Tensor], context: Any) -> list[torch.Tensor]:
        compiled, kernel_args, outputs = runner.prepare(kernel, inputs, context)
        compiled.launch(kernel_args)
        built.launches.append((compiled, kernel_args))
        built.tunings.append(runner.tuned[(kernel.kernel_name, str(inputs[0].device))])
        built.classes.append(kernel_class(kernel))
        return outputs

    (outputs,) = launch_plan.run_virtual(
        module, lowered.name, dist.mesh({"d": 1}), [list(args)], recording
    )
    built.outputs = list(outputs)
    torch.cuda.synchronize()
    return built


def max_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Max absolute error relative to the reference's largest magnitude."""
    ref = ref.float()
    return float((out.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def tuning_record(built: Built) -> list[dict[str, Any]]:
    return [
        {
            "kernel": t.name,
            "class": kind,
            "chosen": _config_text(t.config, kind),
            "tuning_s": round(t.seconds, 2),
            "candidates_ms": [[_config_text(c, kind), round(ms, 5)] for c, ms in t.timings],
            "failed": [[_config_text(c, kind), why] for c, why in t.failed],
        }
        for t, kind in zip(built.tunings, built.classes, strict=True)
    ]


# --- cases -----------------------------------------------------------------------------------


def matmul_rows(shapes: Sequence[tuple[int, int, int]]) -> list[dict[str, Any]]:
    from tessera import op  # noqa: F401  (``@`` on traced tensors is tessera's matmul)

    def mm(a: Any, b: Any) -> Any:
        return a @ b

    rows = []
    for m, n, k in shapes:
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        built = build(mm, [a, b])
        ours = bench_ms(built.launch)
        theirs = bench_ms(lambda a=a, b=b: torch.matmul(a, b))
        flops = 2 * m * n * k
        goal = 0.9 if min(m, n, k) >= 4096 else 0.7
        ratio = theirs / ours
        rows.append(
            {
                "case": "matmul bf16",
                "shape": f"{m}x{n}x{k}",
                "tessera_ms": ours,
                "torch_ms": theirs,
                "tessera": flops / ours / 1e9,
                "torch": flops / theirs / 1e9,
                "unit": "TFLOP/s",
                "ratio": ratio,
                "goal": f">= {goal}x torch",
                "met": ratio >= goal,
                "config": built.configs(),
                "max_rel_error": max_error(built.outputs[0], torch.matmul(a, b)),
                "tuning": tuning_record(built),
            }
        )
        print_row(rows[-1])
        del a, b, built
        torch.cuda.empty_cache()
    return rows


def memory_rows(
    shapes: Sequence[tuple[int, int]], dtypes: Sequence[torch.dtype]
) -> list[dict[str, Any]]:
    import torch.nn.functional as F

    from tessera import op

    def softmax(x: Any) -> Any:
        return op.softmax(x, axis=-1)

    def layer_norm(x: Any) -> Any:
        return op.layer_norm(x)

    def rms_norm(x: Any) -> Any:
        return op.rms_norm(x)

    def gelu_chain(x: Any, a: Any, b: Any) -> Any:
        return op.gelu(x * a + b)

    rows = []
    for rows_, cols in shapes:
        for dtype in dtypes:
            x = torch.randn(rows_, cols, device="cuda", dtype=dtype)
            a = torch.randn(cols, device="cuda", dtype=dtype)
            b = torch.randn(cols, device="cuda", dtype=dtype)
            nbytes = 2 * x.numel() * x.element_size()
            copy_ms = bench_ms(lambda x=x: x.clone())
            cases: list[
                tuple[str, Callable[..., Any], list[torch.Tensor], Callable[[], Any], int]
            ] = [
                ("softmax", softmax, [x], lambda x=x: torch.softmax(x, dim=-1), nbytes),
                (
                    "layer_norm",
                    layer_norm,
                    [x],
                    lambda x=x, cols=cols: F.layer_norm(x, (cols,)),
                    nbytes,
                ),
                (
                    "rms_norm",
                    rms_norm,
                    [x],
                    lambda x=x, cols=cols: F.rms_norm(x, (cols,), eps=1e-6),
                    nbytes,
                ),
                (
                    "gelu(x*a+b)",
                    gelu_chain,
                    [x, a, b],
                    lambda x=x, a=a, b=b: F.gelu(x * a + b),
                    nbytes + 2 * a.numel() * a.element_size(),
                ),
            ]
            for name, fn, args, reference, moved in cases:
                built = build(fn, args)
                ours = bench_ms(built.launch)
                theirs = bench_ms(reference)
                ratio = copy_ms / ours
                rows.append(
                    {
                        "case": f"{name} {str(dtype).removeprefix('torch.')}",
                        "shape": f"{rows_}x{cols}",
                        "tessera_ms": ours,
                        "torch_ms": theirs,
                        "copy_ms": copy_ms,
                        "tessera": moved / ours / 1e6,
                        "torch": moved / theirs / 1e6,
                        "copy": nbytes / copy_ms / 1e6,
                        "unit": "GB/s",
                        "ratio": ratio,
                        "vs_torch": theirs / ours,
                        "goal": ">= 0.8x copy",
                        "met": ratio >= 0.8,
                        "config": built.configs(),
                        "max_rel_error": max_error(built.outputs[0], reference()),
                        "tuning": tuning_record(built),
                    }
                )
                print_row(rows[-1])
            del x, a, b
            torch.cuda.empty_cache()
    return rows


CAUSAL_NOTE = (
    "not measured: tracing the S x S np.tril mask constant costs minutes of CPU at this "
    "length (xdsl builds the dense attribute element by element); see --causal-max-seq"
)


def attention_available() -> bool:
    """Whether ``codegen.attention`` turns softmax(q kᵀ) v into one attention kernel."""
    import tessera as ts
    from tessera.codegen.kernels import kernel_class
    from tessera.ir import schedule

    q = torch.randn(1, 2, 64, 32)
    try:
        lowered = ts.jit(_attention(32**-0.5)).lower(q, q, q)
        module = lowered.module_at("schedule")
    except Exception:
        return False
    kernels = [k for k in module.walk() if isinstance(k, schedule.KernelOp)]
    return any(kernel_class(k) == "attention" for k in kernels)


def _attention(scale: float, causal_seq: int | None = None) -> Callable[..., Any]:
    """softmax(q kᵀ · scale) v; causal through a ``np.tril`` mask constant, which
    ``codegen.attention`` computes from indices (and stops the key loop at the diagonal)."""
    import numpy as np

    from tessera import op

    mask = np.tril(np.ones((causal_seq, causal_seq), dtype=bool)) if causal_seq else None

    def attention(q: Any, k: Any, v: Any) -> Any:
        s = (q @ op.transpose(k, (0, 1, 3, 2))) * scale
        if mask is not None:
            s = op.where(mask, s, float("-inf"))
        return op.softmax(s, axis=-1) @ v

    return attention


def attention_rows(
    cases: Sequence[tuple[int, int, int, int]],
    causal_max_seq: int,
    masks: Sequence[bool] = (False, True),
) -> list[dict[str, Any]]:
    import torch.nn.functional as F

    if not attention_available():
        row = {"case": "attention bf16", "shape": "all", "note": "not available"}
        print(
            f"| attention bf16 | {', '.join(map(str, cases[:1]))}... | not available (codegen.attention.match_attention does not match) |"
        )
        return [row]
    rows = []
    for batch, heads, dim, seq in cases:
        for causal in masks:
            name = f"attention{' causal' if causal else ''} bf16"
            shape = f"b{batch} h{heads} s{seq} d{dim}"
            if causal and seq > causal_max_seq:
                rows.append({"case": name, "shape": shape, "note": CAUSAL_NOTE})
                print_row(rows[-1])
                continue
            q, k, v = (
                torch.randn(batch, heads, seq, dim, device="cuda", dtype=torch.bfloat16)
                for _ in range(3)
            )
            start = time.perf_counter()
            try:
                built = build(_attention(dim**-0.5, seq if causal else None), [q, k, v])
            except Exception as error:
                rows.append({"case": name, "shape": shape, "note": f"failed: {error}"[:300]})
                print_row(rows[-1])
                continue
            build_s = time.perf_counter() - start
            if "attention" not in built.classes:
                note = f"not one attention kernel: {built.classes}"
                rows.append({"case": name, "shape": shape, "note": note})
                print_row(rows[-1])
                continue
            ours = bench_ms(built.launch)
            reference = lambda q=q, k=k, v=v, causal=causal: F.scaled_dot_product_attention(  # noqa: E731
                q, k, v, is_causal=causal
            )
            theirs = bench_ms(reference)
            flops = 4 * batch * heads * seq * seq * dim * (0.5 if causal else 1.0)
            ratio = theirs / ours
            rows.append(
                {
                    "case": name,
                    "shape": shape,
                    "tessera_ms": ours,
                    "torch_ms": theirs,
                    "tessera": flops / ours / 1e9,
                    "torch": flops / theirs / 1e9,
                    "unit": "TFLOP/s",
                    "ratio": ratio,
                    "goal": ">= 1x SDPA" if seq >= 4096 else "(none below seq 4096)",
                    "met": ratio >= 1.0 if seq >= 4096 else None,
                    "config": built.configs(),
                    "max_rel_error": max_error(built.outputs[0], reference()),
                    "tuning": tuning_record(built),
                    "build_s": build_s,
                }
            )
            print_row(rows[-1])
            del q, k, v, built
            torch.cuda.empty_cache()
    return rows


def end_to_end_rows() -> list[dict[str, Any]]:
    """``f(x)`` wall time per call (after a first, tuning call) against its kernel time."""
    import tessera as ts
    from tessera import op

    def mm(a: Any, b: Any) -> Any:
        return a @ b

    def softmax(x: Any) -> Any:
        return op.softmax(x, axis=-1)

    cases = [
        (
            "matmul bf16",
            "4096x4096x4096",
            mm,
            [torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16) for _ in range(2)],
        ),
        (
            "softmax bf16",
            "8192x4096",
            softmax,
            [torch.randn(8192, 4096, device="cuda", dtype=torch.bfloat16)],
        ),
        (
            "softmax bf16",
            "64x256",
            softmax,
            [torch.randn(64, 256, device="cuda", dtype=torch.bfloat16)],
        ),
    ]
    rows = []
    for name, shape, fn, args in cases:
        f = ts.jit(fn)
        lowered = f.lower(*args)
        path = getattr(lowered, "kernels", "reference")
        f(*args)
        torch.cuda.synchronize()
        times = []
        for _ in range(20):
            start = time.perf_counter()
            f(*args)
            torch.cuda.synchronize()
            times.append((time.perf_counter() - start) * 1e3)
        kernel = bench_ms(build(fn, args).launch)
        rows.append(
            {
                "case": f"f(x) end to end, {name}",
                "shape": shape,
                "kernels": path,
                "call_ms": statistics.median(times),
                "kernel_ms": kernel,
                "overhead_ms": statistics.median(times) - kernel,
            }
        )
        r = rows[-1]
        print(
            f"| {r['case']} ({path} kernels) | {shape} | call {r['call_ms']:.3f} ms | kernel {kernel:.3f} ms | overhead {r['overhead_ms']:.3f} ms |"
        )
    return rows


# --- output ----------------------------------------------------------------------------------

HEADER = (
    "| case | shape | Tessera | torch | ratio | copy | goal | met | Tessera config | max rel err |\n"
    "|---|---|---:|---:|---:|---:|---|---|---|---:|"
)


def print_row(r: dict[str, Any]) -> None:
    if "note" in r:
        print(f"| {r['case']} | {r['shape']} | {r['note']} |")
        return
    copy = f"{r['copy']:.0f}" if "copy" in r else ""
    ratio = f"{r['ratio']:.2f}" + (" of copy" if "copy" in r else "")
    met = {True: "yes", False: "**no**", None: ""}[r["met"]]
    print(
        f"| {r['case']} | {r['shape']} | {r['tessera']:.1f} {r['unit']} | {r['torch']:.1f} | "
        f"{ratio} | {copy} | {r['goal']} | {met} | {r['config']} | {r['max_rel_error']:.1e} |",
        flush=True,
    )


def environment() -> dict[str, Any]:
    import triton

    return {
        "date": datetime.date.today().isoformat(),
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "python": sys.version.split()[0],
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the measurements to this file")
    parser.add_argument(
        "--only",
        default="matmul,memory,attention,e2e",
        help="comma-separated subset of matmul, memory, attention, e2e",
    )
    parser.add_argument("--quick", action="store_true", help="one shape per case (a smoke run)")
    parser.add_argument(
        "--causal-max-seq",
        type=int,
        default=2048,
        help="longest sequence for causal attention (its mask constant is slow to trace)",
    )
    parser.add_argument("--seq", type=int, nargs="*", help="attention: only these lengths")
    parser.add_argument(
        "--causal", choices=("both", "only", "none"), default="both", help="attention masks"
    )
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: nothing measured")
        return 0
    only = set(args.only.split(","))
    env = environment()
    print(", ".join(f"{k} {v}" for k, v in env.items()))
    print(HEADER)
    start = time.perf_counter()
    rows: list[dict[str, Any]] = []
    if "matmul" in only:
        shapes = [(n, n, n) for n in MATMUL_SQUARE] + list(MATMUL_LLM)
        rows += matmul_rows(shapes[2:3] if args.quick else shapes)
    if "memory" in only:
        rows += memory_rows(
            ROWS, (torch.bfloat16,) if args.quick else (torch.bfloat16, torch.float32)
        )
    if "attention" in only:
        cases = [c for c in ATTENTION if not args.seq or c[3] in args.seq]
        masks = {"both": (False, True), "only": (True,), "none": (False,)}[args.causal]
        rows += attention_rows(cases[1:2] if args.quick else cases, args.causal_max_seq, masks)
    if "e2e" in only:
        rows += end_to_end_rows()
    measured = [r for r in rows if r.get("met") is not None]
    print(
        f"goals met: {sum(r['met'] for r in measured)} of {len(measured)}; {time.perf_counter() - start:.0f} s"
    )
    if args.json:
        with open(args.json, "w") as out:
            json.dump({**env, "rows": rows}, out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
