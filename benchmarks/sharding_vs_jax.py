"""Bytes moved by Tessera's sharding passes next to JAX/GSPMD for the same programs.

Tessera claims it never moves more bytes than GSPMD. For each program below the script
builds the same computation twice, once with ``tessera.op`` and once with ``jax.numpy``,
with the same global shapes, the same input shardings and the same output sharding on a
``dp × tp = 2 × 4`` mesh (JAX: 8 simulated CPU devices), and compares:

- Tessera: the collectives of the scheduled program (``schedule.start`` ops: after
  shard-propagate, insert-collectives, shard-partition and ``bucket-gradients``, which
  fuses independent all-reduces of one kind over the same axes, as XLA's all-reduce
  combiner does on the JAX side);
- JAX: the collectives of the optimized HLO (``jax.jit(...).lower(...).compile().as_text()``:
  all-reduce, all-gather, reduce-scatter, all-to-all, collective-permute), with their
  result shapes and replica groups.

Context-parallel attention rows run on a ``cp = 8`` mesh, with Tessera's
``schedule.options(context_parallel=...)`` forced to the all-gather or the ring; GSPMD
gathers k and v for the same program (a ring's analytic reference, which JAX cannot
express, is in ``benchmarks/RESULTS.md``).

Bytes follow Tessera's ``CollectiveInfo.nbytes`` convention ("operand bytes", per device:
the local operand of all_reduce / all_to_all / collective_permute, the gathered result of
all_gather, the unscattered input of reduce_scatter; it counts an all-reduce's operand
once though a ring all-reduce moves it twice) and, separately, the bytes a device
*receives* ("received", what the links carry) under ring algorithms: all_reduce 2(n-1)/n·S, all_gather (n-1)/n·S_result, reduce_scatter
(n-1)/n·S_input, all_to_all (n-1)/n·S, collective_permute and broadcast S. Each column is
the busiest device's sum over the program's collectives (every device takes part in every
all_* collective; a collective_permute counts on its target devices only). Both programs
also run on random data and must agree (rtol, atol 1e-4), so the comparison is between
the same computations. Every input is given an explicit sharding (replicated ones too),
and every output the same explicit sharding in both, so neither side can leave a result
in a cheaper layout than the other.

The time columns are modelled per device on the machine the mesh compiles for (one DGX
H100 node: NVLink, NVLS): every collective with ``tessera.perf.collective_cost``'s
alpha-beta model and its fastest algorithm (``collective_time``: the model the sharding
passes decide by), exposed (no overlap), plus the matmul work per device at the
roofline's compute rate (f32 on TF32 tensor cores at the device's matmul efficiency;
matmuls and dots, and attention's products: 2 forward, 4 more backward). "note" flags
a row where Tessera receives more bytes than JAX: "faster by the model" where its time
is still lower (the pick is by time), else "MORE BYTES AND SLOWER".

JAX is not a Tessera dependency: ``pip install jax`` (the CPU build) first. CPU only;
runs in about 10 seconds.

    python benchmarks/sharding_vs_jax.py [--verbose] [--only NAME]
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()

import argparse
import datetime
import functools
import math
import platform
import re
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

import tessera as ts
from tessera import dist, op, schedule
from tessera.backends.collective_info import collectives
from tessera.ir import graph
from tessera.ir.abstract import aval
from tessera.ir.mesh import default_machine
from tessera.perf.collective_cost import collective_time
from tessera.topology import Topology

try:
    import jax
    import jax.numpy as jnp
    import jaxlib
    from jax.sharding import Mesh, NamedSharding, PartitionSpec
except ImportError:  # pragma: no cover - depends on the environment
    jax = None

MESH_AXES, MESH_SHAPE = ("dp", "tp"), (2, 4)
EPS = 1e-5
Spec = tuple[str | tuple[str, ...] | None, ...]  # a PartitionSpec as a tuple; () is replicated


# --- the programs, written once against a numpy-like namespace -------------------------


def _jax_layer_norm(x: Any, weight: Any = None, bias: Any = None) -> Any:
    mean = jnp.mean(x, axis=-1, keepdims=True)
    centered = x - mean
    y = centered * jax.lax.rsqrt(jnp.mean(centered * centered, axis=-1, keepdims=True) + EPS)
    if weight is not None:
        y = y * weight
    return y + bias if bias is not None else y


def _namespaces() -> tuple[SimpleNamespace, SimpleNamespace]:
    tessera_ns = SimpleNamespace(
        gelu=op.gelu,
        softmax=lambda x, axis=-1: op.softmax(x, axis=axis),
        layer_norm=lambda x, weight=None, bias=None: op.layer_norm(
            x, axis=-1, eps=EPS, weight=weight, bias=bias
        ),
        sum=lambda x, axis=None: op.sum(x, axis=axis),
        reshape=op.reshape,
        transpose=op.transpose,
        where=op.where,
        chunk=lambda x, n, axis: op.chunk(x, n, axis=axis),
        concat=lambda xs, axis: op.concat(xs, axis=axis),
        silu=op.silu,
        tanh=op.tanh,
    )
    jax_ns = SimpleNamespace(
        gelu=functools.partial(jax.nn.gelu, approximate=False),
        softmax=lambda x, axis=-1: jax.nn.softmax(x, axis=axis),
        layer_norm=_jax_layer_norm,
        sum=lambda x, axis=None: jnp.sum(x, axis=axis),
        reshape=jnp.reshape,
        transpose=jnp.transpose,
        where=jnp.where,
        chunk=lambda x, n, axis: jnp.split(x, n, axis=axis),
        concat=lambda xs, axis: jnp.concatenate(xs, axis=axis),
        silu=jax.nn.silu,
        tanh=jnp.tanh,
    )
    _add_vocab_parallel_ops(tessera_ns, jax_ns)
    _add_attention_ops(tessera_ns, jax_ns)
    return tessera_ns, jax_ns


def megatron_mlp(m: SimpleNamespace, x: Any, w1: Any, w2: Any) -> Any:
    return m.gelu(x @ w1) @ w2


def _attention(m: SimpleNamespace, x: Any, wq: Any, wk: Any, wv: Any, wo: Any, heads: int) -> Any:
    """Causal multi-head self-attention on ``x: [B, T, C]``; ``wq`` may be the fused
    ``[C, 3C]`` q/k/v projection (then ``wk`` and ``wv`` are None)."""
    batch, seq, dim = x.shape
    head_dim = dim // heads

    def split_heads(t: Any) -> Any:  # [B, T, C] -> [B, H, T, D]
        return m.transpose(m.reshape(t, (batch, seq, heads, head_dim)), (0, 2, 1, 3))

    if wk is None:
        q, k, v = (split_heads(t) for t in m.chunk(x @ wq, 3, axis=-1))
    else:
        q, k, v = split_heads(x @ wq), split_heads(x @ wk), split_heads(x @ wv)
    scores = (q @ m.transpose(k, (0, 1, 3, 2))) * (1.0 / math.sqrt(head_dim))
    causal = np.tril(np.ones((seq, seq), dtype=bool))  # a constant in both
    attended = m.softmax(m.where(causal, scores, -1e9), axis=-1) @ v  # [B, H, T, D]
    return m.reshape(m.transpose(attended, (0, 2, 1, 3)), (batch, seq, dim)) @ wo


def attention(m: SimpleNamespace, x: Any, wq: Any, wk: Any, wv: Any, wo: Any) -> Any:
    return _attention(m, x, wq, wk, wv, wo, heads=8)


def attention_fused_qkv(m: SimpleNamespace, x: Any, wqkv: Any, wo: Any) -> Any:
    return _attention(m, x, wqkv, None, None, wo, heads=8)


def transformer_layer(
    m: SimpleNamespace, x: Any, ln1_w: Any, ln1_b: Any, wq: Any, wk: Any, wv: Any, wo: Any,
    ln2_w: Any, ln2_b: Any, w1: Any, w2: Any,
) -> Any:  # fmt: skip
    x = x + _attention(m, m.layer_norm(x, ln1_w, ln1_b), wq, wk, wv, wo, heads=8)
    return x + m.gelu(m.layer_norm(x, ln2_w, ln2_b) @ w1) @ w2


def gqa_attention(m: SimpleNamespace, x: Any, wq: Any, wk: Any, wv: Any, wo: Any) -> Any:
    """Causal grouped-query attention: ``GQA_HEADS`` query heads share ``GQA_KV`` k/v heads
    (each k/v head repeated for its group by a concat)."""
    batch, seq, _ = x.shape
    head_dim, groups = wk.shape[1] // GQA_KV, GQA_HEADS // GQA_KV

    def heads(t: Any, n: int) -> Any:  # [B, T, n·D] -> [B, n, T, D]
        return m.transpose(m.reshape(t, (batch, seq, n, head_dim)), (0, 2, 1, 3))

    def repeat(t: Any) -> Any:  # [B, G, T, D] -> [B, H, T, D], head h on k/v head h // groups
        t = m.reshape(t, (batch, GQA_KV, 1, seq, head_dim))
        return m.reshape(m.concat([t] * groups, axis=2), (batch, GQA_HEADS, seq, head_dim))

    q = heads(x @ wq, GQA_HEADS)
    k, v = repeat(heads(x @ wk, GQA_KV)), repeat(heads(x @ wv, GQA_KV))
    scores = (q @ m.transpose(k, (0, 1, 3, 2))) * (1.0 / math.sqrt(head_dim))
    causal = np.tril(np.ones((seq, seq), dtype=bool))
    attended = m.softmax(m.where(causal, scores, -1e9), axis=-1) @ v
    return m.reshape(m.transpose(attended, (0, 2, 1, 3)), (batch, seq, GQA_HEADS * head_dim)) @ wo


def sum_last(m: SimpleNamespace, x: Any) -> Any:
    return m.sum(x, axis=-1)


def sum_all(m: SimpleNamespace, x: Any) -> Any:
    return m.sum(x)


def softmax_last(m: SimpleNamespace, x: Any) -> Any:
    return m.softmax(x, axis=-1)


def layer_norm_last(m: SimpleNamespace, x: Any, w: Any, b: Any) -> Any:
    return m.layer_norm(x, w, b)


def add(m: SimpleNamespace, a: Any, b: Any) -> Any:
    return a + b


def matmul(m: SimpleNamespace, a: Any, b: Any) -> Any:
    return a @ b


def split_heads(m: SimpleNamespace, x: Any) -> Any:
    batch, seq, dim = x.shape
    return m.transpose(m.reshape(x, (batch, seq, 8, dim // 8)), (0, 2, 1, 3))


def transpose_flatten(m: SimpleNamespace, x: Any) -> Any:
    return m.reshape(m.transpose(x, (1, 0)), (x.shape[0] * x.shape[1],))


def linear_gelu(m: SimpleNamespace, x: Any, w: Any) -> Any:
    return m.gelu(x @ w)


# --- blocks along a sharded dim (issue 19: collective permutes) ----------------------------


def chunk2_product(m: SimpleNamespace, x: Any) -> Any:
    a, b = m.chunk(x, 2, axis=-1)
    return a * b


def chunk3_combine(m: SimpleNamespace, x: Any) -> Any:
    a, b, c = m.chunk(x, 3, axis=-1)
    return a * b + c


def concat_branches(m: SimpleNamespace, x: Any, a: Any, b: Any) -> Any:
    return m.tanh(m.concat([x @ a, x @ b], axis=-1))


def gelu_matmul(m: SimpleNamespace, a: Any, b: Any) -> Any:
    return m.gelu(a @ b)


def tanh_gelu_matmul(m: SimpleNamespace, a: Any, b: Any) -> Any:
    return m.tanh(m.gelu(a @ b))


def swiglu_mlp(m: SimpleNamespace, x: Any, w_gate_up: Any, w_down: Any) -> Any:
    gate, up = m.chunk(x @ w_gate_up, 2, axis=-1)
    return (m.silu(gate) * up) @ w_down


# --- the table --------------------------------------------------------------------------


@dataclass(frozen=True)
class Program:
    name: str
    fn: Callable[..., Any]
    inputs: tuple[tuple[tuple[int, ...], Spec], ...]  # (global shape, sharding) per argument
    out: Spec
    ids: tuple[tuple[int, int], ...] = ()  # (argument, vocabulary): int32 ids in [0, vocabulary)
    mesh: tuple[tuple[str, ...], tuple[int, ...]] = (MESH_AXES, MESH_SHAPE)  # axes, sizes
    context_parallel: str = "auto"  # Tessera's schedule.options(context_parallel=...)


B, T, C, F = 8, 16, 128, 512  # batch, sequence, hidden, MLP width: f32, small enough for CPU
_X_DP = ((B, T, C), ("dp", None, None))
_ATTN_W = (((C, C), (None, "tp")),) * 3 + (((C, C), ("tp", None)),)
_NORM_W = ((C,), ())

PROGRAMS = [
    Program(
        "megatron_mlp",
        megatron_mlp,
        (((64, C), ("dp", None)), ((C, F), (None, "tp")), ((F, C), ("tp", None))),
        ("dp", None),
    ),
    Program("attention (heads over tp)", attention, (_X_DP, *_ATTN_W), ("dp", None, None)),
    Program(
        "attention, fused qkv + chunk",
        attention_fused_qkv,
        (_X_DP, ((C, 3 * C), (None, "tp")), ((C, C), ("tp", None))),
        ("dp", None, None),
    ),
    Program(
        "transformer_layer",
        transformer_layer,
        (
            _X_DP,
            _NORM_W,
            _NORM_W,
            *_ATTN_W,
            _NORM_W,
            _NORM_W,
            ((C, F), (None, "tp")),
            ((F, C), ("tp", None)),
        ),
        ("dp", None, None),
    ),
    Program("sum over sharded dim", sum_last, (((64, 256), (None, "tp")),), ()),
    Program("softmax over sharded dim", softmax_last, (((64, 256), (None, "tp")),), (None, "tp")),
    Program(
        "layer_norm over sharded dim",
        layer_norm_last,
        (((64, 256), (None, "tp")), ((256,), ("tp",)), ((256,), ("tp",))),
        (None, "tp"),
    ),
    Program(
        "add rows(tp) + cols(tp) -> rows",
        add,
        (((64, 256), ("tp", None)), ((64, 256), (None, "tp"))),
        ("tp", None),
    ),
    Program(
        "add rows(dp) + cols(tp) -> (dp,tp)",
        add,
        (((64, 256), ("dp", None)), ((64, 256), (None, "tp"))),
        ("dp", "tp"),
    ),
    Program(
        "matmul k split -> replicated",
        matmul,
        (((64, 256), (None, "tp")), ((256, C), ("tp", None))),
        (),
    ),
    Program(
        "matmul k split -> rows(tp)",
        matmul,
        (((64, 256), (None, "tp")), ((256, C), ("tp", None))),
        ("tp", None),
    ),
    Program(
        "reshape+transpose (split heads)",
        split_heads,
        (((B, T, C), (None, None, "tp")),),
        (None, "tp", None, None),
    ),
    Program(
        "transpose+flatten of sharded dim", transpose_flatten, (((64, C), ("tp", None)),), ("tp",)
    ),
    Program(
        "2-D: x(dp,tp) @ w(tp,-)",
        matmul,
        (((64, 256), ("dp", "tp")), ((256, C), ("tp", None))),
        ("dp", None),
    ),
    Program(
        "2-D: FSDP x TP gelu(x @ w)",
        linear_gelu,
        (((64, C), ("dp", None)), ((C, F), ("dp", "tp"))),
        ("dp", "tp"),
    ),
    Program("2-D: sum over both axes", sum_all, (((64, 256), ("dp", "tp")),), ()),
]

# small problems on dp × tp = 2 × 2, where a collective's latency outweighs its bytes
# (issue 32): the pick is by modelled time, not by bytes
GQA_HEADS, GQA_KV = 8, 2
_DP_TP_2x2 = (("dp", "tp"), (2, 2))
PROGRAMS += [
    Program(
        "Llama MLP (SwiGLU), batch 8, dp2×tp2",
        swiglu_mlp,
        (((8, C), ("dp", None)), ((C, 2 * F), (None, "tp")), ((F, C), ("tp", None))),
        ("dp", None),
        mesh=_DP_TP_2x2,
    ),
    Program(
        "Llama MLP (SwiGLU), batch 8 x 16, dp2×tp2",
        swiglu_mlp,
        (((B * T, C), ("dp", None)), ((C, 2 * F), (None, "tp")), ((F, C), ("tp", None))),
        ("dp", None),
        mesh=_DP_TP_2x2,
    ),
    Program(
        "GQA attention (8 q / 2 kv heads), dp2×tp2",
        gqa_attention,
        (
            _X_DP,
            ((C, C), (None, "tp")),
            ((C, C // 4), (None, "tp")),
            ((C, C // 4), (None, "tp")),
            ((C, C), ("tp", None)),
        ),
        ("dp", None, None),
        mesh=_DP_TP_2x2,
    ),
]

# blocks along a sharded dim (issue 19: collective permutes)
PROGRAMS += [
    Program(
        "chunk(2) along sharded dim", chunk2_product, (((64, 256), (None, "tp")),), (None, "tp")
    ),
    Program(
        "chunk(3) along sharded dim", chunk3_combine, (((64, 384), (None, "tp")),), (None, "tp")
    ),
    Program(
        "concat along sharded dim",
        concat_branches,
        (((64, C), ("dp", None)), ((C, 128), (None, "tp")), ((C, 256), (None, "tp"))),
        ("dp", "tp"),
    ),
    Program(
        "SwiGLU MLP, fused gate/up + chunk",
        swiglu_mlp,
        (((64, C), ("dp", None)), ((C, 2 * F), (None, "tp")), ((F, C), ("tp", None))),
        ("dp", None),
    ),
    Program(
        "3-D: SwiGLU, gate/up over (tp,sp)",
        swiglu_mlp,
        (
            ((64, C), ("dp", None)),
            ((C, 2 * F), (None, ("tp", "sp"))),
            ((F, C), (("tp", "sp"), None)),
        ),
        ("dp", None),
        mesh=(("dp", "tp", "sp"), (2, 2, 2)),
    ),
    # a partial sum reduce-scattered straight into the layout its (elementwise) users want
    Program(
        "gelu(matmul k split) -> rows(tp)",
        gelu_matmul,
        (((64, 256), (None, "tp")), ((256, C), ("tp", None))),
        ("tp", None),
    ),
    Program(
        "tanh(gelu(matmul k split)) -> cols(tp)",
        tanh_gelu_matmul,
        (((64, 256), (None, "tp")), ((256, C), ("tp", None))),
        (None, "tp"),
    ),
]


# --- vocab-parallel programs (issue 19, item 2): embedding, cross-entropy, logsumexp -------
# Tables and logits split over tp on the vocabulary; ids and labels are int32 in [0, V).


def _jax_cross_entropy(logits: Any, labels: Any) -> Any:
    picked = jnp.take_along_axis(logits, labels[:, None], axis=-1)[:, 0]
    return jnp.mean(jax.nn.logsumexp(logits, axis=-1) - picked)


def _add_vocab_parallel_ops(tessera_ns: SimpleNamespace, jax_ns: SimpleNamespace) -> None:
    tessera_ns.embedding = lambda table, ids: op.embedding(ids, table)
    tessera_ns.cross_entropy = op.cross_entropy
    tessera_ns.logsumexp = lambda x, axis: op.logsumexp(x, axis=axis)
    tessera_ns.grad = ts.grad
    jax_ns.embedding = lambda table, ids: jnp.take(table, ids, axis=0)
    jax_ns.cross_entropy = _jax_cross_entropy
    jax_ns.logsumexp = lambda x, axis: jax.nn.logsumexp(x, axis=axis)
    jax_ns.grad = jax.grad


def embedding(m: SimpleNamespace, table: Any, ids: Any) -> Any:
    return m.embedding(table, ids)


def embedding_grad(m: SimpleNamespace, table: Any, ids: Any) -> Any:
    def loss(t: Any) -> Any:
        rows = m.embedding(t, ids)
        return m.sum(rows * rows)

    return m.grad(loss)(table)


def cross_entropy(m: SimpleNamespace, logits: Any, labels: Any) -> Any:
    return m.cross_entropy(logits, labels)


def cross_entropy_grad(m: SimpleNamespace, logits: Any, labels: Any) -> Any:
    return m.grad(lambda x: m.cross_entropy(x, labels))(logits)


def logsumexp_last(m: SimpleNamespace, x: Any) -> Any:
    return m.logsumexp(x, axis=-1)


def logsumexp_grad(m: SimpleNamespace, x: Any) -> Any:
    return m.grad(lambda v: m.sum(m.logsumexp(v, axis=-1)))(x)


def gpt_head(m: SimpleNamespace, wte: Any, ids: Any, labels: Any, w_out: Any = None) -> Any:
    """Embedding, a layer norm, the output projection (tied to the embedding unless
    ``w_out`` is given) and the mean cross-entropy."""
    x = m.layer_norm(m.embedding(wte, ids))
    logits = x @ (m.transpose(wte, (1, 0)) if w_out is None else w_out)
    return m.cross_entropy(logits, labels)


def gpt_head_untied(m: SimpleNamespace, wte: Any, ids: Any, labels: Any, w_out: Any) -> Any:
    return gpt_head(m, wte, ids, labels, w_out)


def gpt_head_grad(m: SimpleNamespace, wte: Any, ids: Any, labels: Any) -> Any:
    return m.grad(lambda w: gpt_head(m, w, ids, labels))(wte)


def gpt_head_untied_grad(m: SimpleNamespace, wte: Any, ids: Any, labels: Any, w_out: Any) -> Any:
    return m.grad(lambda w: gpt_head(m, wte, ids, labels, w))(w_out)


VOCAB, TOKENS = 1024, 64
_TABLE = ((VOCAB, C), ("tp", None))
_IDS = ((TOKENS,), ("dp",))
_LOGITS = ((TOKENS, VOCAB), ("dp", "tp"))
_HEAD = ((C, VOCAB), (None, "tp"))  # an untied output projection, split on the vocabulary

PROGRAMS += [
    Program("vocab-parallel embedding", embedding, (_TABLE, _IDS), ("dp", None), ids=((1, VOCAB),)),
    Program(
        "vocab-parallel embedding, grad",
        embedding_grad,
        (_TABLE, _IDS),
        ("tp", None),
        ids=((1, VOCAB),),
    ),
    Program("vocab-parallel cross-entropy", cross_entropy, (_LOGITS, _IDS), (), ids=((1, VOCAB),)),
    Program(
        "vocab-parallel cross-entropy, grad",
        cross_entropy_grad,
        (_LOGITS, _IDS),
        ("dp", "tp"),
        ids=((1, VOCAB),),
    ),
    Program("logsumexp over sharded dim", logsumexp_last, (_LOGITS,), ("dp",)),
    Program("logsumexp over sharded dim, grad", logsumexp_grad, (_LOGITS,), ("dp", "tp")),
    Program(
        "GPT head, tied (dp x tp)", gpt_head, (_TABLE, _IDS, _IDS), (), ids=((1, VOCAB), (2, VOCAB))
    ),
    Program(
        "GPT head, tied (dp x tp), grad",
        gpt_head_grad,
        (_TABLE, _IDS, _IDS),
        ("tp", None),
        ids=((1, VOCAB), (2, VOCAB)),
    ),
    Program(
        "GPT head, untied (dp x tp)",
        gpt_head_untied,
        (_TABLE, _IDS, _IDS, _HEAD),
        (),
        ids=((1, VOCAB), (2, VOCAB)),
    ),
    Program(
        "GPT head, untied (dp x tp), grad of the head",
        gpt_head_untied_grad,
        (_TABLE, _IDS, _IDS, _HEAD),
        (None, "tp"),
        ids=((1, VOCAB), (2, VOCAB)),
    ),
]


# --- context-parallel attention (issue 19, item 3): the sequence split over cp ----------
# q, k, v [B, H, T, D] split over cp = 8 on T. JAX/GSPMD all-gathers k and v for the
# query rows each device holds (and reduce-scatters dk, dv in the backward): all-gather
# CP. Tessera runs the same program as ring attention or as the all-gather
# (``schedule.options(context_parallel=...)``). GSPMD has no ring for this program; the
# ring rows' analytic reference (a shard_map ring with ppermute: (cp-1)/cp of k and v
# forward, 3(cp-1)/cp for a grad step) is stated in benchmarks/RESULTS.md.


def _jax_attention(q: Any, k: Any, v: Any, causal: bool = False, zigzag: int = 0) -> Any:
    """``zigzag``: the sequence stored in zig-zag order over that many ranks; the mask
    compares true positions (``dist.zigzag_order``), a constant to GSPMD."""
    scores = jnp.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(q.shape[-1])
    if causal:
        rows = scores.shape[-2]  # Tq = Tk here
        true = dist.zigzag_order(rows, zigzag) if zigzag else np.arange(rows)
        visible = true[:, None] >= true[None, :]
        scores = jnp.where(jnp.asarray(visible), scores, -jnp.inf)
    return jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(scores, axis=-1), v)


def _add_attention_ops(tessera_ns: SimpleNamespace, jax_ns: SimpleNamespace) -> None:
    def tessera_attention(q: Any, k: Any, v: Any, causal: bool = False, zigzag: int = 0) -> Any:
        return op.attention(q, k, v, causal=causal, zigzag=zigzag or None)

    tessera_ns.attention = tessera_attention
    jax_ns.attention = _jax_attention


def cp_attention(m: SimpleNamespace, q: Any, k: Any, v: Any) -> Any:
    return m.attention(q, k, v)


def cp_attention_causal(m: SimpleNamespace, q: Any, k: Any, v: Any) -> Any:
    return m.attention(q, k, v, causal=True)


def cp_attention_zigzag(m: SimpleNamespace, q: Any, k: Any, v: Any) -> Any:
    """Causal, the sequence stored in zig-zag order over cp by the data loader."""
    return m.attention(q, k, v, causal=True, zigzag=CP)


def _cp_grad(m: SimpleNamespace, q: Any, k: Any, v: Any, causal: bool, zigzag: int = 0) -> Any:
    """dq + dk + dv of sum(attention²): every gradient, in the sequence layout."""

    def loss(a: Any, b: Any, c: Any) -> Any:
        out = m.attention(a, b, c, causal=causal, zigzag=zigzag)
        return m.sum(out * out)

    dq, dk, dv = m.grad(loss, argnums=(0, 1, 2))(q, k, v)
    return dq + dk + dv


def cp_attention_grad(m: SimpleNamespace, q: Any, k: Any, v: Any) -> Any:
    return _cp_grad(m, q, k, v, causal=False)


def cp_attention_causal_grad(m: SimpleNamespace, q: Any, k: Any, v: Any) -> Any:
    return _cp_grad(m, q, k, v, causal=True)


def cp_attention_zigzag_grad(m: SimpleNamespace, q: Any, k: Any, v: Any) -> Any:
    return _cp_grad(m, q, k, v, causal=True, zigzag=CP)


CP = 8
_CP_MESH = (("cp",), (CP,))
_CP_QKV = (((1, 2, 8 * CP, 16), (None, None, "cp", None)),) * 3
_CP_OUT = (None, None, "cp", None)
_CP_PROGRAMS = [
    ("CP attention", cp_attention),
    ("CP attention, causal", cp_attention_causal),
    ("CP attention, causal zig-zag", cp_attention_zigzag),
    ("CP attention, grad", cp_attention_grad),
    ("CP attention, causal, grad", cp_attention_causal_grad),
    ("CP attention, causal zig-zag, grad", cp_attention_zigzag_grad),
]
# A causal ring over a sequence in natural order must first move q, k, v into the
# zig-zag split (and the results back): data loaders store the sequence zig-zag instead
# (the "zig-zag" programs), so the causal natural-order programs run all-gather CP only.
_RING_PROGRAMS = [(n, fn) for n, fn in _CP_PROGRAMS if "causal" not in n or "zig-zag" in n]
PROGRAMS += [
    Program(
        f"{name}, {method} (cp={CP})", fn, _CP_QKV, _CP_OUT, mesh=_CP_MESH, context_parallel=method
    )
    for method in ("all_gather", "ring")
    for name, fn in (_CP_PROGRAMS if method == "all_gather" else _RING_PROGRAMS)
]


# --- bytes ------------------------------------------------------------------------------

_ITEMSIZE = {
    "f64": 8,
    "f32": 4,
    "bf16": 2,
    "f16": 2,
    "s64": 8,
    "s32": 4,
    "u32": 4,
    "s8": 1,
    "u8": 1,
    "pred": 1,
}


@dataclass(frozen=True)
class Collective:
    kind: str  # all_reduce, all_gather, reduce_scatter, all_to_all, collective_permute, broadcast
    group_size: int
    nbytes: int  # Tessera's CollectiveInfo.nbytes convention
    receivers: frozenset[int] | None = None  # collective_permute: the target devices; None: all

    @property
    def ring_bytes(self) -> float:
        """Bytes each device receives under ring algorithms."""
        n, s = self.group_size, self.nbytes
        if self.kind == "all_reduce":
            return 2 * (n - 1) / n * s
        if self.kind in ("all_gather", "reduce_scatter", "all_to_all"):
            return (n - 1) / n * s
        return float(s)  # collective_permute, broadcast: one buffer in


def per_device(collectives: Sequence[Collective], num_devices: int, ring: bool = False) -> float:
    """The busiest device's total: every device takes part in every collective except a
    collective_permute, which only its targets receive."""
    totals = [0.0] * num_devices
    for c in collectives:
        for device in range(num_devices):
            if c.receivers is None or device in c.receivers:
                totals[device] += c.ring_bytes if ring else c.nbytes
    return max(totals)


def comm_time(collectives: Sequence[Collective], machine: Topology) -> float:
    """Seconds of the collectives on ``machine``, one after another, each with its
    fastest algorithm (a group of ``group_size`` ranks on consecutive devices: on one
    node every group takes the same link)."""
    total = 0.0
    for c in collectives:
        kind = "collective_permute" if c.kind == "broadcast" else c.kind
        ranks = list(range(c.group_size))
        total += collective_time(machine, kind, c.nbytes, ranks).time_s
    return total


def compute_time(flops: float, machine: Topology) -> float:
    """Seconds of ``flops`` of f32 matmuls at the device's TF32 rate and efficiency."""
    device = machine.device
    return flops / (device.matmul_flops["f32"] * device.matmul_efficiency)


