"""The virtual mesh (tessera.backends.virtual), layouts (scatter / assemble) and
CollectiveInfo, checked against an independent numpy model of the collectives."""

from __future__ import annotations

from math import prod

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from xdsl.context import Context
from xdsl.dialects.builtin import Builtin, ModuleOp
from xdsl.dialects.func import Func
from xdsl.parser import Parser

from tessera.backends.collective_info import CollectiveInfo, collectives
from tessera.backends.launch_plan import run_virtual
from tessera.backends.layout import assemble, scatter
from tessera.backends.virtual import run_partitioned
from tessera.errors import ExecutionError, ShardingError
from tessera.ir.graph import Graph
from tessera.ir.mesh import Mesh
from tessera.ir.reduction_kinds import KINDS, NAMES
from tessera.ir.sharding import Sharding
from tessera.opdefs import op_def
from tessera.passes.lower_graph_to_schedule import LowerGraphToSchedulePass


def parse(text: str) -> ModuleOp:
    context = Context()
    for dialect in (Builtin, Func, Graph):
        context.load_dialect(dialect)
    module = Parser(context, text).parse_module()
    module.verify()
    return module


def ttype(shape: tuple[int, ...], dtype: str = "f32") -> str:
    return f"tensor<{''.join(f'{d}x' for d in shape)}{dtype}>"


def mesh_decl(mesh: Mesh) -> str:
    axes = ", ".join(f"{a} = {s}" for a, s in zip(mesh.axis_names, mesh.shape, strict=True))
    return f"graph.mesh @mesh axes = [{axes}]"


# --- an independent numpy model of the collectives -----------------------------------------


def np_groups(mesh: Mesh, axes: tuple[str, ...]) -> np.ndarray:
    """[group, position] -> rank: ranks row-major over the mesh; a group varies along
    ``axes`` only, ordered by its coordinates along ``axes`` (in that order, major first)."""
    grid = np.arange(prod(mesh.shape)).reshape(mesh.shape)
    moved = np.moveaxis(grid, [mesh.axis_names.index(a) for a in axes], range(-len(axes), 0))
    return moved.reshape(-1, prod(mesh.axis_size(a) for a in axes))


NP_REDUCE = {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min, "prod": np.prod}
NP_IDENTITY = {"sum": 0.0, "prod": 1.0}  # the kinds whose copies do not combine to the value


def np_collective(kind: str, attrs: dict, xs: list[np.ndarray]) -> list[np.ndarray]:
    """One group's results from its members' operands (float64)."""
    n = len(xs)
    if kind == "all_reduce":
        return [NP_REDUCE[attrs["kind"]](np.stack(xs), axis=0)] * n
    if kind == "all_gather":
        return [np.concatenate(xs, axis=attrs["dim"])] * n
    if kind == "all_slice":
        return [np.split(x, n, axis=attrs["dim"])[p] for p, x in enumerate(xs)]
    if kind == "reduce_scatter":
        return np.split(NP_REDUCE[attrs["kind"]](np.stack(xs), axis=0), n, axis=attrs["dim"])
    if kind == "all_to_all":
        return [
            np.concatenate([np.split(x, n, attrs["split_dim"])[p] for x in xs], attrs["concat_dim"])
            for p in range(n)
        ]
    assert kind == "broadcast"
    return [xs[attrs["src"]]] * n


def np_run(mesh: Mesh, kind: str, axes: tuple[str, ...], attrs: dict, xs: list[np.ndarray]) -> list:
    out: list = [None] * len(xs)
    for group in np_groups(mesh, axes):
        for rank, value in zip(
            group, np_collective(kind, attrs, [xs[r] for r in group]), strict=True
        ):
            out[rank] = value
    return out


def result_shape(kind: str, attrs: dict, shape: tuple[int, ...], n: int) -> tuple[int, ...]:
    out = list(shape)
    if kind == "all_gather":
        out[attrs["dim"]] *= n
    if kind in ("all_slice", "reduce_scatter"):
        out[attrs["dim"]] //= n
    if kind == "all_to_all":
        out[attrs["split_dim"]] //= n
        out[attrs["concat_dim"]] *= n
    return tuple(out)


