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
- ``REPLICATED``: the op needs the dim whole (concat's axis, a sliced dim).

Passes read rules through :func:`sharding_rule`; adding an op means adding one entry.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from math import gcd, prod
from typing import Any

from xdsl.ir import Operation

from tessera.ir import graph
from tessera.ir.abstract import AbstractTensor


class FactorKind(enum.Enum):
    PARALLEL = "parallel"
    REDUCTION = "reduction"
    STATISTIC = "statistic"
    REPLICATED = "replicated"


@dataclass(frozen=True)
class Factor:
    size: int
    kind: FactorKind = FactorKind.PARALLEL


Dims = tuple[int | None, ...]  # factor index per tensor dim


@dataclass(frozen=True)
class ShardingRule:
    factors: tuple[Factor, ...]
    operands: tuple[Dims, ...]
    results: tuple[Dims, ...]
    reduction_kind: str = "sum"  # the partial kind a split REDUCTION factor produces:
    # sum, mean (each rank holds the mean of its slice: the value is their average), max, min

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


class _RuleBuilder:
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
        self, operands: Sequence[Dims], results: Sequence[Dims], kind: str = "sum"
    ) -> ShardingRule:
        return ShardingRule(tuple(self.factors), tuple(operands), tuple(results), kind)


Rule = Callable[[list[AbstractTensor], list[AbstractTensor], dict[str, Any]], ShardingRule]


def elementwise(
    operands: list[AbstractTensor], results: list[AbstractTensor], attrs: dict[str, Any]
) -> ShardingRule:
    """Result dims are parallel factors; operands broadcast into them."""
    b = _RuleBuilder()
    out = results[0].shape
    dims = tuple(b.new(s) for s in out)
    return b.rule([b.aligned(x.shape, dims, out) for x in operands], [dims])


def matmul(
    operands: list[AbstractTensor], results: list[AbstractTensor], attrs: dict[str, Any]
) -> ShardingRule:
    """``(..., m, k), (..., k, n) -> (..., m, n)`` with ``k`` a reduction factor."""
    lhs, rhs = operands
    out = results[0].shape
    b = _RuleBuilder()
    batch = tuple(b.new(s) for s in out[:-2])
    m, n = b.new(out[-2]), b.new(out[-1])
    k = b.new(lhs.shape[-1], FactorKind.REDUCTION)
    batch_shape = out[:-2]
    lhs_dims = (*b.aligned(lhs.shape[:-2], batch, batch_shape), m, k)
    rhs_dims = (*b.aligned(rhs.shape[:-2], batch, batch_shape), k, n)
    return b.rule([lhs_dims, rhs_dims], [(*batch, m, n)])


def _reduce(kind: str) -> Rule:
    def rule(
        operands: list[AbstractTensor], results: list[AbstractTensor], attrs: dict[str, Any]
    ) -> ShardingRule:
        (x,) = operands
        b = _RuleBuilder()
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
        b = _RuleBuilder()
        axes = set(axes_of(attrs))
        dims = tuple(
            b.new(s, kind if d in axes else FactorKind.PARALLEL) for d, s in enumerate(x.shape)
        )
        return b.rule([dims], [dims])

    return rule


statistic_along_axis = _along_axes(lambda a: [a["axis"]], FactorKind.STATISTIC)
statistic_along_axes = _along_axes(lambda a: a["axes"], FactorKind.STATISTIC)
replicated_along_axis = _along_axes(lambda a: [a["axis"]], FactorKind.REPLICATED)


def split(
    operands: list[AbstractTensor], results: list[AbstractTensor], attrs: dict[str, Any]
) -> ShardingRule:
    """Pieces keep every dim but the split axis, which must be whole."""
    (x,) = operands
    b = _RuleBuilder()
    dims = tuple(
        b.new(s, FactorKind.REPLICATED if d == attrs["axis"] else FactorKind.PARALLEL)
        for d, s in enumerate(x.shape)
    )
    return b.rule([dims], [dims] * len(results))


