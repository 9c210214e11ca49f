"""Reduction kinds (``tessera.ir.reduction_kinds``): every entry against numpy and torch,
``op.prod`` on one device and sharded, and a guard against kind lists kept by hand.

Values are float64 in [0.5, 1.5) (products of a few dozen of them stay near 1) and
results are compared with rtol 1e-12, atol 1e-12: a few roundings of sums and products
of at most 60 terms. max and min are exact.
"""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest
import torch
from machines import BANDWIDTH_BOUND
from xdsl.context import Context
from xdsl.dialects.builtin import Builtin
from xdsl.dialects.func import Func
from xdsl.parser import Parser

import tessera as ts
from tessera import dist, numerics, op
from tessera.backends.virtual import run_partitioned
from tessera.dtypes import DType
from tessera.ir import graph
from tessera.ir.mesh import Mesh
from tessera.ir.reduction_kinds import KINDS, NAMES, TILE_KINDS

ROOT = Path(__file__).resolve().parents[2]
RTOL = ATOL = 1e-12

# an independent model of each kind (a new kind needs one here)
NUMPY = {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min, "prod": np.prod}
TORCH_DTYPES = {d: d.to_torch() for d in DType}


def values(*shape: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(shape, generator=g, dtype=torch.float64) + 0.5


def test_every_kind_has_a_model_a_graph_op_and_an_op_function() -> None:
    assert set(NUMPY) == set(KINDS) == set(NAMES)
    reductions = [t for t in graph.GRAPH_OPS if issubclass(t, graph.ReductionOp)]
    assert sorted(t.KIND for t in reductions) == sorted(KINDS)
    assert all(callable(getattr(op, name)) for name in KINDS)
    assert set(TILE_KINDS) == {k for k, kind in KINDS.items() if kind.combine == k}


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dims", [(0,), (2,), (0, 2), (0, 1, 2)], ids=str)
@pytest.mark.parametrize("keepdim", [False, True])
def test_torch_reduction_matches_numpy(name: str, dims: tuple[int, ...], keepdim: bool) -> None:
    x = values(3, 4, 5)
    got = KINDS[name].torch_reduce(x, dims, keepdim)
    want = NUMPY[name](x.numpy(), axis=dims, keepdims=keepdim)
    np.testing.assert_allclose(got.numpy(), want, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", list(DType), ids=str)
def test_identity_leaves_every_term_unchanged(name: str, dtype: DType) -> None:
    """Combining the identity with ``x`` gives ``x`` (a mean's terms are summed, so its
    identity is the sum's); a bool's max is or, its min and product and."""
    kind = KINDS[name]
    assert kind.identity(dtype) == KINDS[kind.combine].identity(dtype)
    combine = KINDS[kind.combine]
    if dtype == DType.i1 and combine.name == "sum":
        return  # a sum of bools is not a reduction Tessera has (op.sum counts in int64)
    torch_dtype = TORCH_DTYPES[dtype]
    x = (values(7, seed=1) * 100 - 100).to(torch_dtype) if dtype != DType.i1 else values(7) > 1
    identity = torch.full_like(x, kind.identity(dtype))
    combined = combine.torch_reduce(torch.stack([identity, x]), (0,), False).to(torch_dtype)
    assert torch.equal(combined, x)
    if not combine.selects:  # an empty sum or product is the identity (numpy's too)
        empty = NUMPY[combine.name](np.zeros(0, dtype=np.float64))
        assert empty == combine.identity(DType.f64)


@pytest.mark.parametrize("name", NAMES)
def test_distributed_op_is_the_combining_kinds(name: str) -> None:
    """A kind's collectives run its combine's torch.distributed op (a mean's is SUM, then
    a division); the 4-process agreement test (``multiprocess/agreement.py``) runs them."""
    kind = KINDS[name]
    reduce_op = kind.torch_dist_op()
    assert reduce_op == KINDS[kind.combine].torch_dist_op()
    assert reduce_op == getattr(torch.distributed.ReduceOp, kind.dist_op)


def _collective_module(mesh: Mesh, collective: str, axes: str, attrs: str, shapes: str) -> object:
    sizes = ", ".join(f"{a} = {s}" for a, s in zip(mesh.axis_names, mesh.shape, strict=True))
    t_in, t_out = shapes.split(" -> ")
    context = Context()
    for dialect in (Builtin, Func, graph.Graph):
        context.load_dialect(dialect)
    return Parser(
        context,
        f"""
        graph.mesh @mesh axes = [{sizes}]
        func.func @f(%x: {t_in}) -> {t_out} attributes {{graph.partitioned}} {{
          %y = graph.{collective} %x {{axes = [{axes}], {attrs}}} : {shapes}
          func.return %y : {t_out}
        }}
        """,
    ).parse_module()


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize(
    ("mesh", "axes"),
    [(Mesh(["x"], (4,)), ("x",)), (Mesh(["dp", "tp"], (2, 2)), ("tp",))],
    ids=["x4", "dp2xtp2-tp"],
)
@pytest.mark.parametrize("mode", ["fast", "deterministic"])
def test_virtual_all_reduce_and_reduce_scatter_match_numpy(
    name: str, mesh: Mesh, axes: tuple[str, ...], mode: str
) -> None:
    """Every rank's result of an all_reduce and a reduce_scatter (dim 0) of each kind
    over a virtual mesh equals numpy's reduction of its group's operands."""
    n = len(mesh.groups(axes)[0])
    xs = [values(4, 3, seed=r) for r in range(mesh.size)]
    modules = {
        "all_reduce": _collective_module(
            mesh, "all_reduce", ", ".join(axes), f"kind = {name}",
            "tensor<4x3xf64> -> tensor<4x3xf64>",
        ),
        "reduce_scatter": _collective_module(
            mesh, "reduce_scatter", ", ".join(axes), f"dim = 0, kind = {name}",
            f"tensor<4x3xf64> -> tensor<{4 // n}x3xf64>",
        ),
    }  # fmt: skip
    with numerics.mode_of(mode):
        results = {c: run_partitioned(m, "f", mesh, [[x] for x in xs]) for c, m in modules.items()}
    for group in mesh.groups(axes):
        want = NUMPY[name](np.stack([xs[r].numpy() for r in group]), axis=0)
        for position, rank in enumerate(group):
            (reduced,) = results["all_reduce"][rank]
            (scattered,) = results["reduce_scatter"][rank]
            np.testing.assert_allclose(reduced.numpy(), want, rtol=RTOL, atol=ATOL)
            piece = np.split(want, n, axis=0)[position]
            np.testing.assert_allclose(scattered.numpy(), piece, rtol=RTOL, atol=ATOL)


# --- op.prod ---------------------------------------------------------------------------------

MESH = dist.mesh({"dp": 2}, topology=BANDWIDTH_BOUND)  # toy tensors standing for large ones
ROWS_DP = dist.ShardSpec(partition=(0,), mesh_axes=("dp",))
COLS_DP = dist.ShardSpec(partition=(1,), mesh_axes=("dp",))


def _with_zeros(x: torch.Tensor) -> torch.Tensor:
    """``x`` with one zero in column 1 and two in column 2 (the gradient's special cases)."""
    x = x.clone()
    x[0, 1] = x[1, 2] = x[3, 2] = 0.0
    return x


def _prod_loss(x: torch.Tensor, axis: int) -> torch.Tensor:
    """A weighted sum of the products (traced, or run by torch)."""
    weights = torch.arange(1.0, 1.0 + x.shape[1 - axis], dtype=torch.float64)
    return (x.prod(axis) * weights).sum()


@pytest.mark.parametrize("kernels", ["reference", "triton"])
@pytest.mark.parametrize("axis", [0, 1, None], ids=str)
def test_prod_on_one_device_matches_torch(kernels: str, axis: int | None) -> None:
    x = _with_zeros(values(6, 5))
    f = ts.jit(lambda a: op.prod(a, axis=axis), kernels=kernels)
    want = x.prod() if axis is None else x.prod(axis)
    torch.testing.assert_close(f(x), want, rtol=RTOL, atol=ATOL)
    ints = torch.arange(-6, 6, dtype=torch.int32).reshape(3, 4)
    exact = ts.jit(lambda a: op.prod(a, axis=1), kernels=kernels)(ints)
    assert exact.dtype == torch.int64 and torch.equal(exact, ints.prod(1))


@pytest.mark.parametrize("kernels", ["reference", "triton"])
@pytest.mark.parametrize("axis", [0, 1])
def test_prod_gradient_matches_torch_autograd(kernels: str, axis: int) -> None:
    """Slices without a zero, with one and with two zeros (torch's three cases)."""
    x = _with_zeros(values(6, 5, seed=3))
    grad = ts.grad(lambda a: _prod_loss(a, axis), kernels=kernels)(x)
    leaf = x.clone().requires_grad_(True)
    _prod_loss(leaf, axis).backward()
    torch.testing.assert_close(grad, leaf.grad, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("kernels", ["reference", "triton"])
@pytest.mark.parametrize(("spec", "axis"), [(ROWS_DP, 0), (ROWS_DP, 1), (COLS_DP, 0)])
def test_prod_sharded_over_dp_matches_torch(kernels: str, spec: dist.ShardSpec, axis: int) -> None:
    """Over a split axis each rank multiplies its rows (the result is partial ``prod``
    over dp) and an all_reduce prod resolves it; the gradient is differentiated before
    partitioning, so it too is partial where it multiplies over dp."""
    x = _with_zeros(values(6, 4, seed=4))
    f = ts.jit(lambda a: op.prod(a, axis=axis), mesh=MESH, in_shardings=(spec,), kernels=kernels)
    torch.testing.assert_close(f(x), x.prod(axis), rtol=RTOL, atol=ATOL)
    if spec is ROWS_DP and axis == 0:
        text = f.lower(x).as_text("sharded")
        assert "partial = prod[dp]" in text and "graph.all_reduce" in text
        assert "kind = prod" in text
    loss = ts.jit(
        ts.grad(lambda a: _prod_loss(a, axis)), mesh=MESH, in_shardings=(spec,), kernels=kernels
    )
    leaf = x.clone().requires_grad_(True)
    _prod_loss(leaf, axis).backward()
    torch.testing.assert_close(loss(x), leaf.grad, rtol=RTOL, atol=ATOL)


# --- no kind lists outside the registry --------------------------------------------------------


def _literal_kind_lists(path: Path) -> list[tuple[int, list[str]]]:
    """Tuples, lists, sets and dict keys written as two or more kind names and nothing else."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            items = node.elts
        elif isinstance(node, ast.Dict):
            items = [k for k in node.keys if k is not None]
        else:
            continue
        names = [i.value for i in items if isinstance(i, ast.Constant) and isinstance(i.value, str)]
        if len(items) >= 2 and len(names) == len(items) and set(names) <= set(KINDS):
            found.append((node.lineno, names))
    return sorted(found)


def test_no_module_but_the_registry_lists_reduction_kinds() -> None:
    """A tuple like ``("sum", "mean")`` or a table keyed by kind names outside
    ``tessera/ir/reduction_kinds.py`` is a list kept by hand: ask ``KINDS`` instead."""
    registry = ROOT / "tessera" / "ir" / "reduction_kinds.py"
    offenders = {
        str(path.relative_to(ROOT)): found
        for path in sorted((ROOT / "tessera").rglob("*.py"))
        if path != registry and (found := _literal_kind_lists(path))
    }
    assert not offenders, offenders


def test_the_guard_finds_kind_lists(tmp_path: Path) -> None:
    source = tmp_path / "module.py"
    source.write_text(
        'A = kind in ("sum", "mean")\n'
        'B = {"max": "tl.max", "min": "tl.min"}\n'
        'C = ("mean", "sum", "none")  # loss reductions: not kinds only\n'
        'D = ("sum",)\n',
        encoding="utf-8",
    )
    assert _literal_kind_lists(source) == [(1, ["sum", "mean"]), (2, ["max", "min"])]
