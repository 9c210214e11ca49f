"""``ts.jit(..., cuda_graphs=True)``: launch plans replayed from CUDA graphs.

On any machine: the option's plumbing (``ts.jit``, ``graph.training_step``), which plans
are capturable and the reason given for the others, the fallback to plain dispatch
with one warning (no CUDA here), the deferred index checks, and the capture state
machine (first call plain, second captured, then replayed) with a stand-in graph.

With a GPU (skipped without CUDA): replay equals plain dispatch on an MLP, a sharded
MLP on the virtual mesh and a training step, and replay with new inputs gives new
results. Tolerances: graph against plain dispatch 1e-6 relative (the same kernels and
block configurations); against torch eager in float64, 2e-3 relative (``tl.dot`` may
use TF32), as in test_gpu.py; training-step parameters against plain steps 1e-5.
"""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import pytest
import torch

import tessera as ts
from tessera import dist, graph, op, optim
from tessera.backends import cuda_graphs
from tessera.backends.cuda_graphs import CudaGraphs, CudaGraphWarning, why_not_capturable
from tessera.backends.execution import VirtualMesh
from tessera.backends.launch_plan import KernelStep, LaunchPlan
from tessera.backends.reference import deferred_index_checks, index_check
from tessera.ir import schedule
from tessera.ir.mesh import Mesh

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="the fallback without CUDA")


def _mlp(x, w1, w2):
    return op.gelu(x @ w1) @ w2


def _inputs(seed: int, device: str = "cpu") -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shapes = ((16, 32), (32, 64), (64, 8))
    return [(torch.randn(s, generator=g) / 4).to(device) for s in shapes]


def _eager(x, w1, w2):
    return torch.nn.functional.gelu(x.double() @ w1.double()) @ w2.double()


def _relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.double().cpu(), want.double().cpu()
    return float((got - want).abs().max() / want.abs().max().clamp_min(1e-12))


def _step(name: str, device: str = "cuda") -> KernelStep:
    return KernelStep(name, (0,), (1,), [lambda x: [x * 2]], [0], torch.device(device))


class _CallStep:
    """A step of a kind the capture does not know."""

    what, device = "schedule.call", torch.device("cuda")

    def run(self, envs, timeline) -> None: ...


def _plan(*steps) -> LaunchPlan:
    return LaunchPlan("f", [0], 2, [0], [1], list(steps), [()] * len(steps))


# --- the option ----------------------------------------------------------------------------


def test_the_option_reaches_the_compiled_program() -> None:
    x, w1, w2 = _inputs(0)
    assert ts.jit(_mlp).lower(x, w1, w2).graphs is None
    f = ts.jit(_mlp, cuda_graphs=True)
    assert f.cuda_graphs is True
    assert isinstance(f.lower(x, w1, w2).graphs, CudaGraphs)
    assert ts.jit(cuda_graphs=True)(_mlp).cuda_graphs is True  # as a decorator factory
    with pytest.raises(ts.ArgumentError, match="cuda_graphs must be True or False"):
        ts.jit(_mlp, cuda_graphs="yes")


def test_training_step_passes_the_option_to_its_program() -> None:
    def loss_fn(p, x):
        loss = op.mean(op.gelu(x @ p["w"]) ** 2)
        return graph.backward(loss), {"loss": loss}

    params = {"w": torch.randn(8, 4)}
    step = graph.training_step(loss_fn, optimizer=optim.SGD(lr=0.1), cuda_graphs=True)
    state = step.init(params)
    assert isinstance(step.lower(state, torch.randn(4, 8)).graphs, CudaGraphs)
    plain = graph.training_step(loss_fn, optimizer=optim.SGD(lr=0.1))
    assert plain.lower(plain.init(params), torch.randn(4, 8)).graphs is None
    with pytest.raises(ts.TesseraError, match="not supported for pipelined steps"):
        graph.training_step(
            loss_fn, optimizer=optim.SGD(lr=0.1), mesh=dist.mesh({"pp": 2}), cuda_graphs=True
        )


# --- which plans are capturable ------------------------------------------------------------


def test_a_plan_of_kernels_on_one_cuda_device_is_capturable() -> None:
    assert why_not_capturable(_plan(_step("a"), _step("b"))) is None


@pytest.mark.parametrize(
    ("plan", "reason"),
    [
        (_plan(_step("a", "cpu")), "kernels run on cpu, not on a CUDA device"),
        (_plan(_step("a", "cuda:0"), _step("b", "cuda:1")), "kernels run on 2 devices"),
        (_plan(_step("a"), _CallStep()), "schedule.call steps (_CallStep) are not known"),
        (_plan(), "launches no kernel"),
        (object(), "multi-process job"),
    ],
    ids=["cpu", "two-devices", "unknown-step", "empty", "processes"],
)
def test_plans_that_are_not_capturable_say_why(plan, reason: str) -> None:
    assert reason in (why_not_capturable(plan) or "")


