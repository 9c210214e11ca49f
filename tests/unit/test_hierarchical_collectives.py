"""Hierarchical collectives: ``choose-collective-algorithms`` picks each start's algorithm as
the cost model does; the simulator prices that algorithm; the virtual mesh and gloo run
``hierarchical`` as its phases over domains, with the flat collective's results."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_distributed import SCRIPTS, tessera_run
from test_simulate import DEVICE  # a flat test device (100 TFLOP/s f32, 1 TB/s)
from xdsl.context import Context
from xdsl.dialects.builtin import Builtin, IntegerAttr, ModuleOp, StringAttr, i64
from xdsl.dialects.func import Func
from xdsl.parser import Parser
from xdsl.utils.exceptions import VerifyException

import tessera as ts
from tessera import dist, op, schedule
from tessera.backends import hierarchical
from tessera.backends.launch_plan import run_virtual
from tessera.errors import ExecutionError, TesseraError
from tessera.ir import graph
from tessera.ir import schedule as schedule_ir
from tessera.ir.reduction_kinds import KINDS, NAMES
from tessera.opdefs.collective import reduce_pieces
from tessera.passes.choose_collective_algorithms import ChooseCollectiveAlgorithmsPass
from tessera.perf import Link, Topology, algorithms_for, collective_time, dgx_h100
from tessera.perf.simulate import simulate

TWO_NODES = dgx_h100(nodes=2)
MESH16 = dist.Mesh(axes=["dp", "tp"], shape=(2, 8))
DTYPES = {"f32": 4, "f64": 8}


def _context() -> Context:
    context = Context()
    for dialect in (Builtin, Func, graph.Graph, schedule_ir.Schedule):
        context.load_dialect(dialect)
    return context


def _result_shape(collective: str, shape: tuple[int, ...], dim: int, n: int) -> tuple[int, ...]:
    out = list(shape)
    if collective == "reduce_scatter":
        out[dim] //= n
    elif collective == "all_gather":
        out[dim] *= n
    return tuple(out)


def _tensor(shape: tuple[int, ...], dtype: str) -> str:
    return f"tensor<{'x'.join(map(str, shape))}x{dtype}>"


def scheduled(
    mesh: dist.Mesh,
    axes: tuple[str, ...],
    collective: str,
    shape: tuple[int, ...],
    dtype: str = "f32",
    kind: str = "sum",
    dim: int = 0,
    extra: str = "",
) -> ModuleOp:
    """A scheduled function ``@f(%x)`` of one start/wait of ``collective`` over ``axes``."""
    n = 1
    for a in axes:
        n *= mesh.axis_size(a)
    t, r = _tensor(shape, dtype), _tensor(_result_shape(collective, shape, dim, n), dtype)
    props = f"axes = [{', '.join(axes)}]"
    if collective in ("all_reduce", "reduce_scatter"):
        props += f", kind = {kind}"
    if collective in ("all_gather", "reduce_scatter"):
        props += f", dim = {dim}"
    mesh_axes = ", ".join(f"{a} = {s}" for a, s in zip(mesh.axis_names, mesh.shape, strict=True))
    text = (
        f"graph.mesh @mesh axes = [{mesh_axes}]\n"
        f"func.func @f(%x: {t}) -> {r} attributes {{graph.partitioned}} {{\n"
        f"  %h = schedule.start {collective} %x {{{props}{extra}}} : {t} -> !schedule.handle<{r}>\n"
        f"  %y = schedule.wait %h : !schedule.handle<{r}> -> {r}\n"
        f"  func.return %y : {r}\n}}\n"
    )
    module = Parser(_context(), text).parse_module()
    module.verify()
    return module


def start_of(module: ModuleOp) -> schedule_ir.StartOp:
    return next(o for o in module.walk() if isinstance(o, schedule_ir.StartOp))


def choose(module: ModuleOp, topology: str = "dgx_h100x2", force: str = "") -> schedule_ir.StartOp:
    ChooseCollectiveAlgorithmsPass(topology=topology, force=force).apply(Context(), module)
    module.verify()
    return start_of(module)


def nbytes(shape: tuple[int, ...], dtype: str = "f32") -> int:
    count = 1
    for s in shape:
        count *= s
    return count * DTYPES[dtype]


# --- the pass ------------------------------------------------------------------------------


def test_large_all_reduce_over_two_nodes_is_hierarchical() -> None:
    shape = (2048, 2048)  # 16 MiB
    start = choose(scheduled(MESH16, ("dp", "tp"), "all_reduce", shape))
    assert collective_time(TWO_NODES, "all_reduce", nbytes(shape), range(16)).algorithm == (
        "hierarchical"
    )
    assert (start.algorithm_name, start.domain_size) == ("hierarchical", 8)
    assert "algorithm" not in start.attrs() and "domain" not in start.attrs()
    assert "{axes = [dp, tp], kind = sum, algorithm = hierarchical, domain = 8}" in str(start)


@pytest.mark.parametrize(
    "shape",
    [(16,), (64, 64), (256, 256), (1024, 1024), (8192, 8192)],
    ids=lambda s: f"{nbytes(s)}B",
)
@pytest.mark.parametrize("axes", [("tp",), ("dp", "tp"), ("dp",)], ids=str)
def test_all_reduce_algorithm_is_the_cost_models(shape: tuple[int, ...], axes: tuple) -> None:
    """tree for small messages, nvls within a node, ring above NVLS's 128 MiB, hierarchical
    across nodes: whatever collective_time says for the group."""
    start = choose(scheduled(MESH16, axes, "all_reduce", shape))
    group = MESH16.groups(axes)[0]
    best = collective_time(TWO_NODES, "all_reduce", nbytes(shape), group).algorithm
    assert start.algorithm_name == best
    assert start.domain_size == (8 if best == "hierarchical" else None)


def test_every_algorithm_is_chosen_somewhere() -> None:
    chosen = {
        choose(scheduled(MESH16, axes, "all_reduce", shape)).algorithm_name
        for shape in [(16,), (1024, 1024), (8192, 8192)]
        for axes in [("tp",), ("dp", "tp")]
    }
    assert chosen == {"ring", "tree", "hierarchical", "nvls"}


@pytest.mark.parametrize("collective", ["all_gather", "reduce_scatter"])
@pytest.mark.parametrize("shape", [(16, 4), (1024, 256)], ids=str)
def test_gather_and_scatter_follow_the_cost_model(collective: str, shape: tuple) -> None:
    for axes in [("tp",), ("dp", "tp")]:
        start = choose(scheduled(MESH16, axes, collective, shape))
        n = len(MESH16.groups(axes)[0])
        moved = _result_shape(collective, shape, 0, n) if collective == "all_gather" else shape
        best = collective_time(TWO_NODES, collective, nbytes(moved), MESH16.groups(axes)[0])
        assert start.algorithm_name == best.algorithm
        if axes == ("dp", "tp"):
            assert (start.algorithm_name, start.domain_size) == ("hierarchical", 8)


def test_gb200_nvl72_domains_of_eight() -> None:
    mesh = dist.Mesh(axes=["dp", "tp"], shape=(9, 8))
    start = choose(scheduled(mesh, ("dp", "tp"), "all_gather", (64, 64)), "gb200_nvl72")
    assert (start.algorithm_name, start.domain_size) == ("hierarchical", 8)
    start = choose(scheduled(mesh, ("dp", "tp"), "all_reduce", (1024, 1024)), "gb200_nvl72")
    assert start.algorithm_name == "nvls"  # SHARP over the whole rack


def test_interleaved_domains_are_not_hierarchical() -> None:
    """Over [dp, tp] of a (tp=8, dp=2) mesh, consecutive group members alternate between
    the nodes: the runtimes' domains would not be the topology's, so hierarchical is out."""
    mesh = dist.Mesh(axes=["tp", "dp"], shape=(8, 2))
    shape = (2048, 2048)
    group = mesh.groups(("dp", "tp"))[0]
    assert group[:8] == [0, 2, 4, 6, 8, 10, 12, 14]
    times = algorithms_for(TWO_NODES, "all_reduce", nbytes(shape), group)
    assert min(times, key=times.__getitem__) == "hierarchical"
    start = choose(scheduled(mesh, ("dp", "tp"), "all_reduce", shape))
    others = {a: t for a, t in times.items() if a != "hierarchical"}
    assert start.algorithm_name == min(others, key=others.__getitem__)
    forced = choose(scheduled(mesh, ("dp", "tp"), "all_reduce", shape), force="hierarchical")
    assert forced.algorithm_name == start.algorithm_name


def test_unannotated_beyond_the_machine_and_for_other_collectives() -> None:
    start = choose(scheduled(MESH16, ("dp", "tp"), "all_reduce", (1024, 1024)), "dgx_h100")
    assert start.algorithm_name is None and start.domain_size is None  # 16 ranks, 8 GPUs
    start = choose(scheduled(MESH16, ("tp",), "broadcast", (64, 64), extra=", src = 0"))
    assert start.algorithm_name is None
    one = dist.Mesh(axes=["dp", "tp"], shape=(16, 1))
    assert choose(scheduled(one, ("tp",), "all_reduce", (64, 64))).algorithm_name is None


def test_rerunning_replaces_a_stale_annotation() -> None:
    module = scheduled(MESH16, ("dp", "tp"), "all_reduce", (1024, 1024), extra=", algorithm = ring")
    assert choose(module).algorithm_name == "hierarchical"
    assert choose(module, "dgx_h100").algorithm_name is None


def test_force() -> None:
    module = scheduled(MESH16, ("dp", "tp"), "all_reduce", (1024, 1024))
    assert choose(module, force="ring").algorithm_name == "ring"
    assert choose(module, force="tree").algorithm_name == "tree"
    # NVLS (one node's SHARP) does not apply across nodes: the cost model's choice stands
    start = choose(module, force="nvls")
    assert (start.algorithm_name, start.domain_size) == ("hierarchical", 8)
    small = scheduled(MESH16, ("dp", "tp"), "all_reduce", (4, 4))
    start = choose(small, force="hierarchical")
    assert (start.algorithm_name, start.domain_size) == ("hierarchical", 8)
    within = scheduled(MESH16, ("tp",), "all_reduce", (1024, 1024))
    assert choose(within, force="hierarchical").algorithm_name == "nvls"  # one node: not legal


def test_bad_force_name() -> None:
    with pytest.raises(TesseraError, match="force must be one of ring, tree, hierarchical, nvls"):
        choose(scheduled(MESH16, ("tp",), "all_reduce", (4, 4)), force="butterfly")


def test_schedule_options_run_the_pass() -> None:
    from tessera.driver import CompileConfig, stage_passes

    def passes(options: schedule.ScheduleOptions) -> list:
        return stage_passes("schedule", CompileConfig(schedule=options))

    options = schedule.ScheduleOptions()
    flags = [spec.flag for spec in passes(options)]
    assert flags == [
        "hoist-all-gathers",
        "bucket-gradients",
        "lower-graph-to-schedule",
        "overlap-comm",
        "choose-collective-algorithms",
        "plan-memory",
    ]
    assert dict(passes(options)[4].options) == {}  # the pass prices the mesh's machine
    named = schedule.ScheduleOptions(topology="dgx_h100x2")
    assert dict(passes(named)[4].options) == {"topology": "dgx_h100x2"}
    off = schedule.ScheduleOptions(collective_algorithms=False)
    assert "choose-collective-algorithms" not in [spec.flag for spec in passes(off)]


def test_jit_on_two_nodes_runs_hierarchical_with_the_flat_result() -> None:
    """A matmul with its contraction split over 16 ranks: its 512 KiB all-reduce over two
    DGX nodes is hierarchical, and the virtual mesh gives the flat all-reduce's result."""
    mesh = dist.Mesh(axes=["tp"], shape=(16,))
    cols = dist.ShardSpec(partition=(1,), mesh_axes=("tp",))
    rows = dist.ShardSpec(partition=(0,), mesh_axes=("tp",))
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(128, 1024, generator=g), torch.randn(1024, 1024, generator=g)
    with schedule.options(topology="dgx_h100x2"):
        f = ts.jit(op.matmul, mesh=mesh, in_shardings=(cols, rows))
        text = f.lower(x, w).as_text("schedule")
        got = f(x, w)
    assert "all_reduce %0 {axes = [tp], kind = sum, algorithm = hierarchical, domain = 8}" in text
    with schedule.options(topology="dgx_h100x2", collective_algorithms=False):
        flat_f = ts.jit(op.matmul, mesh=mesh, in_shardings=(cols, rows))
        assert "algorithm" not in flat_f.lower(x, w).as_text("schedule")
        flat = flat_f(x, w)
    torch.testing.assert_close(got, flat, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got, x @ w, rtol=1e-4, atol=1e-3)