def concat(
    operands: list[AbstractTensor], results: list[AbstractTensor], attrs: dict[str, Any]
) -> ShardingRule:
    """All operands share every factor; the concatenation axis must be whole."""
    b = _RuleBuilder()
    out = results[0].shape
    dims = tuple(
        b.new(s, FactorKind.REPLICATED if d == attrs["axis"] else FactorKind.PARALLEL)
        for d, s in enumerate(out)
    )
    return b.rule([dims] * len(operands), [dims])


def slice_(
    operands: list[AbstractTensor], results: list[AbstractTensor], attrs: dict[str, Any]
) -> ShardingRule:
    """Untouched dims are parallel; dims that are cut must be whole."""
    (x,) = operands
    b = _RuleBuilder()
    dims = []
    for d, size in enumerate(x.shape):
        whole = (attrs["starts"][d], attrs["limits"][d], attrs["strides"][d]) == (0, size, 1)
        dims.append(b.new(size, FactorKind.PARALLEL if whole else FactorKind.REPLICATED))
    in_dims = tuple(dims)
    out_dims = tuple(
        f if b.factors[f].kind == FactorKind.PARALLEL else b.new(results[0].shape[d])
        for d, f in enumerate(in_dims)
    )
    return b.rule([in_dims], [out_dims])


def transpose(
    operands: list[AbstractTensor], results: list[AbstractTensor], attrs: dict[str, Any]
) -> ShardingRule:
    (x,) = operands
    b = _RuleBuilder()
    dims = tuple(b.new(s) for s in x.shape)
    return b.rule([dims], [tuple(dims[p] for p in attrs["perm"])])


def broadcast_to(
    operands: list[AbstractTensor], results: list[AbstractTensor], attrs: dict[str, Any]
) -> ShardingRule:
    return elementwise(operands, results, attrs)


def reshape(
    operands: list[AbstractTensor], results: list[AbstractTensor], attrs: dict[str, Any]
) -> ShardingRule:
    """Dims are grouped into runs of equal product; within a run only the major dims of
    both sides share a factor, sized by their gcd (a split of s is the same contiguous
    block on both sides exactly when s divides it); the other dims must stay whole."""
    src, dst = operands[0].shape, results[0].shape
    b = _RuleBuilder()
    src_dims: list[int | None] = []
    dst_dims: list[int | None] = []
    i = j = 0
    while i < len(src) or j < len(dst):
        # skip size-1 dims: they carry no data to split
        if i < len(src) and src[i] == 1:
            src_dims.append(None)
            i += 1
            continue
        if j < len(dst) and dst[j] == 1:
            dst_dims.append(None)
            j += 1
            continue
        run_i, run_j = [i], [j]
        a, c = src[i], dst[j]
        i, j = i + 1, j + 1
        while a != c:
            if a < c:
                a *= src[i]
                run_i.append(i)
                i += 1
            else:
                c *= dst[j]
                run_j.append(j)
                j += 1
        shared = b.new(gcd(src[run_i[0]], dst[run_j[0]]))
        src_dims.append(shared)
        src_dims.extend(b.new(src[d], FactorKind.REPLICATED) for d in run_i[1:])
        dst_dims.append(shared)
        dst_dims.extend(b.new(dst[d], FactorKind.REPLICATED) for d in run_j[1:])
    return b.rule([tuple(src_dims)], [tuple(dst_dims)])


def gather(
    operands: list[AbstractTensor], results: list[AbstractTensor], attrs: dict[str, Any]
) -> ShardingRule:
    """``take(x, idx, axis)``: x's axis must be whole; idx dims and x's other dims pass."""
    x, idx = operands
    axis = attrs["axis"]
    b = _RuleBuilder()
    before = tuple(b.new(s) for s in x.shape[:axis])
    gathered = b.new(x.shape[axis], FactorKind.REPLICATED)
    index_dims = tuple(b.new(s) for s in idx.shape)
    after = tuple(b.new(s) for s in x.shape[axis + 1 :])
    return b.rule([(*before, gathered, *after), index_dims], [(*before, *index_dims, *after)])


