"""VJP rules of reductions, normalisations, layout ops, gathers and collectives.

Each test builds a function ``vjp(operands..., cotangents...) -> operand cotangents``
around one forward op and its rule, runs it with the reference executor and compares
with ``torch.autograd.grad`` (a vector-Jacobian product with the same cotangents).

The graph dialect has no f64, so the IR is typed f32; the reference executor is plain
torch, so it runs the f32-typed graph on float64 tensors (constants and casts give f32
0-d or exact values, which torch promotes to float64), which lets the comparison use a
1e-9 tolerance. The gather rule's one-hot matmul needs one dtype, so it runs in f32.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp, UnitAttr
from xdsl.ir import Block, Region
from xdsl.rewriter import InsertPoint

from tessera.backends.reference import run_function
from tessera.dtypes import DType
from tessera.errors import TesseraError
from tessera.ir import graph
from tessera.ir.abstract import AbstractTensor
from tessera.ir.grad_builder import GradBuilder
from tessera.ir.sharding import Sharding, ShardingAttr
from tessera.opdefs import op_def

TOL = {torch.float64: 1e-9, torch.float32: 1e-5}


def _ir_type(t: torch.Tensor) -> AbstractTensor:
    dtype = DType.f32 if t.dtype.is_floating_point else DType.i64
    return AbstractTensor(tuple(t.shape), dtype)


def build_vjp(
    op_type: type[graph.GraphOp],
    operands: Sequence[torch.Tensor],
    attrs: dict[str, Any],
    with_ct: Sequence[bool] | None = None,
    partitioned: bool = False,
) -> tuple[ModuleOp, graph.GraphOp, list[bool]]:
    """The module of ``vjp(operands..., cts...)``; ``with_ct`` says which results get
    a cotangent argument (all by default). Returns the module, the forward op and which
    operands have a gradient result."""
    types = [_ir_type(t).to_xdsl() for t in operands]
    results = op_type.infer(*(_ir_type(t) for t in operands), **attrs)
    with_ct = list(with_ct) if with_ct is not None else [True] * len(results)
    ct_types = [r.to_xdsl() for r, w in zip(results, with_ct, strict=True) if w]
    block = Block(arg_types=[*types, *ct_types])
    op = graph.build(op_type, block.args[: len(operands)], **attrs)
    block.add_op(op)
    cts_args = iter(block.args[len(operands) :])
    cts = [next(cts_args) if w else None for w in with_ct]
    function = func.FuncOp("vjp", ([*types, *ct_types], []), Region(block))
    if partitioned:
        function.attributes[graph.PARTITIONED] = UnitAttr()
    module = ModuleOp([function])
    grads = op_def(op_type).vjp(GradBuilder(InsertPoint.at_end(block)), op, cts)
    assert len(grads) == len(operands)
    returned = [g for g in grads if g is not None]
    block.add_op(func.ReturnOp(*returned))
    function.function_type = func.FunctionType.from_lists(
        [*types, *ct_types], [g.type for g in returned]
    )
    module.verify()
    return module, op, [g is not None for g in grads]


def check_vjp(
    op_type: type[graph.GraphOp],
    operands: Sequence[torch.Tensor],
    attrs: dict[str, Any],
    torch_fn: Callable[..., Any] | None = None,
    with_ct: Sequence[bool] | None = None,
    dtype: torch.dtype = torch.float64,
) -> list[torch.Tensor]:
    """Compares the rule's operand cotangents with torch autograd of ``torch_fn`` (the
    op's reference semantics by default) on float operands of ``dtype``."""
    operands = [t.to(dtype) if t.is_floating_point() else t for t in operands]
    module, op, has_grad = build_vjp(op_type, operands, attrs, with_ct)
    if torch_fn is None:
        impl = op_def(op_type).reference
        torch_fn = lambda *xs: impl(op, *xs)  # noqa: E731
    inputs = [t.clone().requires_grad_(t.is_floating_point()) for t in operands]
    outs = torch_fn(*inputs)
    outs = list(outs) if isinstance(outs, tuple) else [outs]
    with_ct = list(with_ct) if with_ct is not None else [True] * len(outs)
    torch.manual_seed(1)
    cts = [torch.randn(o.shape, dtype=dtype) for o in outs]
    used = [(o, c) for o, c, w in zip(outs, cts, with_ct, strict=True) if w]
    wrt = [t for t in inputs if t.requires_grad]
    expected = torch.autograd.grad(
        [o for o, _ in used], wrt, [c for _, c in used], allow_unused=True
    )
    got = run_function(module, "vjp", [*operands, *(c for _, c in used)])
    assert has_grad == [t.requires_grad for t in inputs]
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        e = torch.zeros_like(g) if e is None else e
        assert g.shape == e.shape
        torch.testing.assert_close(g.to(dtype), e, rtol=TOL[dtype], atol=TOL[dtype])
    return list(got)