def test_default_pipeline_on_one_node_is_never_hierarchical() -> None:
    mesh = dist.Mesh(axes=["tp"], shape=(8,))

    cols = dist.ShardSpec(partition=(1,), mesh_axes=("tp",))
    rows = dist.ShardSpec(partition=(0,), mesh_axes=("tp",))
    f = ts.jit(op.matmul, mesh=mesh, in_shardings=(cols, rows))
    text = f.lower(torch.randn(64, 64), torch.randn(64, 64)).as_text("schedule")
    assert "all_reduce" in text and "algorithm = tree}" in text  # 16 KiB on one DGX node


# --- the op ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("collective", "extra", "message"),
    [
        ("all_reduce", ", algorithm = butterfly", "algorithm must be one of"),
        ("all_reduce", ", algorithm = hierarchical, domain = 3", "divides the group size 16"),
        ("all_reduce", ", algorithm = hierarchical, domain = 16", "2 <= domain < 16"),
        ("all_reduce", ", algorithm = hierarchical, domain = 1", "found 1"),
        ("all_reduce", ", algorithm = hierarchical", "needs a domain"),
        ("all_reduce", ", algorithm = ring, domain = 8", "a domain needs algorithm = hierarchical"),
        ("all_reduce", ", domain = 8", "a domain needs algorithm = hierarchical"),
        ("broadcast", ", algorithm = hierarchical, domain = 8", "applies only to"),
    ],
)
def test_verifier_rejects(collective: str, extra: str, message: str) -> None:
    props = "src = 0" if collective == "broadcast" else "kind = sum"
    t = "tensor<16x16xf32>"
    text = (
        "graph.mesh @mesh axes = [dp = 2, tp = 8]\n"
        f"func.func @f(%x: {t}) -> {t} {{\n"
        f"  %h = schedule.start {collective} %x {{axes = [dp, tp], {props}{extra}}} : "
        f"{t} -> !schedule.handle<{t}>\n"
        f"  %y = schedule.wait %h : !schedule.handle<{t}> -> {t}\n"
        f"  func.return %y : {t}\n}}\n"
    )
    module = Parser(_context(), text).parse_module()
    with pytest.raises(VerifyException, match=message):
        module.verify()


