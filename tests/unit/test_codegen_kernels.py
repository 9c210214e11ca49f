"""Generated kernels (``codegen.kernels`` -> ``emit-triton`` -> Triton's CPU interpreter)
against torch computed independently in float64.

Each case traces a function with ``ts.jit``, lowers its scheduled kernels with small
blocks (:data:`SMALL`: many programs per kernel, and masks, since the random sizes are
rarely block multiples and often 1), runs the schedule with the Triton kernels only, and
compares every output with torch applied to the same inputs in float64 (never with
Tessera's reference executor).

Tolerances. ``err = max |out - ref| / max |ref|`` over the entries where ``ref`` is
finite; NaN and inf must appear exactly where the reference has them; integer and
boolean results must be equal.

- f32, pointwise (evaluation order preserved, math in f32): ``err <= 1e-5``;
- f32 with a dot or a reduction (summation order differs): ``err <= 1e-4``;
- bf16 (inputs are bf16 values; the reference uses them in f64; the kernel rounds its
  f32 result once): ``err <= 1e-2``.

Every op with pointwise, index-map or row-reduction tile code (``tessera.opdefs``)
of ``codegen.kernels`` is checked to appear in the kernels of some case here.
"""

from __future__ import annotations

import math
import pathlib
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from xdsl.context import Context
from xdsl.dialects.builtin import Builtin, ModuleOp
from xdsl.dialects.func import Func
from xdsl.parser import Parser
from xdsl.transforms.dead_code_elimination import region_dce
from xdsl.utils.exceptions import PassFailedException

import tessera as ts
from tessera import dist, op
from tessera.backends import launch_plan
from tessera.backends.schedule_runner import KernelContext
from tessera.backends.triton import compiled_kernel
from tessera.backends.triton.emit import emit_kernel
from tessera.backends.triton.runtime import TritonKernels
from tessera.codegen.kernels import (
    MAX_ROW_BLOCK,
    BlockConfig,
    kernel_class,
    lower_kernel,
)
from tessera.errors import IRError
from tessera.frontend.tracer import current_trace
from tessera.ir import graph, schedule, tile
from tessera.ir.graph import Graph
from tessera.ir.schedule import Schedule
from tessera.opdefs import Fusion, IndexMap, Pointwise, RowReduction, registered
from tessera.passes.lower_schedule_to_tile import LowerScheduleToTilePass

F32_POINTWISE = 1e-5
F32_ACCUMULATE = 1e-4
BF16 = 1e-2

# small blocks: several programs per kernel, partial blocks, grouped matmul tiles
SMALL = BlockConfig(block=64, row_elements=128, block_m=16, block_n=16, block_k=16, group_m=2)
ONE_DEVICE = dist.Mesh(axes=["d"], shape=(1,))

# the test that runs each op with pointwise, index-map or row-reduction tile code (besides the
# UNARY and BINARY tables below); every such run checks that its kernels contain the op
EXERCISED: dict[type, str] = {
    graph.CompareOp: "test_compare_select_cast",
    graph.SelectOp: "test_compare_select_cast",
    graph.CastOp: "test_compare_select_cast",
    graph.RandomBitsOp: "test_random.py::test_triton_kernels_and_reference_give_identical_bits",
    graph.IotaOp: "test_iota.py::test_iota_equals_numpy",
    graph.DynamicUpdateSliceOp: "test_generate.py::test_dynamic_update_slice_against_numpy",
    graph.Fp8QuantizeOp: "test_fp8.py::test_fp8_quantize_saturates_and_rounds_like_torch",
    graph.Fp8GradOp: "test_fp8.py::test_fp8_gradients_match_torch_float8_emulation",
    graph.Fp8GradDelayedOp: "test_fp8_delayed.py::test_delayed_scaling_runs_in_triton_kernels",
    graph.TransposeOp: "test_layout_ops",
    graph.BroadcastToOp: "test_layout_ops",
    graph.SliceOp: "test_layout_ops",
    graph.ReshapeOp: "test_layout_ops",
    graph.ConcatOp: "test_layout_ops",
    graph.SplitOp: "test_layout_ops",
    graph.GatherOp: "test_layout_ops",
    graph.AllSliceOp: "test_all_slice_uses_the_rank_argument",
    graph.SumOp: "test_sum_mean_max_min",
    graph.MeanOp: "test_sum_mean_max_min",
    graph.MaxOp: "test_sum_mean_max_min",
    graph.MinOp: "test_sum_mean_max_min",
    graph.ProdOp: "test_sum_mean_max_min",
    graph.SoftmaxOp: "test_softmax_log_softmax_norms",
    graph.LogSoftmaxOp: "test_softmax_log_softmax_norms",
    graph.LayerNormOp: "test_softmax_log_softmax_norms",
    graph.RmsNormOp: "test_softmax_log_softmax_norms",
    graph.CrossEntropyOp: "test_cross_entropy",
    # generated gathers run in the MoE tests, against the float64 loop and the reference kernels
    graph.MoeDispatchOp: "test_moe_ops.py::test_grouped_expert_matmul_runs_as_a_triton_kernel_with_its_activation",
    graph.MoeCombineOp: "test_moe_ops.py::test_dispatch_and_combine_kernels_in_the_backward_match_the_reference_kernels",
}


@pytest.fixture(autouse=True, scope="module")
def _private_cache(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Kernel sources go to a fresh cache directory for this module."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TESSERA_CACHE_DIR", str(tmp_path_factory.mktemp("triton-cache")))
        yield


# --- compile, run, compare ---------------------------------------------------------------


@dataclass
class Compiled:
    name: str
    module: ModuleOp

    def tile_kernels(self) -> list[tile.KernelOp]:
        return [k for k in self.module.walk() if isinstance(k, tile.KernelOp)]

    def classes(self) -> list[str]:
        return [kernel_class(k) for k in self.module.walk() if isinstance(k, schedule.KernelOp)]

    def run(
        self, args: Sequence[torch.Tensor], mesh: dist.Mesh = ONE_DEVICE, rank_args: Any = None
    ) -> list[tuple[torch.Tensor, ...]]:
        ranks = rank_args if rank_args is not None else [list(args)]
        return launch_plan.run_virtual(
            self.module, self.name, mesh, ranks, TritonKernels(self.module)
        )