def tessera_flops(lowered: ts.Lowered) -> float:
    """Matmul FLOPs per device of the partitioned program (local shapes), attention's
    products included (2 forward, 4 backward)."""
    flops = 0.0
    for op_ in lowered.module_at("partitioned").walk():
        if isinstance(op_, graph.MatmulOp):
            result = aval(op_.results[0]).shape
            flops += 2 * math.prod(result) * aval(op_.operands[0]).shape[-1]
        elif isinstance(op_, (graph.AttentionOp, graph.AttentionBackwardOp)):
            q, k = aval(op_.operands[0]).shape, aval(op_.operands[1]).shape
            products = 2 if isinstance(op_, graph.AttentionOp) else 4
            flops += products * 2 * math.prod(q) * k[-2]
    return flops


_HLO_DEFINITION = re.compile(r"%(?P<name>[\w.\-]+)\s*=\s*(?P<type>[a-z]+\d*\[[\d,]*\])")
_HLO_DOT = re.compile(
    r"=\s*(?P<result>[a-z]+\d*\[[\d,]*\])\S*\s+dot\(%(?P<lhs>[\w.\-]+)"
    r".*?lhs_contracting_dims=\{(?P<dims>[\d,]*)\}"
)


def _dims(type_text: str) -> list[int]:
    ((_, dims),) = _HLO_ARRAY.findall(type_text)
    return [int(d) for d in dims.split(",") if d]