def test_round_trip() -> None:
    module = scheduled(MESH16, ("dp", "tp"), "all_reduce", (1024, 1024))
    choose(module)
    again = Parser(_context(), str(module)).parse_module()
    again.verify()
    assert str(again) == str(module)
    assert start_of(again).domain_size == 8


# --- the virtual mesh -------------------------------------------------------------------------


def _annotated(module: ModuleOp, domain: int) -> ModuleOp:
    start = start_of(module)
    start.properties["algorithm"] = StringAttr("hierarchical")
    start.properties["domain"] = IntegerAttr(domain, i64)
    module.verify()
    return module


def _rank_args(
    mesh: dist.Mesh, shape: tuple[int, ...], seed: int = 0, integers: bool = False
) -> list[list[torch.Tensor]]:
    """Random f32 arguments per rank; integer-valued ones make every sum exact."""
    g = torch.Generator().manual_seed(seed)
    if integers:
        return [[torch.randint(-64, 64, shape, generator=g).float()] for _ in range(mesh.size)]
    return [[torch.randn(shape, generator=g)] for _ in range(mesh.size)]


def _same(got: torch.Tensor, want: torch.Tensor, exact: bool) -> None:
    if exact:
        assert torch.equal(got, want), (got - want).abs().max()
    else:
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