def lower_module(module: ModuleOp, config: BlockConfig) -> None:
    """What lower-schedule-to-tile does, with every field of ``config`` (group_m too)."""
    for kernel in [k for k in module.walk() if isinstance(k, schedule.KernelOp)]:
        lowered = lower_kernel(kernel, config)
        region_dce(lowered.body)
        module.body.block.add_op(lowered)
    module.verify()


def compile_fn(
    fn: Callable[..., Any],
    *args: torch.Tensor,
    config: BlockConfig = SMALL,
    covers: type | None = None,
    **jit: Any,
) -> Compiled:
    """``fn`` traced and scheduled, and its kernels lowered with ``config``; ``covers``:
    a graph op that must be in one of the kernels."""
    lowered = ts.jit(fn, **jit).lower(*args)
    module = lowered.module_at("schedule").clone()
    lower_module(module, config)
    if covers is not None:
        assert any(isinstance(o, covers) for o in module.walk()), f"no {covers.__name__}"
    return Compiled(lowered.name, module)


def run(
    fn: Callable[..., Any],
    *args: torch.Tensor,
    config: BlockConfig = SMALL,
    covers: type | None = None,
) -> list[Any]:
    """``fn``'s outputs computed by the generated kernels alone."""
    return list(compile_fn(fn, *args, config=config, covers=covers).run(args)[0])


def assert_close(out: torch.Tensor, ref: torch.Tensor, tol: float, what: str = "") -> None:
    """``out`` (the kernels') against ``ref`` (torch, float64), per the module docstring."""
    assert tuple(out.shape) == tuple(ref.shape), f"{what}: shape {out.shape} != {ref.shape}"
    if not ref.is_floating_point():
        assert torch.equal(out.cpu(), ref.to(out.dtype)), f"{what}: {out} != {ref}"
        return
    out, ref = out.double().cpu(), ref.double()
    assert torch.equal(out.isnan(), ref.isnan()), f"{what}: NaNs differ:\n{out}\n{ref}"
    infinite = ref.isinf()
    assert torch.equal(out[infinite], ref[infinite]), f"{what}: infinities differ"
    finite = ref.isfinite()
    assert bool(out[finite].isfinite().all()), f"{what}: non-finite values where ref is finite"
    if not bool(finite.any()):
        return
    scale = ref[finite].abs().max().item() or 1.0
    err = (out[finite] - ref[finite]).abs().max().item() / scale
    assert err <= tol, f"{what}: relative error {err:.3g} > {tol:g}"


def tolerance(dtype: torch.dtype, accumulates: bool) -> float:
    if dtype == torch.bfloat16:
        return BF16
    return F32_ACCUMULATE if accumulates else F32_POINTWISE


def f64(*xs: torch.Tensor) -> list[torch.Tensor]:
    return [x.double() if x.is_floating_point() else x for x in xs]


def random_shape(rng: random.Random, rank: int = 3, most: int = 23) -> tuple[int, ...]:
    """Sizes in [1, most], each 1 with probability 1/4 (singleton dims)."""
    return tuple(1 if rng.random() < 0.25 else rng.randint(2, most) for _ in range(rank))


def randn(shape: Sequence[int], seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype)


# --- pointwise: every elementwise op ------------------------------------------------------


def _positive(x: torch.Tensor) -> torch.Tensor:
    return (x.float().abs() + 0.25).to(x.dtype)


