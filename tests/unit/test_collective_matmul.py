"""``collective-matmul``: chunked collective/matmul pairs, and the row-wise work their chunks
flow through, compute what the unchunked program does (on the virtual mesh, graph-level
and scheduled); chunks keep their place in program order; the simulation's choice of k."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import Builtin, ModuleOp
from xdsl.dialects.func import Func
from xdsl.parser import Parser

import tessera as ts
from tessera import dist, op, optim
from tessera.backends.launch_plan import run_virtual
from tessera.backends.virtual import run_partitioned
from tessera.driver import available_passes, schedule_trial
from tessera.errors import TesseraError
from tessera.graph import backward, training_step
from tessera.ir import graph
from tessera.ir.abstract import AbstractTensor, aval
from tessera.ir.mesh import Mesh
from tessera.ir.mesh_symbol import module_mesh
from tessera.passes import get_all_passes
from tessera.passes.collective_matmul import CollectiveMatmulPass, choose_chunks, simulated_time
from tessera.topology import load_topology

# the pass as the compile driver runs it: chunks=0 times candidates with schedule_trial
DrivenPass = available_passes()["collective-matmul"]()

MESH = dist.mesh({"tp": 4})
ROWS = dist.ShardSpec(partition=(0,), mesh_axes=("tp",))
COLS = dist.ShardSpec(partition=(1,), mesh_axes=("tp",))


def parse(text: str) -> ModuleOp:
    context = Context()
    for dialect in (Builtin, Func, graph.Graph):
        context.load_dialect(dialect)
    module = Parser(context, text).parse_module()
    module.verify()
    return module


def partitioned(
    fn: Callable[..., torch.Tensor], shapes: list[tuple[int, ...]], **shardings: object
) -> ModuleOp:
    """``fn`` traced on MESH with ``shardings`` and partitioned (a fresh copy)."""
    args = [torch.zeros(s) for s in shapes]
    return ts.jit(fn, mesh=MESH, **shardings).lower(*args).module_at("partitioned").clone()


def function_of(module: ModuleOp) -> func.FuncOp:
    return next(o for o in module.ops if isinstance(o, func.FuncOp))


def chunked(module: ModuleOp, chunks: int) -> ModuleOp:
    result = module.clone()
    CollectiveMatmulPass(chunks=chunks).apply(Context(), result)
    result.verify()
    return result


def count(module: ModuleOp, op_type: type[graph.GraphOp]) -> int:
    return sum(isinstance(o, op_type) for o in module.walk())


def random_rank_args(
    module: ModuleOp, mesh: Mesh, seed: int, scale: float = 1.0
) -> list[list[torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    types = [AbstractTensor.from_xdsl(a.type) for a in function_of(module).args]
    return [
        [scale * torch.randn(t.shape, generator=generator) for t in types] for _ in range(mesh.size)
    ]


def assert_same_results(
    before: ModuleOp, after: ModuleOp, scheduled: bool = False, scale: float = 1.0
) -> None:
    """Both modules give every rank the same results on random per-rank inputs (standard
    normal times ``scale``)."""
    mesh = module_mesh(before)[1]  # type: ignore[index]
    name = function_of(before).sym_name.data
    args = random_rank_args(before, mesh, seed=0, scale=scale)
    expected = run_partitioned(before, name, mesh, args)
    if scheduled:
        after = after.clone()
        passes = get_all_passes()
        for flag in ("lower-graph-to-schedule", "overlap-comm", "plan-memory"):
            passes[flag]()().apply(Context(), after)
        after.verify()
        found = run_virtual(after, name, mesh, args)
    else:
        found = run_partitioned(after, name, mesh, args)
    for want_rank, got_rank in zip(expected, found, strict=True):
        for want, got in zip(want_rank, got_rank, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def gather_matmul() -> ModuleOp:
    """all_gather(x rows) -> matmul (sequence-parallel input, column-split weight)."""
    return partitioned(lambda x, w: x @ w, [(16, 32), (32, 64)], in_shardings=(ROWS, COLS))


def matmul_reduce_scatter() -> ModuleOp:
    """matmul (row-split weight, partial sum) -> reduce_scatter on rows."""
    return partitioned(
        lambda x, w: x @ w, [(16, 64), (64, 16)], in_shardings=(COLS, ROWS), out_shardings=ROWS
    )


def matmul_all_reduce() -> ModuleOp:
    """matmul (row-split weight, partial sum) -> all_reduce (Megatron's second matmul)."""
    return partitioned(lambda x, w: x @ w, [(16, 64), (64, 16)], in_shardings=(COLS, ROWS))


def sequence_parallel_mlp() -> ModuleOp:
    """all_gather -> matmul -> gelu -> matmul -> reduce_scatter."""
    return partitioned(
        lambda x, w1, w2: op.gelu(x @ w1) @ w2,
        [(16, 32), (32, 64), (64, 32)],
        in_shardings=(ROWS, COLS, ROWS),
        out_shardings=ROWS,
    )


PROGRAMS = {
    "all_gather-matmul": (gather_matmul, graph.AllGatherOp),
    "matmul-reduce_scatter": (matmul_reduce_scatter, graph.ReduceScatterOp),
    "matmul-all_reduce": (matmul_all_reduce, graph.AllReduceOp),
}


@pytest.mark.parametrize("chunks", [2, 4])
@pytest.mark.parametrize("program", sorted(PROGRAMS))
def test_chunked_pairs_compute_the_same(program: str, chunks: int) -> None:
    build, collective = PROGRAMS[program]
    before = build()
    assert count(before, collective) == 1 and count(before, graph.MatmulOp) == 1
    after = chunked(before, chunks)
    assert count(after, collective) == chunks and count(after, graph.MatmulOp) == chunks
    assert_same_results(before, after)
    assert_same_results(before, after, scheduled=True)


@pytest.mark.parametrize("chunks", [2, 4])
def test_sequence_parallel_mlp_chunks_both_ends(chunks: int) -> None:
    before = sequence_parallel_mlp()
    after = chunked(before, chunks)
    assert count(after, graph.AllGatherOp) == count(after, graph.ReduceScatterOp) == chunks
    assert_same_results(before, after)
    assert_same_results(before, after, scheduled=True)


def test_result_keeps_the_sharding_of_the_replaced_op() -> None:
    before = matmul_reduce_scatter()
    result = function_of(chunked(before, 2)).body.block.last_op.operands[0]
    expected = function_of(before).body.block.last_op.operands[0].owner
    assert isinstance(result.owner, graph.ConcatOp)
    assert result.owner.attributes["graph.sharding"] == expected.attributes["graph.sharding"]


MESH_TEXT = "graph.mesh @mesh axes = [dp = 2, tp = 4]"

BATCHED = f"""
{MESH_TEXT}
func.func @f(%x: tensor<2x4x8xf32>, %w: tensor<8x6xf32>) -> tensor<2x16x6xf32>
    attributes {{graph.partitioned}} {{
  %g = graph.all_gather %x {{axes = [tp], dim = 1}} : tensor<2x4x8xf32> -> tensor<2x16x8xf32>
  %y = graph.matmul %g, %w : tensor<2x16x8xf32>, tensor<8x6xf32> -> tensor<2x16x6xf32>
  func.return %y : tensor<2x16x6xf32>
}}
"""

BATCHED_REDUCE_SCATTER = f"""
{MESH_TEXT}
func.func @f(%x: tensor<2x16x8xf32>, %w: tensor<8x6xf32>) -> tensor<2x4x6xf32>
    attributes {{graph.partitioned}} {{
  %y = graph.matmul %x, %w : tensor<2x16x8xf32>, tensor<8x6xf32> -> tensor<2x16x6xf32>
  %r = graph.reduce_scatter %y {{axes = [tp], dim = 1, kind = sum}}
      : tensor<2x16x6xf32> -> tensor<2x4x6xf32>
  func.return %r : tensor<2x4x6xf32>
}}
"""

BROADCAST_RHS = f"""
{MESH_TEXT}
func.func @f(%x: tensor<4x8xf32>, %w: tensor<3x8x6xf32>) -> tensor<3x16x6xf32>
    attributes {{graph.partitioned}} {{
  %g = graph.all_gather %x {{axes = [tp], dim = 0}} : tensor<4x8xf32> -> tensor<16x8xf32>
  %y = graph.matmul %g, %w : tensor<16x8xf32>, tensor<3x8x6xf32> -> tensor<3x16x6xf32>
  func.return %y : tensor<3x16x6xf32>
}}
"""

BATCH_ALL_REDUCE = f"""
{MESH_TEXT}
func.func @f(%x: tensor<4x3x8xf32>, %w: tensor<1x8x6xf32>) -> tensor<4x3x6xf32>
    attributes {{graph.partitioned}} {{
  %y = graph.matmul %x, %w : tensor<4x3x8xf32>, tensor<1x8x6xf32> -> tensor<4x3x6xf32>
  %r = graph.all_reduce %y {{axes = [dp, tp], kind = max}} : tensor<4x3x6xf32>
  func.return %r : tensor<4x3x6xf32>
}}
"""


@pytest.mark.parametrize(
    "text",
    [BATCHED, BATCHED_REDUCE_SCATTER, BROADCAST_RHS, BATCH_ALL_REDUCE],
    ids=["batched", "batched-reduce_scatter", "broadcast-rhs", "batch-all_reduce-max"],
)
@pytest.mark.parametrize("chunks", [2, 4])
def test_batched_and_broadcast_matmuls(text: str, chunks: int) -> None:
    before = parse(text)
    after = chunked(before, chunks)
    assert count(after, graph.MatmulOp) == chunks
    assert_same_results(before, after)
    assert_same_results(before, after, scheduled=True)


BATCHED_RHS = f"""
{MESH_TEXT}
func.func @f(%x: tensor<1x4x8xf32>, %w: tensor<4x8x6xf32>) -> tensor<4x4x6xf32>
    attributes {{graph.partitioned}} {{
  %g = graph.all_gather %x {{axes = [tp], dim = 0}} : tensor<1x4x8xf32> -> tensor<4x4x8xf32>
  %y = graph.matmul %g, %w : tensor<4x4x8xf32>, tensor<4x8x6xf32> -> tensor<4x4x6xf32>
  func.return %y : tensor<4x4x6xf32>
}}
"""


def test_a_batch_dim_the_rhs_also_has_is_left_alone() -> None:
    before = parse(BATCHED_RHS)
    assert str(chunked(before, 2)) == str(before)


def test_chunks_are_validated_and_functions_without_the_attribute_kept() -> None:
    with pytest.raises(TesseraError, match="chunks must be >= 0"):
        CollectiveMatmulPass(chunks=-1).apply(Context(), gather_matmul())
    global_view = parse(
        f"""
        {MESH_TEXT}
        func.func @f(%x: tensor<16x8xf32>, %w: tensor<8x6xf32>) -> tensor<16x6xf32> {{
          %g = graph.all_gather %x {{axes = [tp], dim = 0}} : tensor<16x8xf32>
          %y = graph.matmul %g, %w : tensor<16x8xf32>, tensor<8x6xf32> -> tensor<16x6xf32>
          func.return %y : tensor<16x6xf32>
        }}
        """
    )
    assert str(chunked(global_view, 2)) == str(global_view)


# --- the cost model ---------------------------------------------------------------------------

LARGE = """
graph.mesh @mesh axes = [tp = 8]
func.func @f(%x: tensor<512x8192xbf16>, %w: tensor<8192x1024xbf16>) -> tensor<4096x1024xbf16>
    attributes {graph.partitioned} {
  %g = graph.all_gather %x {axes = [tp], dim = 0} : tensor<512x8192xbf16> -> tensor<4096x8192xbf16>
  %y = graph.matmul %g, %w : tensor<4096x8192xbf16>, tensor<8192x1024xbf16> -> tensor<4096x1024xbf16>
  func.return %y : tensor<4096x1024xbf16>
}
"""

TINY = """
graph.mesh @mesh axes = [tp = 8]
func.func @f(%x: tensor<2x16xf32>, %w: tensor<16x8xf32>) -> tensor<16x8xf32>
    attributes {graph.partitioned} {
  %g = graph.all_gather %x {axes = [tp], dim = 0} : tensor<2x16xf32> -> tensor<16x16xf32>
  %y = graph.matmul %g, %w : tensor<16x16xf32>, tensor<16x8xf32> -> tensor<16x8xf32>
  func.return %y : tensor<16x8xf32>
}
"""


def test_simulation_decomposes_a_large_gather_and_keeps_a_tiny_one() -> None:
    large, tiny = parse(LARGE), parse(TINY)
    for module in (large, tiny):
        DrivenPass().apply(Context(), module)
        module.verify()
    assert count(large, graph.AllGatherOp) in (2, 4, 8)
    assert count(tiny, graph.AllGatherOp) == 1 and count(tiny, graph.SliceOp) == 0


def test_the_driver_times_the_candidates() -> None:
    """The pass schedules and simulates nothing itself: without the driver's trial
    chunks=0 cannot choose; with one, every candidate k is timed by it, in the pass's
    numerics mode (and equal times go to the smaller k: none)."""
    with pytest.raises(TesseraError, match="compile driver"):
        CollectiveMatmulPass().apply(Context(), parse(LARGE))
    calls = []

    def trial(module, function, mesh, topology, numerics):
        calls.append((function, mesh.size, topology.name, numerics))
        return 1.0

    module = parse(LARGE)
    CollectiveMatmulPass.using(trial)(numerics="deterministic").apply(Context(), module)
    assert calls == [("f", 8, "dgx_h100", "deterministic")] * 4  # k = 1, 2, 4, 8
    assert count(module, graph.AllGatherOp) == 1


def test_simulation_leaves_a_mesh_the_topology_cannot_hold() -> None:
    text = LARGE.replace("tp = 8", "tp = 16").replace("512x", "256x")
    small_machine, large_machine = parse(text), parse(text)
    DrivenPass(topology="dgx_h100").apply(Context(), small_machine)  # 8 devices
    assert count(small_machine, graph.AllGatherOp) == 1
    DrivenPass(topology="dgx_h100x2").apply(Context(), large_machine)
    large_machine.verify()
    assert count(large_machine, graph.AllGatherOp) > 1


# --- propagation: chunks flow through row-wise consumers ---------------------------------------


# Chains of matmuls, norms and gelu on standard-normal inputs reach values ~100, where a
# chunked matmul's float32 summation order shows at ~1e-5; inputs scaled by SCALE keep
# activations ~1, and results agree at the module's 1e-6.
SCALE = 0.25


def megatron_block(x, a, wo, w1, w2, ln_w, ln_b):
    """A Megatron layer's tail: the attention output projection (row-split wo, partial sum,
    all_reduce), the residual add, a layer norm, the MLP (its own all_reduce), the residual."""
    h = x + a @ wo
    n = op.layer_norm(h, axis=-1, weight=ln_w, bias=ln_b)
    return h + op.gelu(n @ w1) @ w2


def megatron_tail(batch: tuple[int, ...]) -> ModuleOp:
    c = 32
    return partitioned(
        megatron_block,
        [(*batch, c), (*batch, c), (c, c), (c, 2 * c), (2 * c, c), (c,), (c,)],
        in_shardings=(
            None,
            COLS if len(batch) == 1 else dist.ShardSpec(partition=(2,), mesh_axes=("tp",)),
            ROWS,
            COLS,
            ROWS,
            None,
            None,
        ),
    )


@pytest.mark.parametrize("chunks", [2, 4])
@pytest.mark.parametrize("batch", [(16,), (2, 8)], ids=["2d", "3d"])
def test_chunks_propagate_through_a_megatron_layer_tail(
    batch: tuple[int, ...], chunks: int
) -> None:
    before = megatron_tail(batch)
    assert count(before, graph.AllReduceOp) == 2 and count(before, graph.LayerNormOp) == 1
    after = chunked(before, chunks)
    # every op from the first matmul to the last add runs per chunk: one concatenation,
    # for the return, and no slice but of the block's inputs
    assert count(after, graph.AllReduceOp) == 2 * chunks
    assert count(after, graph.LayerNormOp) == count(after, graph.GeluOp) == chunks
    assert count(after, graph.MatmulOp) == 3 * chunks
    assert count(after, graph.ConcatOp) == 1
    block = function_of(after).body.block
    assert isinstance(block.last_op.operands[0].owner, graph.ConcatOp)  # type: ignore[union-attr]
    assert_same_results(before, after, scale=SCALE)
    assert_same_results(before, after, scheduled=True, scale=SCALE)


def test_propagated_chunks_are_pipelined_one_step_behind_each_collective() -> None:
    after = chunked(megatron_tail((16,)), 2)
    names = [o.name.removeprefix("graph.") for o in function_of(after).body.block.ops]
    names = [n for n in names if n in ("matmul", "all_reduce", "layer_norm")]
    # chunk 1's projection and all_reduce come before chunk 0's layer norm and MLP
    assert names == [
        "matmul", "all_reduce", "matmul", "all_reduce",
        "layer_norm", "matmul", "matmul", "all_reduce",
        "layer_norm", "matmul", "matmul", "all_reduce",
    ]  # fmt: skip


def full_megatron_layer(x, p):
    """A small pre-LN layer: causal attention (heads split over tp) and the MLP."""
    seq, dim = x.shape
    heads = 4
    head_dim = dim // heads

    def split_heads(t):
        return op.transpose(op.reshape(t, (seq, heads, head_dim)), (1, 0, 2))

    h = op.layer_norm(x, axis=-1, weight=p["ln1_w"], bias=p["ln1_b"])
    q, k, v = (split_heads(h @ p[name]) for name in ("wq", "wk", "wv"))
    scores = (q @ op.transpose(k, (0, 2, 1))) * (1.0 / head_dim**0.5)
    causal = torch.tril(torch.ones(seq, seq, dtype=torch.bool)).numpy()
    attention = op.softmax(op.where(causal, scores, -1e9), axis=-1) @ v
    merged = op.reshape(op.transpose(attention, (1, 0, 2)), (seq, dim))
    x = x + merged @ p["wo"]
    h = op.layer_norm(x, axis=-1, weight=p["ln2_w"], bias=p["ln2_b"])
    return x + op.gelu(h @ p["w1"]) @ p["w2"]


@pytest.mark.parametrize("chunks", [2, 4])
def test_a_full_megatron_layer_computes_the_same(chunks: int) -> None:
    dim, seq = 16, 8
    shapes = {n: (dim, dim) for n in ("wq", "wk", "wv", "wo")}
    shapes |= {"w1": (dim, 2 * dim), "w2": (2 * dim, dim)}
    shapes |= {n: (dim,) for n in ("ln1_w", "ln1_b", "ln2_w", "ln2_b")}
    specs = {n: COLS for n in ("wq", "wk", "wv", "w1")} | {"wo": ROWS, "w2": ROWS}
    specs |= {n: None for n in ("ln1_w", "ln1_b", "ln2_w", "ln2_b")}
    params = {n: torch.zeros(s) for n, s in shapes.items()}
    jitted = ts.jit(full_megatron_layer, mesh=MESH, in_shardings=(None, specs))
    before = jitted.lower(torch.zeros(seq, dim), params).module_at("partitioned").clone()
    after = chunked(before, chunks)
    assert count(after, graph.AllReduceOp) == 2 * chunks
    assert count(after, graph.ConcatOp) == 1  # the attention (before the cut) is whole
    assert_same_results(before, after, scale=SCALE)
    assert_same_results(before, after, scheduled=True, scale=SCALE)


@pytest.mark.parametrize("chunks", [2, 4])
def test_sequence_parallel_mlp_with_residual_propagates_through_gathers(chunks: int) -> None:
    """reduce_scatter -> add -> layer_norm -> all_gather -> matmul -> gelu -> matmul ->
    reduce_scatter -> add: one pipelined region, one concatenation."""

    def block(x, a, wo, w1, w2):
        h = dist.shard(x + a @ wo, ROWS)
        n = op.layer_norm(h, axis=-1)
        return dist.shard(h + op.gelu(n @ w1) @ w2, ROWS)

    before = partitioned(
        block,
        [(16, 32), (16, 32), (32, 32), (32, 64), (64, 32)],
        in_shardings=(ROWS, COLS, ROWS, COLS, ROWS),
        out_shardings=ROWS,
    )
    assert count(before, graph.ReduceScatterOp) == 2 and count(before, graph.AllGatherOp) == 1
    after = chunked(before, chunks)
    assert count(after, graph.ReduceScatterOp) == 2 * chunks
    assert count(after, graph.AllGatherOp) == chunks
    assert count(after, graph.ConcatOp) == 1
    assert_same_results(before, after, scale=SCALE)
    assert_same_results(before, after, scheduled=True, scale=SCALE)


MIXED = f"""
{MESH_TEXT}
func.func @f(%a: tensor<8x4xf32>, %w: tensor<4x6xf32>, %b: tensor<1x6xf32>, %c: tensor<8x6xf32>)
    -> (tensor<8x6xf32>, tensor<6xf32>, tensor<8xf32>) attributes {{graph.partitioned}} {{
  %y = graph.matmul %a, %w : tensor<8x4xf32>, tensor<4x6xf32> -> tensor<8x6xf32>
  %r = graph.all_reduce %y {{axes = [tp], kind = sum}} : tensor<8x6xf32>
  %s = graph.sub %r, %b : tensor<8x6xf32>, tensor<1x6xf32> -> tensor<8x6xf32>
  %p = graph.compare %s, %c {{predicate = gt}} : tensor<8x6xf32>, tensor<8x6xf32> -> tensor<8x6xi1>
  %e = graph.select %p, %s, %c : tensor<8x6xi1>, tensor<8x6xf32>, tensor<8x6xf32> -> tensor<8x6xf32>
  %t = graph.sum %e {{axes = [0], keepdims = false}} : tensor<8x6xf32> -> tensor<6xf32>
  %m = graph.max %e {{axes = [1], keepdims = false}} : tensor<8x6xf32> -> tensor<8xf32>
  %l = graph.log_softmax %e {{axis = 1}} : tensor<8x6xf32>
  %n = graph.rms_norm %l {{axes = [1], eps = 1.0e-06}} : tensor<8x6xf32>
  %d = graph.cast %n : tensor<8x6xf32> -> tensor<8x6xf16>
  %u = graph.cast %d : tensor<8x6xf16> -> tensor<8x6xf32>
  func.return %u, %t, %m : tensor<8x6xf32>, tensor<6xf32>, tensor<8xf32>
}}
"""


@pytest.mark.parametrize("chunks", [2, 4])
def test_elementwise_reductions_and_norms_propagate_or_stop(chunks: int) -> None:
    before = parse(MIXED)
    after = chunked(before, chunks)
    # the sum over the cut dim stops propagation; the rest runs per chunk
    assert count(after, graph.SumOp) == 1
    for op_type in (graph.SubOp, graph.SelectOp, graph.MaxOp, graph.RmsNormOp, graph.LogSoftmaxOp):
        assert count(after, op_type) == chunks
    assert count(after, graph.CastOp) == 2 * chunks
    assert_same_results(before, after)
    assert_same_results(before, after, scheduled=True)


def test_a_whole_operand_is_cut_alike() -> None:
    """``r + rᵀ``: the transpose is not row-wise and takes the whole r; the add is chunked,
    with the transpose's result cut like r."""
    text = f"""
    {MESH_TEXT}
    func.func @f(%a: tensor<8x4xf32>, %w: tensor<4x8xf32>) -> tensor<8x8xf32>
        attributes {{graph.partitioned}} {{
      %y = graph.matmul %a, %w : tensor<8x4xf32>, tensor<4x8xf32> -> tensor<8x8xf32>
      %r = graph.all_reduce %y {{axes = [tp], kind = sum}} : tensor<8x8xf32>
      %t = graph.transpose %r {{perm = [1, 0]}} : tensor<8x8xf32> -> tensor<8x8xf32>
      %s = graph.add %t, %r : tensor<8x8xf32>
      func.return %s : tensor<8x8xf32>
    }}
    """
    before = parse(text)
    after = chunked(before, 2)
    assert count(after, graph.AddOp) == 2 and count(after, graph.TransposeOp) == 1
    assert count(after, graph.ConcatOp) == 2  # r for the transpose, s for the return
    assert_same_results(before, after)


def test_an_operand_chunked_otherwise_stops_propagation() -> None:
    """An add of a value chunked on dim 0 and one chunked on dim 1 takes both whole."""
    text = f"""
    {MESH_TEXT}
    func.func @f(%a: tensor<2x8x4xf32>, %x: tensor<2x2x4xf32>, %w: tensor<4x6xf32>)
        -> tensor<2x8x6xf32> attributes {{graph.partitioned}} {{
      %y = graph.matmul %a, %w : tensor<2x8x4xf32>, tensor<4x6xf32> -> tensor<2x8x6xf32>
      %r = graph.all_reduce %y {{axes = [tp], kind = sum}} : tensor<2x8x6xf32>
      %g = graph.all_gather %x {{axes = [tp], dim = 1}} : tensor<2x2x4xf32> -> tensor<2x8x4xf32>
      %z = graph.matmul %g, %w : tensor<2x8x4xf32>, tensor<4x6xf32> -> tensor<2x8x6xf32>
      %s = graph.add %r, %z : tensor<2x8x6xf32>
      func.return %s : tensor<2x8x6xf32>
    }}
    """
    before = parse(text)
    after = chunked(before, 2)
    assert count(after, graph.AllReduceOp) == count(after, graph.AllGatherOp) == 2
    assert count(after, graph.AddOp) == 1 and count(after, graph.ConcatOp) == 2
    assert_same_results(before, after)
    assert_same_results(before, after, scheduled=True)


# --- program order -----------------------------------------------------------------------------


def dp_training_step() -> ModuleOp:
    """A data-parallel training step of a 2-layer MLP: each weight gradient's matmul is
    all-reduced over dp, the all_reduces placed at the end, by the optimizer."""

    def step(p, x, y):
        out = op.gelu(x @ p["w1"]) @ p["w2"]
        loss = op.mean((out - y) * (out - y))
        return backward(loss), {"loss": loss}

    training = training_step(step, optimizer=optim.SGD(lr=0.1), mesh=dist.mesh({"dp": 4}))
    state = training.init({"w1": torch.zeros(8, 32), "w2": torch.zeros(32, 8)})
    lowered = training.lower(state, torch.zeros(64, 8), torch.zeros(64, 8))
    return lowered.module_at("partitioned").clone()


def test_chunks_keep_the_place_of_the_ops_they_replace() -> None:
    before = dp_training_step()
    ops = list(function_of(before).body.block.ops)
    matmuls = [o for o in ops if isinstance(o, graph.MatmulOp)]
    grads = [o for o in ops if isinstance(o, graph.AllReduceOp) and o.operands[0].owner in matmuls]
    assert len(grads) == 2  # dW2 (made mid-backward) and dW1 (made last)
    dw2 = grads[1].operands[0].owner
    # the op after dW2's matmul in the original backward: dW2's chunks come before it
    follower = ops[ops.index(dw2) + 1]
    assert ops.index(follower) < ops.index(grads[0])  # the original all_reduces come at the end
    after = before.clone()
    follower = list(function_of(after).body.block.ops)[ops.index(follower)]
    CollectiveMatmulPass(chunks=2).apply(Context(), after)
    after.verify()
    chunk_ops = list(function_of(after).body.block.ops)
    dw2_shape = (aval(dw2.operands[0]).shape[0] // 2, aval(dw2.operands[0]).shape[1])
    pieces = [
        i
        for i, o in enumerate(chunk_ops)
        if isinstance(o, graph.MatmulOp) and aval(o.operands[0]).shape == dw2_shape
    ]
    assert len(pieces) == 2
    assert max(pieces) < chunk_ops.index(follower)
    for i in pieces:  # each chunk's all_reduce is issued right after its matmul
        assert isinstance(chunk_ops[i + 1], graph.AllReduceOp)
    assert_same_results(before, after)


# --- choosing k by simulation ------------------------------------------------------------------

TAIL = """
graph.mesh @mesh axes = [tp = 8]
func.func @f(%a: tensor<{T}x{F}x{D}>, %wo: tensor<{F}x{C}x{D}>, %x: tensor<{T}x{C}x{D}>,
             %w1: tensor<{C}x{H}x{D}>, %w2: tensor<{H}x{C}x{D}>) -> tensor<{T}x{C}x{D}>
    attributes {{graph.partitioned}} {{
  %y = graph.matmul %a, %wo : tensor<{T}x{F}x{D}>, tensor<{F}x{C}x{D}> -> tensor<{T}x{C}x{D}>
  %r = graph.all_reduce %y {{axes = [tp], kind = sum}} : tensor<{T}x{C}x{D}>
  %h = graph.add %x, %r : tensor<{T}x{C}x{D}>
  %n = graph.layer_norm %h {{axes = [1], eps = 1.0e-05}} : tensor<{T}x{C}x{D}>
  %u = graph.matmul %n, %w1 : tensor<{T}x{C}x{D}>, tensor<{C}x{H}x{D}> -> tensor<{T}x{H}x{D}>
  %v = graph.gelu %u {{approximate = tanh}} : tensor<{T}x{H}x{D}>
  %z = graph.matmul %v, %w2 : tensor<{T}x{H}x{D}>, tensor<{H}x{C}x{D}> -> tensor<{T}x{C}x{D}>
  %q = graph.all_reduce %z {{axes = [tp], kind = sum}} : tensor<{T}x{C}x{D}>
  %o = graph.add %h, %q : tensor<{T}x{C}x{D}>
  func.return %o : tensor<{T}x{C}x{D}>
}}
"""


def megatron_text(tokens: int, hidden: int, dtype: str) -> str:
    return TAIL.format(T=tokens, F=hidden // 8, C=hidden, H=hidden // 2, D=dtype)


def test_simulation_chooses_k_for_a_megatron_tail() -> None:
    """Tiny: the extra kernels cost more than the hidden communication, left alone. 70B-like
    (4096 tokens, hidden 8192 over tp = 8): chunks pay, and the choice is the fastest k."""
    tiny = parse(megatron_text(16, 64, "f32"))
    DrivenPass().apply(Context(), tiny)
    assert str(tiny) == str(parse(megatron_text(16, 64, "f32")))
    large = parse(megatron_text(4096, 8192, "bf16"))
    mesh = module_mesh(large)[1]  # type: ignore[index]
    topology = load_topology("dgx_h100")
    times = {k: simulated_time(large, 1, mesh, topology, k, schedule_trial) for k in (1, 2, 4, 8)}
    best = min(times, key=lambda k: (times[k], k))
    assert best > 1 and times[best] < times[1]
    assert choose_chunks(large, function_of(large), mesh, "dgx_h100", schedule_trial) == best
    DrivenPass().apply(Context(), large)
    large.verify()
    assert count(large, graph.AllReduceOp) == 2 * best
