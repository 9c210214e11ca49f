"""Communication volume of Megatron transformer layers, forward and training, next to
the analytic formulas.

For tensor parallelism over ``tp`` (q/k/v and the first MLP matmul split by columns, the
attention output projection and the second MLP matmul by rows, heads split over tp) a
layer's forward needs exactly two all-reduces of the activations ``[B/dp, T, C]`` over tp
(Shoeybi et al., Megatron-LM, 2019, section 3). The batch is split over ``dp``, which
needs no communication in the forward pass. The script prints, for each mesh, the
collectives Tessera inserted, the per-rank bytes by the ``collectives()`` convention and
as bytes received under ring all-reduce (2(n-1)/n of the operand), the analytic minimum,
and the ratio.

The second table is a whole training step (``graph.training_step``: forward, backward,
AdamW) of ``--layers`` such layers with a mean-square loss, for data parallelism at each
ZeRO stage, tensor parallelism and both. Per rank, with Ψ the parameter bytes a rank
uses (its tp shard), n = dp and t = tp, bytes received under ring algorithms:

- DP (ZeRO-0): all_reduce of the gradients, 2(n-1)/n Ψ;
- ZeRO-1: all_reduce of the gradients and all_gather of the updated parameters, 3(n-1)/n Ψ;
- ZeRO-2: reduce_scatter of the gradients and all_gather of the parameters, 2(n-1)/n Ψ;
- ZeRO-3: all_gather of the parameters for the forward, again for the backward, and
  reduce_scatter of the gradients, 3(n-1)/n Ψ less (n-1)/n of what the backward does not
  read: the layer norms' biases, and the first layer norm's weight (the gradient of
  the data it normalises is not needed);
- TP: per layer two all-reduces of the activations [B/dp, T, C] in the forward and two
  of their gradients in the backward (Megatron-LM, section 3), except the gradient of
  the first layer's input, which a step does not need (the input is data: ``dce``
  removes it). Its layer norm's weight and bias gradients, partial over tp, are
  all-reduced instead (their dp shard from ZeRO-2 on):
  (4L - 1) 2(t-1)/t B/dp T C b + 2 2(t-1)/t C b / (n if ZeRO >= 2 else 1);
- every step also all-reduces the f32 loss over dp, 2(n-1)/n 4 bytes.

With tp nothing else is all-reduced: every other layer norm's weight and bias gradients
are computed from the all-reduced activation gradient, as in Megatron-LM
(``tessera/analysis/reduction_points.py``).

It checks each sharded step against the same step on one device (the updated
parameters, max abs difference).

The third table is one Llama-style layer (``tessera.plan.layer.transformer_layer``:
grouped-query attention, SwiGLU MLP; bf16) at Llama-3-70B width (h = 8192, 64 query
heads, 8 k/v heads of 128, MLP 28672) on tp = 8, sequence s = 8192, micro-batch b = 1,
its forward and its forward + backward (``ts.grad`` of the layer, weights' and input's
gradients), compiled from shapes alone. With A = b·s·h·2 bytes (one activation) and
t = tp, bytes received per rank under ring algorithms:

- TP (Megatron-LM, section 3): forward two all-reduces of the activations, 2·2(t−1)/t·A;
  forward + backward four, 4·2(t−1)/t·A (the k/v projections' input gradients join the
  all-reduce q's needs: GQA adds nothing);
- SP (Korthikanti et al. 2022, section 4.2.2): the residual stream split over tp along
  the sequence; per block an all-gather of the normed input and a reduce-scatter of the
  output, each (t−1)/t·A: forward 4·(t−1)/t·A, forward + backward 8·(t−1)/t·A (the
  backward transposes each: reduce-scatter ↔ all-gather), weights never moved. Megatron's
  implementation all-gathers each block's input again in the backward for the weight
  gradients (it keeps only the local shard): 10·(t−1)/t·A, 1.25× the minimum. Both
  rms/layer-norm weights' gradients are then partial over tp (an all-reduce of h each,
  2·2(t−1)/t·h·2 bytes, counted in the formula).

The "time" columns are the scheduled program simulated on a DGX H100 (``lowered.simulate``:
per-rank roofline compute and each collective with the algorithm the cost model picks,
overlapped as scheduled): the step time and the collectives' summed time. The first two
tables' "collectives' time" is each collective priced alone by the same alpha-beta model
(``tessera.perf.collective_cost.groups_time``: the fastest algorithm for its groups on one
DGX H100 node, latency included), summed, no overlap. CPU only; runs in about two minutes.

    python benchmarks/comm_volume.py [--only forward|training|llama]
"""