def hlo_flops(hlo_text: str) -> float:
    """Dot FLOPs per device of optimized HLO (fusions' bodies included, each once)."""
    types = {m.group("name"): m.group("type") for m in _HLO_DEFINITION.finditer(hlo_text)}
    flops = 0.0
    for match in _HLO_DOT.finditer(hlo_text):
        lhs = _dims(types[match.group("lhs")])
        contracted = math.prod(lhs[int(d)] for d in match.group("dims").split(",") if d)
        flops += 2 * math.prod(_dims(match.group("result"))) * contracted
    return flops


def tessera_collectives(lowered: ts.Lowered, mesh: dist.Mesh) -> list[Collective]:
    """Tessera's collectives; a collective_permute received by the devices at its
    targets (of another device's data) in every group over its axes."""
    found = []
    for c in collectives(lowered.module_at("schedule")):  # what runs: after bucketing
        receivers = None
        if c.receivers is not None:
            groups = mesh.groups(c.mesh_axes)
            receivers = frozenset(group[p] for group in groups for p in c.receivers)
        found.append(Collective(c.kind, c.group_size, c.nbytes, receivers))
    return found


_HLO_COLLECTIVE = re.compile(
    r"=\s*(?P<type>\(.*?\)|\S+)\s+(?P<op>all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)"
    r"(?P<async>-start|-done)?\("
)
_HLO_ARRAY = re.compile(r"\b([a-z]+\d*)\[([\d,]*)\]")