CASES = [  # (mesh, axes, domain)
    (MESH16, ("dp", "tp"), 8),
    (MESH16, ("dp", "tp"), 4),
    (MESH16, ("dp", "tp"), 2),
    (MESH16, ("tp", "dp"), 8),  # group order [0, 8, 1, 9, ...]
    (dist.Mesh(axes=["a", "b", "c"], shape=(3, 2, 2)), ("a", "c"), 3),
]


@pytest.mark.parametrize("integers", [False, True], ids=["randn", "integer-valued"])
@pytest.mark.parametrize("kind", ["sum", "mean", "max", "min"])
@pytest.mark.parametrize("shape", [(5, 7), (3,), (2, 3, 4)], ids=str)
@pytest.mark.parametrize(("mesh", "axes", "domain"), CASES, ids=lambda c: str(c))
def test_virtual_hierarchical_all_reduce_equals_flat(
    kind: str, shape: tuple, mesh: dist.Mesh, axes: tuple, domain: int, integers: bool
) -> None:
    """Odd sizes (35, 3, 24 elements) need padding to a multiple of the domain."""
    flat = scheduled(mesh, axes, "all_reduce", shape, "f32", kind)
    phased = _annotated(flat.clone(), domain)
    args = _rank_args(mesh, shape, integers=integers)
    want = run_virtual(flat, "f", mesh, args)
    got = run_virtual(phased, "f", mesh, args)
    for (w,), (g,) in zip(want, got, strict=True):
        _same(g, w, exact=integers or kind in ("max", "min"))