def cross_entropy(
    operands: list[AbstractTensor], results: list[AbstractTensor], attrs: dict[str, Any]
) -> ShardingRule:
    """Batch dims are parallel (a partial mean / sum for those reductions); classes whole."""
    logits, _ = operands
    b = _RuleBuilder()
    reduction = attrs["reduction"]
    batch_kind = FactorKind.PARALLEL if reduction == "none" else FactorKind.REDUCTION
    batch = tuple(b.new(s, batch_kind) for s in logits.shape[:-1])
    classes = b.new(logits.shape[-1], FactorKind.REPLICATED)
    out = batch if reduction == "none" else ()
    return b.rule([(*batch, classes), batch], [out], "mean" if reduction == "mean" else "sum")


def constant(
    operands: list[AbstractTensor], results: list[AbstractTensor], attrs: dict[str, Any]
) -> ShardingRule:
    """A constant can be materialised in any layout (each rank builds its slice)."""
    return elementwise(operands, results, attrs)


RULES: dict[type[graph.GraphOp], Rule] = {
    **{
        op: elementwise
        for op in (
            graph.NegOp, graph.AbsOp, graph.ReluOp, graph.ExpOp, graph.LogOp, graph.TanhOp,
            graph.SqrtOp, graph.RsqrtOp, graph.SiluOp, graph.SigmoidOp, graph.GeluOp,
            graph.AddOp, graph.SubOp, graph.MulOp, graph.DivOp, graph.PowOp, graph.MaximumOp,
            graph.MinimumOp, graph.CompareOp, graph.SelectOp, graph.CastOp,
        )
    },
    graph.MatmulOp: matmul,
    graph.ConstantOp: constant,
    graph.SumOp: _reduce("sum"),
    graph.MeanOp: _reduce("mean"),
    graph.MaxOp: _reduce("max"),
    graph.MinOp: _reduce("min"),
    graph.SoftmaxOp: statistic_along_axis,
    graph.LogSoftmaxOp: statistic_along_axis,
    graph.LayerNormOp: statistic_along_axes,
    graph.RmsNormOp: statistic_along_axes,
    graph.CrossEntropyOp: cross_entropy,
    graph.ReshapeOp: reshape,
    graph.BroadcastToOp: broadcast_to,
    graph.TransposeOp: transpose,
    graph.SliceOp: slice_,
    graph.ConcatOp: concat,
    graph.SplitOp: split,
    graph.GatherOp: gather,
}  # fmt: skip


def sharding_rule(op: Operation) -> ShardingRule:
    """The sharding rule of a graph op instance."""
    if not isinstance(op, graph.GraphOp) or type(op) not in RULES:
        raise KeyError(f"no sharding rule for {op.name}")
    operands = [AbstractTensor.from_xdsl(v.type) for v in op.operands]
    results = [AbstractTensor.from_xdsl(r.type) for r in op.results]
    return RULES[type(op)](operands, results, op.attrs())


def factor_product(rule: ShardingRule) -> int:
    return prod(f.size for f in rule.factors)


# Partial values through linear ops: a value partial over an axis (each rank holds a term
# of a sum or mean) stays partial through an op that is linear in it, so the reduction can
# wait (GSPMD's lazy all-reduce). The entry says which operands may be partial: "all"
# (every operand partial over the same axes, as in add) or a tuple of operand indices of
# which exactly one may be partial (mul, matmul).
PartialRule = str | tuple[int, ...]
PARTIAL_PASSTHROUGH: dict[type[graph.GraphOp], PartialRule] = {
    graph.NegOp: (0,),
    graph.AddOp: "all",
    graph.SubOp: "all",
    graph.MulOp: (0, 1),
    graph.DivOp: (0,),
    graph.MatmulOp: (0, 1),
    graph.SumOp: (0,),
    graph.MeanOp: (0,),
    graph.ReshapeOp: (0,),
    graph.TransposeOp: (0,),
    graph.BroadcastToOp: (0,),
    graph.SliceOp: (0,),
    graph.SplitOp: (0,),
    graph.ConcatOp: "all",
    graph.GatherOp: (0,),
}
LINEAR_KINDS = ("sum", "mean")