def test_region_calls_and_scans_are_captured_through_their_callees() -> None:
    """A region's call and a scan run their callee's plan: capturable when its steps are
    (here its kernels run on the CPU, so the reason names the device, not the step)."""
    from tessera import graph

    layer = graph.region(lambda w, h: op.gelu(h @ w))

    def model(w, x):
        x = layer(w[0], layer(w[1], x))
        x, _ = graph.scan(lambda h, v: (op.gelu(h @ v), None), x, w)
        return x

    lowered = ts.jit(model, kernels="triton").lower(torch.randn(2, 8, 8), torch.randn(4, 8))
    plan = lowered.launch_plan(VirtualMesh(Mesh(("device",), (1,))))
    assert {type(step).__name__ for step in plan.steps} >= {"CallStep", "ScanStep"}
    host = cuda_graphs.host_kernels(lowered.module_at("tile"), lowered.name)
    assert why_not_capturable(plan, host) == "kernels run on cpu, not on a CUDA device"


def test_host_kernels_are_not_captured() -> None:
    """top-k runs on the host by its torch reference (Fusion.HOST)."""
    lowered = ts.jit(lambda x: op.top_k(x * 2, 2)[0] + 1, kernels="triton").lower(torch.ones(4, 8))
    execution = VirtualMesh(Mesh(("device",), (1,)))
    plan = lowered.launch_plan(execution)
    host = cuda_graphs.host_kernels(lowered.module_at("tile"), lowered.name)
    assert len(host) == 1
    reason = why_not_capturable(plan, host)
    assert reason is not None and f"kernel @{next(iter(host))} runs on the host" in reason


def test_index_checks_are_deferred_inside_a_capture() -> None:
    lowered = ts.jit(lambda x, i: op.take(x, i, axis=0), kernels="triton").lower(
        torch.ones(4, 3), torch.zeros(2, dtype=torch.int32)
    )
    (kernel,) = [
        k
        for k in lowered.module_at("schedule").walk()
        if isinstance(k, schedule.KernelOp) and index_check(k.body.block)
    ]
    check = index_check(kernel.body.block)
    bad = torch.tensor([0, 7], dtype=torch.int32)
    with pytest.raises(ts.ExecutionError, match="indices must be in"):
        check([torch.ones(4, 3), bad])
    with deferred_index_checks() as deferred:
        check([torch.ones(4, 3), bad])  # recorded, not run
    ((tensor, run),) = deferred
    assert tensor is bad
    with pytest.raises(ts.ExecutionError, match="indices must be in"):
        run(tensor)


# --- without CUDA: plain dispatch after one warning ----------------------------------------


@cpu_only
@pytest.mark.parametrize(
    ("kernels", "reason"),
    [("triton", "CUDA is not available"), ("reference", "reference executor")],
)
def test_without_cuda_the_program_runs_plainly_after_one_warning(kernels, reason) -> None:
    f = ts.jit(_mlp, kernels=kernels, cuda_graphs=True)
    plain = ts.jit(_mlp, kernels=kernels)
    with pytest.warns(CudaGraphWarning, match=reason):
        first = f(*_inputs(0))
    with warnings.catch_warnings():
        warnings.simplefilter("error", CudaGraphWarning)  # once per program and reason
        for seed in (1, 2):
            assert torch.equal(f(*_inputs(seed)), plain(*_inputs(seed)))
    assert torch.equal(first, plain(*_inputs(0)))
    assert f.lower(*_inputs(0)).graphs.captures == 0


# --- the capture state machine, with a stand-in for the CUDA graph -------------------------


class _FakeCapture:
    """Records what CudaGraphs asks of a captured plan; ``fail`` makes the capture fail."""

    made: list[_FakeCapture] = []
    fail = False

    def __init__(self, plan, rank_args):
        if _FakeCapture.fail:
            raise cuda_graphs.NotCapturable("the capture failed: stand-in")
        self.plan, self.replays = plan, 0
        _FakeCapture.made.append(self)

    def run(self, rank_args):
        self.replays += 1
        return self.plan.run(rank_args)


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(cuda_graphs, "CapturedPlan", _FakeCapture)
    monkeypatch.setattr(_FakeCapture, "made", [])
    monkeypatch.setattr(_FakeCapture, "fail", False)


def test_first_call_runs_plainly_the_second_captures_later_calls_replay(
    fake_cuda, monkeypatch: pytest.MonkeyPatch
) -> None:
    graphs, plan = CudaGraphs("f"), _plan(_step("a"), _step("b"))
    execution = VirtualMesh(Mesh(("device",), (1,)))
    x = torch.ones(3)
    assert graphs.run(execution, plan, [[x]])[0][0].tolist() == [2.0] * 3
    assert _FakeCapture.made == [] and graphs.reason(plan) is None
    graphs.run(execution, plan, [[x]])
    (captured,) = _FakeCapture.made
    assert graphs.captures == 1 and captured.replays == 1
    graphs.run(execution, plan, [[x]])
    assert captured.replays == 2
    recording = SimpleNamespace(active=lambda: object())  # inside perf.record_timeline()
    monkeypatch.setattr(cuda_graphs, "perf_timeline", recording)
    graphs.run(execution, plan, [[x]])  # timed per kernel: plainly
    assert captured.replays == 2 and len(_FakeCapture.made) == 1


