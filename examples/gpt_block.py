"""A GPT-style (pre-LN) transformer block traced by Tessera, checked against torch.

    python examples/gpt_block.py [--batch 2] [--seq 16] [--dim 64] [--heads 4]

The block is ``x + attn(ln1(x))`` then ``x + mlp(ln2(x))``, with causal multi-head
self-attention (``op.attention``: one flash-attention kernel). Parameters live in a dict,
which ``ts.jit`` takes as a pytree input; ``n_head`` is a Python int, so it is static
(the program is specialised on it).
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

import tessera as ts
from tessera import op

RTOL, ATOL = 1e-5, 1e-5  # f32


@ts.jit
def gpt_block(x, params, n_head):
    """One transformer block on ``x: [B, T, C]``; weights are ``[in, out]``."""
    p = params
    B, T, C = x.shape
    D = C // n_head

    def split_heads(t):  # [B, T, C] -> [B, H, T, D]
        return op.transpose(op.reshape(t, (B, T, n_head, D)), (0, 2, 1, 3))

    h = op.layer_norm(x, weight=p["ln1_w"], bias=p["ln1_b"])
    q, k, v = op.chunk(h @ p["attn_w"] + p["attn_b"], 3, axis=-1)
    q, k, v = split_heads(q), split_heads(k), split_heads(v)
    attn = op.attention(q, k, v, causal=True)  # softmax(q kᵀ / sqrt(D)) v: [B, H, T, D]
    attn = op.reshape(op.transpose(attn, (0, 2, 1, 3)), (B, T, C))
    x = x + (attn @ p["proj_w"] + p["proj_b"])

    h = op.layer_norm(x, weight=p["ln2_w"], bias=p["ln2_b"])
    return x + (op.gelu(h @ p["fc_w"] + p["fc_b"]) @ p["out_w"] + p["out_b"])


def torch_gpt_block(x, params, n_head):
    """The reference, written independently with torch.nn.functional."""
    p = params
    B, T, C = x.shape
    h = F.layer_norm(x, (C,), p["ln1_w"], p["ln1_b"])
    q, k, v = F.linear(h, p["attn_w"].T, p["attn_b"]).split(C, dim=-1)
    q, k, v = (t.view(B, T, n_head, C // n_head).transpose(1, 2) for t in (q, k, v))
    attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    x = x + F.linear(attn.transpose(1, 2).reshape(B, T, C), p["proj_w"].T, p["proj_b"])
    h = F.layer_norm(x, (C,), p["ln2_w"], p["ln2_b"])
    return x + F.linear(F.gelu(F.linear(h, p["fc_w"].T, p["fc_b"])), p["out_w"].T, p["out_b"])


def init_params(dim: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random parameters for a block of width ``dim`` (MLP width ``4 * dim``)."""
    g = torch.Generator().manual_seed(seed)

    def randn(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return scale * torch.randn(shape, generator=g)

    return {
        "ln1_w": 1 + randn(dim, scale=0.1), "ln1_b": randn(dim, scale=0.1),
        "attn_w": randn(dim, 3 * dim, scale=dim**-0.5), "attn_b": randn(3 * dim, scale=0.02),
        "proj_w": randn(dim, dim, scale=dim**-0.5), "proj_b": randn(dim, scale=0.02),
        "ln2_w": 1 + randn(dim, scale=0.1), "ln2_b": randn(dim, scale=0.1),
        "fc_w": randn(dim, 4 * dim, scale=dim**-0.5), "fc_b": randn(4 * dim, scale=0.02),
        "out_w": randn(4 * dim, dim, scale=(4 * dim) ** -0.5), "out_b": randn(dim, scale=0.02),
    }  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=16)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.dim % args.heads:
        parser.error(f"--dim ({args.dim}) must be a multiple of --heads ({args.heads})")

    params = init_params(args.dim, args.seed)
    gen = torch.Generator().manual_seed(args.seed + 1)
    x = torch.randn((args.batch, args.seq, args.dim), generator=gen)
    print(gpt_block.lower(x, params, args.heads).as_text("graph"))

    out = gpt_block(x, params, args.heads)
    expected = torch_gpt_block(x, params, args.heads)
    error = (out - expected).abs().max().item()
    print(f"max abs error vs torch: {error:.3e} (rtol={RTOL}, atol={ATOL})")
    if not torch.allclose(out, expected, rtol=RTOL, atol=ATOL):
        print("MISMATCH")
        raise SystemExit(1)
    print("OK")


if __name__ == "__main__":
    main()