@pytest.mark.parametrize("integers", [False, True], ids=["randn", "integer-valued"])
@pytest.mark.parametrize("kind", ["sum", "mean", "max"])
@pytest.mark.parametrize(("mesh", "axes", "domain"), CASES, ids=lambda c: str(c))
def test_virtual_hierarchical_reduce_scatter_and_all_gather_equal_flat(
    kind: str, mesh: dist.Mesh, axes: tuple, domain: int, integers: bool
) -> None:
    n = len(mesh.groups(axes)[0])
    for collective, shape, dim in [
        ("reduce_scatter", (3, 2 * n), 1),
        ("reduce_scatter", (n, 5), 0),
        ("all_gather", (3, 5), 1),
        ("all_gather", (2, 3), 0),
    ]:
        flat = scheduled(mesh, axes, collective, shape, "f32", kind, dim)
        phased = _annotated(flat.clone(), domain)
        args = _rank_args(mesh, shape, seed=1, integers=integers)
        want = run_virtual(flat, "f", mesh, args)
        got = run_virtual(phased, "f", mesh, args)
        for (w,), (g,) in zip(want, got, strict=True):
            _same(g, w, exact=integers or kind == "max" or collective == "all_gather")


@pytest.mark.parametrize("kind", NAMES)
@pytest.mark.parametrize("count", [1, 7, 35, 64])
def test_float64_groups_equal_the_flat_reduction(kind: str, count: int) -> None:
    """The phases on float64 (the IR has no f64; the runtime helpers take any dtype)."""
    g = torch.Generator().manual_seed(count)
    xs = [torch.randn(count, generator=g, dtype=torch.float64) for _ in range(12)]
    for domain in (2, 3, 4, 6):
        out = hierarchical.run_group("all_reduce", {"kind": kind}, xs, domain)
        want = reduce_pieces(xs, kind)
        for o in out:
            assert o.dtype == torch.float64
            if KINDS[kind].selects:
                assert torch.equal(o, want)
            else:
                torch.testing.assert_close(o, want, rtol=1e-13, atol=1e-13)


def test_virtual_phases_move_pieces_within_and_across_domains() -> None:
    """Integer ranks make each phase visible: after the intra-domain reduce_scatter member
    k*d + i holds domain k's sum of piece i; the result is the whole group's sum."""
    intra, inter = hierarchical.domains([0, 1, 2, 3, 4, 5], 3)
    assert intra == [[0, 1, 2], [3, 4, 5]] and inter == [[0, 3], [1, 4], [2, 5]]
    xs = [torch.full((2, 2), float(10**p)) for p in range(6)]
    out = hierarchical.run_group("all_reduce", {"kind": "sum"}, xs, 3)
    assert all(torch.equal(o, torch.full((2, 2), 111111.0)) for o in out)
    with pytest.raises(ExecutionError, match="domain 4 must divide the group size 6"):
        hierarchical.domains(range(6), 4)


def test_low_precision_sums_round_once() -> None:
    xs = [torch.full((7,), v, dtype=torch.bfloat16) for v in (1.0, 2.0**-9, 2.0**-9, 2.0**-9)]
    out = hierarchical.run_group("all_reduce", {"kind": "sum"}, xs, 2)
    flat = xs[0].float() + xs[1].float() + xs[2].float() + xs[3].float()
    assert all(torch.equal(o, flat.bfloat16()) and o.dtype == torch.bfloat16 for o in out)


