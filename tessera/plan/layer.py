"""The transformer layer of a :class:`~tessera.plan.models.ModelSpec`, written in Tessera,
and its compiled profile per strategy.

:func:`transformer_layer` is one pre-norm block: attention with grouped-query heads
(``op.attention``, causal) and a SwiGLU or GELU MLP, with the residual stream
``[batch, seq, hidden]``. Its weights are laid out Megatron-style over ``tp`` (q, k, v and
the MLP's first matmuls by columns, the output projections by rows) and the sequence is
split over ``cp`` (context parallelism by all-gather of K/V). An MoE layer is compiled as
the dense layer its tokens see: an MLP of ``(top_k + shared) · expert_ffn`` (the same
matmul FLOPs per token); expert parallelism's all-to-alls are priced analytically by the
caller.

:func:`profile_layer` compiles the layer's gradient (``ts.grad``) at the model's real
widths from abstract arrays (``device="meta"``: shapes and dtypes, no data), runs the
Schedule IR passes, and reads from them: the simulated time of its forward (the ops the
layer's output depends on, :func:`forward_ops`) and of the whole program on the cluster (``tessera.perf.simulate``); the *saved
activations* (:func:`saved_activations`: the per-rank values the scheduled gradient
program's forward kernels make and its backward kernels read, the bytes one layer keeps
per microbatch in flight);
and ``plan-memory``'s peak of the gradient program less its arguments and results (the
working set while one layer runs its backward: its saved values plus transients).
For a GPT layer (GELU MLP of 4h, no dropout, flash attention) the saved bytes are
Korthikanti et al. 2022's ``s·b·h·(10 + 24/t)`` without sequence parallelism and
``34·s·b·h/t`` with it (no ``a·s²`` term: the scores are recomputed by the fused
attention), plus the attention's f32 log-sum-exp: the two dropout masks the formula
counts (2sbh) are absent and flash attention's output (2sbh) present. A SwiGLU MLP of
width f keeps four ``s·b·f`` values (both projections, the SiLU and the product): Llama 3
405B's layer (f = 3.25h, 8 KV heads of 128) keeps 40.3·s·b·h/t with sequence parallelism.
Profiles are cached by what the per-rank program depends on, so a search compiles each
distinct layer program once.
"""

from __future__ import annotations

import dataclasses
import functools
import multiprocessing
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from xdsl.dialects import func
from xdsl.ir import Operation

from tessera import dist, op
from tessera.autodiff.api import grad
from tessera.errors import TesseraError
from tessera.ir.abstract import AbstractTensor
from tessera.jit_function import jit
from tessera.plan.models import ModelSpec
from tessera.topology import Topology

COLUMNS = ("wq", "wk", "wv", "w1", "w3")
ROWS = ("wo", "w2")


@dataclass(frozen=True)
class LayerShape:
    """What a layer's per-rank program depends on."""

    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    mlp: str
    seq: int
    micro_batch: int
    tp: int
    cp: int
    sp: bool = False  # sequence parallelism: the residual stream split over tp too
    dtype: str = "bfloat16"  # of activations and weights (tests compare float32 steps)
    layer: str = ""  # a Tessera layer function ("module:function"); "": transformer_layer

    @staticmethod
    def of(
        model: ModelSpec, seq: int, micro_batch: int, tp: int, cp: int, sp: bool = False
    ) -> LayerShape:
        return LayerShape(
            model.hidden, model.heads, model.kv_heads, model.head_dim, model.active_ffn(),
            model.mlp, seq, micro_batch, tp, cp, sp and tp > 1, layer=model.layer,
        )  # fmt: skip


@dataclass(frozen=True)
class LayerProfile:
    """One layer's compiled, simulated per-rank program (one microbatch)."""

    shape: LayerShape
    forward_s: float
    backward_s: float  # the gradient program's time less the forward's
    forward_exposed_comm_s: float
    backward_exposed_comm_s: float
    stash_bytes: int  # forward values the backward reads (saved_activations), per rank
    input_bytes: int  # the layer's per-rank input (kept under full recomputation)
    work_bytes: int = 0  # plan-memory peak of the gradient program less its arguments and results
    attention_forward_flops: float = 0.0  # the attention kernels' matmul FLOPs, per rank
    attention_backward_flops: float = 0.0