def _hlo_nbytes(type_text: str) -> int:
    """Bytes of an HLO type: an array ``f32[16,128]{1,0}`` or a tuple of them."""
    total = 0
    for dtype, dims in _HLO_ARRAY.findall(type_text):
        total += _ITEMSIZE[dtype] * math.prod(int(d) for d in dims.split(",") if d)
    return total


def _group_size(line: str, num_devices: int) -> int:
    """Devices per replica group, in any of the printed forms."""
    if match := re.search(r"replica_groups=\{(\{[\d,]*\})", line):  # {{0,1,2,3},{4,5,6,7}}
        members = match.group(1).strip("{}")
        return len(members.split(",")) if members else num_devices
    if re.search(r"replica_groups=\{\}", line):
        return num_devices
    if match := re.search(r"replica_groups=\[(\d+),(\d+)\]<=", line):  # iota: [groups,size]<=[...]
        return int(match.group(2))
    if match := re.search(
        r"replica_groups=mesh\[([^\]]*)\].*?\{([^}]*)\}", line
    ):  # mesh[...] {'axis_1'}
        sizes = dict(re.findall(r"'(\w+)'=(\d+)", match.group(1)))
        return math.prod(int(sizes[a]) for a in re.findall(r"'(\w+)'", match.group(2)))
    if "source_target_pairs" in line:  # a permutation: one sender per receiver
        return 2
    raise ValueError(f"cannot read the replica groups of: {line.strip()}")


