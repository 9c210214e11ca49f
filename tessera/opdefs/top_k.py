"""``graph.top_k``: the ``k`` largest entries of the last dim and their indices.

Sharding: the leading dims are parallel, the last dim is needed whole (``REPLICATED``:
the top k of a slice are not the top k of the row). The VJP scatters the values'
cotangent back to the chosen positions (a one-hot of the indices against an iota);
the indices have none. Ties go to the lower index (a stable sort). Tile code: none yet,
the op runs on the host (:attr:`Fusion.HOST`), as MoE routing's integer bookkeeping does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from tessera.ir import graph
from tessera.ir.abstract import AbstractTensor, aval
from tessera.ir.grad_builder import GradBuilder
from tessera.ir.sharding_rules import FactorKind, RuleBuilder, ShardingRule
from tessera.opdefs.registry import NOT_LINEAR, Cotangents, Fusion, NotApplicable, bound, register

HOST_TILE = NotApplicable("computed on the host by its reference (Fusion.HOST)")


def _top_k_sharding(
    operands: list[AbstractTensor], results: list[AbstractTensor], attrs: dict[str, Any]
) -> ShardingRule:
    """Leading dims parallel; the searched dim and the k results whole."""
    (x,) = operands
    b = RuleBuilder()
    lead = tuple(b.new(s) for s in x.shape[:-1])
    row = b.new(x.shape[-1], FactorKind.REPLICATED)
    chosen = b.new(attrs["k"], FactorKind.REPLICATED)
    return b.rule([(*lead, row)], [(*lead, chosen), (*lead, chosen)])


@bound
def _top_k_reference(op: graph.TopKOp) -> Callable[[torch.Tensor], tuple[torch.Tensor, ...]]:
    """The first ``k`` of a stable descending sort of the last dim, i32 indices: largest
    first, equal values in index order (the lower index wins a tie). Not ``torch.topk``,
    whose order among equal values is unspecified (on a CPU, eight equal values give
    indices 6, 5, ...; it changes with the row's length and the device), so that MoE
    routing is the same on every backend and device."""
    k = op.attrs()["k"]

    def run(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        values, indices = torch.sort(x, dim=-1, descending=True, stable=True)
        return values[..., :k].contiguous(), indices[..., :k].to(torch.int32).contiguous()

    return run


def _top_k_vjp(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
    """``dx[..., n] = sum_j ct[..., j] * (indices[..., j] == n)``."""
    ct = cts[0]
    if ct is None:
        return [None]
    x = op.operands[0]
    shape = aval(x).shape
    k = op.attrs()["k"]
    indices = op.results[1]
    lead = shape[:-1]
    chosen = b.reshape(indices, (*lead, k, 1))
    hit = b.op(graph.CompareOp, chosen, b.iota(indices, shape[-1], (shape[-1],)), predicate="eq")
    spread = b.mul(b.cast(hit, ct), b.reshape(ct, (*lead, k, 1)))
    return [b.sum(spread, [len(lead)])]


register(
    graph.TopKOp,
    sharding=_top_k_sharding,
    partial=NOT_LINEAR,
    vjp=_top_k_vjp,
    reference=_top_k_reference,
    tile=HOST_TILE,
    fusion=Fusion.HOST,
)