def transformer_layer(
    x: Any, p: dict[str, Any], heads: int, kv_heads: int, mlp: str, residual: Any = None
) -> Any:
    """One pre-norm decoder block on ``x [batch, seq, hidden]``; ``residual``: a layout the
    residual stream is constrained to after each block (sequence parallelism)."""
    batch, seq, _ = x.shape

    def keep(t: Any) -> Any:
        return dist.shard(t, residual) if residual is not None else t

    head_dim = p["wq"].shape[1] // heads

    def split_heads(t: Any, count: int) -> Any:
        return op.transpose(op.reshape(t, (batch, seq, count, head_dim)), (0, 2, 1, 3))

    h = op.layer_norm(x, weight=p["ln1"])
    q = split_heads(h @ p["wq"], heads)
    k = split_heads(h @ p["wk"], kv_heads)
    v = split_heads(h @ p["wv"], kv_heads)
    attention = op.attention(q, k, v, causal=True)
    merged = op.reshape(op.transpose(attention, (0, 2, 1, 3)), (batch, seq, heads * head_dim))
    x = keep(x + merged @ p["wo"])
    h = op.layer_norm(x, weight=p["ln2"])
    up = h @ p["w1"]
    inner = op.silu(up) * (h @ p["w3"]) if mlp == "swiglu" else op.gelu(up)
    return keep(x + inner @ p["w2"])


def layer_loss(
    x: Any, p: dict[str, Any], heads: int, kv_heads: int, mlp: str, residual: Any = None
) -> Any:
    """A scalar of the layer's output, to differentiate (its gradient is the backward),
    and the output itself (``has_aux``): the forward is what the output depends on."""
    out = transformer_layer(x, p, heads, kv_heads, mlp, residual)
    return op.sum(out), out


def layer_of(shape: LayerShape) -> Callable[..., Any]:
    """The layer function ``shape`` compiles: the model's own, else :func:`transformer_layer`."""
    if not shape.layer:
        return transformer_layer
    from tessera.plan.models import layer_function

    return layer_function(shape.layer)


def _loss_of(layer: Callable[..., Any]) -> Callable[..., Any]:
    if layer is transformer_layer:
        return layer_loss

    def loss(
        x: Any, p: dict[str, Any], heads: int, kv_heads: int, mlp: str, residual: Any = None
    ) -> Any:
        out = layer(x, p, heads, kv_heads, mlp, residual)
        return op.sum(out), out

    loss.__name__ = f"{getattr(layer, '__name__', 'layer')}_loss"
    return loss


def layer_param_shapes(shape: LayerShape) -> dict[str, tuple[int, ...]]:
    q, kv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    shapes = {
        "ln1": (shape.hidden,), "ln2": (shape.hidden,),
        "wq": (shape.hidden, q), "wk": (shape.hidden, kv), "wv": (shape.hidden, kv),
        "wo": (q, shape.hidden), "w1": (shape.hidden, shape.ffn), "w2": (shape.ffn, shape.hidden),
    }  # fmt: skip
    if shape.mlp == "swiglu":
        shapes["w3"] = (shape.hidden, shape.ffn)
    return shapes


def layer_shardings(shape: LayerShape) -> tuple[Any, dict[str, Any]]:
    """The residual stream's layout (sequence over cp, and over tp with sequence
    parallelism) and the weights' (Megatron over tp)."""
    columns = dist.ShardSpec(partition=(1,), mesh_axes=("tp",))
    rows = dist.ShardSpec(partition=(0,), mesh_axes=("tp",))
    specs = {
        name: columns if name in COLUMNS else rows if name in ROWS else None
        for name in layer_param_shapes(shape)
    }
    axes = (("cp",) if shape.cp > 1 else ()) + (("tp",) if shape.sp else ())
    x_spec = dist.ShardSpec(partition=(1,) * len(axes), mesh_axes=axes) if axes else None
    return x_spec, specs


def layer_mesh(shape: LayerShape, topology: Topology | None = None) -> dist.Mesh:
    """The layer's cp × tp mesh, on the first ranks of ``topology`` when given."""
    machine = None if topology is None else layer_machine(topology, shape.cp * shape.tp)
    return dist.mesh({"cp": shape.cp, "tp": shape.tp}, topology=machine)


