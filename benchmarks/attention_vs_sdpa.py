"""``op.attention`` forward and backward against torch SDPA: time and max error.

    python benchmarks/attention_vs_sdpa.py [--shape 4x16x2048x64 ...] [--causal both]
    python benchmarks/attention_vs_sdpa.py --tiny      # a CPU smoke run (Triton's interpreter)

For each shape (batch x heads x sequence x head dim) and mask, ``op.attention`` compiled
by ``ts.jit`` (Triton kernels: one flash kernel forward, one backward) against
``F.scaled_dot_product_attention``: the forward ``attention(q, k, v)``, and the backward
as ``ts.grad`` of ``sum(attention(q, k, v) * w)`` for q, k and v against torch's
``autograd.grad`` of the same (both include the forward). Times are medians of whole
calls, Python included (the first call compiles and autotunes and is not timed):
``triton.testing.do_bench`` on a GPU, wall time on a CPU. Errors are the largest absolute
difference relative to the largest magnitude of a float64 reference (SDPA and autograd
in float64 on the same device), for Tessera and for SDPA in the same dtype. Prints one
markdown table. (``benchmarks/kernels.py`` times the forward kernel's launch alone.)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

import tessera as ts
from tessera import op

DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


def median_ms(fn: Callable[[], Any], cuda: bool, reps: int) -> float:
    """The median time of ``fn()`` in ms (after one untimed call)."""
    fn()
    if cuda:
        from triton.testing import do_bench

        return float(do_bench(fn, warmup=5, rep=max(reps, 20), return_mode="median"))
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def relative_error(got: Sequence[torch.Tensor], want: Sequence[torch.Tensor]) -> float:
    """The largest of each pair's max |got - want| / max |want|."""
    return max(
        float((g.double() - w).abs().max() / w.abs().max().clamp_min(1e-30))
        for g, w in zip(got, want, strict=True)
    )


def loss(causal: bool) -> Callable[..., Any]:
    def attention_loss(q: Any, k: Any, v: Any, w: Any) -> Any:
        return op.sum(op.attention(q, k, v, causal=causal) * w)

    return attention_loss


def torch_grads(q, k, v, w, causal: bool) -> tuple[torch.Tensor, ...]:
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    out = F.scaled_dot_product_attention(*leaves, is_causal=causal)
    return torch.autograd.grad(out, leaves, w)


def rows(
    shape: tuple[int, int, int, int], causal: bool, dtype: torch.dtype, device: str, reps: int
) -> list[dict[str, Any]]:
    batch, heads, seq, dim = shape
    g = torch.Generator().manual_seed(0)
    q, k, v, w = (
        torch.randn(batch, heads, seq, dim, generator=g).to(device=device, dtype=dtype)
        for _ in range(4)
    )
    exact = [t.double() for t in (q, k, v, w)]
    cuda = device == "cuda"
    forward = ts.jit(lambda q, k, v: op.attention(q, k, v, causal=causal), kernels="triton")
    backward = ts.jit(ts.grad(loss(causal), argnums=(0, 1, 2)), kernels="triton")
    want_out = [F.scaled_dot_product_attention(*exact[:3], is_causal=causal)]
    want_grads = list(torch_grads(*exact, causal))
    mask = "causal" if causal else "full"
    name = str(dtype).removeprefix("torch.")
    out = []
    for what, ours, theirs, want in (
        ("forward", lambda: [forward(q, k, v)], lambda: [F.scaled_dot_product_attention(
            q, k, v, is_causal=causal)], want_out),
        ("backward", lambda: list(backward(q, k, v, w)),
         lambda: list(torch_grads(q, k, v, w, causal)), want_grads),
    ):  # fmt: skip
        tessera_ms = median_ms(ours, cuda, reps)
        sdpa_ms = median_ms(theirs, cuda, reps)
        out.append(
            {
                "case": f"{what} {mask} {name}",
                "shape": f"b{batch} h{heads} s{seq} d{dim}",
                "tessera_ms": tessera_ms,
                "sdpa_ms": sdpa_ms,
                "tessera_error": relative_error(ours(), want),
                "sdpa_error": relative_error(theirs(), want),
            }
        )
    return out


HEADER = (
    "| case | shape | Tessera ms | SDPA ms | SDPA / Tessera | Tessera max err | SDPA max err |\n"
    "|---|---|---:|---:|---:|---:|---:|"
)


def format_row(r: dict[str, Any]) -> str:
    return (
        f"| {r['case']} | {r['shape']} | {r['tessera_ms']:.3f} | {r['sdpa_ms']:.3f} | "
        f"{r['sdpa_ms'] / r['tessera_ms']:.2f}x | {r['tessera_error']:.1e} | "
        f"{r['sdpa_error']:.1e} |"
    )


def parse_shape(text: str) -> tuple[int, int, int, int]:
    parts = tuple(int(p) for p in text.lower().split("x"))
    if len(parts) != 4:
        raise argparse.ArgumentTypeError(f"expected batch x heads x seq x dim, found {text!r}")
    return parts  # type: ignore[return-value]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", type=parse_shape, nargs="+", default=None)
    parser.add_argument("--causal", choices=("both", "only", "none"), default="both")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default=None)
    parser.add_argument("--reps", type=int, default=20, help="timed calls on a CPU")
    parser.add_argument(
        "--tiny", action="store_true", help="one tiny f32 shape on the CPU (a smoke run)"
    )
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available() and not args.tiny
    device = "cuda" if cuda else "cpu"
    shapes = args.shape or ([(1, 2, 32, 16)] if not cuda else [(4, 16, 2048, 64)])
    dtype = DTYPES[args.dtype or ("bf16" if cuda else "f32")]
    masks = {"both": (False, True), "only": (True,), "none": (False,)}[args.causal]
    reps = 3 if args.tiny else args.reps
    where = torch.cuda.get_device_name() if cuda else "CPU (Triton's interpreter)"
    print(f"attention vs torch SDPA on {where}, torch {torch.__version__}")
    print(HEADER)
    for shape in shapes:
        for causal in masks:
            for row in rows(shape, causal, dtype, device, reps):
                print(format_row(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
