"""Sharding rules: each graph op's index space as einsum-like factors.

A rule maps every dim of every operand and result to a *factor* of the op's iteration
space (or to ``None`` for a dim that is broadcast from size 1 and is never split). The
factor's kind says what splitting it over a mesh axis means (as in Shardy's
``OpShardingRule`` and MLIR's ``ShardingInterface``):

- ``PARALLEL``: every rank computes its own slice of the results (matmul's m and n).
- ``REDUCTION``: the op sums (max, min) over it: results without it become *partial*
  (matmul's k; a gathered axis, where each rank looks up only the indices in its slice);
  a result that has it is split (attention's backward: dq keeps the query rows, dk and
  dv sum over them).
- ``STATISTIC``: the op reduces over it internally but its results keep the dim
  (softmax's axis, layer_norm's axes) or do not show it (cross_entropy's classes):
  splitting it needs an all-reduce of per-row statistics inside the op, never a gather
  of the tensor.
- ``BLOCKS``: the op takes *windows* of the factor's index space on some tensors (a
  split's pieces, a concat's operands, a slice's result; :class:`FactorWindows`). The
  dim may stay split: each rank then holds its block of every window, and the blocks
  that live on another rank move there by collective permutes
  (:mod:`tessera.transforms.block_moves`), priced by the cost model like any reshard.
- ``REPLICATED``: the op needs the dim whole (a reshape's merged minor dims).
- ``CONTEXT``: a sequence the op attends over (attention's keys and values): a split
  stays on the tensors that have it, and ``shard-partition`` expands the op so that each
  rank sees the whole sequence (context parallelism): the operands with the factor are
  all-gathered along it before the op, the results with it (dk, dv) come out whole and
  partial over the query rows' axes and are reduce-scattered back to their split
  (:func:`context_layouts`). A ring of collective permutes is the other expansion of
  the same rule (issue 19, phase 2). Its mesh axes may also split factors that no
  tensor of the op has together with it: the queries' rows, so that each rank keeps
  its queries and sees every key.

A rule may also name *position operands* (``ShardingRule.positions``): i32 scalars
holding the global index of a factor's first element (attention's causal offsets).
When the factor's slices differ per rank, ``shard-partition`` adds this rank's start.

This module is the rules' vocabulary and the builders shared by several ops; each op's
rule is declared with the op in :mod:`tessera.opdefs` (see ``tessera.opdefs.sharding_rule``).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from math import prod
from typing import Any

from tessera.ir.abstract import AbstractTensor
from tessera.ir.sharding import Sharding


class FactorKind(enum.Enum):
    PARALLEL = "parallel"
    REDUCTION = "reduction"
    STATISTIC = "statistic"
    BLOCKS = "blocks"
    REPLICATED = "replicated"
    CONTEXT = "context"


@dataclass(frozen=True)
class Factor:
    size: int
    kind: FactorKind = FactorKind.PARALLEL


Dims = tuple[int | None, ...]  # factor index per tensor dim
Assignment = dict[int, tuple[str, ...]]  # factor -> mesh axes splitting it


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
    reduction_kind: str = "sum"  # the partial kind a split REDUCTION factor produces (one
    # of reduction_kinds.KINDS; for mean each rank holds the mean of its slice: the value
    # is their average)
    positions: tuple[tuple[int, int], ...] = ()  # (factor, operand index) of each
    # position operand (see the module docstring); the indices past the op's operands
    # when it has none (shard-partition appends them, 0 plus this rank's start)

    def kind(self, factor: int) -> FactorKind:
        return self.factors[factor].kind

    @property
    def has_context(self) -> bool:
        return any(f.kind is FactorKind.CONTEXT for f in self.factors)
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
        positions: Sequence[tuple[int, int]] = (),
        windows: Sequence[FactorWindows] = (),
    ) -> ShardingRule:
        return ShardingRule(
            tuple(self.factors),
            tuple(operands),
            tuple(results),
            kind,
            positions=tuple(positions),
            windows=tuple(windows),
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


# --- context factors -----------------------------------------------------------------------


def axis_sharing(rule: ShardingRule) -> frozenset[frozenset[int]]:
    """The pairs of factors that may be split over the same mesh axes: a ``CONTEXT``
    factor and any factor that no operand or result has together with it."""
    context = [f for f, factor in enumerate(rule.factors) if factor.kind is FactorKind.CONTEXT]
    if not context:
        return frozenset()
    together = {
        frozenset((a, b))
        for dims in (*rule.operands, *rule.results)
        for a in dims
        for b in dims
        if a is not None and b is not None and a != b
    }
    return frozenset(
        pair
        for c in context
        for f in range(len(rule.factors))
        if f != c and (pair := frozenset((c, f))) not in together
    )


def context_layouts(
    rule: ShardingRule,
    assignment: Assignment,
    operands: Sequence[Sharding],
    results: Sequence[Sharding],
) -> tuple[list[Sharding], list[Sharding]]:
    """The layouts in which each rank computes an op whose ``CONTEXT`` factors are split
    (``operands`` and ``results`` are the layouts the op takes and gives): every operand
    with such a factor gathered along it; every result with it whole along it and
    partial over the axes it shares with the ``REDUCTION`` factors the result lacks
    (each rank summed over its own query rows). The expansion reshards from these to
    the given layouts; without a split ``CONTEXT`` factor they are the given ones."""
    context = {
        f: axes for f, axes in assignment.items() if axes and rule.kind(f) is FactorKind.CONTEXT
    }
    if not context:
        return list(operands), list(results)

    def whole(sharding: Sharding, dims: Dims) -> tuple[tuple[str, ...], ...]:
        return tuple(
            () if f in context else axes for f, axes in zip(dims, sharding.dims, strict=True)
        )

    computed_operands = [
        Sharding(whole(s, dims), s.partial) if any(f in context for f in dims) else s
        for s, dims in zip(operands, rule.operands, strict=True)
    ]
    computed_results = []
    for sharding, dims in zip(results, rule.results, strict=True):
        shared = {a for f in dims if f in context for a in context[f]}
        if not shared:
            computed_results.append(sharding)
            continue
        summed = tuple(
            (a, rule.reduction_kind)
            for f, axes in assignment.items()
            if rule.kind(f) is FactorKind.REDUCTION and f not in dims
            for a in axes
            if a in shared
        )
        computed_results.append(Sharding(whole(sharding, dims), (*sharding.partial, *summed)))
    return computed_operands, computed_results
