"""``--dry-run``: a chosen strategy compiled at reduced width and one training step run on
the virtual mesh.

The model keeps its structure (attention heads to KV heads ratio, MLP kind, the strategy's
layout) at small sizes: ``pp · virtual`` layers (one per stage), hidden ``16 · heads``
with heads reduced to ``2 · tp``, sequence ``8 · cp``; each mesh axis keeps the
strategy's size up to ``max_axis`` (the virtual mesh runs every rank in one process).
The step is ``graph.training_step`` (AdamW, the strategy's ZeRO stage and precision, Megatron layout
over tp, batch over dp, sequence over cp, pipelined over pp with its schedule; Tessera's
pipelined steps run ZeRO-0 and split the batch over dp themselves, so a pipelined plan's
dry run does that) of the
Tessera layer (:func:`tessera.plan.layer.transformer_layer`, or the model's own
``layer=`` function); the loss must be finite.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from tessera import dist, graph, op, optim, schedule
from tessera.plan.layer import LayerShape, layer_of, layer_param_shapes, layer_shardings
from tessera.plan.models import ModelSpec
from tessera.plan.strategy import Strategy


@dataclass(frozen=True)
class DryRun:
    strategy: Strategy  # the reduced mesh's strategy
    layers: int
    hidden: int
    loss: float
    collectives: tuple[str, ...]


def reduced(s: Strategy, max_axis: int = 2) -> Strategy:
    """The strategy with each mesh axis capped at ``max_axis``."""
    dp = min(s.dp, max_axis)
    ep = min(s.ep, dp) if dp % min(s.ep, dp) == 0 else 1
    return replace(s, dp=dp, tp=min(s.tp, max_axis), pp=min(s.pp, max_axis),
                   cp=min(s.cp, max_axis), ep=ep)  # fmt: skip


def dry_run(
    model: ModelSpec, s: Strategy, max_axis: int = 2, seed: int = 0, kernels: str = "reference"
) -> DryRun:
    """Compiles ``s`` (axes capped) at reduced width and runs one step on the virtual mesh
    (``kernels="triton"``: the generated kernels, slow under Triton's CPU interpreter)."""
    small = reduced(s, max_axis)
    group = model.heads // model.kv_heads
    kv_heads = small.tp
    heads = min(group, 4) * kv_heads
    hidden = 16 * heads
    seq = 8 * small.cp
    ffn = 2 * hidden
    layers = small.pp * (small.virtual if small.schedule == "interleaved" else 1)
    shape = LayerShape(hidden, heads, kv_heads, 16, ffn, model.mlp, seq, 1, small.tp, small.cp,
                       small.sp and small.tp > 1, layer=model.layer)  # fmt: skip
    block = layer_of(shape)
    x_spec, specs = layer_shardings(shape)
    microbatches = 2 * small.pp if small.pp > 1 else 1
    batch = small.dp * microbatches
    axes = {"pp": small.pp} if small.pp > 1 else {}
    axes |= {"dp": small.dp, "cp": small.cp, "tp": small.tp}
    mesh = dist.mesh(axes)
    g = torch.Generator().manual_seed(seed)
    params = {
        f"{name}{i}": torch.randn(size, generator=g) * (size[0] ** -0.5 if len(size) > 1 else 1)
        for i in range(layers)
        for name, size in layer_param_shapes(shape).items()
    }
    shardings = {f"{name}{i}": specs[name] for i in range(layers) for name in specs}
    batch_axes = ("dp",) + (x_spec.mesh_axes if x_spec is not None else ())
    batch_spec = dist.ShardSpec(partition=(0,) + (1,) * (len(batch_axes) - 1), mesh_axes=batch_axes)
    residual = x_spec if shape.sp else None

    def step(p, x):
        for i in range(layers):
            if i and small.pp > 1:
                graph.stage()
            layer = {name: p[f"{name}{i}"] for name in specs}
            x = block(x, layer, heads, kv_heads, model.mlp, residual)
        loss = op.mean(x * x)
        return graph.backward(loss), {"loss": loss}

    x = torch.randn(batch, seq, hidden, generator=g)
    if small.pp > 1:
        virtual = small.virtual if small.schedule == "interleaved" else 1
        schedule.pipeline_microbatches(microbatches, kind=small.schedule, virtual=virtual)
    zero = 0 if small.pp > 1 else small.zero  # Tessera's pipelined steps run ZeRO-0 only
    training = graph.training_step(
        step, optimizer=optim.AdamW(lr=1e-3), mesh=mesh, zero=zero, kernels=kernels,
        param_shardings=shardings, batch_shardings=None if small.pp > 1 else (batch_spec,),
        precision=small.precision,
    )  # fmt: skip
    state = training.init(params)
    loss = float(training(state, x)["loss"])
    kinds: tuple[str, ...] = ()
    if small.pp == 1:
        found = training.lower(state, x).collectives()
        kinds = tuple(sorted({f"{c.kind}[{','.join(c.mesh_axes)}]" for c in found}))
    return DryRun(small, layers, hidden, loss, kinds)
