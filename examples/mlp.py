"""A two-layer MLP traced by Tessera, checked against torch.

python examples/mlp.py
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import tessera as ts
from tessera import op

RTOL, ATOL = 1e-5, 1e-5  # f32


@ts.jit
def mlp(x, w1, b1, w2, b2):
    """``gelu(x @ w1 + b1) @ w2 + b2``."""
    return op.gelu(x @ w1 + b1) @ w2 + b2


def torch_mlp(x, w1, b1, w2, b2):
    """The same model in eager torch: the reference."""
    return F.gelu(x @ w1 + b1) @ w2 + b2


def random_inputs(
    batch: int = 8, d_in: int = 32, d_hidden: int = 128, d_out: int = 16, seed: int = 0
):
    g = torch.Generator().manual_seed(seed)
    shapes = [(batch, d_in), (d_in, d_hidden), (d_hidden,), (d_hidden, d_out), (d_out,)]
    return [torch.randn(shape, generator=g) for shape in shapes]


def main() -> None:
    args = random_inputs()
    print(mlp.lower(*args).as_text("graph"))
    out = mlp(*args)
    expected = torch_mlp(*args)
    error = (out - expected).abs().max().item()
    print(f"max abs error vs torch: {error:.3e} (rtol={RTOL}, atol={ATOL})")
    if not torch.allclose(out, expected, rtol=RTOL, atol=ATOL):
        print("MISMATCH")
        raise SystemExit(1)
    print("OK")


if __name__ == "__main__":
    main()
