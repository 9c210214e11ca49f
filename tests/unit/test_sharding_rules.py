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
from tessera.opdefs import has_sharding_rule, op_def, registered, sharding_rule
from tessera.transforms.block_moves import (
    Window,
    communicating_moves,
    plan_block_moves,
    received_elements,
)

F32, I64, I1, I32 = DType.f32, DType.i64, DType.i1, DType.i32

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
    (
        graph.AttentionOp,
        [((2, 4, 6, 8), F32), ((2, 2, 4, 8), F32), ((2, 2, 4, 6), F32)],
        {"causal": False, "scale": 0.3},
    ),
    (
        graph.AttentionBackwardOp,
        [
            ((2, 4, 6, 8), F32),
            ((2, 2, 4, 8), F32),
            ((2, 2, 4, 6), F32),
            ((2, 4, 6, 6), F32),
            ((2, 4, 6), F32),
            ((2, 4, 6), F32),
        ],
        {"causal": False, "scale": 0.3},
    ),
    (graph.TopKOp, [((2, 4, 6), F32)], {"k": 3}),
    (graph.RandomBitsOp, [((), I32), ((), I32), ((4, 6), I32)], {"stream": 1}),
    (graph.MoeRouteOp, [((2, 6, 2), I32)], {"experts": 4, "capacity": 3}),
    (graph.MoeDispatchOp, [((2, 6, 8), F32), ((2, 6, 2), I32), ((2, 4, 3), I32)], {}),
    (graph.MoeDispatchOp, [((2, 6, 2, 8), F32), ((2, 6, 2), I32), ((2, 4, 3), I32)], {}),
    (graph.MoeCombineOp, [((2, 4, 3, 8), F32), ((2, 6, 2), I32), ((2, 4, 3), I32)], {}),
]

COMBINE = {"sum": torch.add, "max": torch.maximum, "min": torch.minimum}


def _random(aval: AbstractTensor, bound: int, generator: torch.Generator) -> torch.Tensor:
    if aval.dtype == DType.i1:
        return torch.rand(aval.shape, generator=generator) > 0.5
    if aval.dtype.is_int:
        return torch.randint(0, bound, aval.shape, generator=generator)
    return torch.randn(aval.shape, generator=generator, dtype=torch.float64).float()


def _run(
    op_type: type[graph.GraphOp],
    avals: list[AbstractTensor],
    attrs: dict[str, Any],
    inputs: list[torch.Tensor],
) -> tuple[graph.GraphOp, tuple[torch.Tensor, ...]]:
    block = Block(arg_types=[a.to_xdsl() for a in avals])
    op = graph.build(op_type, block.args, **attrs)
    result = op_def(op_type).reference(op, *inputs)
    return op, result if isinstance(result, tuple) else (result,)


def _local_attrs(
    op_type: type[graph.GraphOp],
    attrs: dict[str, Any],
    rule: ShardingRule,
    factor: int,
    pieces: int,
) -> dict[str, Any]:
    """Attributes of the op on one piece: shapes and slice bounds shrink with the split."""
    local = dict(attrs)
    if "shape" in attrs:
        local["shape"] = tuple(
            s // pieces if f == factor else s
            for s, f in zip(attrs["shape"], rule.results[0], strict=True)
        )
    if op_type is graph.SliceOp:
        local["limits"] = tuple(
            lim // pieces if f == factor else lim
            for lim, f in zip(attrs["limits"], rule.operands[0], strict=True)
        )
    return local


@pytest.mark.parametrize(
    ("op_type", "operands", "attrs"), CASES, ids=[f"{c[0].name}-{i}" for i, c in enumerate(CASES)]
)
def test_splitting_a_factor_preserves_the_result(
    op_type: type[graph.GraphOp],
    operands: list[tuple[tuple[int, ...], DType]],
    attrs: dict[str, Any],
) -> None:
    generator = torch.Generator().manual_seed(0)
    avals = [AbstractTensor(shape, dtype) for shape, dtype in operands]
    bound = (
        avals[0].shape[attrs.get("axis", -1)]
        if op_type in (graph.GatherOp, graph.CrossEntropyOp)
        else 2
    )
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
            halves.append(
                _run(
                    op_type,
                    local_avals,
                    _local_attrs(op_type, attrs, rule, factor, 2),
                    local_inputs,
                )[1]
            )
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
            torch.testing.assert_close(
                got, want, rtol=1e-5, atol=1e-5, msg=f"{op_type.name} {rule} factor {factor}"
            )
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