# --- the simulator -----------------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ["ring", "tree", "hierarchical"])
def test_simulator_prices_the_annotated_algorithm(algorithm: str) -> None:
    shape = (1024, 1024)
    module = scheduled(MESH16, ("dp", "tp"), "all_reduce", shape)
    choose(module, force=algorithm)
    sim = simulate(module, "f", MESH16, TWO_NODES)
    times = algorithms_for(TWO_NODES, "all_reduce", nbytes(shape), range(16))
    assert sim.comm_time_s == pytest.approx(times[algorithm], rel=1e-12)
    events = [e for e in sim.events if e.stream == "comm"]
    assert {e.args["algorithm"] for e in events} == {algorithm}


def test_simulator_prices_unannotated_or_foreign_starts_at_the_fastest() -> None:
    shape = (1024, 1024)
    best = collective_time(TWO_NODES, "all_reduce", nbytes(shape), range(16))
    module = scheduled(MESH16, ("dp", "tp"), "all_reduce", shape)
    assert simulate(module, "f", MESH16, TWO_NODES).comm_time_s == pytest.approx(best.time_s)
    # nvls chosen for one node's machine: the two-node machine has no NVLS over 16 ranks
    mesh = dist.Mesh(axes=["tp"], shape=(8,))
    module = scheduled(mesh, ("tp",), "all_reduce", shape, extra=", algorithm = nvls")
    flat = Topology("flat", 8, TWO_NODES.device, (Link("switch", 8, 5e-6, 100e9),))
    sim = simulate(module, "f", mesh, flat)
    assert sim.comm_time_s == pytest.approx(
        collective_time(flat, "all_reduce", nbytes(shape), range(8)).time_s
    )


# --- gloo ----------------------------------------------------------------------------------


def two_domains_of_two() -> Topology:
    """4 devices: 2 domains of 2 on a fast link, joined by a slow network."""
    levels = (Link("nvlink", 2, 1e-6, 400e9), Link("network", 4, 10e-6, 10e9))
    return Topology("two_domains_of_two", 4, DEVICE, levels)


def test_four_gloo_ranks_run_hierarchical_collectives(tmp_path: Path) -> None:
    path = tmp_path / "two_domains_of_two.json"
    path.write_text(two_domains_of_two().to_json())
    result = tessera_run(4, SCRIPTS / "hierarchical.py", str(path), limit=240.0)
    assert result.returncode == 0, result.stderr[-3000:]
    for rank in range(4):
        assert f"rank {rank} OK" in result.stdout
        assert (
            f"rank {rank}: jit all_reduce[tp] hierarchical matches flat and virtual"
            in result.stdout
        )
        assert f"rank {rank}: every hierarchical collective matches" in result.stdout


# --- all_to_all -------------------------------------------------------------------------------


def scheduled_all_to_all(
    mesh: dist.Mesh, axes: tuple[str, ...], shape: tuple[int, ...], split: int, concat: int
) -> ModuleOp:
    """A scheduled ``@f(%x)`` of one all_to_all over ``axes`` (``split`` → ``concat``)."""
    n = len(mesh.groups(axes)[0])
    out = list(shape)
    out[split] //= n
    out[concat] *= n
    t, r = _tensor(shape, "f32"), _tensor(tuple(out), "f32")
    mesh_axes = ", ".join(f"{a} = {s}" for a, s in zip(mesh.axis_names, mesh.shape, strict=True))
    props = f"axes = [{', '.join(axes)}], split_dim = {split}, concat_dim = {concat}"
    text = (
        f"graph.mesh @mesh axes = [{mesh_axes}]\n"
        f"func.func @f(%x: {t}) -> {r} attributes {{graph.partitioned}} {{\n"
        f"  %h = schedule.start all_to_all %x {{{props}}} : {t} -> !schedule.handle<{r}>\n"
        f"  %y = schedule.wait %h : !schedule.handle<{r}> -> {r}\n"
        f"  func.return %y : {r}\n}}\n"
    )
    module = Parser(_context(), text).parse_module()
    module.verify()
    return module