def hlo_collectives(hlo_text: str, num_devices: int) -> list[Collective]:
    """The collectives of optimized (SPMD-partitioned) HLO, in text order."""
    found = []
    for line in hlo_text.splitlines():
        match = _HLO_COLLECTIVE.search(line)
        if match is None:
            continue
        if match.group("async"):
            raise ValueError(f"async collectives are not handled: {line.strip()}")
        kind = match.group("op").replace("-", "_")
        result_bytes = _hlo_nbytes(match.group("type"))
        n = _group_size(line, num_devices)
        nbytes = (
            result_bytes * n if kind == "reduce_scatter" else result_bytes
        )  # reduce_scatter: the input
        receivers = None
        if pairs := re.search(r"source_target_pairs=\{(.*?)\}\}", line):
            receivers = frozenset(
                int(t) for _, t in re.findall(r"\{(\d+),(\d+)", pairs.group(1) + "}")
            )
        found.append(Collective(kind, n, nbytes, receivers))
    return found


def summary(collectives: Sequence[Collective]) -> str:
    counts = Counter(c.kind for c in collectives)
    return ", ".join(f"{kind}×{n}" for kind, n in sorted(counts.items())) or "none"


# --- running one program both ways --------------------------------------------------------


def _shard_spec(spec: Spec) -> dist.ShardSpec:
    partition = [d for d, axes in enumerate(spec) if axes is not None]
    if not partition:
        return dist.ShardSpec(replicate=True)
    return dist.ShardSpec(partition=partition, mesh_axes=[spec[d] for d in partition])


