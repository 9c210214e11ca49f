"""How long a kernel computes on a :class:`~tessera.topology.Device` (a roofline).

A kernel is bound by its arithmetic or by its memory traffic, whichever is slower, plus
the launch overhead:

    time = launch + max(flops / (peak[dtype] · matmul_efficiency),
                        bytes / (memory_bandwidth · memory_efficiency))

- flops: ``2·m·n·k`` per matmul (times its batch); attention (a fused ``softmax(q kᵀ) v``
  or ``graph.attention``) is its two matmuls, its backward kernel seven, halved when causal
  (the kernels skip masked blocks); other ops are memory-bound, and their arithmetic is
  not counted.
- bytes: what crosses the kernel's boundary, its inputs and outputs (a fused kernel keeps
  its intermediates in registers and shared memory), plus constants passed by pointer.

A kernel that only re-views memory costs nothing (:func:`is_view`): a reshape (row-major
data keep their order), a slice that keeps one contiguous block, and a concatenation of
such blocks whose producers write straight into it (XLA and PyTorch make these views or
in-place writes). Tessera's runtime still copies in these kernels; the model prices
what a buffer-aware runtime does.
"""

from __future__ import annotations

from math import prod

from xdsl.ir import SSAValue

from tessera.ir import graph, schedule
from tessera.ir.abstract import aval
from tessera.topology import Device


def matmul_flops(op: graph.GraphOp) -> float:
    """``2·m·n·k`` times the batch of a ``graph.matmul``."""
    lhs = aval(op.operands[0])
    return 2.0 * prod(aval(op.results[0]).shape) * lhs.shape[-1]


def attention_flops(op: graph.GraphOp) -> float:
    """The matmul FLOPs of ``graph.attention`` (``q kᵀ`` and ``p v``) or of its backward
    kernel (``q kᵀ`` and ``do vᵀ`` in each of its two loops, ``pᵀ do``, ``dsᵀ q``, ``ds
    k``: atomic-free, it recomputes two products), halved when causal."""
    q, v = aval(op.operands[0]), aval(op.operands[2])
    d, dv, keys = q.shape[-1], v.shape[-1], v.shape[-2]
    backward = isinstance(op, graph.AttentionBackwardOp)
    per_row = 2.0 * keys * ((4 * d + 3 * dv) if backward else d + dv)  # per query row
    flops = prod(q.shape[:-1]) * per_row
    return flops / 2 if op.attrs()["causal"] else flops


def kernel_flops(kernel: schedule.KernelOp) -> float:
    """The matmul FLOPs of a kernel's body (half for a causal attention kernel)."""
    from tessera.codegen.attention import match_attention

    ops = kernel.body.block.ops
    flops = sum(matmul_flops(op) for op in ops if isinstance(op, graph.MatmulOp))
    flops += sum(
        attention_flops(op)
        for op in ops
        if isinstance(op, graph.AttentionOp | graph.AttentionBackwardOp)
    )
    attention = match_attention(kernel)
    return flops / 2 if attention is not None and attention.causal else flops


def kernel_bytes(kernel: schedule.KernelOp) -> int:
    """Bytes read and written at the kernel's boundary: an input read only by slices
    counts the windows it reads."""
    constants = [
        op.results[0]
        for op in kernel.body.block.ops
        if isinstance(op, graph.ConstantOp) and aval(op.results[0]).size > 1
    ]
    reads = sum(
        _read_bytes(value, argument)
        for value, argument in zip(kernel.inputs, kernel.body.block.args, strict=False)
    )
    return reads + sum(aval(v).nbytes for v in [*kernel.results, *constants])


def _read_bytes(value: SSAValue, argument: SSAValue) -> int:
    """What a kernel reads of ``value`` (its block argument ``argument``)."""
    users = [use.operation for use in argument.uses]
    if users and all(isinstance(u, graph.SliceOp) for u in users):
        return min(aval(value).nbytes, sum(aval(u.results[0]).nbytes for u in users))
    return aval(value).nbytes


def compute_time(device: Device, flops: float, nbytes: float, dtype: str) -> float:
    """The roofline time of ``flops`` in ``dtype`` and ``nbytes`` of memory traffic."""
    peak = device.matmul_flops.get(dtype) or max(device.matmul_flops.values())
    arithmetic = flops / (peak * device.matmul_efficiency) if flops else 0.0
    memory = nbytes / (device.memory_bandwidth * device.memory_efficiency)
    return device.launch_overhead_s + max(arithmetic, memory)


def _contiguous_block(shape: tuple[int, ...], axis: int) -> bool:
    """Whether pieces along ``axis`` of a row-major ``shape`` are contiguous blocks."""
    return all(d == 1 for d in shape[:axis])


def runs_as_view(kernel: schedule.KernelOp) -> bool:
    """Whether the kernel is reshapes and contiguous slices only, which the runtime
    computes as a torch view of its contiguous input: no code, no launch, no copy (so
    ``lower-schedule-to-tile`` gives it no tile kernel)."""
    body = kernel.body.block.ops
    return is_view(kernel) and all(
        isinstance(o, (graph.ReshapeOp, graph.SliceOp, schedule.YieldOp)) for o in body
    )


def runs_on_host(kernel: schedule.KernelOp) -> bool:
    """Whether the kernel holds an op without generated code (``Fusion.HOST``: MoE
    routing, top-k), which the runtime computes by the ops' references (so
    ``lower-schedule-to-tile`` gives it no tile kernel)."""
    from tessera.opdefs import Fusion, fusion_of

    return any(fusion_of(o) is Fusion.HOST for o in kernel.body.block.ops)


def is_view(kernel: schedule.KernelOp) -> bool:
    """Whether the kernel only re-views its input: reshapes, contiguous slices, or a
    concatenation of contiguous blocks made for it alone (each piece's producer writes
    into its place)."""
    ops = [o for o in kernel.body.block.ops if not isinstance(o, schedule.YieldOp)]
    if not ops:
        return False
    for op in ops:
        if isinstance(op, graph.ReshapeOp):
            continue
        if isinstance(op, graph.SliceOp):
            attrs = op.attrs()
            source = aval(op.operands[0]).shape
            cut = [
                d
                for d, (lo, hi) in enumerate(zip(attrs["starts"], attrs["limits"], strict=True))
                if (lo, hi) != (0, source[d])
            ]
            steps = attrs.get("strides") or [1] * len(source)
            if len(cut) > 1 or any(s != 1 for s in steps):
                return False
            if cut and not _contiguous_block(aval(op.results[0]).shape, cut[0]):
                return False
            continue
        if isinstance(op, graph.ConcatOp):
            if not _contiguous_block(aval(op.results[0]).shape, op.attrs()["axis"]):
                return False
            if len(ops) != 1 or any(len(list(v.uses)) != 1 for v in kernel.inputs):
                return False
            continue
        return False
    return True


def kernel_time(device: Device, kernel: schedule.KernelOp) -> float:
    """Modelled time of one ``schedule.kernel`` on ``device`` (0 for a view)."""
    if is_view(kernel):
        return 0.0
    matmuls = [
        op
        for op in kernel.body.block.ops
        if isinstance(op, graph.MatmulOp | graph.AttentionOp | graph.AttentionBackwardOp)
    ]
    dtype = str(aval(matmuls[0].operands[0]).dtype) if matmuls else "f32"
    return compute_time(device, kernel_flops(kernel), kernel_bytes(kernel), dtype)
