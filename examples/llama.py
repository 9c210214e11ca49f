"""A Llama-style decoder (RMSNorm, rotary embeddings, grouped-query attention, SwiGLU),
written with ``tessera.op`` and, independently, with torch: the model of the feature
matrix (``benchmarks/feature_matrix.py``).

Rotary embeddings use the rotate-half convention (Llama's and ``transformers``'):
``op.rope`` computes the cos/sin tables in the program from the positions; the torch
twin computes them with torch. Under context parallelism the positions are the true
position of each stored token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tessera import dist, graph, op


@dataclass(frozen=True)
class LlamaConfig:
    vocab: int = 64
    dim: int = 32
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    ffn: int = 64
    seq: int = 8
    theta: float = 10000.0
    eps: float = 1e-6

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads


def init_params(
    config: LlamaConfig, seed: int = 0, dtype: torch.dtype = torch.float32
) -> dict[str, torch.Tensor]:
    """Random weights (normal, scaled by fan-in), norms' weights near 1."""
    g = torch.Generator().manual_seed(seed)
    c, kv = config, config.kv_heads * config.head_dim

    def randn(*shape: int) -> torch.Tensor:
        return (torch.randn(shape, generator=g, dtype=torch.float64) * shape[0] ** -0.5).to(dtype)

    def norm() -> torch.Tensor:
        return (1 + 0.1 * torch.randn(c.dim, generator=g, dtype=torch.float64)).to(dtype)

    p = {"embed": randn(c.vocab, c.dim) * c.vocab**0.5 * 0.5}
    for i in range(c.layers):
        p |= {
            f"attn_norm{i}": norm(), f"wq{i}": randn(c.dim, c.dim), f"wk{i}": randn(c.dim, kv),
            f"wv{i}": randn(c.dim, kv), f"wo{i}": randn(c.dim, c.dim), f"mlp_norm{i}": norm(),
            f"w_gate{i}": randn(c.dim, c.ffn), f"w_up{i}": randn(c.dim, c.ffn), f"w_down{i}": randn(c.ffn, c.dim),
        }  # fmt: skip
    return p | {"final_norm": norm(), "head": randn(c.dim, c.vocab)}


def megatron_layout(params: dict[str, torch.Tensor]) -> dict[str, dist.ShardSpec | None]:
    """Tensor parallelism over ``tp``: q, k, v, gate and up by columns (heads split), o
    and down by rows; norms, the embedding and the head replicated."""
    columns = dist.ShardSpec(partition=(1,), mesh_axes=("tp",))
    rows = dist.ShardSpec(partition=(0,), mesh_axes=("tp",))
    by_columns = ("wq", "wk", "wv", "w_gate", "w_up")
    return {
        k: columns if k.startswith(by_columns) else rows if k.startswith(("wo", "w_down")) else None
        for k in params
    }