def test_a_failed_capture_falls_back_with_a_warning(fake_cuda) -> None:
    _FakeCapture.fail = True
    graphs, plan = CudaGraphs("f"), _plan(_step("a"))
    execution = VirtualMesh(Mesh(("device",), (1,)))
    graphs.run(execution, plan, [[torch.ones(2)]])
    with pytest.warns(CudaGraphWarning, match="the capture failed: stand-in"):
        graphs.run(execution, plan, [[torch.ones(2)]])
    assert graphs.reason(plan) == "the capture failed: stand-in"
    _FakeCapture.fail = False
    graphs.run(execution, plan, [[torch.ones(2)]])  # not tried again
    assert graphs.captures == 0 and _FakeCapture.made == []


def test_a_plan_that_is_not_capturable_warns_at_its_first_call(fake_cuda) -> None:
    graphs, plan = CudaGraphs("f"), _plan(_step("a", "cpu"))
    execution = VirtualMesh(Mesh(("device",), (1,)))
    with pytest.warns(CudaGraphWarning, match="f: cuda_graphs=True, but .* kernels run on cpu"):
        graphs.run(execution, plan, [[torch.ones(2)]])
    graphs.run(execution, plan, [[torch.ones(2)]])
    assert _FakeCapture.made == []


# --- on a GPU --------------------------------------------------------------------------------


@gpu
def test_replay_equals_plain_dispatch_and_follows_new_inputs() -> None:
    f = ts.jit(_mlp, kernels="triton", cuda_graphs=True)
    plain = ts.jit(_mlp, kernels="triton")
    results = []
    for seed in range(4):  # plain, captured, replayed, replayed
        args = _inputs(seed, "cuda")
        got = f(*args)
        assert _relative_error(got, plain(*args)) <= 1e-6
        assert _relative_error(got, _eager(*args)) <= 2e-3
        results.append((got, _eager(*args)))
    assert f.lower(*_inputs(0, "cuda")).graphs.captures == 1
    for got, want in results:  # earlier results are not overwritten by later replays
        assert _relative_error(got, want) <= 2e-3


@gpu
def test_sharded_mlp_on_the_virtual_mesh_replays_on_one_gpu() -> None:
    mesh = dist.mesh({"tp": 2})
    cols = dist.ShardSpec(partition=(1,), mesh_axes=("tp",))
    rows = dist.ShardSpec(partition=(0,), mesh_axes=("tp",))
    specs = (dist.ShardSpec(replicate=True), cols, rows)
    f = ts.jit(_mlp, mesh=mesh, in_shardings=specs, kernels="triton", cuda_graphs=True)
    for seed in range(3):
        args = _inputs(seed, "cuda")
        assert _relative_error(f(*args), _eager(*args)) <= 2e-3
    assert f.lower(*_inputs(0, "cuda")).graphs.captures == 1


@gpu
def test_cross_entropy_labels_are_checked_before_each_replay() -> None:
    f = ts.jit(lambda x, y: op.cross_entropy(x, y), kernels="triton", cuda_graphs=True)
    g = torch.Generator().manual_seed(3)
    for _ in range(3):
        logits = torch.randn(32, 100, generator=g)
        labels = torch.randint(0, 100, (32,), generator=g)
        want = torch.nn.functional.cross_entropy(logits.double(), labels)
        got = f(logits.cuda(), labels.cuda())
        assert abs(float(got) - float(want)) <= 1e-4 * abs(float(want))
    assert f.lower(logits.cuda(), labels.cuda()).graphs.captures == 1
    with pytest.raises(ts.ExecutionError, match="labels must be in"):
        f(logits.cuda(), torch.full((32,), 100).cuda())


@gpu
def test_training_step_replay_equals_plain_steps() -> None:
    def loss_fn(p, x, y):
        loss = op.mean((op.gelu(x @ p["w1"]) @ p["w2"] - y) ** 2)
        return graph.backward(loss), {"loss": loss}

    g = torch.Generator().manual_seed(4)
    params = {"w1": torch.randn(16, 32, generator=g) / 4, "w2": torch.randn(32, 8, generator=g) / 6}
    steps = [
        graph.training_step(
            loss_fn, optimizer=optim.AdamW(lr=1e-2), kernels="triton", cuda_graphs=c
        )
        for c in (True, False)
    ]
    states = [s.init({k: v.cuda() for k, v in params.items()}) for s in steps]
    for _ in range(4):
        x, y = torch.randn(64, 16, generator=g).cuda(), torch.randn(64, 8, generator=g).cuda()
        losses = [float(s(state, x, y)["loss"]) for s, state in zip(steps, states, strict=True)]
        assert abs(losses[0] - losses[1]) <= 1e-5 * abs(losses[1])
        for name in params:
            graphed, plain = (state.params[name] for state in states)
            assert _relative_error(graphed, plain) <= 1e-5, name
    assert steps[0].lower(states[0], x, y).graphs.captures == 1