def randn(*shape: int) -> torch.Tensor:
    return torch.randn(shape, dtype=torch.float64)


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


# --- reductions ---------------------------------------------------------------------------


@pytest.mark.parametrize("op_type", [graph.SumOp, graph.MeanOp])
@pytest.mark.parametrize(
    ("axes", "keepdims"),
    [([1], False), ([1], True), ([0, 2], False), ([0, 1, 2], True), ([], False)],
)
def test_sum_mean(op_type: type[graph.GraphOp], axes: list[int], keepdims: bool) -> None:
    check_vjp(op_type, [randn(2, 3, 4)], {"axes": axes, "keepdims": keepdims})


@pytest.mark.parametrize("op_type", [graph.MaxOp, graph.MinOp])
@pytest.mark.parametrize(("axes", "keepdims"), [([1], False), ([0, 2], True), ([], False)])
@pytest.mark.parametrize("ties", [False, True])
def test_max_min(op_type: type[graph.GraphOp], axes: list[int], keepdims: bool, ties: bool) -> None:
    x = torch.randint(0, 3, (3, 4, 5)).double() if ties else randn(3, 4, 5)
    check_vjp(op_type, [x], {"axes": axes, "keepdims": keepdims})


def test_max_splits_ties_evenly() -> None:
    x = torch.tensor([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, 2.0]])
    module, _, _ = build_vjp(graph.MaxOp, [x], {"axes": [1], "keepdims": False})
    (grad,) = run_function(module, "vjp", [x, torch.tensor([1.0, 2.0])])
    expected = torch.tensor([[0.0, 0.5, 0.5, 0.0], [0.5, 0.5, 0.5, 0.5]])
    torch.testing.assert_close(grad, expected)


# --- softmax and normalisations -------------------------------------------------------------


@pytest.mark.parametrize("op_type", [graph.SoftmaxOp, graph.LogSoftmaxOp])
@pytest.mark.parametrize("axis", [0, 2])
def test_softmax(op_type: type[graph.GraphOp], axis: int) -> None:
    check_vjp(op_type, [randn(3, 4, 5)], {"axis": axis})


