"""Sharding rules checked against the reference semantics.

For every op and every factor a rule says may be split, split the operands' dims mapped
to that factor into two halves, run the op on each half, and combine the halves'
results: concatenated along the result dims of a PARALLEL factor (and of a REDUCTION
factor a result keeps: attention's backward dq), reduced (sum, mean, max, min) for a
REDUCTION factor the result lacks. The combination must equal the unsplit op's result.
(A factor that appears in no operand is split by slicing the result locally.)
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from xdsl.ir import Block

from tessera.dtypes import DType
from tessera.ir import graph
from tessera.ir.abstract import AbstractTensor
from tessera.ir.sharding_rules import FactorKind, ShardingRule
from tessera.ops import has_sharding_rule, op_def, registered, sharding_rule

F32, I64, I1 = DType.f32, DType.i64, DType.i1

CASES: list[tuple[type[graph.GraphOp], list[tuple[tuple[int, ...], DType]], dict[str, Any]]] = [
    (graph.NegOp, [((4, 6), F32)], {}),
    (graph.ExpOp, [((2, 4, 6), F32)], {}),
    (graph.GeluOp, [((4, 6), F32)], {"approximate": "tanh"}),
    (graph.AddOp, [((4, 6), F32), ((6,), F32)], {}),
    (graph.MulOp, [((4, 1), F32), ((1, 6), F32)], {}),
    (graph.SubOp, [((2, 4, 6), F32), ((2, 4, 6), F32)], {}),
    (graph.DivOp, [((4, 6), F32), ((4, 6), F32)], {}),
    (graph.MaximumOp, [((4, 6), F32), ((), F32)], {}),
    (graph.CompareOp, [((4, 6), F32), ((4, 6), F32)], {"predicate": "lt"}),
    (graph.SelectOp, [((4, 6), I1), ((4, 6), F32), ((6,), F32)], {}),
    (graph.CastOp, [((4, 6), F32)], {"dtype": DType.i64}),
    (graph.MatmulOp, [((4, 6), F32), ((6, 8), F32)], {}),
    (graph.MatmulOp, [((2, 4, 6), F32), ((6, 8), F32)], {}),
    (graph.MatmulOp, [((2, 1, 4, 6), F32), ((2, 6, 2), F32)], {}),
    (graph.SumOp, [((4, 6), F32)], {"axes": (1,), "keepdims": False}),
    (graph.SumOp, [((2, 4, 6), F32)], {"axes": (0, 2), "keepdims": True}),
    (graph.MeanOp, [((4, 6), F32)], {"axes": (0,), "keepdims": False}),
    (graph.MaxOp, [((4, 6), F32)], {"axes": (1,), "keepdims": True}),
    (graph.MinOp, [((4, 6), F32)], {"axes": (0, 1), "keepdims": False}),
    (graph.SoftmaxOp, [((4, 6), F32)], {"axis": 1}),
    (graph.LogSoftmaxOp, [((4, 6), F32)], {"axis": 0}),
    (graph.LayerNormOp, [((2, 4, 6), F32)], {"axes": (2,), "eps": 1e-5}),
    (graph.RmsNormOp, [((4, 6), F32)], {"axes": (1,), "eps": 1e-6}),
    (graph.CrossEntropyOp, [((4, 6), F32), ((4,), I64)], {"reduction": "mean"}),
    (graph.CrossEntropyOp, [((2, 4, 6), F32), ((2, 4), I64)], {"reduction": "sum"}),
    (graph.CrossEntropyOp, [((4, 6), F32), ((4,), I64)], {"reduction": "none"}),
    (graph.ReshapeOp, [((4, 6, 2), F32)], {"shape": (24, 2)}),
    (graph.ReshapeOp, [((24, 2), F32)], {"shape": (4, 6, 2)}),
    (graph.ReshapeOp, [((4, 6), F32)], {"shape": (8, 3)}),
    (graph.ReshapeOp, [((6, 4), F32)], {"shape": (4, 6)}),
    (graph.BroadcastToOp, [((1, 6), F32)], {"shape": (4, 4, 6)}),
    (graph.TransposeOp, [((2, 4, 6), F32)], {"perm": (2, 0, 1)}),
    (graph.SliceOp, [((4, 6), F32)], {"starts": (0, 1), "limits": (4, 5), "strides": (1, 2)}),
    (graph.ConcatOp, [((4, 2), F32), ((4, 4), F32)], {"axis": 1}),
    (graph.SplitOp, [((4, 6), F32)], {"axis": 1, "sizes": (2, 4)}),
    (graph.GatherOp, [((6, 4), F32), ((2, 4), I64)], {"axis": 0}),
    (graph.GatherOp, [((4, 6, 2), F32), ((4,), I64)], {"axis": 1}),
    (graph.AttentionOp, [((2, 4, 6, 8), F32), ((2, 2, 4, 8), F32), ((2, 2, 4, 6), F32)], {"causal": False, "scale": 0.3}),
    (graph.AttentionBackwardOp, [((2, 4, 6, 8), F32), ((2, 2, 4, 8), F32), ((2, 2, 4, 6), F32), ((2, 4, 6, 6), F32), ((2, 4, 6), F32), ((2, 4, 6), F32)], {"causal": False, "scale": 0.3}),
]

COMBINE = {"sum": torch.add, "max": torch.maximum, "min": torch.minimum}


def _random(aval: AbstractTensor, bound: int, generator: torch.Generator) -> torch.Tensor:
    if aval.dtype == DType.i1:
        return torch.rand(aval.shape, generator=generator) > 0.5
    if aval.dtype.is_int:
        return torch.randint(0, bound, aval.shape, generator=generator)
    return torch.randn(aval.shape, generator=generator, dtype=torch.float64).float()


def _run(op_type: type[graph.GraphOp], avals: list[AbstractTensor], attrs: dict[str, Any], inputs: list[torch.Tensor]) -> tuple[graph.GraphOp, tuple[torch.Tensor, ...]]:
    block = Block(arg_types=[a.to_xdsl() for a in avals])
    op = graph.build(op_type, block.args, **attrs)
    result = op_def(op_type).reference(op, *inputs)
    return op, result if isinstance(result, tuple) else (result,)


def _local_attrs(op_type: type[graph.GraphOp], attrs: dict[str, Any], rule: ShardingRule, factor: int, pieces: int) -> dict[str, Any]:
    """Attributes of the op on one piece: shapes and slice bounds shrink with the split."""
    local = dict(attrs)
    if "shape" in attrs:
        local["shape"] = tuple(s // pieces if f == factor else s for s, f in zip(attrs["shape"], rule.results[0], strict=True))
    if op_type is graph.SliceOp:
        local["limits"] = tuple(lim // pieces if f == factor else lim for lim, f in zip(attrs["limits"], rule.operands[0], strict=True))
    return local


@pytest.mark.parametrize(("op_type", "operands", "attrs"), CASES, ids=[f"{c[0].name}-{i}" for i, c in enumerate(CASES)])
def test_splitting_a_factor_preserves_the_result(op_type: type[graph.GraphOp], operands: list[tuple[tuple[int, ...], DType]], attrs: dict[str, Any]) -> None:
    generator = torch.Generator().manual_seed(0)
    avals = [AbstractTensor(shape, dtype) for shape, dtype in operands]
    bound = avals[0].shape[attrs.get("axis", -1)] if op_type in (graph.GatherOp, graph.CrossEntropyOp) else 2
    inputs = [_random(a, bound, generator) for a in avals]
    op, expected = _run(op_type, avals, attrs, inputs)
    rule = sharding_rule(op)
    checked = 0
    for factor, info in enumerate(rule.factors):
        if info.kind not in (FactorKind.PARALLEL, FactorKind.REDUCTION) or info.size % 2:
            continue
        if not any(factor in dims for dims in rule.operands):
            continue  # a result-only factor: splitting it is a free local slice of the result
        if op_type is graph.GatherOp and info.kind == FactorKind.REDUCTION:
            continue  # the gathered axis: a rank runs the op's per-rank form (a masked lookup,
            # its Partition), not the op on its piece: test_sharding_property.py checks it
        halves = []
        for piece in range(2):
            local_inputs, local_avals = [], []
            for x, aval, dims in zip(inputs, avals, rule.operands, strict=True):
                for d, f in enumerate(dims):
                    if f == factor:
                        x = x.chunk(2, dim=d)[piece]
                local_inputs.append(x)
                local_avals.append(AbstractTensor(tuple(x.shape), aval.dtype))
            halves.append(_run(op_type, local_avals, _local_attrs(op_type, attrs, rule, factor, 2), local_inputs)[1])
        for index, (want, dims) in enumerate(zip(expected, rule.results, strict=True)):
            first, second = halves[0][index], halves[1][index]
            if info.kind == FactorKind.PARALLEL or factor in dims:  # a split result
                got = first
                for d, f in enumerate(dims):
                    if f == factor:
                        got = torch.cat([first, second], dim=d)
            elif rule.reduction_kind == "mean":
                got = (first + second) / 2
            else:
                got = COMBINE[rule.reduction_kind](first, second)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, msg=f"{op_type.name} {rule} factor {factor}")
        checked += 1
    if op_type not in (graph.SplitOp,):
        assert checked > 0, f"no splittable factor was exercised for {op_type.name}: {rule}"


def test_every_graph_op_has_a_sharding_rule() -> None:
    ops_with_rules = {t for t in registered() if has_sharding_rule(t)}
    assert ops_with_rules == set(graph.GRAPH_OPS) | set(graph.PER_RANK_OPS)


def test_reshape_shares_only_gcd_sized_major_factor() -> None:
    block = Block(arg_types=[AbstractTensor((4, 6), F32).to_xdsl()])
    rule = sharding_rule(graph.build(graph.ReshapeOp, block.args, shape=(3, 8)))
    shared = rule.operands[0][0]
    assert rule.results[0][0] == shared and rule.factors[shared].size == 1