def layer_machine(topology: Topology, size: int) -> Topology:
    """The first ``size`` ranks of ``topology``, where one layer's tp × cp group runs: its
    levels up to the first that holds them all, that one cut to ``size`` (the whole
    topology when the cut would not nest, e.g. 12 ranks in groups of 8). Clusters that
    differ only outside the group (``dgx_h100x4``, ``dgx_h100x16`` for 8 ranks) give
    equal machines, so the layer compiles once for both."""
    inner = [link for link in topology.levels if link.group_size < size]
    outer = next((link for link in topology.levels if link.group_size >= size), None)
    if outer is None or any(size % link.group_size for link in inner):
        return topology
    levels = (*inner, dataclasses.replace(outer, group_size=size))
    sharp = topology.sharp if topology.sharp and topology.sharp.level < len(levels) else None
    return dataclasses.replace(
        topology, name=f"{topology.name}[:{size}]", num_devices=size, levels=levels, sharp=sharp
    )


def _machine_key(topology: Topology | None, size: int) -> str:
    """What a layer's compile depends on of ``topology`` (None: the mesh's default)."""
    if topology is None:
        return ""
    machine = layer_machine(topology, size)
    return repr((machine.device, machine.levels, machine.sharp))


def compile_layer(
    shape: LayerShape,
    dtype: torch.dtype = torch.bfloat16,
    device: str = "meta",
    topology: Topology | None = None,
) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """The jitted gradient of the layer (its loss's, with the layer's output as ``has_aux``)
    and its example arguments, compiled for the first tp × cp ranks of ``topology`` (the
    collective algorithms, overlap and collective-matmul choices of that machine)."""
    x_spec, specs = layer_shardings(shape)
    mesh = layer_mesh(shape, topology)
    params = {
        n: torch.empty(s, dtype=dtype, device=device) for n, s in layer_param_shapes(shape).items()
    }
    x = torch.empty(shape.micro_batch, shape.seq, shape.hidden, dtype=dtype, device=device)
    static = (shape.heads, shape.kv_heads, shape.mlp, x_spec if shape.sp else None)
    shardings = (x_spec, specs, None, None, None, None)
    gradient = jit(
        grad(_loss_of(layer_of(shape)), argnums=(0, 1), has_aux=True),
        static_argnums=(2, 3, 4, 5), mesh=mesh, in_shardings=shardings,
    )  # fmt: skip
    return gradient, (x, params, *static)


@functools.lru_cache(maxsize=32)
def fp8_unsupported(layer: str, mlp: str) -> str | None:
    """Why a model's layer cannot run with fp8 matmuls (the error tracing it as
    ``graph.training_step(precision="fp8")`` does, at a reduced width), None when it can:
    the built-in :func:`transformer_layer` always can (its matmuls are bf16)."""
    if not layer:
        return None
    shape = LayerShape(32, 2, 1, 16, 64, mlp, 8, 1, 1, 1, layer=layer)
    gradient, args = compile_layer(shape)
    try:
        with op.fp8_matmuls(True):
            gradient.lower(*args)
    except TesseraError as error:
        return str(error).splitlines()[0]
    return None


def _argument_bytes(module: Any, name: str) -> int:
    function = _function(module, name)
    args = sum(AbstractTensor.from_xdsl(a.type).nbytes for a in function.body.block.args)
    results = sum(AbstractTensor.from_xdsl(t).nbytes for t in function.function_type.outputs)
    return args + results


VIEWS = ("graph.reshape", "graph.shard")  # results that alias their operand


def _function(module: Any, name: str) -> func.FuncOp:
    return next(o for o in module.ops if isinstance(o, func.FuncOp) and o.sym_name.data == name)


def forward_ops(function: func.FuncOp) -> set[Operation]:
    """The ops of a gradient program of :func:`layer_loss` that its last result (the
    layer's output) depends on: the layer's forward, as the gradient program runs it."""
    output = list(function.body.block.ops)[-1].operands[-1]
    forward: set[Operation] = set()
    stack = [output.owner] if isinstance(output.owner, Operation) else []
    while stack:
        node = stack.pop()
        if node in forward:
            continue
        forward.add(node)
        stack.extend(v.owner for v in node.operands if isinstance(v.owner, Operation))
    return forward