def rope_tables(config: LlamaConfig, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of ``positions · θ^(-2j/d)``, ``[T, head_dim]`` (rotate-half layout)."""
    half = config.head_dim // 2
    inv_freq = config.theta ** (-torch.arange(half, dtype=torch.float64) * 2 / config.head_dim)
    angles = positions.to(torch.float64)[:, None] * inv_freq[None, :]
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def _positions(T: int, zigzag: int | None) -> torch.Tensor:
    """The true position of each stored token."""
    return torch.arange(T) if zigzag is None else torch.as_tensor(dist.zigzag_order(T, zigzag))


LAYER_PARAMS = ("attn_norm", "wq", "wk", "wv", "wo", "mlp_norm", "w_gate", "w_up", "w_down")


def layer_params(p: dict, i: int) -> dict:
    """Layer ``i``'s parameters, by their names without the index."""
    return {name: p[f"{name}{i}"] for name in LAYER_PARAMS}


@graph.checkpoint
def block(p, x, config: LlamaConfig, zigzag: int | None = None):
    """One decoder layer (its parameters ``p``: :func:`layer_params`) of ``x [B, T, C]``."""
    B, T, C = x.shape
    H, KV, D = config.heads, config.kv_heads, config.head_dim
    h = op.rms_norm(x, eps=config.eps, weight=p["attn_norm"])
    q = op.transpose(op.reshape(h @ p["wq"], (B, T, H, D)), (0, 2, 1, 3))
    k = op.transpose(op.reshape(h @ p["wk"], (B, T, KV, D)), (0, 2, 1, 3))
    v = op.transpose(op.reshape(h @ p["wv"], (B, T, KV, D)), (0, 2, 1, 3))
    positions = _positions(T, zigzag)
    q, k = (op.rope(t, positions, theta=config.theta) for t in (q, k))
    # [B, KV, T, D] -> [B, H, T, D]: each kv head shared by H / KV heads
    k, v = (op.repeat_interleave(t, H // KV, dim=1) for t in (k, v))
    attn = op.attention(q, k, v, causal=True, zigzag=zigzag)
    x = x + op.reshape(op.transpose(attn, (0, 2, 1, 3)), (B, T, C)) @ p["wo"]
    h = op.rms_norm(x, eps=config.eps, weight=p["mlp_norm"])
    return x + (op.silu(h @ p["w_gate"]) * (h @ p["w_up"])) @ p["w_down"]


def stacked_params(params: dict, config: LlamaConfig) -> dict:
    """``params`` with each layer parameter stacked over the layers on a new dim 0,
    named without the index (for ``loss(..., scan=True)``)."""
    layers = {n: torch.stack([params[f"{n}{i}"] for i in range(config.layers)]) for n in LAYER_PARAMS}
    return {k: v for k, v in params.items() if k in ("embed", "final_norm", "head")} | layers


def loss(
    p, tokens, targets, config: LlamaConfig, zigzag: int | None = None,
    sequence_parallel: dist.ShardSpec | None = None, regions: bool = False, scan: bool = False,
):  # fmt: skip
    """Mean next-token cross-entropy of ``tokens [B, T]`` (stored in zig-zag order over
    ``zigzag`` ranks when given: the rotary tables follow the true positions). With
    ``sequence_parallel`` (a layout of ``[B, T, C]`` splitting T over tp), the residual
    stream between layers is kept in that layout (Megatron's sequence parallelism). With
    ``regions``, every layer is a call of one ``graph.region``; with ``scan``, ``p`` holds
    the layers' parameters stacked (:func:`stacked_params`) and the layers are one
    ``graph.scan``."""
    layer = graph.region(block) if regions else block
    x = op.take(p["embed"], tokens, axis=0)
    if scan:  # the layers' parameters stacked (stacked_params): one graph.scan
        stack = {n: p[n] for n in LAYER_PARAMS}
        x, _ = graph.scan(lambda h, q: (block(q, h, config, zigzag), None), x, stack)
    for i in range(0 if scan else config.layers):
        if sequence_parallel is not None:
            x = dist.shard(x, sequence_parallel)
        x = layer(layer_params(p, i), x, config, zigzag)
    logits = op.rms_norm(x, eps=config.eps, weight=p["final_norm"]) @ p["head"]
    return op.cross_entropy(logits, targets)


def torch_loss(p, tokens, targets, config: LlamaConfig) -> torch.Tensor:
    """The same model, written independently with torch (``repeat_interleave`` for the
    shared kv heads, SDPA for attention)."""
    B, T = tokens.shape
    H, KV, D = config.heads, config.kv_heads, config.head_dim
    cos, sin = (t.to(p["embed"].dtype) for t in rope_tables(config, torch.arange(T)))

    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + config.eps) * w

    def rope(x):
        first, second = x.chunk(2, dim=-1)
        return x * cos + torch.cat([-second, first], dim=-1) * sin

    x = p["embed"][tokens]
    for i in range(config.layers):
        h = rms(x, p[f"attn_norm{i}"])
        q = rope((h @ p[f"wq{i}"]).view(B, T, H, D).transpose(1, 2))
        k = rope((h @ p[f"wk{i}"]).view(B, T, KV, D).transpose(1, 2))
        v = (h @ p[f"wv{i}"]).view(B, T, KV, D).transpose(1, 2)
        k, v = (t.repeat_interleave(H // KV, dim=1) for t in (k, v))
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + attn.transpose(1, 2).reshape(B, T, H * D) @ p[f"wo{i}"]
        h = rms(x, p[f"mlp_norm{i}"])
        x = x + (F.silu(h @ p[f"w_gate{i}"]) * (h @ p[f"w_up{i}"])) @ p[f"w_down{i}"]
    logits = rms(x, p["final_norm"]) @ p["head"]
    return F.cross_entropy(logits.reshape(-1, config.vocab), targets.reshape(-1))
