"""Communication volume of a Megatron transformer layer, next to the analytic minimum.

For tensor parallelism over ``tp`` (q/k/v and the first MLP matmul split by columns, the
attention output projection and the second MLP matmul by rows, heads split over tp) a
layer's forward needs exactly two all-reduces of the activations ``[B/dp, T, C]`` over tp
(Shoeybi et al., Megatron-LM, 2019, section 3). The batch is split over ``dp``, which
needs no communication in the forward pass. The script prints, for each mesh, the
collectives Tessera inserted, the per-rank bytes by the ``collectives()`` convention and
as bytes received under ring all-reduce (2(n-1)/n of the operand), the analytic minimum,
and the ratio. CPU only; runs in seconds.

    python benchmarks/comm_volume.py
"""

from __future__ import annotations

import argparse
from collections import Counter

import numpy as np
import torch

import tessera as ts
from tessera import dist, op


def transformer_layer(x: torch.Tensor, p: dict[str, torch.Tensor], heads: int) -> torch.Tensor:
    """Pre-LN block: causal multi-head attention and a gelu MLP, with residuals."""
    batch, seq, dim = x.shape
    head_dim = dim // heads

    def split_heads(t: torch.Tensor) -> torch.Tensor:
        return op.transpose(op.reshape(t, (batch, seq, heads, head_dim)), (0, 2, 1, 3))

    h = op.layer_norm(x, axis=-1, weight=p["ln1_w"], bias=p["ln1_b"])
    q, k, v = (split_heads(h @ p[name]) for name in ("wq", "wk", "wv"))
    scores = (q @ op.transpose(k, (0, 1, 3, 2))) * (1.0 / head_dim**0.5)
    causal = np.tril(np.ones((seq, seq), dtype=bool))
    attention = op.softmax(op.where(causal, scores, -1e9), axis=-1) @ v
    merged = op.reshape(op.transpose(attention, (0, 2, 1, 3)), (batch, seq, dim))
    x = x + merged @ p["wo"]
    h = op.layer_norm(x, axis=-1, weight=p["ln2_w"], bias=p["ln2_b"])
    return x + op.gelu(h @ p["w1"]) @ p["w2"]


def layouts(mesh: dist.Mesh, has_dp: bool) -> tuple[dist.ShardSpec, dict[str, dist.ShardSpec | None]]:
    columns = dist.ShardSpec(partition=(1,), mesh_axes=("tp",))
    rows = dist.ShardSpec(partition=(0,), mesh_axes=("tp",))
    params = {
        "ln1_w": None, "ln1_b": None, "ln2_w": None, "ln2_b": None,
        "wq": columns, "wk": columns, "wv": columns, "wo": rows, "w1": columns, "w2": rows,
    }  # fmt: skip
    batch = dist.ShardSpec(partition=(0,), mesh_axes=("dp",)) if has_dp else dist.ShardSpec(replicate=True)
    return batch, params


def measure(dp: int, tp: int, batch: int, seq: int, dim: int, heads: int) -> dict[str, object]:
    axes, shape = (["dp", "tp"], (dp, tp)) if dp > 1 else (["tp"], (tp,))
    mesh = dist.Mesh(axes=axes, shape=shape)
    x_spec, p_specs = layouts(mesh, dp > 1)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, seq, dim, generator=g)
    params = {n: torch.randn(dim, dim, generator=g) / dim**0.5 for n in ("wq", "wk", "wv", "wo")}
    params |= {"w1": torch.randn(dim, 4 * dim, generator=g) / dim**0.5, "w2": torch.randn(4 * dim, dim, generator=g) / (4 * dim) ** 0.5}
    params |= {n: torch.ones(dim) for n in ("ln1_w", "ln2_w")} | {n: torch.zeros(dim) for n in ("ln1_b", "ln2_b")}
    layer = ts.jit(transformer_layer, static_argnums=2, mesh=mesh, in_shardings=(x_spec, p_specs, None))
    infos = layer.lower(x, params, heads).collectives()
    moved = sum(i.nbytes for i in infos)
    received = sum(2 * (i.group_size - 1) / i.group_size * i.nbytes for i in infos if i.kind == "all_reduce")
    received += sum(i.nbytes for i in infos if i.kind != "all_reduce")  # other kinds: count fully
    minimum = 2 * (batch // dp) * seq * dim * 4  # two all-reduces of [B/dp, T, C] f32
    reference = ts.jit(transformer_layer, static_argnums=2)(x, params, heads)
    error = (layer(x, params, heads) - reference).abs().max().item()
    kinds = ", ".join(f"{n}× {k}[{','.join(a)}]" for (k, a), n in Counter((i.kind, i.mesh_axes) for i in infos).items())
    return {
        "mesh": f"dp={dp} × tp={tp}", "collectives": kinds or "none", "bytes": moved,
        "received": received, "minimum": minimum, "ratio": moved / minimum, "error": error,
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=16)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--heads", type=int, default=8)
    args = parser.parse_args()
    print(f"Megatron layer forward: B={args.batch}, T={args.seq}, C={args.dim}, heads={args.heads}, f32")
    print("| mesh | collectives inserted | bytes (nbytes sum) | ring bytes received | analytic minimum | ratio | max error vs unsharded |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for dp, tp in ((1, 2), (1, 4), (1, 8), (2, 2), (2, 4)):
        r = measure(dp, tp, args.batch, args.seq, args.dim, args.heads)
        print(
            f"| {r['mesh']} | {r['collectives']} | {r['bytes']} | {r['received']:.0f} | {r['minimum']} "
            f"| {r['ratio']:.2f} | {r['error']:.1e} |"
        )


if __name__ == "__main__":
    main()