UNARY = {
    "neg": (graph.NegOp, op.negative, torch.neg, None),
    "abs": (graph.AbsOp, op.abs, torch.abs, None),
    "relu": (graph.ReluOp, op.relu, torch.relu, None),
    "exp": (graph.ExpOp, op.exp, torch.exp, None),
    "log": (graph.LogOp, op.log, torch.log, _positive),
    "tanh": (graph.TanhOp, op.tanh, torch.tanh, None),
    "sqrt": (graph.SqrtOp, op.sqrt, torch.sqrt, _positive),
    "rsqrt": (graph.RsqrtOp, op.rsqrt, torch.rsqrt, _positive),
    "sigmoid": (graph.SigmoidOp, op.sigmoid, torch.sigmoid, None),
    "silu": (graph.SiluOp, op.silu, F.silu, None),
    "erf": (graph.ErfOp, op.erf, torch.erf, None),
    "stop_gradient": (graph.StopGradientOp, op.stop_gradient, lambda x: x, None),
    # h.wait() of a value no collective makes (a wait of one is no kernel op)
    "wait": (graph.WaitOp, lambda x: current_trace().bind(graph.WaitOp, [x])[0], lambda x: x, None),
    "gelu": (graph.GeluOp, op.gelu, F.gelu, None),
    "gelu_tanh": (
        graph.GeluOp,
        lambda x: op.gelu(x, approximate="tanh"),
        lambda x: F.gelu(x, approximate="tanh"),
        None,
    ),
    "cos": (graph.CosOp, op.cos, torch.cos, None),
    "sin": (graph.SinOp, op.sin, torch.sin, None),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_unary_ops(dtype: torch.dtype) -> None:
    """Each unary op alone on a random 3-D shape (a kernel each)."""
    rng = random.Random(1)
    for seed, (name, (graph_op, fn, ref_fn, domain)) in enumerate(UNARY.items()):
        x = randn(random_shape(rng), seed, dtype)
        x = domain(x) if domain else x
        (out,) = run(fn, x, covers=graph_op)
        assert out.dtype == dtype
        assert_close(out, ref_fn(x.double()), tolerance(dtype, False), name)


BINARY = {
    "add": (graph.AddOp, op.add, torch.add),
    "sub": (graph.SubOp, op.subtract, torch.sub),
    "mul": (graph.MulOp, op.multiply, torch.mul),
    "div": (graph.DivOp, op.divide, torch.div),
    "pow": (graph.PowOp, op.power, torch.pow),
    "maximum": (graph.MaximumOp, op.maximum, torch.maximum),
    "minimum": (graph.MinimumOp, op.minimum, torch.minimum),
}


def _broadcast_partner(rng: random.Random, shape: tuple[int, ...]) -> tuple[int, ...]:
    """A shape that broadcasts against ``shape``: a suffix, some dims set to 1."""
    suffix = shape[rng.randint(0, len(shape) - 1) :]
    return tuple(1 if rng.random() < 0.4 else s for s in suffix)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_binary_ops_with_broadcasting(dtype: torch.dtype) -> None:
    """Each binary op with numpy broadcasting (the second operand a suffix with 1s)."""
    rng = random.Random(2)
    for seed, (name, (graph_op, fn, ref_fn)) in enumerate(BINARY.items()):
        shape = random_shape(rng)
        x, y = randn(shape, seed, dtype), randn(_broadcast_partner(rng, shape), seed + 50, dtype)
        if name == "div":
            y = (y.float().sign() * (y.float().abs() + 0.5)).to(dtype)
        if name == "pow":
            x = _positive(x)
        (out,) = run(fn, x, y, covers=graph_op)
        assert_close(out, ref_fn(*f64(x, y)), tolerance(dtype, False), name)


def test_pow_negative_bases() -> None:
    """torch.pow on negative bases: real for integral exponents (sign of odd powers), NaN
    for others; x ** 0 is 1, also for x = 0."""
    x = torch.tensor([[-2.0, -2.0, -1.5, -3.0, 0.0, 2.0, -0.5]])
    y = torch.tensor([[3.0, 2.0, 0.5, 0.0, 0.0, -1.5, -3.0]])
    (out,) = run(op.power, x, y)
    assert_close(out, torch.pow(x.double(), y.double()), F32_POINTWISE, "pow")


def test_compare_select_cast() -> None:
    """The six comparisons (ties included), select, and casts to bf16, i32, bool and back."""
    rng = random.Random(3)
    shape = random_shape(rng)
    g = torch.Generator().manual_seed(3)
    x = torch.randint(-3, 4, shape, generator=g).float()
    y = torch.randint(-3, 4, shape[1:], generator=g).float()
    comparisons = {
        "eq": (op.equal, torch.eq),
        "ne": (op.not_equal, torch.ne),
        "lt": (op.less, torch.lt),
        "le": (op.less_equal, torch.le),
        "gt": (op.greater, torch.gt),
        "ge": (op.greater_equal, torch.ge),
    }
    for name, (fn, ref_fn) in comparisons.items():
        (out,) = run(fn, x, y, covers=graph.CompareOp)
        assert out.dtype == torch.bool
        assert_close(out, ref_fn(x, y), 0, name)

    (out,) = run(lambda a, b: op.where(op.greater(a, 0.5), a, b * 2.0), x, y, covers=graph.SelectOp)
    assert_close(out, torch.where(x > 0.5, x, y * 2.0), F32_POINTWISE, "where")

    z = randn(shape, 4) * 40
    casts = {
        "i32": (lambda a: op.astype(a, "i32"), z.to(torch.int32)),
        "bool": (lambda a: op.astype(op.relu(a), "bool"), z.relu() != 0),
        "i32 to f32": (lambda a: op.astype(op.astype(a, "i32"), "f32") / 3.0, None),
        "bf16": (lambda a: op.astype(a, "bf16"), z.double()),
    }
    casts["i32 to f32"] = (casts["i32 to f32"][0], z.to(torch.int32).double() / 3.0)
    for name, (fn, ref) in casts.items():
        (out,) = run(fn, z, covers=graph.CastOp)
        tol = BF16 if name == "bf16" else F32_POINTWISE
        assert_close(out, ref, tol, name)


def test_cast_to_bf16_rounds_to_nearest_even() -> None:
    """A cast to bf16 (and a bf16 output) rounds to nearest even, as torch does."""
    z = randn((8, 33), 4) * 40
    to_bf16, through_bf16 = run(
        lambda a: (op.astype(a, "bf16"), op.astype(op.astype(a, "bf16"), "f32") + 1.0), z
    )
    assert_close(to_bf16, z.bfloat16(), 0, "bf16")
    assert_close(through_bf16, z.bfloat16().double() + 1.0, 0, "through bf16")


def test_integer_elementwise() -> None:
    """Integer arithmetic stays integer: add, sub, mul, neg, abs, relu, max, min."""
    g = torch.Generator().manual_seed(5)
    x = torch.randint(-50, 50, (9, 1, 13), generator=g, dtype=torch.int32)
    y = torch.randint(-50, 50, (7, 13), generator=g, dtype=torch.int32)

    def f(a: Any, b: Any) -> tuple[Any, ...]:
        return (
            (a + b) * 3 - b,
            op.abs(a - b) + op.relu(-a),
            op.maximum(a, b) - op.minimum(a, b),
        )

    outs = run(f, x, y)
    refs = ((x + y) * 3 - y, (x - y).abs() + (-x).relu(), torch.maximum(x, y) - torch.minimum(x, y))
    for out, ref in zip(outs, refs, strict=True):
        assert out.dtype == torch.int32
        assert_close(out, ref, 0, "int")


def test_nan_propagates_through_relu_maximum_minimum() -> None:
    """arith.maximumf / minimumf propagate NaN, as torch does; tl.maximum's default does not."""
    x = torch.tensor([float("nan"), -1.0, 2.0, float("nan")])
    y = torch.tensor([0.5, float("nan"), 1.0, float("nan")])
    relu, high, low = run(lambda a, b: (op.relu(a), op.maximum(a, b), op.minimum(a, b)), x, y)
    assert_close(relu, torch.relu(x.double()), 0, "relu")
    assert_close(high, torch.maximum(x.double(), y.double()), 0, "maximum")
    assert_close(low, torch.minimum(x.double(), y.double()), 0, "minimum")


def test_fused_chain_with_broadcasts_and_outputs() -> None:
    """A chain of elementwise ops over operands of three broadcast shapes with two outputs,
    and a size that is a block multiple (no mask) next to one that is not."""
    rng = random.Random(6)
    for shape in [(4, 16), random_shape(rng)]:
        x = randn(shape, 1)
        col = randn((*shape[:-1], 1), 2)
        row = randn(shape[-1:], 3)

        def f(a: Any, c: Any, r: Any) -> tuple[Any, Any]:
            h = op.gelu(a * c + r) - op.exp(a) / 3.0
            return h, op.sigmoid(h) * r

        h, y = run(f, x, col, row)
        xd, cd, rd = f64(x, col, row)
        href = F.gelu(xd * cd + rd) - torch.exp(xd) / 3.0
        assert_close(h, href, F32_POINTWISE, "chain")
        assert_close(y, torch.sigmoid(href) * rd, F32_POINTWISE, "chain second output")


# --- pointwise: every layout op -----------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_layout_ops(dtype: torch.dtype) -> None:
    """transpose, broadcast_to, slice, reshape, concat, split and gather (layout kernels
    move values exactly, whatever the dtype)."""
    rng = random.Random(7)
    x = randn(random_shape(rng), 1, dtype)
    perm = (2, 0, 1)
    (out,) = run(lambda a: op.transpose(a, perm), x, covers=graph.TransposeOp)
    assert_close(out, x.double().permute(perm), 0, "transpose")

    b = randn((5, 1, 7), 2, dtype)
    (out,) = run(lambda a: op.broadcast_to(a, (3, 5, 4, 7)), b, covers=graph.BroadcastToOp)
    assert_close(out, b.double().expand(3, 5, 4, 7), 0, "broadcast_to")

    s = randn((9, 4, 23), 3, dtype)
    (out,) = run(lambda a: op.slice(a, (1, 0, 3), (8, 4, 23), (2, 1, 3)), s, covers=graph.SliceOp)
    assert_close(out, s.double()[1:8:2, :, 3:23:3], 0, "slice")
    (out,) = run(lambda a: a[-1, 1:3] * 2.0, s)
    assert_close(out, s.double()[-1, 1:3] * 2.0, tolerance(dtype, False), "getitem")

    r = randn((6, 1, 10), 4, dtype)
    (out,) = run(lambda a: op.reshape(a, (3, 4, 5)), r, covers=graph.ReshapeOp)
    assert_close(out, r.double().reshape(3, 4, 5), 0, "reshape")
    (out,) = run(lambda a: op.reshape(a, (60, 1)), r)
    assert_close(out, r.double().reshape(60, 1), 0, "reshape to a column")

    parts = [randn((4, n, 3), 10 + n, dtype) for n in (2, 1, 5)]
    (out,) = run(lambda a, b, c: op.concat([a, b, c], axis=1), *parts, covers=graph.ConcatOp)
    assert_close(out, torch.cat(f64(*parts), dim=1), 0, "concat")

    c = [randn((n, 6), 20 + n, dtype) for n in (3, 1, 4)]
    (out,) = run(lambda a, b, d: op.concat([a, b, d], axis=0), *c)
    assert_close(out, torch.cat(f64(*c), dim=0), 0, "concat rows")

    w = randn((5, 8, 3), 5, dtype)
    outs = run(lambda a: tuple(op.split(a, [3, 4], axis=1)), w, covers=graph.SplitOp)
    for out, ref in zip(outs, torch.split(w.double(), [3, 1, 4], dim=1), strict=True):
        assert_close(out, ref, 0, "split")
    outs = run(lambda a: tuple(op.split(a, [2, 4], axis=0)), w)  # pieces 2, 2, 1
    for out, ref in zip(outs, torch.split(w.double(), 2, dim=0), strict=True):
        assert_close(out, ref, 0, "split rows")

    table = randn((10, 6), 6, dtype)
    idx = torch.tensor([3, -1, 0, 9, -10, 4])
    (out,) = run(lambda t, i: op.take(t, i, axis=0), table, idx, covers=graph.GatherOp)
    assert_close(out, table.double()[idx % 10], 0, "gather rows")
    idx2 = torch.tensor([[5, 0], [-2, 1], [3, 3]], dtype=torch.int32)
    (out,) = run(lambda t, i: op.take(t, i, axis=1), table, idx2)
    assert_close(out, table.double()[:, (idx2 % 6).long()], 0, "gather columns")


def test_concat_takes_each_piece_from_its_own_operand() -> None:
    """Every piece of a concat comes from its own operand (regression: the selection once
    compared with the first operand's start, so the first operand won everywhere)."""
    a, b, c = torch.zeros(2, 3), torch.ones(2, 2), torch.full((2, 4), 2.0)
    (out,) = run(lambda x, y, z: op.concat([x, y, z], axis=1), a, b, c)
    assert_close(out, torch.cat([a, b, c], dim=1).double(), 0, "concat")


@pytest.mark.parametrize("dim", [0, 1])
def test_all_slice_uses_the_rank_argument(dim: int) -> None:
    """all_slice (a replicated value split over tp): each rank keeps its chunk, found
    from its position along tp (the kernel's i32 rank argument)."""
    mesh = dist.Mesh(axes=["dp", "tp"], shape=(2, 2))
    split = dist.ShardSpec(partition=(dim,), mesh_axes=("tp",))
    whole = dist.ShardSpec(partition=(), mesh_axes=())
    x = randn((6, 10), 8)
    compiled = compile_fn(
        lambda a: a * 2.0,
        x,
        covers=graph.AllSliceOp,
        mesh=mesh,
        in_shardings=(whole,),
        out_shardings=split,
    )
    kernels = compiled.tile_kernels()
    assert any("positions" in k.attributes for k in kernels)
    per_rank = compiled.run([x], mesh, [[x] for _ in range(mesh.size)])
    for rank, (out,) in enumerate(per_rank):
        position, size = KernelContext(mesh, rank).position(("tp",))
        ref = (x.double() * 2.0).chunk(size, dim)[position]
        assert_close(out, ref, F32_POINTWISE, f"rank {rank}")


def test_axis_index_is_the_rank_argument() -> None:
    """A vocabulary-parallel lookup (the table's rows split over tp): each rank's kernel
    reads its position along tp (graph.axis_index, the i32 rank argument) for the offset
    of its rows and zeroes the rows it does not hold; the partial results sum to the
    lookup."""
    mesh = dist.Mesh(axes=["dp", "tp"], shape=(2, 2))
    rows = dist.ShardSpec(partition=(0,), mesh_axes=("tp",))
    whole = dist.ShardSpec(partition=(), mesh_axes=())
    table, ids = randn((64, 5), 3), torch.tensor([0, 63, -1, 31, 32, -64])
    compiled = compile_fn(
        lambda t, i: op.embedding(i, t),
        table,
        ids,
        covers=graph.AxisIndexOp,
        mesh=mesh,
        in_shardings=(rows, whole),
        out_shardings=whole,
    )
    assert any("positions" in k.attributes for k in compiled.tile_kernels())
    pieces = table.chunk(2)
    rank_args = [
        [pieces[KernelContext(mesh, r).position(("tp",))[0]], ids] for r in range(mesh.size)
    ]
    per_rank = compiled.run([table, ids], mesh, rank_args)
    for rank, (out,) in enumerate(per_rank):
        assert_close(out, table.double()[ids], F32_POINTWISE, f"rank {rank}")


# --- row reductions -----------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_sum_mean_max_min(dtype: torch.dtype) -> None:
    """sum, mean, max, min and prod over the last, first and a middle axis, two axes and
    all of them, with and without keepdims; an elementwise prologue and epilogue."""
    rng = random.Random(9)
    x = randn((5, 1, 9) if dtype == torch.bfloat16 else random_shape(rng), 1, dtype)
    cases = [
        (graph.SumOp, op.sum, torch.sum, -1, False),
        (graph.MeanOp, op.mean, torch.mean, 0, False),
        (graph.MaxOp, op.max, torch.amax, 1, True),
        (graph.MinOp, op.min, torch.amin, -1, True),
        (graph.SumOp, op.sum, torch.sum, (0, 2), False),
        (graph.MeanOp, op.mean, torch.mean, None, False),
        (graph.MaxOp, op.max, torch.amax, (0, 1), True),
        (graph.ProdOp, op.prod, torch.prod, -1, True),
        (graph.ProdOp, op.prod, torch.prod, 0, False),
    ]
    for graph_op, fn, ref_fn, axis, keepdims in cases:
        name = graph_op.name
        (out,) = run(
            lambda a, f=fn, ax=axis, k=keepdims: f(a * 2.0, axis=ax, keepdims=k) + 1.0,
            x,
            covers=graph_op,
        )
        dims = tuple(range(x.dim())) if axis is None else axis
        ref = ref_fn(x.double() * 2.0, dim=dims, keepdim=keepdims) + 1.0
        assert_close(out, ref, tolerance(dtype, True), f"{name} axis={axis}")


def test_integer_sum_and_nan_max() -> None:
    """An i32 sum stays exact; max / min of a row holding NaN are NaN (as in torch)."""
    g = torch.Generator().manual_seed(10)
    x = torch.randint(-1000, 1000, (7, 37), generator=g, dtype=torch.int32)
    (out,) = run(lambda a: op.sum(a, axis=1), x)
    assert_close(out, x.sum(dim=1, dtype=torch.int32), 0, "int sum")

    y = randn((3, 11), 11)
    y[1, 4] = float("nan")
    high, low = run(lambda a: (op.max(a, axis=1), op.min(a, axis=1)), y)
    assert_close(high, y.double().amax(dim=1), 0, "max with NaN")
    assert_close(low, y.double().amin(dim=1), 0, "min with NaN")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_softmax_log_softmax_norms(dtype: torch.dtype) -> None:
    """softmax and log_softmax over the last and the first axis; layer_norm (with weight
    and bias, and over two axes) and rms_norm with a weight; prologues and epilogues."""
    rng = random.Random(12)
    shape = (3, *random_shape(rng, 2)) if dtype == torch.float32 else (4, 1, 37)
    x = randn(shape, 1, dtype)
    xd = x.double()
    w, b = randn(shape[-1:], 2, dtype), randn(shape[-1:], 3, dtype)
    wd, bd = f64(w, b)
    tol = tolerance(dtype, True)
    for axis in (-1, 0):
        p, lp = run(
            lambda a, ax=axis: (op.softmax(a * 0.5, axis=ax), op.log_softmax(a, axis=ax) * 2.0),
            x,
            covers=graph.LogSoftmaxOp,
        )
        assert_close(p, torch.softmax(xd * 0.5, dim=axis), tol, f"softmax {axis}")
        assert_close(lp, torch.log_softmax(xd, dim=axis) * 2.0, tol, f"log_softmax {axis}")

    (out,) = run(
        lambda a, g, h: op.layer_norm(a + 1.0, weight=g, bias=h), x, w, b, covers=graph.LayerNormOp
    )
    ref = F.layer_norm(xd + 1.0, shape[-1:], wd, bd, eps=1e-5)
    assert_close(out, ref, tol, "layer_norm")
    (out,) = run(lambda a: op.layer_norm(a, axis=(-2, -1)), x)
    assert_close(out, F.layer_norm(xd, shape[-2:], eps=1e-5), tol, "layer_norm 2 axes")
    (out,) = run(lambda a, g: op.rms_norm(a, weight=g) - 1.0, x, w, covers=graph.RmsNormOp)
    ref = xd * torch.rsqrt(xd.square().mean(dim=-1, keepdim=True) + 1e-6) * wd - 1.0
    assert_close(out, ref, tol, "rms_norm")


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy(reduction: str) -> None:
    """cross_entropy on [B, T, C] logits: per-row losses, then (for mean and sum) a
    second reduction kernel over them (lower-graph-to-schedule splits it)."""
    g = torch.Generator().manual_seed(13)
    logits = randn((3, 5, 11), 13) * 3
    labels = torch.randint(0, 11, (3, 5), generator=g)
    compiled = compile_fn(
        lambda a, t: op.cross_entropy(a, t, reduction), logits, labels, covers=graph.CrossEntropyOp
    )
    assert compiled.classes() == ["reduction"] * (1 if reduction == "none" else 2)
    (out,) = compiled.run([logits, labels])[0]
    ref = F.cross_entropy(
        logits.double().reshape(-1, 11), labels.reshape(-1), reduction=reduction
    ).reshape(() if reduction != "none" else (3, 5))
    assert_close(out, ref, F32_ACCUMULATE, reduction)


# --- matmul -------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_matmul(dtype: torch.dtype) -> None:
    """Plain (block multiples, then sizes below and between blocks), grouped tiles with
    a partial group (5 x 3 tiles, group_m = 2), a matrix-vector product, and a batched
    matmul whose batch dims broadcast ([2, 1] with [3])."""
    shapes = [
        ((32, 48), (48, 32)),
        ((5, 7), (7, 3)),
        ((80, 20), (20, 45)),
        ((33,), (33, 18)),
        ((2, 1, 9, 20), (3, 20, 13)),
    ]
    for seed, (sa, sb) in enumerate(shapes):
        a, b = randn(sa, seed, dtype), randn(sb, seed + 100, dtype)
        compiled = compile_fn(op.matmul, a, b)
        assert "matmul" in compiled.classes()
        (out,) = compiled.run([a, b])[0]
        assert out.dtype == dtype
        assert_close(out, torch.matmul(*f64(a, b)), tolerance(dtype, True), f"{sa} @ {sb}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_matmul_epilogue(dtype: torch.dtype) -> None:
    """bias + gelu + residual fused into the matmul kernel (one kernel), M, N, K not block
    multiples; and a batched matmul with a scaled, column-broadcast epilogue."""
    x, w = randn((40, 33), 1, dtype), randn((33, 20), 2, dtype)
    bias, res = randn((20,), 3, dtype), randn((40, 20), 4, dtype)
    compiled = compile_fn(lambda a, b, c, r: op.gelu(a @ b + c) + r, x, w, bias, res)
    assert compiled.classes() == ["matmul"]
    (out,) = compiled.run([x, w, bias, res])[0]
    xd, wd, bd, rd = f64(x, w, bias, res)
    assert_close(out, F.gelu(xd @ wd + bd) + rd, tolerance(dtype, True), "epilogue")

    p, q, s = randn((3, 17, 24), 5, dtype), randn((3, 24, 16), 6, dtype), randn((17, 1), 7, dtype)
    (out,) = run(lambda a, b, c: op.relu(a @ b) * c - 1.0, p, q, s)
    pd, qd, sd = f64(p, q, s)
    assert_close(out, torch.relu(pd @ qd) * sd - 1.0, tolerance(dtype, True), "batched epilogue")


# --- fused kernels (lower-graph-to-schedule's grouping) -----------------------------------


def kernel_bodies(compiled: Compiled) -> list[list[str]]:
    """Each schedule kernel's body as its ops' names (constants and the yield left out)."""
    return [
        [o.name for o in k.body.block.ops if o.name not in ("graph.constant", "schedule.yield")]
        for k in compiled.module.walk()
        if isinstance(k, schedule.KernelOp)
    ]


def test_multi_output_optimizer_update() -> None:
    """An AdamW-like update is one kernel: the two moment chains merge where the update
    reads both, and the new moments, returned and used by the update, are outputs too."""
    rng = random.Random(11)
    shape = random_shape(rng, 2)
    p, g, m, v = (randn(shape, seed) for seed in range(4))
    v = v.abs()

    def update(p: Any, g: Any, m: Any, v: Any, sqrt: Any = op.sqrt) -> tuple[Any, Any, Any]:
        m_new = m * 0.9 + g * 0.1
        v_new = v * 0.999 + g * g * 0.001
        step = m_new / (sqrt(v_new / 0.5) + 1e-8)
        return p - 1e-2 * step - 1e-4 * p, m_new, v_new

    compiled = compile_fn(update, p, g, m, v)
    assert compiled.classes() == ["pointwise"]
    outs = compiled.run([p, g, m, v])[0]
    refs = update(*f64(p, g, m, v), sqrt=torch.sqrt)
    for out, ref, what in zip(outs, refs, ("p", "m", "v"), strict=True):
        assert_close(out, ref, F32_POINTWISE, what)


def test_layout_ops_read_through_by_consumers() -> None:
    """Reshape, transpose, slice and broadcast_to feeding elementwise ops and a row
    reduction are evaluated in the consumers' kernels: no kernel of their own."""
    x, y = randn((6, 10), 1), randn((5, 3, 4), 2)
    z, col = randn((7, 9), 3), randn((7, 1), 4)

    def f(a: Any, b: Any, c: Any, d: Any) -> tuple[Any, Any, Any]:
        moved = op.transpose(op.reshape(op.exp(a), (3, 4, 5)), (2, 0, 1)) + b
        picked = op.slice(c, (1, 2), (7, 9), (2, 3)) * op.broadcast_to(d[1:7:2], (3, 3))
        split = op.reshape(op.transpose(b, (1, 0, 2)), (3, 5, 2, 2)) * 2.0  # per-dim runs
        return op.negative(moved), op.sum(op.transpose(picked, (1, 0)), axis=-1), split

    compiled = compile_fn(f, x, y, z, col)
    bodies = kernel_bodies(compiled)
    assert all(any(n not in LAYOUT_NAMES for n in body) for body in bodies), bodies
    a, b, c, d = f64(x, y, z, col)
    moved = torch.exp(a).reshape(3, 4, 5).permute(2, 0, 1) + b
    picked = c[1:7:2, 2:9:3] * d[1:7:2].expand(3, 3)
    first, second, third = compiled.run([x, y, z, col])[0]
    assert_close(first, -moved, F32_POINTWISE, "elementwise through layout ops")
    assert_close(second, picked.T.sum(-1), F32_ACCUMULATE, "sum through layout ops")
    split = b.permute(1, 0, 2).reshape(3, 5, 2, 2) * 2.0
    assert_close(third, split, F32_POINTWISE, "a reshape splitting one dim")


LAYOUT_NAMES = {"graph.reshape", "graph.transpose", "graph.slice", "graph.broadcast_to"}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_matmul_prologue(dtype: torch.dtype) -> None:
    """Matmul operands read in place through layout ops: a transposed weight, and the
    attention scores of heads split from projections (reshape + transpose, then the key
    transposed); M, N, K are not block multiples. One kernel per matmul."""
    x, wq, wk = randn((2, 9, 20), 1, dtype), randn((24, 20), 2, dtype), randn((20, 24), 3, dtype)

    def f(a: Any, q_w: Any, k_w: Any) -> Any:
        q = op.transpose(op.reshape(a @ op.transpose(q_w), (2, 9, 3, 8)), (0, 2, 1, 3))
        k = op.transpose(op.reshape(a @ k_w, (2, 9, 3, 8)), (0, 2, 1, 3))
        return q @ op.transpose(k, (0, 1, 3, 2))

    compiled = compile_fn(f, x, wq, wk)
    assert compiled.classes() == ["matmul"] * 3
    (out,) = compiled.run([x, wq, wk])[0]
    a, q_w, k_w = f64(x, wq, wk)
    q = (a @ q_w.T).reshape(2, 9, 3, 8).transpose(1, 2)
    k = (a @ k_w).reshape(2, 9, 3, 8).transpose(1, 2)
    assert_close(out, q @ k.transpose(-1, -2), tolerance(dtype, True), "scores")


def test_matmul_elementwise_prologue_in_a_kernel() -> None:
    """The matmul kernel computes an operand's elementwise prologue per tile (the grouping
    makes only layout prologues; the kernel takes any), lanes past K being 0."""
    module = _parse("""
func.func @f(%x: tensor<20x13xf32>, %w: tensor<13x9xf32>) -> tensor<20x9xf32> {
  %0 = schedule.kernel @k(%a = %x, %b = %w) : (tensor<20x13xf32>, tensor<13x9xf32>) -> tensor<20x9xf32> {
    %c = graph.constant dense<1.5> : tensor<f32>
    %1 = graph.exp %a : tensor<20x13xf32>
    %2 = graph.add %b, %c : tensor<13x9xf32>, tensor<f32> -> tensor<13x9xf32>
    %3 = graph.matmul %1, %2 : tensor<20x13xf32>, tensor<13x9xf32> -> tensor<20x9xf32>
    schedule.yield %3 : tensor<20x9xf32>
  }
  func.return %0 : tensor<20x9xf32>
}""")
    lower_module(module, SMALL)
    x, w = randn((20, 13), 1), randn((13, 9), 2)
    (out,) = Compiled("f", module).run([x, w])[0]
    xd, wd = f64(x, w)
    assert_close(out, torch.exp(xd) @ (wd + 1.5), F32_ACCUMULATE, "prologue")


def test_batch_summed_matmul_is_one_matmul() -> None:
    """A weight gradient, sum over the batch of xᵀ dy, is one matmul kernel with the batch
    folded into K."""
    x, dy = randn((3, 11, 20), 1), randn((3, 11, 18), 2)
    compiled = compile_fn(lambda a, g: op.sum(op.transpose(a, (0, 2, 1)) @ g, axis=0), x, dy)
    assert compiled.classes() == ["matmul"]
    (out,) = compiled.run([x, dy])[0]
    a, g = f64(x, dy)
    assert_close(out, (a.transpose(1, 2) @ g).sum(0), F32_ACCUMULATE, "batch-summed matmul")


def test_reductions_over_the_same_rows_in_one_kernel() -> None:
    """A layer norm's backward (statistics recomputed, the means of the gradient terms)
    is one row kernel holding four reductions; the bias and weight gradients, sums over
    the other axis of the same input, are one more kernel with two reductions."""
    rng = random.Random(13)
    rows, width = rng.randint(5, 20), rng.randint(5, 40)
    x, dy, w = randn((rows, width), 1), randn((rows, width), 2), randn((width,), 3)

    def backward(a: Any, g: Any, gamma: Any, t: Any = op) -> tuple[Any, Any, Any]:
        def mean(v: Any) -> Any:
            return t.mean(v, -1, keepdims=True)

        centred = a - mean(a)
        inv = t.rsqrt(mean(centred * centred) + 1e-5)
        normed = centred * inv
        scaled = g * gamma
        dx = (scaled - mean(scaled) - normed * mean(scaled * normed)) * inv
        return dx, t.sum(g * normed, 0), t.sum(g, 0)

    compiled = compile_fn(backward, x, dy, w)
    bodies = kernel_bodies(compiled)
    assert sorted(sum(n in ("graph.mean", "graph.sum") for n in b) for b in bodies) == [2, 4]
    outs = compiled.run([x, dy, w])[0]
    refs = backward(*f64(x, dy, w), t=torch)
    for out, ref, what in zip(outs, refs, ("dx", "dw", "db"), strict=True):
        assert_close(out, ref, F32_ACCUMULATE, what)


# --- coverage -------------------------------------------------------------------------------


def test_every_op_is_exercised() -> None:
    """Every op with pointwise, index-map or row-reduction tile code is run by a test here
    (UNARY, BINARY or EXERCISED says which; those runs check that their kernels hold it).
    Constants, in nearly every kernel, are left out."""
    exercised = {t for t, *_ in UNARY.values()} | {t for t, *_ in BINARY.values()}
    exercised |= set(EXERCISED)
    expected = {
        t
        for t, d in registered().items()
        if isinstance(d.tile, Pointwise | IndexMap | RowReduction)
        and d.fusion is not Fusion.CONSTANT
    }
    missing = sorted(t.__name__ for t in expected - exercised)
    assert not missing, f"not exercised: {missing}"
    for name in EXERCISED.values():
        if "::" in name:  # a test of another file
            path, test = name.split("::")
            assert f"def {test}(" in (pathlib.Path(__file__).parent / path).read_text(), name
        else:
            assert name in globals(), name


# --- unsupported cases: a clean IRError --------------------------------------------------


def _parse(text: str) -> ModuleOp:
    ctx = Context()
    for dialect in (Builtin, Func, Graph, Schedule, *tile.TILE_DIALECTS):
        ctx.load_dialect(dialect)
    return Parser(ctx, text).parse_module()


def _kernel(module: ModuleOp) -> schedule.KernelOp:
    return next(k for k in module.walk() if isinstance(k, schedule.KernelOp))


def test_row_longer_than_one_block_is_an_ir_error() -> None:
    x = torch.zeros(2, MAX_ROW_BLOCK + 1)
    module = ts.jit(lambda a: op.sum(a, axis=-1)).lower(x).module_at("schedule").clone()
    with pytest.raises(IRError, match=f"reduced row of {MAX_ROW_BLOCK + 1} elements exceeds"):
        lower_kernel(_kernel(module), SMALL)
    with pytest.raises(PassFailedException, match=r"lower-schedule-to-tile: @\w+: .*a reduced row"):
        LowerScheduleToTilePass().apply(Context(), module)


def test_pass_error_names_the_kernel_once() -> None:
    x = torch.zeros(2, MAX_ROW_BLOCK + 1)
    module = ts.jit(lambda a: op.sum(a, axis=-1)).lower(x).module_at("schedule").clone()
    with pytest.raises(PassFailedException) as failure:
        LowerScheduleToTilePass().apply(Context(), module)
    assert str(failure.value).count("@_lambda__k0_sum") == 1, str(failure.value)


def test_unsupported_kernels_are_ir_errors() -> None:
    cases = {
        "cross_entropy with reduction must be split first": """
func.func @f(%x: tensor<6x11xf32>, %l: tensor<6xi64>) -> tensor<f32> {
  %0 = schedule.kernel @k(%a = %x, %b = %l) : (tensor<6x11xf32>, tensor<6xi64>) -> tensor<f32> {
    %1 = graph.cross_entropy %a, %b {reduction = mean} : tensor<6x11xf32>, tensor<6xi64> -> tensor<f32>
    schedule.yield %1 : tensor<f32>
  }
  func.return %0 : tensor<f32>
}""",
        "its reductions do not reduce the same rows": """
func.func @f(%x: tensor<4x6xf32>) -> (tensor<4xf32>, tensor<6xf32>) {
  %0, %1 = schedule.kernel @k(%a = %x) : (tensor<4x6xf32>) -> (tensor<4xf32>, tensor<6xf32>) {
    %2 = graph.sum %a {axes = [1], keepdims = false} : tensor<4x6xf32> -> tensor<4xf32>
    %3 = graph.sum %a {axes = [0], keepdims = false} : tensor<4x6xf32> -> tensor<6xf32>
    schedule.yield %2, %3 : tensor<4xf32>, tensor<6xf32>
  }
  func.return %0, %1 : tensor<4xf32>, tensor<6xf32>
}""",
        "do not share one iteration space": """
func.func @f(%x: tensor<4x3xf32>, %y: tensor<5xf32>) -> (tensor<4x3xf32>, tensor<5xf32>) {
  %0, %1 = schedule.kernel @k(%a = %x, %b = %y) : (tensor<4x3xf32>, tensor<5xf32>) -> (tensor<4x3xf32>, tensor<5xf32>) {
    %2 = graph.neg %a : tensor<4x3xf32>
    %3 = graph.neg %b : tensor<5xf32>
    schedule.yield %2, %3 : tensor<4x3xf32>, tensor<5xf32>
  }
  func.return %0, %1 : tensor<4x3xf32>, tensor<5xf32>
}""",
    }
    for message, text in cases.items():
        module = _parse(text)
        with pytest.raises(IRError, match=message):
            lower_kernel(_kernel(module), SMALL)
        with pytest.raises(PassFailedException, match=f"lower-schedule-to-tile: @k: .*{message}"):
            LowerScheduleToTilePass().apply(Context(), module)


def test_emit_rejects_what_triton_cannot_express() -> None:
    module = _parse("""
tile.kernel @k(%x: !tile.ptr<f32>) grid [1, 1, 1] warps 4 stages 1 {
  %c = arith.constant dense<[1.0, 2.0]> : tensor<2xf32>
  tile.return
}
tile.kernel @j(%s: f32) grid [1, 1, 1] warps 4 stages 1 {
  %c = arith.cmpf olt, %s, %s : f32
  tile.return
}""")
    k, j = (o for o in module.walk() if isinstance(o, tile.KernelOp))
    with pytest.raises(IRError, match="only splat block constants are supported"):
        emit_kernel(k)
    with pytest.raises(IRError, match=r"no Triton source for arith\.cmpf"):
        emit_kernel(j)


# --- the source cache -----------------------------------------------------------------------


def test_sources_compile_once_from_the_cache(
    monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path
) -> None:
    """Each kernel class's source is written once under its content hash and imported
    from there as an interpreted Triton function; the same source gives the same
    function, also after the in-process table is dropped (the file is reused, not
    rewritten); a different source gives a different file."""
    monkeypatch.setattr(compiled_kernel, "_MODULES", {})
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    x, w = randn((9, 20), 1), randn((20, 17), 2)
    compiled = compile_fn(lambda a, b: op.softmax(op.relu(a), axis=-1) @ b + 1.0, x, w)
    kernels = compiled.tile_kernels()
    assert sorted(compiled.classes()) == ["matmul", "reduction"]
    cache = compiled_kernel.cache_dir()
    for kernel in kernels:
        source = emit_kernel(kernel)
        function = compiled_kernel.load_source(kernel.kernel_name, source)
        assert type(function).__name__ == "InterpretedFunction"
        (path,) = cache.glob(f"{kernel.kernel_name}_*.py")
        assert path.read_text(encoding="utf-8") == source
        assert function.fn.__code__.co_filename == str(path)
        assert compiled_kernel.load_source(kernel.kernel_name, source) is function
        written = path.stat().st_mtime_ns
        monkeypatch.setattr(compiled_kernel, "_MODULES", {})
        again = compiled_kernel.load_source(kernel.kernel_name, source)
        assert again is not function and again.fn.__code__.co_filename == str(path)
        assert path.stat().st_mtime_ns == written
        other = compiled_kernel.load_source(kernel.kernel_name, source + "\n# another version\n")
        assert other is not again
        assert len(list(cache.glob(f"{kernel.kernel_name}_*.py"))) == 2
    (out,) = compiled.run([x, w])[0]
    ref = torch.softmax(torch.relu(x.double()), dim=-1) @ w.double() + 1.0
    assert_close(out, ref, F32_ACCUMULATE, "cached kernels")


def test_block_configs_agree() -> None:
    """The same program under the default blocks (one program, no masks for these
    sizes) and under small ones (many programs, masks) gives the same results."""
    x, w, b = randn((16, 64), 1), randn((64, 32), 2), randn((32,), 3)

    def f(a: Any, m: Any, c: Any) -> tuple[Any, Any]:
        h = op.layer_norm(a) @ m + c
        return h, op.softmax(h, axis=0)

    big = compile_fn(f, x, w, b, config=BlockConfig())
    small = compile_fn(f, x, w, b, config=SMALL)
    assert all(k.grid_size == (1, 1, 1) for k in big.tile_kernels())
    assert any(math.prod(k.grid_size) > 1 for k in small.tile_kernels())
    for a, c in zip(big.run([x, w, b])[0], small.run([x, w, b])[0], strict=True):
        assert_close(a, c.double(), F32_ACCUMULATE, "configs")
