"""Launch plans (``tessera.backends.launch_plan``): a compiled program is planned once and
every call runs the plan, on one device and on a 2 x 2 virtual mesh, through generated
Triton kernels (Triton's interpreter on a CPU) and through the reference closures.

Results are compared with float64 torch on random inputs: within ``RTOL`` of the largest
reference value (f32 kernels with dots and reductions)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from xdsl.ir import Operation

import tessera as ts
from tessera import dist, op, perf
from tessera.backends import launch_plan, schedule_runner
from tessera.backends.triton import runtime
from tessera.execute import Executor
from tessera.ir import graph, schedule
from tessera.opdefs import registry
from tessera.perf.trace import COMPUTE
from tessera.program import Lowered

RTOL = 1e-4
KERNELS = ("triton", "reference")


def close(got: torch.Tensor, want: torch.Tensor, rtol: float = RTOL) -> None:
    scale = want.abs().max().item() or 1.0
    error = (got.double() - want.double()).abs().max().item()
    assert error <= rtol * scale, f"max error {error:.3g} > {rtol} x {scale:.3g}"


def block(x, w1, b1, w2):
    """A residual gelu MLP and a layer norm: matmul, epilogue, reduction kernels."""
    return op.layer_norm(op.gelu(x @ w1 + b1) @ w2 + x)


def block64(x, w1, b1, w2):
    x, w1, b1, w2 = (t.double() for t in (x, w1, b1, w2))
    h = torch.nn.functional.gelu(x @ w1 + b1) @ w2 + x
    return torch.nn.functional.layer_norm(h, (h.shape[-1],))


def inputs(seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randn(8, 16, generator=g),
        torch.randn(16, 32, generator=g) / 4,
        torch.randn(32, generator=g),
        torch.randn(32, 16, generator=g) / 6,
    ]


MESH = dist.Mesh(axes=["dp", "tp"], shape=(2, 2))
MEGATRON = (  # rows over dp, columns then rows over tp: one all_reduce over tp
    dist.ShardSpec(partition=(0,), mesh_axes=("dp",)),
    dist.ShardSpec(partition=(1,), mesh_axes=("tp",)),
    dist.ShardSpec(partition=(0,), mesh_axes=("tp",)),
    dist.ShardSpec(partition=(0,), mesh_axes=("tp",)),
)


@pytest.fixture
def no_ir(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Makes walking the IR, reading op attributes and looking up kernel runners or op
    definitions fail (set it up after the first call, which plans)."""

    def forbidden(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a planned call walked the IR or looked something up")

    for owner, name in [
        (Operation, "walk"),
        (graph.GraphOp, "attrs"),
        (schedule.StartOp, "attrs"),
        (Executor, "kernel_runner"),
        (Lowered, "module_at"),
        (runtime.TritonKernels, "kernel"),
        (runtime.TritonKernels, "tile_name"),
        (registry, "lookup"),
        (registry, "op_def"),
        (schedule_runner, "lookup"),
        (schedule_runner, "bind_reference"),
        (launch_plan, "build_plan"),
    ]:
        monkeypatch.setattr(owner, name, forbidden)
    yield


@pytest.mark.parametrize("kernels", KERNELS)
def test_one_device_matches_float64(kernels: str) -> None:
    f = ts.jit(block, kernels=kernels)
    for seed in range(3):
        close(f(*inputs(seed)), block64(*inputs(seed)))


@pytest.mark.parametrize("kernels", KERNELS)
def test_virtual_mesh_with_collectives_matches_float64(kernels: str) -> None:
    f = ts.jit(block, mesh=MESH, in_shardings=MEGATRON, kernels=kernels)
    lowered = f.lower(*inputs(0))
    assert [c.kind for c in lowered.collectives()] == ["all_reduce"]
    for seed in range(3):
        close(f(*inputs(seed)), block64(*inputs(seed)))


@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("mesh", [None, MESH])
def test_a_plan_is_built_once_and_reused(kernels: str, mesh: dist.Mesh | None) -> None:
    shardings = MEGATRON if mesh is not None else None
    f = ts.jit(block, mesh=mesh, in_shardings=shardings, kernels=kernels)
    lowered = f.lower(*inputs(0))
    assert lowered.plan_builds == 0
    for seed in range(3):
        f(*inputs(seed))
    assert lowered.plan_builds == 1


@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("mesh", [None, MESH])
def test_a_second_call_walks_no_ir(
    kernels: str, mesh: dist.Mesh | None, request: pytest.FixtureRequest
) -> None:
    shardings = MEGATRON if mesh is not None else None
    f = ts.jit(block, mesh=mesh, in_shardings=shardings, kernels=kernels)
    first = f(*inputs(0))
    request.getfixturevalue("no_ir")
    with pytest.raises(AssertionError, match="walked the IR"):
        Operation.walk(f.lower(*inputs(0)).module)  # the guard is in place
    torch.testing.assert_close(f(*inputs(0)), first, rtol=0, atol=0)
    close(f(*inputs(1)), block64(*inputs(1)))


def test_a_recorded_call_reuses_the_plan_and_records_every_step(
    request: pytest.FixtureRequest,
) -> None:
    f = ts.jit(block, mesh=MESH, in_shardings=MEGATRON, kernels="triton")
    lowered = f.lower(*inputs(0))
    want = f(*inputs(0))
    kernels = [
        k.kernel_name
        for k in lowered.module_at("schedule").walk()
        if isinstance(k, schedule.KernelOp)
    ]
    request.getfixturevalue("no_ir")
    with perf.record_timeline() as timeline:
        got = f(*inputs(0))
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert lowered.plan_builds == 1
    for rank in range(MESH.size):
        events = timeline.rank_events(rank)
        assert [e.name for e in events if e.stream == COMPUTE] == kernels
        assert [e.name for e in events if e.stream != COMPUTE] == ["all_reduce[tp]"]


def test_plans_follow_the_device_and_the_ranks() -> None:
    """One plan per (execution, ranks): a pipeline stage's subset of the mesh is another."""
    f = ts.jit(block, mesh=MESH, in_shardings=MEGATRON, kernels="reference")
    lowered = f.lower(*inputs(0))
    execution = launch_plan_execution()
    whole = lowered.launch_plan(execution)
    assert lowered.launch_plan(execution) is whole and whole.ranks == [0, 1, 2, 3]
    stage = lowered.launch_plan(execution, [2, 3])  # one tp group
    assert stage is not whole and stage.ranks == [2, 3] and lowered.plan_builds == 2
    with pytest.raises(ts.ExecutionError, match=r"ranks \[3\] of the group \[2, 3\] do not run"):
        lowered.launch_plan(execution, [2])


def launch_plan_execution() -> Any:
    from tessera.backends.execution import VirtualMesh

    return VirtualMesh(MESH)


def test_slots_are_freed_after_their_last_use() -> None:
    lowered = ts.jit(block).lower(*inputs(0))
    plan = lowered.launch_plan(launch_plan_execution_one())
    freed = [slot for step in plan.frees for slot in step]
    assert len(freed) == len(set(freed)) and not set(freed) & set(plan.results)
    read = {s for step in plan.steps for s in getattr(step, "inputs", ())}
    assert read - set(plan.results) <= set(freed)


def launch_plan_execution_one() -> Any:
    from tessera.backends.execution import VirtualMesh

    return VirtualMesh(dist.Mesh(("device",), (1,)))


# --- errors --------------------------------------------------------------------------------


@pytest.mark.parametrize("kernels", KERNELS)
def test_out_of_range_indices_name_the_line_on_a_planned_call(kernels: str) -> None:
    f = ts.jit(lambda table, ids: op.take(table, ids, axis=0) * 2, kernels=kernels)  # <- take
    table = torch.randn(5, 3)
    close(f(table, torch.tensor([4, 0, -5])), table.double()[[4, 0, 0]] * 2)
    with pytest.raises(ts.ExecutionError, match=r"indices must be in \[-5, 5\)") as info:
        f(table, torch.tensor([1, 5]))
    assert f"{__file__}:" in str(info.value)


def test_wrong_arguments_to_a_lowered_program() -> None:
    lowered = ts.jit(block).lower(*inputs(0))
    x, w1, b1, w2 = inputs(0)
    lowered(x, w1, b1, w2)
    with pytest.raises(ts.ExecutionError, match=r"compiled for arrays .*found .*tensor<16x8xf32>"):
        lowered(x.T.contiguous(), w1, b1, w2)


@pytest.mark.parametrize("mesh", [None, dist.Mesh(("tp",), (2,))])
def test_a_failing_reference_op_is_named_with_its_line(
    mesh: dist.Mesh | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    bind = schedule_runner.bind_reference

    def boom(x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("boom")

    def failing(o: Operation) -> Any:
        return boom if isinstance(o, graph.ExpOp) else bind(o)

    monkeypatch.setattr(schedule_runner, "bind_reference", failing)
    f = ts.jit(lambda x: op.exp(x) + 1, mesh=mesh, kernels="reference")  # <- exp
    with pytest.raises(ts.ExecutionError, match=r"graph\.exp failed: boom\n  at ") as info:
        f(torch.zeros(2, 3))
    assert "<- exp" in str(info.value)  # the traced line


def test_run_virtual_checks_the_ranks_arguments() -> None:
    lowered = ts.jit(lambda x: op.exp(x), kernels="reference").lower(torch.zeros(3))
    module = lowered.module_at("schedule")
    with pytest.raises(ts.ExecutionError, match=r"expected arguments for 1 ranks, found 2"):
        launch_plan.run_virtual(module, lowered.name, dist.Mesh(("d",), (1,)), [[], []])
    with pytest.raises(ts.ExecutionError, match=r"takes 1 arguments, found 0"):
        launch_plan.run_virtual(module, lowered.name, dist.Mesh(("d",), (1,)), [[]])
    with pytest.raises(ts.ExecutionError, match=r"no function @nope"):
        launch_plan.run_virtual(module, "nope", dist.Mesh(("d",), (1,)), [[]])


# --- arena buffers (plan-memory's offsets) -------------------------------------------------


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def test_intermediates_live_in_the_arena_and_results_never_do() -> None:
    f = ts.jit(block, kernels="triton")
    lowered = f.lower(*inputs(0))
    first = f(*inputs(0))
    kept = first.clone()
    (plan,) = lowered.executor.plans.values()
    (arena,) = plan.arenas
    placed, size = launch_plan.arena_offsets(lowered.module_at("schedule").ops.last)  # type: ignore[arg-type]
    assert placed and arena.numel() == size  # two of the three kernels write the arena
    for seed in range(1, 4):
        got = f(*inputs(seed))
        assert _storage(got) != _storage(arena)
        close(got, block64(*inputs(seed)))
    torch.testing.assert_close(first, kept, rtol=0, atol=0)  # an earlier result is untouched


def test_arena_on_the_mesh_one_per_rank() -> None:
    f = ts.jit(block, mesh=MESH, in_shardings=MEGATRON, kernels="triton")
    for seed in range(3):
        close(f(*inputs(seed)), block64(*inputs(seed)))
    (plan,) = f.lower(*inputs(0)).executor.plans.values()
    assert len(plan.arenas) == MESH.size
    assert len({_storage(a) for a in plan.arenas}) == MESH.size


def _viewed(x, w):
    h = op.reshape(op.gelu(x @ w), (4, 2, 8))  # returned: a view kernel of the matmul's result
    return op.transpose(h, (1, 0, 2)) * 2, h


def test_a_value_a_view_kernel_reads_is_not_placed() -> None:
    g = torch.Generator().manual_seed(4)
    f = ts.jit(_viewed, kernels="triton")
    lowered = f.lower(torch.randn(4, 8), torch.randn(8, 16))
    function = lowered.module_at("schedule").ops.last
    placed, _ = launch_plan.arena_offsets(function)  # type: ignore[arg-type]
    kernels = [o for o in function.walk() if isinstance(o, schedule.KernelOp)]
    viewed = {v for k in kernels if k.kernel_name.endswith("reshape") for v in k.inputs}
    assert viewed and not viewed & set(placed)
    for _ in range(3):
        x, w = torch.randn(4, 8, generator=g), torch.randn(8, 16, generator=g)
        want = torch.nn.functional.gelu(x.double() @ w.double()).reshape(4, 2, 8)
        got, viewed_result = f(x, w)
        close(got, want.transpose(0, 1) * 2)
        close(viewed_result, want)


def test_donated_arguments_and_the_arena() -> None:
    def step(p, g, m):
        m = 0.9 * m + g
        return p - 0.1 * op.tanh(m) * op.exp(-p * p), m

    f = ts.jit(step, donate_argnums=(0, 2), kernels="triton")
    gen = torch.Generator().manual_seed(5)
    p, m = torch.randn(16, 8, generator=gen), torch.zeros(16, 8)
    p64, m64 = p.double(), m.double()
    for _ in range(4):
        g = torch.randn(16, 8, generator=gen)
        p, m = f(p, g, m)
        m64 = 0.9 * m64 + g.double()
        p64 = p64 - 0.1 * torch.tanh(m64) * torch.exp(-p64 * p64)
    close(p, p64)
    close(m, m64)
