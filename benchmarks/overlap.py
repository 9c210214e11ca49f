"""Simulated step time and exposed communication, serial vs overlapped schedules.

Compiles (without running) a 70B-like transformer layer's forward under tensor
parallelism and a data-parallel training step, lowers each twice, with
``schedule.all_reduce_overlap(False)`` (serial: every collective waited for at once) and
``True`` (``overlap-comm``, plus ``collective-matmul`` for TP), and simulates both on a topology
preset (``tessera.perf``). Printed per case: step time T, the compute-only time, the
communication time, the exposed fraction E = (T − T_compute_only) / T_comm, and the
speedup of the overlapped schedule.

- TP forward (hidden 8192, sequence 4096, 64 heads, MLP 4×hidden, bf16, batch 1, tp = 8):
  Megatron-LM's layer (two all-reduces), and its sequence-parallel form (Korthikanti et
  al. 2022: the residual stream split over tp along the sequence, all-gather before the
  column-parallel matmuls, reduce-scatter after the row-parallel ones). Goal: E ≤ 0.3 and
  ≥ 1.15× speedup.
- DP backward: a training step (forward, backward, SGD) of L such layers (hidden 4096)
  with the batch split over dp, without and with ``bucket-gradients`` (25 MiB buckets);
  each all-reduce starts as the backward makes its (last) gradient. Goal: exposed communication ≤ 1/L + 0.05 of its total.
- Context parallelism (issue 19): causal ``op.attention`` with q, k, v
  ``[1, heads, 131072, 128]`` bf16 split over cp = 8 along the sequence (DGX H100: one
  NVLink node), forward and a grad step (dq, dk, dv), as ring attention (k/v blocks
  passed round by collective permutes, zig-zag causal split) and as the all-gather of
  k and v (``schedule.options(context_parallel=...)``), each with the sequence stored in
  zig-zag order by the data loader (``zigzag=cp``) and in natural order (the ring then
  moves q, k, v to the zig-zag split and the results back). The ring overlaps each step's
  block with the next block's transfer; the all-gather's k and v are needed whole by the
  first kernel, so overlap cannot hide it.

    python benchmarks/overlap.py [--trace nvl72_trace.json]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

import tessera as ts
from tessera import dist, graph, op, optim, schedule

sys.path.insert(0, str(Path(__file__).parent))
import comm_volume  # the Megatron layer and its parameters

BF16 = torch.bfloat16
COLUMNS = dist.ShardSpec(partition=(1,), mesh_axes=("tp",))
ROWS = dist.ShardSpec(partition=(0,), mesh_axes=("tp",))
SEQUENCE = dist.ShardSpec(partition=(1,), mesh_axes=("tp",))  # [B, T, C] split along T


def sequence_parallel_layer(x, p, heads: int):
    """Megatron-SP: the layer of comm_volume with a fused QKV projection, and the residual
    stream kept split along the sequence over tp between the blocks."""
    batch, seq, dim = x.shape
    head_dim = dim // heads
    h = op.layer_norm(x, axis=-1, weight=p["ln1_w"], bias=p["ln1_b"])
    qkv = op.reshape(h @ p["wqkv"], (batch, seq, heads, 3, head_dim))

    def head(i: int):
        part = op.slice(qkv, (0, 0, 0, i, 0), (batch, seq, heads, i + 1, head_dim))
        return op.transpose(op.reshape(part, (batch, seq, heads, head_dim)), (0, 2, 1, 3))

    q, k, v = head(0), head(1), head(2)
    scores = (q @ op.transpose(k, (0, 1, 3, 2))) * (1.0 / head_dim**0.5)
    causal = np.tril(np.ones((seq, seq), dtype=bool))
    attention = op.softmax(op.where(causal, scores, -1e9), axis=-1) @ v
    merged = op.reshape(op.transpose(attention, (0, 2, 1, 3)), (batch, seq, dim))
    x = dist.shard(x + merged @ p["wo"], SEQUENCE)
    h = op.layer_norm(x, axis=-1, weight=p["ln2_w"], bias=p["ln2_b"])
    return dist.shard(x + op.gelu(h @ p["w1"]) @ p["w2"], SEQUENCE)


def layer_params(dim: int, fused_qkv: bool) -> dict[str, torch.Tensor]:
    shapes = {"wo": (dim, dim), "w1": (dim, 4 * dim), "w2": (4 * dim, dim)}
    if fused_qkv:
        shapes["wqkv"] = (dim, 3 * dim)
    else:
        shapes |= {n: (dim, dim) for n in ("wq", "wk", "wv")}
    shapes |= {n: (dim,) for n in ("ln1_w", "ln1_b", "ln2_w", "ln2_b")}
    return {n: torch.empty(s, dtype=BF16) for n, s in shapes.items()}


def tp_forward(kind: str, overlap: bool, topology: str, dim: int, seq: int, heads: int, tp: int):
    mesh = dist.mesh({"tp": tp})
    fused = kind == "megatron-sp"
    layer = sequence_parallel_layer if fused else comm_volume.transformer_layer
    specs = {"wo": ROWS, "w1": COLUMNS, "w2": ROWS}
    specs |= {"wqkv": COLUMNS} if fused else {n: COLUMNS for n in ("wq", "wk", "wv")}
    specs |= {n: None for n in ("ln1_w", "ln1_b", "ln2_w", "ln2_b")}
    x_spec = SEQUENCE if fused else None
    with (
        schedule.all_reduce_overlap(overlap),
        schedule.options(topology=topology, collective_matmul=True),
    ):
        jitted = ts.jit(layer, static_argnums=2, mesh=mesh, in_shardings=(x_spec, specs, None))
        lowered = jitted.lower(
            torch.empty(1, seq, dim, dtype=BF16), layer_params(dim, fused), heads
        )
        return lowered.simulate(topology)


def dp_training(
    overlap: bool, topology: str, dp: int, layers: int, dim: int, seq: int, heads: int,
    bucket_bytes: int = 25 * 2**20,
):  # fmt: skip
    mesh = dist.mesh({"dp": dp})
    names = ("wq", "wk", "wv", "wo", "w1", "w2", "ln1_w", "ln1_b", "ln2_w", "ln2_b")

    def step(p, x):
        for i in range(layers):
            x = comm_volume.transformer_layer(x, {n: p[f"{n}{i}"] for n in names}, heads)
        loss = op.mean(x * x)
        return graph.backward(loss), {"loss": loss}

    params = comm_volume.layer_params(dim, layers, materialize=False)
    params = {k: torch.empty(v.shape, dtype=BF16) for k, v in params.items()}
    with (
        schedule.all_reduce_overlap(overlap),
        schedule.options(topology=topology, bucket_bytes=bucket_bytes),
    ):
        training = graph.training_step(step, optimizer=optim.SGD(lr=1e-3), mesh=mesh)
        state = training.init(params)
        lowered = training.lower(state, torch.empty(dp, seq, dim, dtype=BF16))
        return lowered.simulate(topology)


CP_SEQUENCE = dist.ShardSpec(partition=(2,), mesh_axes=("cp",))  # [B, H, T, D] split on T


def cp_attention(
    method: str, overlap: bool, topology: str, seq: int, heads: int, head_dim: int, cp: int,
    grad: bool, zigzag: bool,
):  # fmt: skip
    """Causal attention with the sequence split over cp: forward, or the grad step;
    ``zigzag``: the sequence stored in zig-zag order over cp (by the data loader)."""
    order = cp if zigzag else None

    def forward(q, k, v):
        return op.attention(q, k, v, causal=True, zigzag=order)

    def loss(q, k, v):
        return op.sum(op.attention(q, k, v, causal=True, zigzag=order))

    fn = ts.grad(loss, argnums=(0, 1, 2)) if grad else forward
    with (
        schedule.all_reduce_overlap(overlap),
        schedule.options(topology=topology, context_parallel=method),
    ):
        jitted = ts.jit(fn, mesh=dist.mesh({"cp": cp}), in_shardings=(CP_SEQUENCE,) * 3)
        x = torch.empty(1, heads, seq, head_dim, dtype=BF16)
        return jitted.lower(x, x, x).simulate(topology)


def row(case: str, topology: str, serial, overlapped, goal: str) -> str:
    return (
        f"| {case} | {topology} | {serial.step_time_s * 1e3:.3f} | {overlapped.step_time_s * 1e3:.3f} "
        f"| {overlapped.compute_only_s * 1e3:.3f} | {overlapped.comm_time_s * 1e3:.3f} "
        f"| {serial.exposed_fraction:.2f} | {overlapped.exposed_fraction:.2f} "
        f"| {serial.step_time_s / overlapped.step_time_s:.2f}× | {goal} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=8192)
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--heads", type=int, default=64)
    parser.add_argument("--tp", type=int, default=8)
    parser.add_argument("--layers", type=int, default=8, help="DP training: layers L")
    parser.add_argument("--dp-hidden", type=int, default=4096)
    parser.add_argument("--cp-seq", type=int, default=131072, help="context parallel: sequence")
    parser.add_argument("--cp", type=int, default=8)
    parser.add_argument("--cp-heads", type=int, default=32)
    parser.add_argument("--cp-head-dim", type=int, default=128)
    parser.add_argument("--only-cp", action="store_true", help="only the context-parallel rows")
    parser.add_argument("--trace", type=Path, help="write the NVL72 TP step's Chrome trace here")
    args = parser.parse_args()
    started = time.time()
    print("| case | topology | serial T (ms) | overlapped T (ms) | compute only (ms) "
          "| comm (ms) | E serial | E overlapped | speedup | goal |")  # fmt: skip
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---|")
    sizes = (args.hidden, args.seq, args.heads, args.tp)
    for topology in () if args.only_cp else ("dgx_h100", "gb200_nvl72"):
        for kind in ("megatron", "megatron-sp"):
            serial, overlapped = (tp_forward(kind, o, topology, *sizes) for o in (False, True))
            goal = "E ≤ 0.30, ≥ 1.15×"
            print(row(f"TP forward, {kind}, tp={args.tp}", topology, serial, overlapped, goal))
            if args.trace and topology == "gb200_nvl72" and kind == "megatron":
                overlapped.save_trace(args.trace)
    L = args.layers
    for dp, topology in () if args.only_cp else ((8, "dgx_h100"), (16, "dgx_h100x2")):
        for bucket_bytes in (0, 25 * 2**20):
            sizes = (dp, L, args.dp_hidden, args.seq, args.dp_hidden // 128, bucket_bytes)
            serial, overlapped = (dp_training(o, topology, *sizes) for o in (False, True))
            goal = f"E ≤ 1/L + 0.05 = {1 / L + 0.05:.3f}"
            buckets = f"{bucket_bytes >> 20} MiB buckets" if bucket_bytes else "no buckets"
            case = f"DP training step, L={L}, dp={dp}, {buckets}"
            print(row(case, topology, serial, overlapped, goal))
    cp_sizes = (args.cp_seq, args.cp_heads, args.cp_head_dim, args.cp)
    for grad in (False, True):
        for method, zigzag in (
            ("ring", True),
            ("ring", False),
            ("all_gather", True),
            ("all_gather", False),
        ):
            serial, overlapped = (
                cp_attention(method, o, "dgx_h100", *cp_sizes, grad, zigzag) for o in (False, True)
            )
            step = "grad step" if grad else "forward"
            order = "zig-zag stored" if zigzag else "natural order"
            case = (
                f"CP causal attention {step}, {method}, {order}, seq={args.cp_seq}, "
                f"cp={args.cp}, {args.cp_heads}×{args.cp_head_dim} heads"
            )
            goal = "ring: E ≤ 0.30" if method == "ring" else "(reference)"
            print(row(case, "dgx_h100", serial, overlapped, goal))
    print(f"\n({time.time() - started:.0f} s; simulated, nothing ran on a GPU)")


if __name__ == "__main__":
    main()