from __future__ import annotations

import argparse
from collections import Counter
from typing import Any

import numpy as np
import torch

import tessera as ts
from tessera import dist, graph, op, optim
from tessera.backends.collective_info import CollectiveInfo
from tessera.ir.mesh import default_machine
from tessera.perf.collective_cost import groups_time


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


def layouts(
    mesh: dist.Mesh, has_dp: bool
) -> tuple[dist.ShardSpec, dict[str, dist.ShardSpec | None]]:
    columns = dist.ShardSpec(partition=(1,), mesh_axes=("tp",))
    rows = dist.ShardSpec(partition=(0,), mesh_axes=("tp",))
    params = {
        "ln1_w": None, "ln1_b": None, "ln2_w": None, "ln2_b": None,
        "wq": columns, "wk": columns, "wv": columns, "wo": rows, "w1": columns, "w2": rows,
    }  # fmt: skip
    batch = (
        dist.ShardSpec(partition=(0,), mesh_axes=("dp",))
        if has_dp
        else dist.ShardSpec(replicate=True)
    )
    return batch, params


def measure(
    dp: int,
    tp: int,
    batch: int,
    seq: int,
    dim: int,
    heads: int,
    check: tuple[int, int, int, int] | None = None,
) -> dict[str, object]:
    """The collectives of the layer at (batch, seq, dim, heads), and its largest error vs
    the unsharded layer run at ``check`` = (B, T, C, heads) (default: the same sizes)."""
    axes, shape = (["dp", "tp"], (dp, tp)) if dp > 1 else (["tp"], (tp,))
    mesh = dist.Mesh(axes=axes, shape=shape, topology=default_machine(dp * tp).name)
    x_spec, p_specs = layouts(mesh, dp > 1)
    layer = ts.jit(
        transformer_layer, static_argnums=2, mesh=mesh, in_shardings=(x_spec, p_specs, None)
    )
    x, params = layer_inputs(batch, seq, dim, random=False)
    infos = layer.lower(x, params, heads).collectives()
    moved = sum(i.nbytes for i in infos)
    received = sum(
        2 * (i.group_size - 1) / i.group_size * i.nbytes for i in infos if i.kind == "all_reduce"
    )
    received += sum(i.nbytes for i in infos if i.kind != "all_reduce")  # other kinds: count fully
    minimum = 2 * (batch // dp) * seq * dim * 4  # two all-reduces of [B/dp, T, C] f32
    b, t, c, h = check or (batch, seq, dim, heads)
    x, params = layer_inputs(b, t, c)
    reference = ts.jit(transformer_layer, static_argnums=2)(x, params, h)
    error = (layer(x, params, h) - reference).abs().max().item()
    kinds = ", ".join(
        f"{n}× {k}[{','.join(a)}]"
        for (k, a), n in Counter((i.kind, i.mesh_axes) for i in infos).items()
    )
    return {
        "mesh": f"dp={dp} × tp={tp}", "collectives": kinds or "none", "bytes": moved,
        "received": received, "minimum": minimum, "ratio": moved / minimum, "error": error,
        "comm_us": comm_us(infos, mesh),
    }  # fmt: skip


def layer_inputs(
    batch: int, seq: int, dim: int, random: bool = True
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The layer's input and parameters (random, or uninitialised for compiling only)."""
    g = torch.Generator().manual_seed(0)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=g) / shape[-1] ** 0.5 if random else torch.empty(shape)

    x = randn(batch, seq, dim) * dim**0.5 if random else torch.empty(batch, seq, dim)
    params = {n: randn(dim, dim) for n in ("wq", "wk", "wv", "wo")}
    params |= {"w1": randn(dim, 4 * dim), "w2": randn(4 * dim, dim)}
    params |= {n: torch.ones(dim) for n in ("ln1_w", "ln2_w")} | {
        n: torch.zeros(dim) for n in ("ln1_b", "ln2_b")
    }
    return x, params


RING_RECEIVED = {  # bytes a rank receives, per byte of CollectiveInfo.nbytes, group of n
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,  # nbytes: the unscattered input
    "all_gather": lambda n: (n - 1) / n,  # nbytes: the gathered result
    "all_to_all": lambda n: (n - 1) / n,
}


def received(infos: list[CollectiveInfo]) -> float:
    return sum(RING_RECEIVED[i.kind](i.group_size) * i.nbytes for i in infos)


def comm_us(infos: list[CollectiveInfo], mesh: dist.Mesh) -> float:
    """Microseconds of the collectives one after another on the mesh's machine (one DGX
    H100 node here), each with the alpha-beta model's fastest algorithm for its groups
    (``groups_time``: what the sharding decisions and choose-collective-algorithms use)."""
    machine = mesh.machine()
    return 1e6 * sum(
        groups_time(machine, i.kind, i.nbytes, mesh.groups(list(i.mesh_axes))).time_s
        for i in infos
    )


def layer_params(dim: int, layers: int, materialize: bool = True) -> dict[str, torch.Tensor]:
    """The parameters of ``layers`` layers (random, or uninitialised shapes only)."""
    g = torch.Generator().manual_seed(0)

    def randn(*shape: int) -> torch.Tensor:
        return (
            torch.randn(shape, generator=g) / shape[0] ** 0.5 if materialize else torch.empty(shape)
        )

    params = {}
    for i in range(layers):
        for n in ("wq", "wk", "wv", "wo"):
            params[f"{n}{i}"] = randn(dim, dim)
        params[f"w1{i}"] = randn(dim, 4 * dim)
        params[f"w2{i}"] = randn(4 * dim, dim)
        params |= {f"ln1_w{i}": torch.ones(dim), f"ln2_w{i}": torch.ones(dim)}
        params |= {f"ln1_b{i}": torch.zeros(dim), f"ln2_b{i}": torch.zeros(dim)}
    return params


def stacked(params: dict[str, torch.Tensor], layers: int) -> dict[str, torch.Tensor]:
    """``layer_params``' parameters stacked by name on a new dim 0 (for ``graph.scan``)."""
    names = ("wq", "wk", "wv", "wo", "w1", "w2", "ln1_w", "ln1_b", "ln2_w", "ln2_b")
    return {n: torch.stack([params[f"{n}{i}"] for i in range(layers)]) for n in names}


def stacked_layouts(mesh: dist.Mesh) -> dict[str, dist.ShardSpec | None]:
    """``layouts``' parameter layouts for stacked parameters: dim 0 (the layer) whole."""
    return {
        n: None if spec is None else dist.ShardSpec(
            partition=tuple(int(d) + 1 for d in spec.partition), mesh_axes=spec.mesh_axes
        )
        for n, spec in layouts(mesh, False)[1].items()
    }  # fmt: skip


def scan_training_step(
    mesh: dist.Mesh, zero: int, heads: int, **options: Any
) -> graph.TrainingStep:
    """:func:`training_step` with stacked parameters (:func:`stacked`): the layers are
    one ``graph.scan`` of ``transformer_layer`` (``options``: the step's others)."""

    def step(p, x):
        x, _ = graph.scan(lambda h, layer: (transformer_layer(h, layer, heads), None), x, p)
        loss = op.mean(x * x)
        return graph.backward(loss), {"loss": loss}

    return graph.training_step(
        step, optimizer=optim.AdamW(lr=1e-3), mesh=mesh, param_shardings=stacked_layouts(mesh),
        zero=zero, kernels="reference", **options,
    )  # fmt: skip


def training_step(
    mesh: dist.Mesh | None, zero: int, layers: int, heads: int, tp: bool, regions: bool = False,
    **options: Any,
) -> graph.TrainingStep:
    """AdamW on ``transformer_layer`` × ``layers`` (each a ``graph.region`` call with
    ``regions``) and a mean-square loss (``options``: the step's others)."""
    layout = layouts(mesh, False)[1] if tp else {}
    specs = {f"{n}{i}": spec for i in range(layers) for n, spec in layout.items()} or None
    layer = graph.region(transformer_layer) if regions else transformer_layer

    def step(p, x):
        for i in range(layers):
            x = layer(
                x,
                {
                    n: p[f"{n}{i}"]
                    for n in layout
                    or ("wq", "wk", "wv", "wo", "w1", "w2", "ln1_w", "ln1_b", "ln2_w", "ln2_b")
                },
                heads,
            )
        loss = op.mean(x * x)
        return graph.backward(loss), {"loss": loss}

    return graph.training_step(
        step, optimizer=optim.AdamW(lr=1e-3), mesh=mesh, param_shardings=specs if mesh else None,
        zero=zero, kernels="reference", **options,
    )  # fmt: skip


def measure_training(
    dp: int,
    tp: int,
    zero: int,
    dims: tuple[int, int, int, int],
    check: tuple[int, int, int, int],
    layers: int,
    regions: bool = False,
) -> dict[str, object]:
    """Collectives of one step at ``dims`` = (B, T, C, heads) (compiled, not run) and the
    largest parameter difference after one step run at ``check`` against one device
    (``regions``: each layer a call of one ``graph.region``)."""
    batch, seq, dim, heads = dims
    mesh = dist.mesh({"dp": dp, "tp": tp}, topology=default_machine(dp * tp).name)
    params = {
        k: torch.empty(v.shape) for k, v in layer_params(dim, layers, materialize=False).items()
    }
    x = torch.empty(batch, seq, dim)
    step = training_step(mesh, zero, layers, heads, tp > 1, regions)
    state = step.init(params)
    lowered = step.lower(state, x)
    infos = lowered.collectives()
    memory = lowered.memory().model_states
    assert memory is not None
    # the analytic volume, from the model's dimensions alone
    per_rank = sum(
        v.numel() * 4 / (tp if k[:2] in ("wq", "wk", "wv", "wo", "w1", "w2") else 1)
        for k, v in params.items()
    )
    n, t = dp, tp
    dp_factor = {0: 2, 1: 3, 2: 2, 3: 3}[zero] * (n - 1) / n
    # ZeRO-3 gathers again for the backward all but what it does not read: the biases,
    # and unrolled the first norm's weight (the input's gradient is not made; the backward
    # every layer's region call shares makes it)
    unread = sum(v.numel() * 4 for k, v in params.items() if k.startswith(("ln1_b", "ln2_b")))
    unread += 0 if regions else params["ln1_w0"].numel() * 4
    tp_factor = 2 * (t - 1) / t
    # unrolled, the first layer's input gradient is not made: one all-reduce fewer
    activations = (4 * layers - (0 if regions else 1)) * tp_factor * (batch // dp) * seq * dim * 4
    # the first layer norm's weight and bias gradients; from ZeRO-2 on, reduce-scattered
    # over dp before the all-reduce over tp (with regions none: the backward all layers
    # share makes them from the input's gradient, all-reduced over tp anyway)
    norm_grads = 0 if regions else 2 * tp_factor * dim * 4 / (n if zero >= 2 else 1)
    formula = dp_factor * per_rank + 2 * (n - 1) / n * 4 + activations + norm_grads
    if zero >= 3:
        formula -= (n - 1) / n * unread
    kinds = ", ".join(
        f"{c}× {k}[{','.join(a)}]"
        for (k, a), c in sorted(Counter((i.kind, i.mesh_axes) for i in infos).items())
    )
    return {
        "mesh": f"dp={dp} × tp={tp}", "zero": zero, "collectives": kinds, "received": received(infos),
        "formula": formula, "ratio": received(infos) / formula, "error": check_training(dp, tp, zero, check, layers, regions),
        "params": memory.params, "grads": memory.grads, "state": memory.optimizer_state,
        "comm_us": comm_us(infos, mesh),
    }  # fmt: skip


def check_training(
    dp: int, tp: int, zero: int, dims: tuple[int, int, int, int], layers: int, regions: bool = False
) -> float:
    """Largest parameter difference after one sharded step vs the same step on one device."""
    batch, seq, dim, heads = dims
    params = layer_params(dim, layers)
    x = torch.randn(batch, seq, dim, generator=torch.Generator().manual_seed(1))
    machine = default_machine(dp * tp).name
    sharded = training_step(
        dist.mesh({"dp": dp, "tp": tp}, topology=machine), zero, layers, heads, tp > 1, regions
    )
    single = training_step(None, 0, layers, heads, False)
    states = [s.init({k: v.clone() for k, v in params.items()}) for s in (sharded, single)]
    sharded(states[0], x)
    single(states[1], x)
    return max((states[0].params[k] - states[1].params[k]).abs().max().item() for k in params)


LLAMA_70B = dict(hidden=8192, heads=64, kv_heads=8, head_dim=128, ffn=28672, mlp="swiglu")


def measure_llama(sp: bool, backward: bool, tp: int, seq: int, batch: int) -> dict[str, object]:
    """Collectives, bytes and simulated time of one Llama-style layer (see the module
    docstring), and the analytic volume it is held to."""
    from tessera.autodiff.api import grad
    from tessera.plan.layer import (
        LayerShape,
        layer_loss,
        layer_mesh,
        layer_param_shapes,
        layer_shardings,
    )  # fmt: skip
    from tessera.plan.layer import transformer_layer as llama_layer

    shape = LayerShape(**LLAMA_70B, seq=seq, micro_batch=batch, tp=tp, cp=1, sp=sp)  # type: ignore[arg-type]
    x_spec, specs = layer_shardings(shape)
    fn = grad(layer_loss, argnums=(0, 1), has_aux=True) if backward else llama_layer
    jitted = ts.jit(
        fn, static_argnums=(2, 3, 4, 5), mesh=layer_mesh(shape),
        in_shardings=(x_spec, specs, None, None, None, None),
    )  # fmt: skip
    params = {
        n: torch.empty(s, dtype=torch.bfloat16, device="meta")
        for n, s in layer_param_shapes(shape).items()
    }
    x = torch.empty(batch, seq, shape.hidden, dtype=torch.bfloat16, device="meta")
    lowered = jitted.lower(x, params, shape.heads, shape.kv_heads, shape.mlp, x_spec if sp else None)
    infos = lowered.collectives()
    simulated = lowered.simulate("dgx_h100")
    act = batch * seq * shape.hidden * 2
    t = tp
    if sp:
        formula = (8 if backward else 4) * (t - 1) / t * act
        formula += 2 * 2 * (t - 1) / t * shape.hidden * 2 if backward else 0  # norm weights
        megatron = formula + (2 * (t - 1) / t * act if backward else 0)  # re-gathers
    else:
        formula = megatron = (4 if backward else 2) * 2 * (t - 1) / t * act
    kinds = ", ".join(
        f"{c}× {k}[{','.join(a)}]"
        for (k, a), c in sorted(Counter((i.kind, i.mesh_axes) for i in infos).items())
    )
    moved = received(infos)
    return {
        "layout": ("SP" if sp else "TP") + (", fwd + bwd" if backward else ", fwd"),
        "collectives": kinds, "received": moved, "formula": formula, "ratio": moved / formula,
        "megatron": moved / megatron, "step_ms": simulated.step_time_s * 1e3,
        "comm_ms": simulated.comm_time_s * 1e3,
    }  # fmt: skip


def llama_table(tp: int = 8, seq: int = 8192, batch: int = 1) -> None:
    print(
        f"Llama-style layer at Llama-3-70B width (h=8192, 64 heads, 8 k/v heads, MLP 28672), "
        f"tp={tp}, s={seq}, b={batch}, bf16; time: simulated on dgx_h100"
    )
    print(
        "| layout | collectives inserted | ring bytes received | formula | ratio | vs Megatron's implementation | step time (ms) | collectives' time (ms) |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for sp in (False, True):
        for backward in (False, True):
            r = measure_llama(sp, backward, tp, seq, batch)
            print(
                f"| {r['layout']} | {r['collectives']} | {r['received']:.0f} | {r['formula']:.0f} "
                f"| {r['ratio']:.3f} | {r['megatron']:.3f} | {r['step_ms']:.2f} | {r['comm_ms']:.2f} |"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--dim", type=int, default=4096)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument(
        "--train", type=int, nargs=4, default=(8, 512, 4096, 32), metavar=("B", "T", "C", "HEADS")
    )
    parser.add_argument(
        "--check", type=int, nargs=4, default=(8, 16, 64, 8), metavar=("B", "T", "C", "HEADS")
    )
    parser.add_argument("--only", choices=("forward", "training", "llama"), default=None)
    parser.add_argument(
        "--regions", action="store_true", help="training steps: each layer a graph.region call"
    )
    args = parser.parse_args()
    if args.only == "llama":
        llama_table()
        return
    print(
        f"Megatron layer forward: B={args.batch}, T={args.seq}, C={args.dim}, heads={args.heads}, f32"
    )
    print(
        f"(volumes of the program compiled at that size; errors from a run at B, T, C, heads = {tuple(args.check)})"
    )
    print(
        "| mesh | collectives inserted | bytes (nbytes sum) | ring bytes received | analytic minimum | ratio | collectives' time (µs) | max error vs unsharded |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for dp, tp in ((1, 2), (1, 4), (1, 8), (2, 2), (2, 4)):
        r = measure(dp, tp, args.batch, args.seq, args.dim, args.heads, tuple(args.check))
        print(
            f"| {r['mesh']} | {r['collectives']} | {r['bytes']} | {r['received']:.0f} | {r['minimum']} "
            f"| {r['ratio']:.2f} | {r['comm_us']:.1f} | {r['error']:.1e} |"
        )
    print()
    (batch, seq, dim, heads), check = args.train, args.check
    print(
        f"Training step (forward, backward, AdamW): {args.layers} layers"
        f"{' (each a graph.region call)' if args.regions else ''}, B={batch}, T={seq}, C={dim}, heads={heads}, f32"
    )
    print(
        f"(volumes of the program compiled at that size; errors from one step run at B, T, C, heads = {tuple(check)})"
    )
    print(
        "| mesh | ZeRO | collectives inserted | ring bytes received | formula | ratio | collectives' time (µs) | params / grads / optimizer state (bytes per rank) | max error vs one device |"
    )
    print("|---|---:|---|---:|---:|---:|---:|---|---:|")
    configs = [(4, 1, z) for z in (0, 1, 2, 3)] + [
        (1, 4, 0),
        (2, 2, 0),
        (2, 2, 1),
        (2, 2, 2),
        (2, 2, 3),
    ]
    for dp, tp, zero in configs:
        r = measure_training(
            dp, tp, zero, tuple(args.train), tuple(check), args.layers, args.regions
        )
        print(
            f"| {r['mesh']} | {r['zero']} | {r['collectives']} | {r['received']:.0f} | {r['formula']:.0f} "
            f"| {r['ratio']:.2f} | {r['comm_us']:.1f} | {r['params']} / {r['grads']} / {r['state']} | {r['error']:.1e} |"
        )


if __name__ == "__main__":
    main()
