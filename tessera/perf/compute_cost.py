"""How long a kernel computes on a :class:`~tessera.perf.topology.Device` (a roofline).

A kernel is bound by its arithmetic or by its memory traffic, whichever is slower, plus
the launch overhead:

    time = launch + max(flops / (peak[dtype] · matmul_efficiency),
                        bytes / (memory_bandwidth · memory_efficiency))

- flops: ``2·m·n·k`` per matmul (times its batch); attention (a fused ``softmax(q kᵀ) v``)
  is its two matmuls, halved when causal (the kernel skips masked blocks); other ops
  are memory-bound, and their arithmetic is not counted.
- bytes: what crosses the kernel's boundary, its inputs and outputs (a fused kernel keeps
  its intermediates in registers and shared memory), plus constants passed by pointer.
"""

from __future__ import annotations

from math import prod

from tessera.ir import graph, schedule
from tessera.ir.abstract import aval
from tessera.perf.topology import Device


def matmul_flops(op: graph.GraphOp) -> float:
    """``2·m·n·k`` times the batch of a ``graph.matmul``."""
    lhs = aval(op.operands[0])
    return 2.0 * prod(aval(op.results[0]).shape) * lhs.shape[-1]


def kernel_flops(kernel: schedule.KernelOp) -> float:
    """The matmul FLOPs of a kernel's body (half for a causal attention kernel)."""
    from tessera.codegen.attention import match_attention

    flops = sum(
        matmul_flops(op) for op in kernel.body.block.ops if isinstance(op, graph.MatmulOp)
    )
    attention = match_attention(kernel)
    return flops / 2 if attention is not None and attention.causal else flops


def kernel_bytes(kernel: schedule.KernelOp) -> int:
    """Bytes read and written at the kernel's boundary."""
    boundary = [*kernel.inputs, *kernel.results]
    constants = [
        op.results[0]
        for op in kernel.body.block.ops
        if isinstance(op, graph.ConstantOp) and aval(op.results[0]).size > 1
    ]
    return sum(aval(v).nbytes for v in [*boundary, *constants])


def compute_time(device: Device, flops: float, nbytes: float, dtype: str) -> float:
    """The roofline time of ``flops`` in ``dtype`` and ``nbytes`` of memory traffic."""
    peak = device.matmul_flops.get(dtype) or max(device.matmul_flops.values())
    arithmetic = flops / (peak * device.matmul_efficiency) if flops else 0.0
    memory = nbytes / (device.memory_bandwidth * device.memory_efficiency)
    return device.launch_overhead_s + max(arithmetic, memory)


def kernel_time(device: Device, kernel: schedule.KernelOp) -> float:
    """Modelled time of one ``schedule.kernel`` on ``device``."""
    matmuls = [op for op in kernel.body.block.ops if isinstance(op, graph.MatmulOp)]
    dtype = str(aval(matmuls[0].operands[0]).dtype) if matmuls else "f32"
    return compute_time(device, kernel_flops(kernel), kernel_bytes(kernel), dtype)