@pytest.mark.parametrize("op_type", [graph.LayerNormOp, graph.RmsNormOp])
@pytest.mark.parametrize(("axes", "eps"), [([2], 1e-5), ([1, 2], 0.0), ([0], 0.5)])
def test_normalization(op_type: type[graph.GraphOp], axes: list[int], eps: float) -> None:
    check_vjp(op_type, [randn(3, 4, 5) * 2 + 1], {"axes": axes, "eps": eps})


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("batch", [(), (6,), (2, 3)])
def test_cross_entropy(reduction: str, batch: tuple[int, ...]) -> None:
    classes = 5
    logits = randn(*batch, classes)
    labels = torch.randint(0, classes, batch)

    def torch_fn(z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = F.cross_entropy(z.reshape(-1, classes), y.reshape(-1), reduction=reduction)
        return loss.reshape(batch) if reduction == "none" else loss

    check_vjp(graph.CrossEntropyOp, [logits, labels], {"reduction": reduction}, torch_fn)


# --- layout -----------------------------------------------------------------------------------


def test_reshape() -> None:
    check_vjp(graph.ReshapeOp, [randn(2, 3, 4)], {"shape": (4, 6)})


@pytest.mark.parametrize(
    ("shape", "target"), [((3, 1), (2, 3, 4)), ((4,), (2, 3, 4)), ((), (2, 3)), ((2, 3), (2, 3))]
)
def test_broadcast_to(shape: tuple[int, ...], target: tuple[int, ...]) -> None:
    check_vjp(graph.BroadcastToOp, [randn(*shape)], {"shape": target})


@pytest.mark.parametrize("perm", [[1, 0, 2], [2, 0, 1], [0, 1, 2]])
def test_transpose(perm: list[int]) -> None:
    check_vjp(graph.TransposeOp, [randn(2, 3, 4)], {"perm": perm})


@pytest.mark.parametrize(
    ("starts", "limits", "strides"),
    [
        ([0, 0], [7, 9], [1, 1]),  # the whole tensor
        ([2, 1], [5, 9], [1, 1]),
        ([0, 0], [7, 9], [2, 3]),
        ([1, 2], [6, 8], [2, 4]),  # strides that do not divide the span
        ([6, 3], [7, 3], [1, 1]),  # an empty slice
        ([1, 0], [7, 9], [5, 9]),
    ],
)
def test_slice(starts: list[int], limits: list[int], strides: list[int]) -> None:
    check_vjp(
        graph.SliceOp, [randn(7, 9)], {"starts": starts, "limits": limits, "strides": strides}
    )


@pytest.mark.parametrize("axis", [0, 1])
def test_concat(axis: int) -> None:
    parts = [randn(2, 3), randn(2, 3), randn(2, 3)]
    parts[1] = randn(4, 3) if axis == 0 else randn(2, 1)
    check_vjp(graph.ConcatOp, parts, {"axis": axis}, lambda *xs: torch.cat(xs, dim=axis))


@pytest.mark.parametrize("with_ct", [[True, True, True], [False, True, False]])
def test_split(with_ct: list[bool]) -> None:
    sizes = [2, 0, 3]
    check_vjp(
        graph.SplitOp,
        [randn(4, 5)],
        {"axis": 1, "sizes": sizes},
        lambda x: tuple(torch.split(x, sizes, dim=1)),
        with_ct=with_ct,
    )


@pytest.mark.parametrize(
    ("shape", "indices", "axis"),
    [
        ((5, 3), [0, 2, 2, 4, 0], 0),  # an embedding lookup with repeated rows
        ((2, 6, 3), [[5, -1], [0, 3]], 1),  # 2-d and negative indices
        ((4, 3), [[1, 1, 1]], 1),
    ],
)
def test_gather(shape: tuple[int, ...], indices: list[Any], axis: int) -> None:
    check_vjp(
        graph.GatherOp,
        [randn(*shape), torch.tensor(indices)],
        {"axis": axis},
        dtype=torch.float32,
    )


# --- collectives and sharding constraints -------------------------------------------------

COLLECTIVES = [
    (graph.AllReduceOp, {"axes": ["dp"], "kind": "sum"}),
    (graph.AllGatherOp, {"axes": ["dp"], "dim": 0}),
    (graph.AllSliceOp, {"axes": ["dp"], "dim": 1}),
    (graph.ReduceScatterOp, {"axes": ["dp"], "dim": 0, "kind": "sum"}),
    (graph.AllToAllOp, {"axes": ["dp"], "split_dim": 0, "concat_dim": 1}),
    (graph.BroadcastOp, {"axes": ["dp"], "src": 0}),
    (graph.ShardOp, {"sharding": ShardingAttr.get("mesh", Sharding(((), ("dp",))))}),
]


@pytest.mark.parametrize(("op_type", "attrs"), COLLECTIVES, ids=lambda v: getattr(v, "name", ""))
def test_collectives_are_identities(op_type: type[graph.GraphOp], attrs: dict[str, Any]) -> None:
    check_vjp(op_type, [randn(4, 6)], attrs, lambda x: x * 1)


def test_partitioned_collective_is_an_error() -> None:
    with pytest.raises(TesseraError, match="before shard-partition"):
        build_vjp(graph.AllReduceOp, [randn(4)], COLLECTIVES[0][1], partitioned=True)


# --- finite differences (an oracle independent of torch autograd) ----------------------------


@pytest.mark.parametrize(
    ("op_type", "attrs"),
    [
        (graph.LayerNormOp, {"axes": [1], "eps": 1e-3}),
        (graph.SoftmaxOp, {"axis": 1}),
        (graph.SliceOp, {"starts": [1, 0], "limits": [3, 5], "strides": [1, 2]}),
    ],
)
def test_against_finite_differences(op_type: type[graph.GraphOp], attrs: dict[str, Any]) -> None:
    """Central differences of the op's reference forward in float64."""
    x = randn(3, 5)
    module, op, _ = build_vjp(op_type, [x], attrs)
    forward = lambda v: op_def(op_type).reference(op, v)  # noqa: E731
    ct = randn(*forward(x).shape)
    (grad,) = run_function(module, "vjp", [x, ct])
    step = 1e-6
    numeric = torch.zeros_like(x)
    for i in range(x.numel()):
        delta = torch.zeros(x.numel(), dtype=x.dtype)
        delta[i] = step
        delta = delta.reshape(x.shape)
        numeric.view(-1)[i] = ((forward(x + delta) - forward(x - delta)) * ct).sum() / (2 * step)
    torch.testing.assert_close(grad, numeric, rtol=1e-7, atol=1e-7)


@pytest.mark.parametrize(
    ("op_type", "attrs"),
    [
        (graph.LayerNormOp, {"axes": [2], "eps": 1e-5}),
        (graph.RmsNormOp, {"axes": [1, 2], "eps": 1e-5}),
        (graph.MaxOp, {"axes": [1], "keepdims": False}),
        (graph.MeanOp, {"axes": [0, 2], "keepdims": True}),
        (graph.LogSoftmaxOp, {"axis": 1}),
        (graph.SliceOp, {"starts": [0, 1, 0], "limits": [3, 4, 5], "strides": [2, 2, 2]}),
    ],
)
def test_in_f32(op_type: type[graph.GraphOp], attrs: dict[str, Any]) -> None:
    """The backward graphs also run with their own (f32) types."""
    check_vjp(op_type, [randn(3, 4, 5)], attrs, dtype=torch.float32)


def test_value_and_grad_end_to_end() -> None:
    """The rules under ``ts.value_and_grad`` (skipped while the autodiff API is absent)."""
    api = pytest.importorskip("tessera.autodiff.api")
    from tessera import op as O

    def loss(x: Any, table: Any, ids: Any, labels: Any) -> Any:
        h = O.layer_norm(O.embedding(ids, table) + x, axis=-1)
        a, rest = O.split(h, [3], axis=1)
        z = O.concat([rest, a], axis=1)[:, 1:7:2]
        z = O.reshape(O.transpose(O.reshape(z, (2, 2, 3)), (1, 0, 2)), (4, 3))
        z = z - O.max(z, axis=1, keepdims=True)
        return O.cross_entropy(O.log_softmax(z, axis=-1), labels) + O.mean(O.rms_norm(z))

    def torch_loss(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
        h = F.layer_norm(table[ids] + x, (8,), eps=1e-5)
        a, rest = torch.split(h, [3, 5], dim=1)
        z = torch.cat([rest, a], 1)[:, 1:7:2].reshape(2, 2, 3).permute(1, 0, 2).reshape(4, 3)
        z = z - z.amax(1, keepdim=True)
        rms = z * torch.rsqrt(z.square().mean(-1, keepdim=True) + 1e-6)
        return F.cross_entropy(torch.log_softmax(z, -1), labels) + rms.mean()

    x, table = torch.randn(4, 8), torch.randn(6, 8)
    ids, labels = torch.tensor([0, 5, 5, 2]), torch.tensor([0, 2, 1, 1])
    value, grads = api.value_and_grad(loss, argnums=(0, 1))(x, table, ids, labels)
    inputs = [x.double().requires_grad_(), table.double().requires_grad_()]
    expected_value = torch_loss(*inputs)
    expected = torch.autograd.grad(expected_value, inputs)
    torch.testing.assert_close(value.double(), expected_value.detach(), rtol=1e-5, atol=1e-6)
    for got, want in zip(grads, expected, strict=True):
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)
