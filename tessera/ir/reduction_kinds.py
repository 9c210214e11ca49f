"""Reduction kinds: the one table of ``sum``, ``mean``, ``max``, ``min`` and ``prod``.

A kind is named wherever a reduction appears: a graph reduction op (``graph.sum``), a
tile reduction (``tile.reduce``), a partial value (``partial = sum[tp]``: each rank
holds one term of the reduction) and the collective that resolves it
(``graph.all_reduce {kind = sum}``). Every module that needs a kind's identity, its
torch, torch.distributed or Triton form, or how its partial terms combine asks
:data:`KINDS`; none keeps a list of its own, so a new kind is one entry here (plus the
graph op and the ``tessera.op`` function that expose it, if any).

Reading or rewriting IR needs no torch: the torch, torch.distributed and Triton forms
are names, resolved when a program runs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tessera.dtypes import DType

if TYPE_CHECKING:
    import torch


_ONE_DIM_AT_A_TIME = frozenset({"prod"})  # torch reductions whose ``dim`` is one int


@dataclass(frozen=True)
class ReductionKind:
    """One reduction kind and its forms in torch, torch.distributed and Triton."""

    name: str
    identity_value: float  # no term changes the result: 0, 1, -inf (max) or inf (min)
    combine: str  # the kind that combines terms: itself, or sum for mean (then / count)
    linear: bool  # a partial value stays partial through linear ops (and reduce-scatters)
    selects: bool  # the result is one of the terms (max, min): exact in any order
    torch_name: str  # torch's reduction: torch.<torch_name>(x, dim, keepdim)
    dist_op: str  # torch.distributed.ReduceOp.<dist_op> (mean: SUM, then / group size)
    triton_reduce: str | None  # Triton's reduction function, or None: tl.reduce with ...
    triton_combine: str  # ... this combine of two terms ``a`` and ``b``

    @property
    def averages(self) -> bool:
        """Whether terms are summed, then divided by their count (mean)."""
        return self.combine != self.name

    @property
    def rounds(self) -> bool:
        """Whether combining terms rounds (sum, mean, prod): f16/bf16 terms combine in
        f32, and the deterministic numerics fix their order."""
        return not self.selects

    @property
    def idempotent(self) -> bool:
        """Whether copies of a value combine to the value (mean, max, min): a replicated
        value is a partial one as it is; otherwise (sum, prod) one rank holds the value
        and the others the identity."""
        return self.selects or self.averages

    def identity(self, dtype: DType) -> float | int:
        """The identity in ``dtype``: for integers the extreme of the type stands for
        ±inf (a bool's max is or, with identity 0; its min is and, with identity 1)."""
        if dtype.is_float:
            return self.identity_value
        bits = 1 if dtype == DType.i1 else 8 * dtype.itemsize
        if not math.isinf(self.identity_value):
            return int(self.identity_value)
        if bits == 1:
            return int(self.identity_value > 0)
        return 2 ** (bits - 1) - 1 if self.identity_value > 0 else -(2 ** (bits - 1))

    def torch_reduce(self, x: torch.Tensor, dims: Sequence[int], keepdim: bool) -> torch.Tensor:
        """``x`` reduced over ``dims`` (not empty) by torch (``torch.prod`` takes one dim
        at a time); the dtype is torch's (an int32 sum or product is int64)."""
        import torch

        fn = getattr(torch, self.torch_name)
        if self.torch_name not in _ONE_DIM_AT_A_TIME:
            return fn(x, dim=tuple(dims), keepdim=keepdim)
        for dim in sorted(dims, reverse=True):
            x = fn(x, dim=dim, keepdim=keepdim)
        return x

    def torch_dist_op(self) -> Any:
        """The ``torch.distributed.ReduceOp`` of this kind's collectives."""
        from torch import distributed

        return getattr(distributed.ReduceOp, self.dist_op)


KINDS: dict[str, ReductionKind] = {
    kind.name: kind
    for kind in (
        ReductionKind(
            "sum", 0.0, combine="sum", linear=True, selects=False, torch_name="sum",
            dist_op="SUM", triton_reduce="tl.sum", triton_combine="a + b",
        ),
        ReductionKind(  # terms are summed, then divided by their count: the sum's forms
            "mean", 0.0, combine="sum", linear=True, selects=False, torch_name="mean",
            dist_op="SUM", triton_reduce="tl.sum", triton_combine="a + b",
        ),
        ReductionKind(
            "max", -math.inf, combine="max", linear=False, selects=True, torch_name="amax",
            dist_op="MAX", triton_reduce="tl.max", triton_combine="tl.maximum(a, b)",
        ),
        ReductionKind(
            "min", math.inf, combine="min", linear=False, selects=True, torch_name="amin",
            dist_op="MIN", triton_reduce="tl.min", triton_combine="tl.minimum(a, b)",
        ),
        ReductionKind(
            "prod", 1.0, combine="prod", linear=False, selects=False, torch_name="prod",
            dist_op="PRODUCT", triton_reduce=None, triton_combine="a * b",
        ),
    )
}  # fmt: skip

NAMES = tuple(KINDS)  # every kind, for messages
TILE_KINDS = tuple(k for k, kind in KINDS.items() if not kind.averages)  # tile.reduce's


def rounds(kind: str | None) -> bool:
    """Whether a collective's reduction ``kind`` (None: it reduces nothing) rounds, so
    that the deterministic numerics fix the order of its terms."""
    return kind is not None and KINDS[kind].rounds


__all__ = ["KINDS", "NAMES", "TILE_KINDS", "ReductionKind", "rounds"]