@dataclass
class Row:
    name: str
    tessera: list[Collective]
    jax: list[Collective]
    error: float
    tessera_ir: str
    jax_lines: list[str]
    devices: int = math.prod(MESH_SHAPE)
    tessera_flops: float = 0.0
    jax_flops: float = 0.0

    @property
    def machine(self) -> Topology:
        return default_machine(self.devices)

    def time(self, tessera: bool) -> float:
        """Modelled seconds per device: collectives (exposed) plus matmul compute."""
        collectives, flops = (
            (self.tessera, self.tessera_flops) if tessera else (self.jax, self.jax_flops)
        )
        machine = self.machine
        return comm_time(collectives, machine) + compute_time(flops, machine)


def measure(
    program: Program, tessera_ns: SimpleNamespace, jax_ns: SimpleNamespace, seed: int = 0
) -> Row:
    rng = np.random.default_rng(seed)
    data = [
        rng.standard_normal(shape).astype(np.float32) / math.sqrt(shape[0])
        for shape, _ in program.inputs
    ]
    for argument, vocabulary in program.ids:
        data[argument] = rng.integers(0, vocabulary, program.inputs[argument][0], dtype=np.int32)
    specs = [spec for _, spec in program.inputs]

    axes, shape = program.mesh
    # named, so that the sharding clock prices latency too (an unnamed mesh leaves it out)
    machine = default_machine(math.prod(shape)).name
    ts_mesh = dist.Mesh(axes=list(axes), shape=shape, topology=machine)
    with schedule.options(context_parallel=program.context_parallel):
        compiled = ts.jit(
            functools.partial(program.fn, tessera_ns),
            mesh=ts_mesh,
            in_shardings=tuple(_shard_spec(s) for s in specs),
            out_shardings=_shard_spec(program.out),
        )
        torch_args = [torch.from_numpy(d) for d in data]
        lowered = compiled.lower(*torch_args)
        tessera_out = compiled(*torch_args).numpy()

    jax_mesh = Mesh(np.array(jax.devices()[: math.prod(shape)]).reshape(shape), axes)
    in_shardings = tuple(NamedSharding(jax_mesh, PartitionSpec(*s)) for s in specs)
    out_sharding = NamedSharding(jax_mesh, PartitionSpec(*program.out))
    jitted = jax.jit(
        functools.partial(program.fn, jax_ns), in_shardings=in_shardings, out_shardings=out_sharding
    )
    jax_args = [jax.device_put(d, s) for d, s in zip(data, in_shardings, strict=True)]
    executable = jitted.lower(*jax_args).compile()
    (jax_out_sharding,) = jax.tree.leaves(executable.output_shardings)
    if not jax_out_sharding.is_equivalent_to(out_sharding, len(tessera_out.shape)):
        raise AssertionError(
            f"{program.name}: JAX returned {jax_out_sharding}, asked for {out_sharding}"
        )
    hlo = executable.as_text()
    jax_out = np.asarray(executable(*jax_args))

    np.testing.assert_allclose(tessera_out, jax_out, rtol=1e-4, atol=1e-4, err_msg=program.name)
    error = float(np.max(np.abs(tessera_out - jax_out))) if tessera_out.size else 0.0
    jax_lines = [line.strip() for line in hlo.splitlines() if _HLO_COLLECTIVE.search(line)]
    return Row(
        program.name,
        tessera_collectives(lowered, ts_mesh),
        hlo_collectives(hlo, jax_mesh.size),
        error,
        lowered.as_text("partitioned"),
        jax_lines,
        jax_mesh.size,
        tessera_flops(lowered),
        hlo_flops(hlo),
    )