BLOCK_CASES: list[tuple[type[graph.GraphOp], list[tuple[int, ...]], dict[str, Any]]] = [
    (graph.SplitOp, [(4, 24)], {"axis": 1, "sizes": (12, 12)}),
    (graph.SplitOp, [(24, 3)], {"axis": 0, "sizes": (6, 6, 12)}),
    (graph.SplitOp, [(2, 36)], {"axis": 1, "sizes": (12, 24)}),
    (graph.ConcatOp, [(3, 12), (3, 24)], {"axis": 1}),
    (graph.ConcatOp, [(12, 2), (12, 2), (12, 2)], {"axis": 0}),
    (graph.SliceOp, [(4, 24)], {"starts": (0, 6), "limits": (4, 18), "strides": (1, 1)}),
    (graph.SliceOp, [(36, 2)], {"starts": (12, 0), "limits": (24, 2), "strides": (1, 1)}),
]


@pytest.mark.parametrize(
    ("op_type", "shapes", "attrs"),
    BLOCK_CASES,
    ids=[f"{c[0].name}-{i}" for i, c in enumerate(BLOCK_CASES)],
)
@pytest.mark.parametrize("ranks", [2, 3, 4, 6])
def test_block_moves_build_every_result_block(
    op_type: type[graph.GraphOp], shapes: list[tuple[int, ...]], attrs: dict[str, Any], ranks: int
) -> None:
    """A BLOCKS factor split ``ranks`` ways: every rank's block of every result, built
    as the plan says (slices of the operand blocks moved by permutes, summed where ranks
    take different moves, concatenated), equals that block of the op's result."""
    generator = torch.Generator().manual_seed(ranks)
    avals = [AbstractTensor(shape, F32) for shape in shapes]
    inputs = [_random(a, 2, generator).double() for a in avals]
    op, expected = _run(op_type, avals, attrs, inputs)
    rule = sharding_rule(op)
    (windows,) = rule.windows
    assert rule.factors[windows.factor].kind == FactorKind.BLOCKS
    if not rule.divides(windows.factor, ranks):
        pytest.skip(f"{ranks} does not divide the windows {windows}")
    sources = [i for i, w in enumerate(windows.operands) if w is not None]
    targets = [j for j, w in enumerate(windows.results) if w is not None]
    plan = plan_block_moves(
        [Window(*windows.operands[i]) for i in sources],
        [Window(*windows.results[j]) for j in targets],
        ranks,
    )
    blocks = [inputs[i].chunk(ranks, rule.operands[i].index(windows.factor)) for i in sources]
    for j, segments in zip(targets, plan, strict=True):
        dim = rule.results[j].index(windows.factor)
        for p, want in enumerate(expected[j].chunk(ranks, dim)):
            pieces = []
            for segment in segments:
                senders = [[s for s, t in move.pairs if t == p] for move in segment.moves]
                assert sorted(len(s) for s in senders) == [0] * (len(senders) - 1) + [
                    1
                ]  # one move reaches p
                total = None
                for move, sender in zip(segment.moves, senders, strict=True):
                    slices = [
                        b.narrow(dim, move.start, segment.length) for b in blocks[move.source]
                    ]
                    term = slices[sender[0]] if sender else torch.zeros_like(slices[0])
                    total = term if total is None else total + term
                pieces.append(total)
            got = torch.cat(pieces, dim) if pieces else want
            torch.testing.assert_close(
                got, want, rtol=0, atol=0, msg=f"{op_type.name} result {j} rank {p}"
            )


def test_block_moves_of_a_fused_qkv_chunk() -> None:
    """chunk(x, 3) of a dim of 384 split over 4 ranks (blocks of 96; pieces' blocks of
    32): 9 moves, 7 of which send; every rank receives 2 of its 3 blocks of 32."""
    plan = plan_block_moves(
        [Window(0, 384)], [Window(0, 128), Window(128, 128), Window(256, 128)], 4
    )
    assert [len(segments) for segments in plan] == [1, 1, 1]
    assert [[m.pairs for m in segments[0].moves] for segments in plan] == [
        [((0, 0), (1, 3)), ((0, 1),), ((0, 2),)],
        [((1, 0), (2, 3)), ((1, 1),), ((2, 2),)],
        [((2, 0), (3, 3)), ((3, 1),), ((3, 2),)],
    ]
    assert communicating_moves(plan) == 7
    received = received_elements(plan, 4)
    assert [sum(r[p] for r in received) for p in range(4)] == [64, 64, 64, 64]


def test_block_moves_are_local_when_each_rank_keeps_its_block() -> None:
    """A window that is the whole dim is each rank's own block: one local slice."""
    (segments,) = plan_block_moves([Window(0, 8)], [Window(0, 8)], 4)
    assert len(segments) == 1 and segments[0].is_local_slice(4)
    assert communicating_moves(((segments),)) == 0