def attr_text(axes: tuple[str, ...], attrs: dict) -> str:
    items = [f"axes = [{', '.join(axes)}]", *(f"{k} = {v}" for k, v in attrs.items())]
    return "{" + ", ".join(items) + "}"


def collective_module(
    mesh: Mesh, kind: str, axes: tuple[str, ...], attrs: dict, shape, dtype="f32"
):
    n = prod(mesh.axis_size(a) for a in axes)
    t_in, t_out = ttype(shape, dtype), ttype(result_shape(kind, attrs, shape, n), dtype)
    return parse(
        f"""
        {mesh_decl(mesh)}
        func.func @f(%x: {t_in}) -> {t_out} attributes {{graph.partitioned}} {{
          %y = graph.{kind} %x {attr_text(axes, attrs)} : {t_in} -> {t_out}
          func.return %y : {t_out}
        }}
        """
    )


MESHES_AND_AXES = [
    (Mesh(["x"], (4,)), ("x",)),
    *(
        (Mesh(["dp", "tp"], s), axes)
        for s in [(2, 2), (2, 3)]
        for axes in [("dp",), ("tp",), ("dp", "tp"), ("tp", "dp")]
    ),
]
SPECS = [
    *(("all_reduce", {"kind": k}) for k in KINDS),
    ("all_gather", {"dim": 0}),
    ("all_gather", {"dim": 1}),
    ("all_slice", {"dim": 0}),
    ("all_slice", {"dim": 1}),
    *(
        ("reduce_scatter", {"dim": d, "kind": k})
        for d, k in [(0, "sum"), (1, "mean"), (0, "max"), (1, "min"), (0, "prod")]
    ),
    ("all_to_all", {"split_dim": 0, "concat_dim": 1}),
    ("all_to_all", {"split_dim": 1, "concat_dim": 0}),
    ("broadcast", {"src": 0}),
    ("broadcast", {"src": "last"}),
]
LOCAL_SHAPE = (12, 24)  # divisible by every group size used: 2, 3, 4, 6


@pytest.mark.parametrize(("mesh", "axes"), MESHES_AND_AXES, ids=lambda v: str(v))
@pytest.mark.parametrize(("kind", "attrs"), SPECS, ids=lambda v: str(v))
def test_collective_matches_numpy(mesh, axes, kind, attrs):
    n = prod(mesh.axis_size(a) for a in axes)
    attrs = {k: (n - 1 if v == "last" else v) for k, v in attrs.items()}
    module = collective_module(mesh, kind, axes, attrs, LOCAL_SHAPE)
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(LOCAL_SHAPE).astype(np.float32) for _ in range(mesh.size)]
    results = run_partitioned(module, "f", mesh, [[torch.from_numpy(x)] for x in inputs])
    expected = np_run(mesh, kind, axes, attrs, [x.astype(np.float64) for x in inputs])
    assert len(results) == mesh.size
    for rank, (got,) in enumerate(results):
        assert got.dtype == torch.float32
        np.testing.assert_allclose(
            got.numpy(), expected[rank], rtol=1e-5, atol=1e-6, err_msg=f"rank {rank}"
        )


def test_results_do_not_share_storage():
    mesh = Mesh(["x"], (4,))
    module = collective_module(mesh, "all_reduce", ("x",), {"kind": "sum"}, (2, 2))
    results = run_partitioned(module, "f", mesh, [[torch.ones(2, 2)] for _ in range(4)])
    results[0][0].zero_()
    assert torch.equal(results[1][0], torch.full((2, 2), 4.0))


