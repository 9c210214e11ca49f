"""``collective-matmul``: chunked collective/matmul pairs compute what the unchunked ones do
(on the virtual mesh, graph-level and scheduled), and the cost model's choice of chunks."""

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
from tessera import dist, op
from tessera.backends.schedule_runner import run_virtual
from tessera.backends.virtual import run_partitioned
from tessera.dist.mesh import Mesh
from tessera.errors import TesseraError
from tessera.ir import graph
from tessera.ir.abstract import AbstractTensor
from tessera.ir.mesh_symbol import module_mesh
from tessera.passes import get_all_passes
from tessera.passes.collective_matmul import CollectiveMatmulPass, pipelined_time

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


def random_rank_args(module: ModuleOp, mesh: Mesh, seed: int) -> list[list[torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    types = [AbstractTensor.from_xdsl(a.type) for a in function_of(module).args]
    return [[torch.randn(t.shape, generator=generator) for t in types] for _ in range(mesh.size)]


def assert_same_results(before: ModuleOp, after: ModuleOp, scheduled: bool = False) -> None:
    """Both modules give every rank the same results on random per-rank inputs."""
    mesh = module_mesh(before)[1]  # type: ignore[index]
    name = function_of(before).sym_name.data
    args = random_rank_args(before, mesh, seed=0)
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


def test_cost_model_decomposes_a_large_gather_and_keeps_a_tiny_one() -> None:
    large, tiny = parse(LARGE), parse(TINY)
    for module in (large, tiny):
        CollectiveMatmulPass().apply(Context(), module)
        module.verify()
    assert count(large, graph.AllGatherOp) in (2, 4, 8)
    assert count(tiny, graph.AllGatherOp) == 1 and count(tiny, graph.SliceOp) == 0


def test_cost_model_leaves_a_group_the_topology_cannot_hold() -> None:
    text = LARGE.replace("tp = 8", "tp = 16").replace("512x", "256x")
    small_machine, large_machine = parse(text), parse(text)
    CollectiveMatmulPass().apply(Context(), small_machine)  # dgx_h100: 8 devices
    assert count(small_machine, graph.AllGatherOp) == 1
    CollectiveMatmulPass(topology="dgx_h100x2").apply(Context(), large_machine)
    large_machine.verify()
    assert count(large_machine, graph.AllGatherOp) > 1


def test_pipelined_time() -> None:
    assert pipelined_time(3.0, 5.0, 1) == 8.0  # serial
    assert pipelined_time(1.0, 2.0, 4) == 1.0 + 3 * 2.0 + 2.0