def saved_activations(module: Any, name: str) -> tuple[int, list[tuple[str, int]]]:
    """The per-rank bytes of the forward values the backward reads (the activations a
    layer keeps per microbatch between its forward and its backward), and each value's
    producing op and bytes.

    ``module`` is the scheduled (or partitioned) gradient program of :func:`layer_loss`,
    per-rank shapes, with the layer's output as the last result: the *forward* is the ops
    (kernels, after fusion) that output depends on; the *saved* values are the results of forward ops
    (and the layer input) read by any other op, those computed from parameters alone
    left out (gathered or transposed weights: model state, re-made in the backward). A
    view (reshape, sharding constraint) of a value counts once, as its base."""
    function = _function(module, name)
    block = function.body.block
    ops = list(block.ops)
    forward = forward_ops(function)
    x = block.args[0]
    activation: set[Any] = {x}  # values that depend on the layer input
    for node in ops:
        if any(v in activation for v in node.operands):
            activation.update(node.results)

    def base(value: Any) -> Any:
        while isinstance(value.owner, Operation) and value.owner.name in VIEWS:
            value = value.owner.operands[0]
        return value

    saved: dict[Any, str] = {}
    for node in ops[:-1]:
        if node in forward:
            continue
        for v in node.operands:
            made_forward = v is x or (isinstance(v.owner, Operation) and v.owner in forward)
            if made_forward and v in activation:
                root = base(v)
                saved.setdefault(root, "input" if root is x else root.owner.name)
    parts = [(what, AbstractTensor.from_xdsl(v.type).nbytes) for v, what in saved.items()]
    return sum(n for _, n in parts), parts


def _attention_flops(ops: Iterable[Operation]) -> float:
    """The matmul FLOPs of the attention ops (forward and backward kernels) in ``ops``."""
    from tessera.ir import graph
    from tessera.perf.compute_cost import attention_flops

    return sum(
        attention_flops(o)
        for top in ops
        for o in top.walk()
        if isinstance(o, graph.AttentionOp | graph.AttentionBackwardOp)
    )


_LOWERED: dict[tuple[LayerShape, str], Any] = {}
_PROFILES: dict[tuple[LayerShape, str], LayerProfile] = {}


def lowered_layer(shape: LayerShape, topology: Topology | None = None) -> Any:
    """The lowered gradient program of ``shape`` on ``topology``'s first tp × cp ranks
    (compiled once per shape and :func:`layer_machine`; the forward is the part of it
    that the layer's output depends on, :func:`forward_ops`)."""
    key = (shape, _machine_key(topology, shape.cp * shape.tp))
    if key not in _LOWERED:
        gradient, args = compile_layer(shape, getattr(torch, shape.dtype), topology=topology)
        _LOWERED[key] = gradient.lower(*args)
    return _LOWERED[key]