def test_program_of_several_collectives_matches_numpy():
    mesh = Mesh(["dp", "tp"], (2, 4))
    module = parse(
        mesh_decl(mesh)
        + """
        func.func @f(%x: tensor<8x16xf32>) -> tensor<8x16xf32> attributes {graph.partitioned} {
          %a = graph.all_gather %x {axes = [tp], dim = 0} : tensor<8x16xf32> -> tensor<32x16xf32>
          %b = graph.all_slice %a {axes = [tp], dim = 0} : tensor<32x16xf32> -> tensor<8x16xf32>
          %c = graph.all_to_all %b {axes = [dp], split_dim = 1, concat_dim = 0} : tensor<8x16xf32> -> tensor<16x8xf32>
          %d = graph.reduce_scatter %c {axes = [dp, tp], dim = 0, kind = sum} : tensor<16x8xf32> -> tensor<2x8xf32>
          %e = graph.all_gather %d {axes = [dp, tp], dim = 0} : tensor<2x8xf32> -> tensor<16x8xf32>
          %r = graph.reshape %e : tensor<16x8xf32> -> tensor<8x16xf32>
          func.return %r : tensor<8x16xf32>
        }
        """
    )
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal((8, 16)).astype(np.float32) for _ in range(mesh.size)]
    results = run_partitioned(module, "f", mesh, [[torch.from_numpy(x)] for x in xs])
    v = [x.astype(np.float64) for x in xs]
    v = np_run(mesh, "all_gather", ("tp",), {"dim": 0}, v)
    v = np_run(mesh, "all_slice", ("tp",), {"dim": 0}, v)
    v = np_run(mesh, "all_to_all", ("dp",), {"split_dim": 1, "concat_dim": 0}, v)
    v = np_run(mesh, "reduce_scatter", ("dp", "tp"), {"dim": 0, "kind": "sum"}, v)
    v = np_run(mesh, "all_gather", ("dp", "tp"), {"dim": 0}, v)
    for rank, (got,) in enumerate(results):
        np.testing.assert_allclose(got.numpy(), v[rank].reshape(8, 16), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_low_precision_sum_accumulates_in_f32(dtype):
    mesh = Mesh(["x"], (4,))
    module = collective_module(mesh, "all_reduce", ("x",), {"kind": "sum"}, (1,), dtype)
    torch_dtype = torch.bfloat16 if dtype == "bf16" else torch.float16
    big = 256.0 if dtype == "bf16" else 2048.0  # where adding 1 is lost to rounding
    values = [big, 1.0, 1.0, 1.0]
    results = run_partitioned(
        module, "f", mesh, [[torch.tensor([v], dtype=torch_dtype)] for v in values]
    )
    expected = torch.tensor([sum(values)], dtype=torch.float32).to(torch_dtype)
    assert expected.item() != big
    for (got,) in results:
        assert got.dtype == torch_dtype
        assert torch.equal(got, expected)


@pytest.mark.parametrize(
    ("mesh", "x_axes"),
    [(Mesh(["tp"], (4,)), ()), (Mesh(["dp", "tp"], (2, 2)), ("dp",))],
    ids=["tp4", "dp2xtp2"],
)
def test_megatron_mlp_matches_torch_eager(mesh, x_axes):
    torch.manual_seed(0)
    x, w1, w2 = torch.randn(16, 8), torch.randn(8, 32), torch.randn(32, 8)
    xs, w1s, w2s = Sharding((x_axes, ())), Sharding(((), ("tp",))), Sharding((("tp",), ()))
    tx, tw1, tw2 = (ttype(s.local_shape(mesh, t.shape)) for s, t in [(xs, x), (w1s, w1), (w2s, w2)])
    th = ttype((xs.local_shape(mesh, x.shape)[0], w1s.local_shape(mesh, w1.shape)[1]))
    module = parse(
        mesh_decl(mesh)
        + f"""
        func.func @mlp(%x: {tx}, %w1: {tw1}, %w2: {tw2}) -> {tx} attributes {{graph.partitioned}} {{
          %h = graph.matmul %x, %w1 : {tx}, {tw1} -> {th}
          %g = graph.gelu %h {{approximate = tanh}} : {th}
          %p = graph.matmul %g, %w2 : {th}, {tw2} -> {tx}
          %y = graph.all_reduce %p {{axes = [tp], kind = sum}} : {tx}
          func.return %y : {tx}
        }}
        """
    )
    pieces = [scatter(t, s, mesh) for t, s in [(x, xs), (w1, w1s), (w2, w2s)]]
    results = run_partitioned(
        module, "mlp", mesh, [[p[r] for p in pieces] for r in range(mesh.size)]
    )
    expected = torch.nn.functional.gelu(x @ w1, approximate="tanh") @ w2
    got = assemble([r[0] for r in results], xs, mesh)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


# --- scatter / assemble ------------------------------------------------------------------------

LAYOUT_MESHES = [
    Mesh(["x"], (4,)),
    Mesh(["dp", "tp"], (2, 2)),
    Mesh(["dp", "tp"], (2, 3)),
    Mesh(["a", "b", "c"], (2, 1, 3)),
]


@st.composite
def layouts(draw):
    """A mesh, a sharding (multi-axis dims, partial axes of any kind) and a fitting value."""
    mesh = draw(st.sampled_from(LAYOUT_MESHES))
    rank = draw(st.integers(1, 3))
    dims: list[list[str]] = [[] for _ in range(rank)]
    partial = []
    for axis in draw(st.permutations(mesh.axis_names)):
        role = draw(st.sampled_from(["dim", "partial", "none"]))
        if role == "dim":
            dims[draw(st.integers(0, rank - 1))].append(axis)
        elif role == "partial":
            partial.append((axis, draw(st.sampled_from(NAMES))))
    sharding = Sharding(tuple(map(tuple, dims)), tuple(partial))
    shape = tuple(draw(st.integers(1, 2)) * sharding.shards(mesh, d) for d in range(rank))
    seed = draw(st.integers(0, 2**16))
    value = torch.from_numpy(np.random.default_rng(seed).standard_normal(shape))
    return mesh, sharding, value


def np_piece(value: np.ndarray, sharding: Sharding, mesh: Mesh, rank: int) -> np.ndarray:
    """The block of ``rank`` (mixed-radix over each dim's axes, major first)."""
    coords = dict(zip(mesh.axis_names, np.unravel_index(rank, mesh.shape), strict=True))
    for dim, axes in enumerate(sharding.dims):
        sizes = [mesh.axis_size(a) for a in axes]
        index = int(np.ravel_multi_index([coords[a] for a in axes], sizes)) if axes else 0
        value = np.split(value, prod(sizes), axis=dim)[index]
    return value


@given(layouts())
def test_scatter_assemble_round_trip(layout):
    mesh, sharding, value = layout
    pieces = scatter(value, sharding, mesh)
    assert len(pieces) == mesh.size
    for rank, piece in enumerate(pieces):
        assert tuple(piece.shape) == sharding.local_shape(mesh, value.shape)
        block = np_piece(value.numpy(), sharding, mesh, rank)
        coords = mesh.coords(rank)
        # the identity of the first partial axis (in reduction order) of a kind whose
        # copies do not combine to the value, along which the rank is not first
        held = [NP_IDENTITY[k] for a, k in sharding.partial if coords[a] and k in NP_IDENTITY]
        expected = np.full_like(block, held[0]) if held else block
        np.testing.assert_array_equal(piece.numpy(), expected)
    torch.testing.assert_close(assemble(pieces, sharding, mesh), value, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kind", NAMES)
def test_assemble_reduces_partial_pieces(kind):
    mesh = Mesh(["dp", "tp"], (2, 3))
    sharding = Sharding((("dp",), ()), (("tp", kind),))
    rng = np.random.default_rng(2)
    pieces = [rng.standard_normal((2, 5)) for _ in range(mesh.size)]
    rows = [
        NP_REDUCE[kind](np.stack([pieces[r] for r in group]), axis=0)
        for group in np_groups(mesh, ("tp",))
    ]
    got = assemble([torch.from_numpy(p) for p in pieces], sharding, mesh)
    np.testing.assert_allclose(got.numpy(), np.concatenate(rows, axis=0))


def test_layout_errors():
    mesh = Mesh(["dp", "tp"], (2, 2))
    with pytest.raises(ShardingError, match="not divisible"):
        scatter(torch.zeros(3, 4), Sharding((("dp",), ())), mesh)
    with pytest.raises(ShardingError, match="expected 4 pieces"):
        assemble([torch.zeros(2)] * 3, Sharding((("dp",),)), mesh)
    with pytest.raises(ShardingError, match="piece of rank 1"):
        assemble(
            [torch.zeros(2), torch.zeros(3), torch.zeros(2), torch.zeros(2)],
            Sharding((("dp",),)),
            mesh,
        )


# --- CollectiveInfo ------------------------------------------------------------------------------


def test_collective_info_for_each_kind():
    mesh = Mesh(["dp", "tp"], (2, 3))
    module = parse(
        mesh_decl(mesh)
        + """
        func.func @f(%x: tensor<6x12xf32>, %h: tensor<4x6xbf16>) -> tensor<6x12xf32> attributes {graph.partitioned} {
          %a = graph.all_reduce %x {axes = [tp], kind = sum} : tensor<6x12xf32>
          %b = graph.all_gather %a {axes = [dp, tp], dim = 0} : tensor<6x12xf32> -> tensor<36x12xf32>
          %c = graph.all_slice %b {axes = [dp, tp], dim = 0} : tensor<36x12xf32> -> tensor<6x12xf32>
          %d = graph.reduce_scatter %c {axes = [tp], dim = 1, kind = max} : tensor<6x12xf32> -> tensor<6x4xf32>
          %e = graph.all_to_all %d {axes = [dp], split_dim = 0, concat_dim = 1} : tensor<6x4xf32> -> tensor<3x8xf32>
          %f = graph.broadcast %h {axes = [dp], src = 1} : tensor<4x6xbf16>
          func.return %a : tensor<6x12xf32>
        }
        func.func @g(%x: tensor<6x12xf32>) -> tensor<6x12xf32> {
          %a = graph.all_reduce %x {axes = [tp], kind = sum} : tensor<6x12xf32>
          func.return %a : tensor<6x12xf32>
        }
        """
    )
    assert collectives(module) == [
        CollectiveInfo("all_reduce", ("tp",), 3, (6, 12), "f32", 6 * 12 * 4),
        CollectiveInfo("all_gather", ("dp", "tp"), 6, (6, 12), "f32", 36 * 12 * 4),
        CollectiveInfo("reduce_scatter", ("tp",), 3, (6, 12), "f32", 6 * 12 * 4),
        CollectiveInfo("all_to_all", ("dp",), 2, (6, 4), "f32", 6 * 4 * 4),
        CollectiveInfo("broadcast", ("dp",), 2, (4, 6), "bf16", 4 * 6 * 2),
    ]


# --- collective_permute ------------------------------------------------------------------------


def np_permute(pairs: list[list[int]], xs: list[np.ndarray]) -> list[np.ndarray]:
    """One group's results: each target takes its source's operand, others zeros."""
    out = [np.zeros_like(x) for x in xs]
    for source, target in pairs:
        out[target] = xs[source]
    return out


def permute_patterns(n: int) -> list[list[list[int]]]:
    """Pairs to test in a group of ``n``: a cyclic shift, its inverse, a swap of the ends
    with the rest keeping their own values, one pair (the rest get zeros), none."""
    return [
        [[p, (p + 1) % n] for p in range(n)],
        [[p, (p - 1) % n] for p in range(n)],
        [[0, n - 1], [n - 1, 0], *([[p, p] for p in range(1, n - 1)])],
        [[n - 1, 0]],
        [],
    ]


@pytest.mark.parametrize(("mesh", "axes"), MESHES_AND_AXES, ids=lambda v: str(v))
@pytest.mark.parametrize("pattern", range(5))
def test_collective_permute_matches_numpy(mesh, axes, pattern):
    n = prod(mesh.axis_size(a) for a in axes)
    pairs = permute_patterns(n)[pattern]
    module = collective_module(mesh, "collective_permute", axes, {"pairs": pairs}, LOCAL_SHAPE)
    rng = np.random.default_rng(pattern)
    inputs = [rng.standard_normal(LOCAL_SHAPE).astype(np.float32) for _ in range(mesh.size)]
    results = run_partitioned(module, "f", mesh, [[torch.from_numpy(x)] for x in inputs])
    scheduled = module.clone()
    LowerGraphToSchedulePass().apply(Context(), scheduled)
    from_plan = run_virtual(scheduled, "f", mesh, [[torch.from_numpy(x)] for x in inputs])
    expected: list = [None] * mesh.size
    for group in np_groups(mesh, axes):
        for rank, value in zip(group, np_permute(pairs, [inputs[r] for r in group]), strict=True):
            expected[rank] = value
    for rank in range(mesh.size):
        np.testing.assert_array_equal(
            results[rank][0].numpy(), expected[rank], err_msg=f"rank {rank}"
        )
        np.testing.assert_array_equal(
            from_plan[rank][0].numpy(), expected[rank], err_msg=f"rank {rank}"
        )


def test_collective_permute_info_counts_only_moving_permutes():
    mesh = Mesh(["dp", "tp"], (2, 4))
    module = parse(
        mesh_decl(mesh)
        + """
        func.func @f(%x: tensor<4x6xf32>) -> tensor<4x6xf32> attributes {graph.partitioned} {
          %a = graph.collective_permute %x {axes = [tp], pairs = [[0, 1], [2, 2]]} : tensor<4x6xf32>
          %b = graph.collective_permute %a {axes = [tp], pairs = [[2, 2]]} : tensor<4x6xf32>
          %c = graph.collective_permute %b {axes = [dp, tp], pairs = [[7, 0], [3, 3]]} : tensor<4x6xf32>
          func.return %c : tensor<4x6xf32>
        }
        """
    )
    infos = collectives(module)
    assert infos == [  # %b keeps rank 2's own value and moves nothing: not listed
        CollectiveInfo(
            "collective_permute", ("tp",), 4, (4, 6), "f32", 4 * 6 * 4, ((0, 1), (2, 2))
        ),
        CollectiveInfo(
            "collective_permute", ("dp", "tp"), 8, (4, 6), "f32", 4 * 6 * 4, ((7, 0), (3, 3))
        ),
    ]
    assert [i.receivers for i in infos] == [(1,), (0,)]


def test_collective_permute_has_no_global_value():
    with pytest.raises(ExecutionError, match="per-rank semantics only"):
        module = collective_module(
            Mesh(["x"], (2,)), "collective_permute", ("x",), {"pairs": [[0, 1]]}, (2,)
        )
        (permute,) = [o for o in module.walk() if o.name == "graph.collective_permute"]
        op_def(permute).reference(permute, torch.zeros(2))


# --- errors --------------------------------------------------------------------------------------


@pytest.fixture
def reduce_module():
    return collective_module(Mesh(["x"], (4,)), "all_reduce", ("x",), {"kind": "sum"}, (2, 3))


def test_error_for_a_function_that_is_not_partitioned():
    module = parse(
        """
        func.func @g(%x: tensor<2xf32>) -> tensor<2xf32> {
          %y = graph.neg %x : tensor<2xf32>
          func.return %y : tensor<2xf32>
        }
        """
    )
    with pytest.raises(ExecutionError, match="not partitioned"):
        run_partitioned(module, "g", Mesh(["x"], (2,)), [[torch.zeros(2)]] * 2)
    with pytest.raises(ExecutionError, match="no function @h"):
        run_partitioned(module, "h", Mesh(["x"], (2,)), [[torch.zeros(2)]] * 2)


def test_error_for_wrong_arguments(reduce_module):
    mesh = Mesh(["x"], (4,))
    good = torch.zeros(2, 3)
    with pytest.raises(ExecutionError, match="for 4 ranks"):
        run_partitioned(reduce_module, "f", mesh, [[good]] * 3)
    with pytest.raises(ExecutionError, match="takes 1 arguments, rank 2 has 2"):
        run_partitioned(reduce_module, "f", mesh, [[good], [good], [good, good], [good]])
    with pytest.raises(ExecutionError, match=r"rank 1, argument 0: expected tensor<2x3xf32>"):
        run_partitioned(reduce_module, "f", mesh, [[good], [torch.zeros(3, 2)], [good], [good]])
    with pytest.raises(ExecutionError, match=r"rank 0, argument 0: expected tensor<2x3xf32>"):
        run_partitioned(reduce_module, "f", mesh, [[good.double()], [good], [good], [good]])
    with pytest.raises(ExecutionError, match=r"expected a torch\.Tensor"):
        run_partitioned(reduce_module, "f", mesh, [[np.zeros((2, 3), np.float32)]] * 4)


def test_error_for_a_mesh_unlike_the_modules(reduce_module):
    with pytest.raises(ExecutionError, match="does not match"):
        run_partitioned(reduce_module, "f", Mesh(["y"], (4,)), [[torch.zeros(2, 3)]] * 4)


def test_error_for_a_broadcast_source_outside_the_group():
    mesh = Mesh(["x"], (4,))
    module = collective_module(mesh, "broadcast", ("x",), {"src": 4}, (2,))
    with pytest.raises(ExecutionError, match="source index 4 is outside the group of 4"):
        run_partitioned(module, "f", mesh, [[torch.zeros(2)]] * 4)


@pytest.mark.parametrize("axes", [("tp",), ("dp",), ("dp", "tp"), ("tp", "dp")])
def test_axis_index_is_each_ranks_position(axes: tuple[str, ...]) -> None:
    """graph.axis_index on every rank (the graph-level oracle and the scheduled program's
    reference kernels) is the rank's position in its group along ``axes``, major first:
    the numpy model's column index of the rank."""
    from tessera.backends.launch_plan import run_virtual
    from tessera.backends.schedule_runner import reference_kernel
    from tessera.passes.lower_graph_to_schedule import LowerGraphToSchedulePass

    mesh = Mesh(["dp", "tp"], (2, 3))
    module = parse(f"""
{mesh_decl(mesh)}
func.func @f(%x: tensor<2xi32>) -> tensor<2xi32> attributes {{graph.partitioned}} {{
  %r = graph.axis_index {{axes = [{", ".join(axes)}]}} : tensor<i32>
  %y = graph.add %x, %r : tensor<2xi32>, tensor<i32> -> tensor<2xi32>
  func.return %y : tensor<2xi32>
}}""")
    groups = np_groups(mesh, axes)
    expected = {int(rank): position for group in groups for position, rank in enumerate(group)}
    args = [[torch.tensor([10, 20], dtype=torch.int32)] for _ in range(mesh.size)]
    scheduled = module.clone()
    LowerGraphToSchedulePass().apply(Context(), scheduled)
    for per_rank in (
        run_partitioned(module, "f", mesh, args),
        run_virtual(scheduled, "f", mesh, args, reference_kernel),
    ):
        for rank, (y,) in enumerate(per_rank):
            assert y.tolist() == [10 + expected[rank], 20 + expected[rank]], (axes, rank)


def test_axis_index_has_no_value_in_the_global_view() -> None:
    from tessera.ir import graph
    from tessera.opdefs import op_def

    with pytest.raises(ExecutionError, match=r"graph\.axis_index has a value per rank"):
        op_def(graph.AxisIndexOp).reference(
            graph.AxisIndexOp.create(result_types=[], properties={})
        )
