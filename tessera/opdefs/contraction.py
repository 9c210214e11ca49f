"""``graph.matmul``: ``[..., m, k] @ [..., k, n] -> [..., m, n]`` with broadcast batch dims.

Sharded with ``k`` a reduction factor (a split ``k`` makes the result partial), linear in
either operand, and lowered by the matmul kernel (``codegen.kernels.lower_matmul``:
``tile.dot`` tiles with an f32 accumulator) that takes elementwise epilogues.
"""

from __future__ import annotations

from typing import Any

import torch
from xdsl.ir import SSAValue

from tessera.ir import graph
from tessera.ir.abstract import AbstractTensor, aval
from tessera.ir.grad_builder import GradBuilder
from tessera.ir.sharding_rules import FactorKind, RuleBuilder, ShardingRule
from tessera.opdefs.registry import Cotangents, Fusion, Kernel, on_operands, register


def _matmul_sharding(
    operands: list[AbstractTensor], results: list[AbstractTensor], attrs: dict[str, Any]
) -> ShardingRule:
    """``(..., m, k), (..., k, n) -> (..., m, n)`` with ``k`` a reduction factor."""
    lhs, rhs = operands
    out = results[0].shape
    b = RuleBuilder()
    batch = tuple(b.new(s) for s in out[:-2])
    m, n = b.new(out[-2]), b.new(out[-1])
    k = b.new(lhs.shape[-1], FactorKind.REDUCTION)
    batch_shape = out[:-2]
    lhs_dims = (*b.aligned(lhs.shape[:-2], batch, batch_shape), m, k)
    rhs_dims = (*b.aligned(rhs.shape[:-2], batch, batch_shape), k, n)
    return b.rule([lhs_dims, rhs_dims], [(*batch, m, n)])


def _matmul_vjp(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
    """dA = dC Bᵀ, dB = Aᵀ dC, summed over broadcast batch dims."""
    lhs, rhs = op.operands
    ct = cts[0]
    assert ct is not None

    def swap(value: SSAValue) -> SSAValue:
        rank = aval(value).rank
        return b.op(graph.TransposeOp, value, perm=[*range(rank - 2), rank - 1, rank - 2])

    lhs_ct = b.op(graph.MatmulOp, ct, swap(rhs))
    rhs_ct = b.op(graph.MatmulOp, swap(lhs), ct)
    return [b.unbroadcast(lhs_ct, aval(lhs).shape), b.unbroadcast(rhs_ct, aval(rhs).shape)]


register(
    graph.MatmulOp,
    sharding=_matmul_sharding,
    partial=(0, 1),
    vjp=_matmul_vjp,
    reference=on_operands(torch.matmul),
    tile=Kernel("matmul"),
    fusion=Fusion.MATMUL,
)