def _ratio(tessera_bytes: float, jax_bytes: float) -> str:
    if jax_bytes == 0:
        return "1.00 (both 0)" if tessera_bytes == 0 else "inf"
    return f"{tessera_bytes / jax_bytes:.2f}"


def table(rows: Sequence[Row]) -> str:
    lines = [
        "| program | Tessera collectives | Tessera operand bytes | JAX collectives | JAX operand bytes "
        "| operand ratio | Tessera received/dev | JAX received/dev | received ratio "
        "| Tessera time (µs) | JAX time (µs) | time ratio | note |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        n = row.devices
        tb, jb = per_device(row.tessera, n), per_device(row.jax, n)
        tr, jr = per_device(row.tessera, n, ring=True), per_device(row.jax, n, ring=True)
        tt, jt = row.time(True) * 1e6, row.time(False) * 1e6
        note = ""
        if tr > jr:
            note = "more bytes, faster by the model" if tt < jt else "MORE BYTES AND SLOWER"
        elif tt > jt * 1.001:
            note = "slower by the model"
        lines.append(
            f"| {row.name} | {summary(row.tessera)} | {tb:.0f} | {summary(row.jax)} | {jb:.0f} | {_ratio(tb, jb)} "
            f"| {tr:.0f} | {jr:.0f} | {_ratio(tr, jr)} | {tt:.2f} | {jt:.2f} | {_ratio(tt, jt)} | {note} |"
        )
    return "\n".join(lines)


def versions() -> str:
    return (
        f"date {datetime.date.today().isoformat()}; jax {jax.__version__}, jaxlib {jaxlib.__version__}, "
        f"torch {torch.__version__}, python {platform.python_version()}; "
        f"mesh dp×tp = {MESH_SHAPE[0]}×{MESH_SHAPE[1]} (3-D rows: dp×tp×sp = 2×2×2; CP rows: cp = {CP}), f32"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="print Tessera's partitioned IR and JAX's collective HLO lines",
    )
    parser.add_argument("--only", help="run the programs whose name contains this text")
    args = parser.parse_args(argv)
    if jax is None:
        print(
            "sharding_vs_jax: jax is not installed; run `pip install jax` (CPU build) and retry",
            file=sys.stderr,
        )
        return 2
    if len(jax.devices()) < math.prod(MESH_SHAPE):
        print(f"sharding_vs_jax: need {math.prod(MESH_SHAPE)} JAX devices, found {len(jax.devices())} "
              "(XLA_FLAGS must be set before jax is imported)", file=sys.stderr)  # fmt: skip
        return 2
    tessera_ns, jax_ns = _namespaces()
    rows = []
    for program in PROGRAMS:
        if args.only and args.only not in program.name:
            continue
        row = measure(program, tessera_ns, jax_ns)
        rows.append(row)
        if args.verbose:
            print(f"== {row.name} (max |Tessera - JAX| = {row.error:.1e})")
            print(row.tessera_ir)
            print("\n".join(row.jax_lines) or "(JAX: no collectives)", end="\n\n")
    print(table(rows))
    print(versions())
    return 0


if __name__ == "__main__":
    sys.exit(main())
