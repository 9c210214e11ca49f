"""Sharding rules: each graph op's index space as einsum-like factors.

A rule maps every dim of every operand and result to a *factor* of the op's iteration
space (or to ``None`` for a dim that is broadcast from size 1 and is never split). The
factor's kind says what splitting it over a mesh axis means (as in Shardy's
``OpShardingRule`` and MLIR's ``ShardingInterface``):

- ``PARALLEL``: every rank computes its own slice of the results (matmul's m and n).
- ``REDUCTION``: the op sums (max, min) over it: results become *partial* (matmul's k).
- ``STATISTIC``: the op reduces over it internally but its results keep the dim
  (softmax's axis, layer_norm's axes): splitting it needs an all-reduce of per-row
  statistics inside the op, never a gather of the tensor.
- ``BLOCKS``: the op takes *windows* of the factor's index space on some tensors (a
  split's pieces, a concat's operands, a slice's result; :class:`FactorWindows`). The
  dim may stay split: each rank then holds its block of every window, and the blocks
  that live on another rank move there by collective permutes
  (:mod:`tessera.ir.block_moves`), priced by the cost model like any reshard.
- ``REPLICATED``: the op needs the dim whole (a reshape's merged minor dims, a gathered
  axis).

This module is the rules' vocabulary and the builders shared by several ops; each op's
rule is declared with the op in :mod:`tessera.ops` (see ``tessera.ops.sharding_rule``).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from math import prod
from typing import Any

from tessera.ir.abstract import AbstractTensor


class FactorKind(enum.Enum):
    PARALLEL = "parallel"
    REDUCTION = "reduction"
    STATISTIC = "statistic"
    BLOCKS = "blocks"
    REPLICATED = "replicated"


@dataclass(frozen=True)
class Factor:
    size: int
    kind: FactorKind = FactorKind.PARALLEL


Dims = tuple[int | None, ...]  # factor index per tensor dim


@dataclass(frozen=True)
class FactorWindows:
    """Where the tensors of a BLOCKS factor lie along its index space: operand ``i``'s
    dim is the window ``operands[i]`` (``(offset, size)``, None for an operand without
    the factor), and likewise for the results."""

    factor: int
    operands: tuple[tuple[int, int] | None, ...]
    results: tuple[tuple[int, int] | None, ...]

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(w[1] for w in (*self.operands, *self.results) if w is not None)


@dataclass(frozen=True)
class ShardingRule:
    factors: tuple[Factor, ...]
    operands: tuple[Dims, ...]
    results: tuple[Dims, ...]
    reduction_kind: str = "sum"  # the partial kind a split REDUCTION factor produces:
    # sum, mean (each rank holds the mean of its slice: the value is their average), max, min
    windows: tuple[FactorWindows, ...] = ()  # one per BLOCKS factor

    def windows_of(self, factor: int) -> FactorWindows | None:
        return next((w for w in self.windows if w.factor == factor), None)

    def divides(self, factor: int, ways: int) -> bool:
        """Whether ``factor`` can be split ``ways`` ways: its size and, for a BLOCKS
        factor, every window's size divide evenly."""
        windows = self.windows_of(factor)
        sizes = windows.sizes if windows is not None else ()
        return all(size % ways == 0 for size in (self.factors[factor].size, *sizes))

    def __str__(self) -> str:
        names = [chr(ord("i") + i) if i < 18 else f"f{i}" for i in range(len(self.factors))]

        def text(dims: Dims) -> str:
            return "(" + ",".join(names[f] if f is not None else "1" for f in dims) + ")"

        lhs = ", ".join(text(d) for d in self.operands)
        rhs = ", ".join(text(d) for d in self.results)
        kinds = " ".join(
            f"{names[i]}:{f.kind.value}"
            for i, f in enumerate(self.factors)
            if f.kind != FactorKind.PARALLEL
        )
        return f"{lhs} -> {rhs}" + (f"  {{{kinds}}}" if kinds else "")


class RuleBuilder:
    """Accumulates factors while a rule maps dims to them."""

    def __init__(self) -> None:
        self.factors: list[Factor] = []

    def new(self, size: int, kind: FactorKind = FactorKind.PARALLEL) -> int:
        self.factors.append(Factor(size, kind))
        return len(self.factors) - 1

    def aligned(
        self, shape: Sequence[int], result_dims: Sequence[int], result_shape: Sequence[int]
    ) -> Dims:
        """Operand dims aligned right with the result's (numpy broadcasting)."""
        offset = len(result_shape) - len(shape)
        return tuple(
            None if size == 1 and result_shape[offset + d] != 1 else result_dims[offset + d]
            for d, size in enumerate(shape)
        )

    def rule(
        self,
        operands: Sequence[Dims],
        results: Sequence[Dims],
        kind: str = "sum",
        windows: Sequence[FactorWindows] = (),
    ) -> ShardingRule:
        return ShardingRule(
            tuple(self.factors), tuple(operands), tuple(results), kind, tuple(windows)
        )


Rule = Callable[[list[AbstractTensor], list[AbstractTensor], dict[str, Any]], ShardingRule]


def elementwise(
    operands: list[AbstractTensor], results: list[AbstractTensor], attrs: dict[str, Any]
) -> ShardingRule:
    """Result dims are parallel factors; operands broadcast into them."""
    b = RuleBuilder()
    out = results[0].shape
    dims = tuple(b.new(s) for s in out)
    return b.rule([b.aligned(x.shape, dims, out) for x in operands], [dims])


def reduction(kind: str) -> Rule:
    """The rule of a ``kind`` reduction over ``attrs["axes"]`` (honouring ``keepdims``)."""

    def rule(
        operands: list[AbstractTensor], results: list[AbstractTensor], attrs: dict[str, Any]
    ) -> ShardingRule:
        (x,) = operands
        b = RuleBuilder()
        axes = set(attrs["axes"])
        dims = tuple(
            b.new(s, FactorKind.REDUCTION if d in axes else FactorKind.PARALLEL)
            for d, s in enumerate(x.shape)
        )
        if attrs["keepdims"]:
            out = tuple(None if d in axes else f for d, f in enumerate(dims))
        else:
            out = tuple(f for d, f in enumerate(dims) if d not in axes)
        return b.rule([dims], [out], kind)

    rule.__doc__ = f"Reduced axes are {kind}-reduction factors; the rest are parallel."
    return rule


def _along_axes(axes_of: Callable[[dict[str, Any]], Sequence[int]], kind: FactorKind) -> Rule:
    def rule(
        operands: list[AbstractTensor], results: list[AbstractTensor], attrs: dict[str, Any]
    ) -> ShardingRule:
        x = operands[0]
        b = RuleBuilder()
        axes = set(axes_of(attrs))
        dims = tuple(
            b.new(s, kind if d in axes else FactorKind.PARALLEL) for d, s in enumerate(x.shape)
        )
        return b.rule([dims], [dims])

    return rule


statistic_along_axis = _along_axes(lambda a: [a["axis"]], FactorKind.STATISTIC)
statistic_along_axes = _along_axes(lambda a: a["axes"], FactorKind.STATISTIC)


def factor_product(rule: ShardingRule) -> int:
    return prod(f.size for f in rule.factors)


LINEAR_KINDS = ("sum", "mean")  # partial kinds that stay partial through linear ops
