"""A Tessera layer for ``tessera plan``: the parallel attention + MLP block of GPT-J and
PaLM (one layer norm, attention and MLP both read it, their outputs summed into the
residual), over the planner's weights (``wq wk wv wo w1 w2 w3 ln1``; ``ln2`` unused).

    tessera plan recommend --model base=llama3-8b,layer=examples/plan_parallel_block.py:parallel_block --gpus 8 --tp 8
"""

from __future__ import annotations

from typing import Any

from tessera import dist, op


def parallel_block(
    x: Any, p: dict[str, Any], heads: int, kv_heads: int, mlp: str, residual: Any = None
) -> Any:
    batch, seq, _ = x.shape
    head_dim = p["wq"].shape[1] // heads

    def split_heads(t: Any, count: int) -> Any:
        return op.transpose(op.reshape(t, (batch, seq, count, head_dim)), (0, 2, 1, 3))

    h = op.layer_norm(x, weight=p["ln1"])
    q = split_heads(h @ p["wq"], heads)
    k = split_heads(h @ p["wk"], kv_heads)
    v = split_heads(h @ p["wv"], kv_heads)
    attention = op.attention(q, k, v, causal=True)
    merged = op.reshape(op.transpose(attention, (0, 2, 1, 3)), (batch, seq, heads * head_dim))
    up = h @ p["w1"]
    inner = op.silu(up) * (h @ p["w3"]) if mlp == "swiglu" else op.gelu(up)
    out = x + merged @ p["wo"] + inner @ p["w2"]
    return dist.shard(out, residual) if residual is not None else out