def profile_layer(shape: LayerShape, topology: Topology, exact: bool = True) -> LayerProfile:
    """The layer's simulated times and memory on ``topology`` (cached per shape and machine).

    One program is compiled per shape, the gradient: the forward's time is the
    simulation of its forward ops alone (:func:`forward_ops`), the backward's the whole
    program's less that.
    ``exact=False`` (a search's screening pass) profiles one sequence per microbatch and
    scales times and bytes by ``micro_batch``; the finalists are profiled exactly."""
    if not exact and shape.micro_batch > 1:
        one = profile_layer(dataclasses.replace(shape, micro_batch=1), topology)
        b = shape.micro_batch
        return dataclasses.replace(
            one, shape=shape, forward_s=b * one.forward_s, backward_s=b * one.backward_s,
            forward_exposed_comm_s=b * one.forward_exposed_comm_s,
            backward_exposed_comm_s=b * one.backward_exposed_comm_s,
            stash_bytes=b * one.stash_bytes, input_bytes=b * one.input_bytes,
            work_bytes=b * one.work_bytes,
            attention_forward_flops=b * one.attention_forward_flops,
            attention_backward_flops=b * one.attention_backward_flops,
        )  # fmt: skip
    key = _profile_key(shape, topology)
    if key in _PROFILES:
        return _PROFILES[key]
    from tessera.perf.simulate import simulate

    lowered = lowered_layer(shape, topology)
    module = lowered.module_at("schedule")
    function = _function(module, lowered.name)
    forward = forward_ops(function)
    fwd = simulate(module, lowered.name, lowered.mesh, topology, only=forward)
    both = lowered.simulate(topology)
    peak = lowered.memory().peak_bytes
    live = peak - _argument_bytes(module, lowered.name)
    saved, _ = saved_activations(module, lowered.name)
    width = torch.empty((), dtype=getattr(torch, shape.dtype)).element_size()
    local_x = shape.micro_batch * (shape.seq // shape.cp) * shape.hidden * width
    local_x //= shape.tp if shape.sp else 1
    attention_forward = _attention_flops(forward)
    profile = LayerProfile(
        shape=shape,
        forward_s=fwd.step_time_s,
        backward_s=max(0.0, both.step_time_s - fwd.step_time_s),
        forward_exposed_comm_s=fwd.exposed_comm_s,
        backward_exposed_comm_s=max(0.0, both.exposed_comm_s - fwd.exposed_comm_s),
        stash_bytes=max(saved, local_x),
        input_bytes=local_x,
        work_bytes=max(live, saved),
        attention_forward_flops=attention_forward,
        attention_backward_flops=_attention_flops(function.body.block.ops) - attention_forward,
    )
    _PROFILES[key] = profile
    return profile


def _profile_key(shape: LayerShape, topology: Topology) -> tuple[LayerShape, str]:
    return shape, topology.name + repr(topology.device)


# (shape, machine key) compiled by prefetch_profiles' workers
_PREFETCHED: set[tuple[LayerShape, str]] = set()


def compiled_count() -> int:
    """Distinct layer programs (one gradient program per shape and layer machine)
    compiled so far by this process and its :func:`prefetch_profiles` workers."""
    return len(_PREFETCHED | set(_LOWERED))


def prefetch_profiles(
    shapes: Iterable[LayerShape], topologies: Sequence[Topology], jobs: int
) -> None:
    """Profiles every shape on every topology (as :func:`profile_layer` does) in ``jobs``
    forked worker processes, one shape per task, so a search's independent layer
    compiles run in parallel (as ``make -j`` or TorchInductor's compile workers). The
    profiles are plain numbers, returned over a pipe; a shape a worker fails on is left
    for :func:`profile_layer` to compile (and report) in this process. Without ``fork``
    (not Linux or macOS), with ``jobs <= 1`` or with fewer than three shapes to compile
    this does nothing: :func:`profile_layer` compiles them when asked."""
    missing = list(
        dict.fromkeys(
            s for s in shapes if any(_profile_key(s, t) not in _PROFILES for t in topologies)
        )
    )
    if jobs <= 1 or len(missing) < 3 or "fork" not in multiprocessing.get_all_start_methods():
        return
    # the first shape here: the workers inherit the modules and caches compiling it
    # loaded (lazily imported passes, kernel templates), instead of each loading them
    for topology in topologies:
        profile_layer(missing[0], topology)
    missing = missing[1:]
    context = multiprocessing.get_context("fork")
    with context.Pool(
        min(jobs, len(missing)), initializer=torch.set_num_threads, initargs=(1,)
    ) as pool:
        for shape, profiles in zip(
            missing, pool.map(_profiles_of, [(s, list(topologies)) for s in missing]), strict=True
        ):
            if profiles is None:
                continue
            for topology, profile in zip(topologies, profiles, strict=True):
                _PREFETCHED.add((shape, _machine_key(topology, shape.cp * shape.tp)))
                _PROFILES[_profile_key(shape, topology)] = profile


def _profiles_of(task: tuple[LayerShape, list[Topology]]) -> list[LayerProfile] | None:
    """A worker's task: the shape's profile on each topology (None if it fails)."""
    shape, topologies = task
    try:
        return [profile_layer(shape, t) for t in topologies]
    except Exception:  # the parent compiles it again and reports the error
        return None