def test_all_to_all_across_nodes_is_hierarchical() -> None:
    """Over both DGX nodes (dp x tp), the two-level all_to_all (within each node, then one
    message per node pair across InfiniBand) is cheaper than the flat pairwise exchange,
    whose 15 messages all go at InfiniBand's latency and bandwidth; inside a node it does
    not apply and the start stays unannotated (direct)."""
    shape = (16, 4096)  # 256 KiB per rank
    group = MESH16.groups(("dp", "tp"))[0]
    times = algorithms_for(TWO_NODES, "all_to_all", nbytes(shape), group)
    assert set(times) == {"direct", "hierarchical"}
    assert times["hierarchical"] < times["direct"]
    start = choose(scheduled_all_to_all(MESH16, ("dp", "tp"), shape, 0, 1))
    assert (start.algorithm_name, start.domain_size) == ("hierarchical", 8)
    assert "split_dim = 0, concat_dim = 1, algorithm = hierarchical, domain = 8}" in str(start)
    within = choose(scheduled_all_to_all(MESH16, ("tp",), shape, 0, 1))
    assert set(algorithms_for(TWO_NODES, "all_to_all", nbytes(shape), range(8))) == {"direct"}
    assert within.algorithm_name is None
    forced = choose(scheduled_all_to_all(MESH16, ("tp",), shape, 0, 1), force="hierarchical")
    assert forced.algorithm_name is None  # one node: not legal
    # interleaved domains ([0, 8, 1, 9, ...]): not the runtimes' domains, so direct
    assert choose(scheduled_all_to_all(MESH16, ("tp", "dp"), shape, 0, 1)).algorithm_name is None
    # the simulator prices the annotated start as the cost model does
    module = scheduled_all_to_all(MESH16, ("dp", "tp"), shape, 0, 1)
    choose(module)
    sim = simulate(module, "f", MESH16, TWO_NODES)
    assert sim.comm_time_s == pytest.approx(times["hierarchical"])


@pytest.mark.parametrize(("split", "concat"), [(0, 1), (1, 0), (0, 2), (1, 2)], ids=str)
@pytest.mark.parametrize(("mesh", "axes", "domain"), CASES, ids=lambda c: str(c))
def test_virtual_hierarchical_all_to_all_equals_flat(
    split: int, concat: int, mesh: dist.Mesh, axes: tuple, domain: int
) -> None:
    """Data movement only: exactly the flat all_to_all's result, piece for piece."""
    n = len(mesh.groups(axes)[0])
    shape = (2 * n, n, 3)
    flat = scheduled_all_to_all(mesh, axes, shape, split, concat)
    phased = _annotated(flat.clone(), domain)
    args = _rank_args(mesh, shape, seed=2)
    want = run_virtual(flat, "f", mesh, args)
    got = run_virtual(phased, "f", mesh, args)
    for (w,), (g,) in zip(want, got, strict=True):
        assert torch.equal(g, w)


def test_expert_parallel_across_two_nodes_runs_hierarchical_all_to_alls() -> None:
    """EP over 16 ranks of two DGX nodes (ep = 16, 16 experts): the dispatch and combine
    all-to-alls are hierarchical (domain 8) and the layer equals the flat program's."""
    from moe_reference import reference_moe

    experts, k, capacity = 16, 2, 2

    def layer(x, wr, w1, w2):
        weights, chosen, _ = op.router(x @ wr, k=k)
        routing = op.route(chosen, num_experts=experts, capacity=capacity)
        return op.combine(op.relu(op.dispatch(x, routing) @ w1) @ w2, routing, weights)

    mesh = dist.Mesh(axes=["ep"], shape=(16,))
    groups = dist.ShardSpec(partition=(0,), mesh_axes=("ep",))
    split = dist.ShardSpec(partition=(0,), mesh_axes=("ep",))
    g = torch.Generator().manual_seed(3)
    shapes = [(16, 4, 8), (8, experts), (experts, 8, 8), (experts, 8, 8)]
    args = [torch.randn(s, generator=g, dtype=torch.float64) for s in shapes]
    results = {}
    for algorithms in (True, False):
        with schedule.options(topology="dgx_h100x2", collective_algorithms=algorithms):
            f = ts.jit(layer, mesh=mesh, in_shardings=(groups, None, split, split))
            text = f.lower(*args).as_text("schedule")
            results[algorithms] = f(*args)
        marked = text.count("algorithm = hierarchical, domain = 8")
        assert marked == (2 if algorithms else 0), text
    assert torch.equal(results[True], results[False])
    want = reference_moe(*args, k, capacity)
    torch.testing.assert_close(results[True], want, rtol=1e-10, atol=1e-10)
