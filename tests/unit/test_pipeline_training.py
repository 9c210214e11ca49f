"""Pipelined training steps (a mesh with a ``pp`` axis) against the unpipelined step.

The GPT of ``examples/train_gpt.py`` (tied embedding: its weight lives on the first and
the last stage) trains for two AdamW steps with every schedule; losses and parameters
must equal the unpipelined step on a ``dp x tp`` mesh up to float32 rounding (the
microbatch gradients are summed in another order): losses to 1e-5 relative, parameters
to 3e-5 absolute. Over gloo processes the pipeline must be *bit-identical* to the same
pipeline on the virtual mesh.
"""

from __future__ import annotations

import functools
import itertools
import re

import numpy as np
import pytest
import torch
from pipeline_case import batch, losses_and_params
from test_distributed import SCRIPTS, tessera_run

from tessera import dist, graph, op, optim, schedule
from tessera.backends.execution import VirtualMesh
from tessera.dtypes import as_dtype
from tessera.errors import ExecutionError, ShardingError, TesseraError, TraceError
from tessera.frontend.tracer import Tensor, Trace, tracing
from tessera.ir import pipeline_actions as A
from tessera.ir.abstract import AbstractTensor, aval
from tessera.ir.mesh import Mesh
from tessera.pipeline.runtime import PipelineExecutor, Placement
from tessera.pipeline.split import _op_time, balanced_cuts, plan_stages
from tessera.topology import dgx_h100
from tessera.transforms.pipeline_schedules import pipeline_schedule

LOSS_RTOL, PARAM_ATOL = 1e-5, 3e-5
F32 = as_dtype(torch.float32)


@functools.cache
def unpipelined(dp: int, tp: int) -> tuple[list[float], dict[str, torch.Tensor]]:
    return losses_and_params(0, dp, tp)


@pytest.mark.parametrize(
    ("pp", "dp", "tp", "microbatches", "kind", "virtual"),
    [
        (2, 2, 2, 2, "1f1b", 1),
        (2, 1, 2, 4, "gpipe", 1),
        (2, 2, 1, 2, "interleaved", 2),
        (4, 1, 2, 4, "zb-h1", 1),
    ],
)
def test_pipelined_gpt_matches_the_unpipelined_step(
    pp: int, dp: int, tp: int, microbatches: int, kind: str, virtual: int
) -> None:
    losses, params = losses_and_params(pp, dp, tp, microbatches, kind, virtual)
    expected_losses, expected_params = unpipelined(dp, tp)
    np.testing.assert_allclose(losses, expected_losses, rtol=LOSS_RTOL)
    assert losses[1] < losses[0]
    for name, value in expected_params.items():
        torch.testing.assert_close(params[name], value, atol=PARAM_ATOL, rtol=0, msg=name)


def test_the_executed_actions_come_from_the_schedule_ir() -> None:
    from pipeline_case import train_gpt

    params = train_gpt.init_params(64, 8, 32, 2)
    mesh = dist.Mesh(axes=["pp", "dp", "tp"], shape=(2, 1, 1))
    args = __import__("argparse").Namespace(lr=1e-3, zero=0, heads=2, layers=2)
    step = train_gpt.make_step(mesh, params, args)
    state = step.init(params)
    with schedule.options(pipeline_microbatches=4, pipeline_schedule="zb-h1"):
        compiled = step.pipeline().compiled(state, batch())
    text = str(compiled.pipeline_ir)
    assert text.startswith("schedule.pipeline") and "backward_weight" in text
    assert compiled.lists == pipeline_schedule("zb-h1", 2, 4)
    assert [s.backward for s in compiled.stages] == [None, None]  # split backward programs
    assert all(s.backward_input and s.backward_weight for s in compiled.stages)


def _mlp_step(mesh: Mesh, marks: int, layers: int = 4):
    @graph.training_step(optimizer=optim.SGD(lr=0.1), mesh=mesh)
    def step(p, x, y):
        h = x
        for i in range(layers):
            h = op.tanh(h @ p[f"w{i}"])
            if i < marks:
                graph.stage()
        loss = op.mean((h - y) * (h - y))
        return graph.backward(loss), {"loss": loss}

    return step


def _mlp_params(layers: int = 4) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return {f"w{i}": torch.randn(16, 16, generator=g) * 0.3 for i in range(layers)}


def test_stage_marks_choose_the_cuts() -> None:
    mesh = dist.Mesh(axes=["pp", "dp"], shape=(4, 1))
    params = _mlp_params()
    step = _mlp_step(mesh, marks=3)
    state = step.init(params)
    x, y = torch.randn(8, 16), torch.randn(8, 16)
    with schedule.options(pipeline_microbatches=2):
        compiled = step.pipeline().compiled(state, (x, y))
        assert [s.params for s in compiled.stages] == [[0], [1], [2], [3]]
        # one SGD step equals the unpipelined gradient step (numpy, float64)
        before = {k: v.double().numpy().copy() for k, v in params.items()}
        loss = step(state, x, y)["loss"]
    h, hs = x.double().numpy(), []
    for i in range(4):
        hs.append(h)
        h = np.tanh(h @ before[f"w{i}"])
    diff = h - y.double().numpy()
    grad_h = 2 * diff / diff.size
    np.testing.assert_allclose(float(loss), float(np.mean(diff * diff)), rtol=1e-5)
    for i in reversed(range(4)):
        out = np.tanh(hs[i] @ before[f"w{i}"])
        grad_pre = grad_h * (1 - out * out)
        expected = before[f"w{i}"] - 0.1 * (hs[i].T @ grad_pre)
        np.testing.assert_allclose(params[f"w{i}"].double().numpy(), expected, atol=1e-5)
        grad_h = grad_pre @ before[f"w{i}"].T


def test_stage_marks_must_match_the_stage_count() -> None:
    mesh = dist.Mesh(axes=["pp"], shape=(2,))
    step = _mlp_step(mesh, marks=2)
    state = step.init(_mlp_params())
    with pytest.raises(
        TraceError, match=r"2 graph.stage\(\) marks make 3 stages, but the mesh's pp=2"
    ):
        step(state, torch.randn(4, 16), torch.randn(4, 16))


def test_balanced_split_is_the_best_split() -> None:
    """The dynamic program's cuts give the same slowest stage as trying every split."""
    mesh = dist.Mesh(axes=["pp"], shape=(4,))
    step = _mlp_step(mesh, marks=0, layers=8)
    params = {f"w{i}": torch.randn(256, 256) for i in range(8)}
    state = step.init(params)
    compiled = step.pipeline().compiled(state, (torch.randn(512, 256), torch.randn(512, 256)))
    assert all(s.params for s in compiled.stages)  # every stage holds layers
    trace = Trace(
        "f", [AbstractTensor((256, 256), F32)] * 8 + [AbstractTensor((512, 256), F32)] * 2
    )
    args = [Tensor(trace, a) for a in trace.block.args]
    with tracing(trace):
        h = args[8]
        for w in args[:8]:
            h = op.tanh(h @ w)
        loss = op.mean((h - args[9]) * (h - args[9]))
    ops, topology = list(trace.block.ops), dgx_h100()
    link = topology.levels[0].bandwidth

    def slowest(cuts: tuple[int, ...]) -> float:
        plan = plan_stages(ops, cuts, [loss.value])
        times = [
            sum(_op_time(o, topology) for o in stage) + sum(aval(v).nbytes for v in sent) / link
            for stage, sent in zip(plan.ops, plan.sent, strict=True)
        ]
        return max(times)

    positions = [i for i, o in enumerate(ops) if o.operands][1:]
    best = min(slowest(c) for c in itertools.combinations(positions, 3))
    chosen = tuple(balanced_cuts(ops, [loss.value], 4, topology))
    assert slowest(chosen) == pytest.approx(best, rel=1e-12)
    assert compiled.cuts == list(chosen)


def test_pipeline_errors_name_the_problem() -> None:
    params = _mlp_params()
    mesh = dist.Mesh(axes=["pp", "dp"], shape=(2, 2))
    with pytest.raises(
        ShardingError, match=r"zero=3 .* with the pipeline axis 'pp' is not supported"
    ):
        graph.training_step(lambda p, x: None, optimizer=optim.SGD(), mesh=mesh, zero=3)
    step = _mlp_step(mesh, marks=1)
    state = step.init(params)
    with (
        schedule.options(pipeline_microbatches=4),
        pytest.raises(
            ShardingError,
            match=r"6 rows \(dim 0\), which must split evenly over 2 data-parallel ranks x 4",
        ),
    ):
        step(state, torch.randn(6, 16), torch.randn(6, 16))
    interleaved = _mlp_step(mesh, marks=3)
    with (
        schedule.options(
            pipeline_microbatches=3, pipeline_schedule="interleaved", pipeline_virtual=2
        ),
        pytest.raises(TesseraError, match="interleaved"),
    ):
        interleaved(interleaved.init(params), torch.randn(12, 16), torch.randn(12, 16))
    split_over_pp = dist.ShardSpec(partition=(0,), mesh_axes=("pp",))
    bad = graph.training_step(
        lambda p, x: (graph.backward(op.sum(x @ p["w0"])), {}), optimizer=optim.SGD(), mesh=mesh,
        param_shardings={"w0": split_over_pp},
    )  # fmt: skip
    with pytest.raises(
        ShardingError, match="over the pipeline axis 'pp'; stages own whole parameters"
    ):
        bad(bad.init({"w0": torch.randn(16, 16)}), torch.randn(4, 16))
    with pytest.raises(
        TesseraError, match=r"is pipelined over 'pp': it compiles into stage programs"
    ):
        step.lower(state, torch.randn(8, 16), torch.randn(8, 16))
    with pytest.raises(TesseraError, match="expects a count >= 1"):
        schedule.pipeline_microbatches(0)


def test_a_deadlocking_action_list_is_reported() -> None:
    mesh = dist.Mesh(axes=["pp"], shape=(2,))
    executor = PipelineExecutor([], Placement(mesh, "pp", 2), None, None, VirtualMesh(mesh))  # type: ignore[arg-type]
    lists = [
        [A.Action(A.RECV_GRAD, 0, 0, peer=1)],
        [A.Action(A.RECV_ACTIVATION, 0, 1, peer=0)],
    ]
    with pytest.raises(ExecutionError, match="deadlocks: pipeline rank 0 at recv_grad"):
        executor.run_virtual(lists)


@pytest.mark.parametrize(
    ("pp", "dp", "tp", "microbatches", "kind", "virtual", "processes"),
    [(2, 2, 2, 2, "1f1b", 1, 8), (4, 2, 2, 4, "zb-h1", 1, 16)],
)
def test_pipelined_gpt_over_processes_equals_the_virtual_mesh(
    pp: int, dp: int, tp: int, microbatches: int, kind: str, virtual: int, processes: int
) -> None:
    """pp x dp x tp gloo processes: losses and parameters bit-identical to the virtual
    mesh's pipeline (so within tolerance of the unpipelined step, checked above)."""
    args = [str(a) for a in (pp, dp, tp, microbatches, kind, virtual, 2)]
    result = tessera_run(processes, SCRIPTS / "pipeline_gpt.py", *args, timeout=120.0, limit=400.0)
    assert result.returncode == 0, result.stderr[-3000:]
    losses, params = losses_and_params(pp, dp, tp, microbatches, kind, virtual)
    digest = torch.cat([params[k].flatten() for k in sorted(params)]).double()
    assert "losses: " + " ".join(x.hex() for x in losses) in result.stdout
    assert f"params: {float(digest.sum()).hex()} {float(digest.abs().sum()).hex()}" in result.stdout
    mesh = dist.Mesh(axes=["pp", "dp", "tp"], shape=(pp, dp, tp))
    for rank in range(processes):
        assert f"rank {rank} OK" in result.stdout
        # a process compiles its own stage's programs and update only
        line = next(
            x for x in result.stdout.splitlines() if x.startswith(f"rank {rank} scheduled:")
        )
        stages = {int(m) for m in re.findall(r"_s(\d+)_", line)}
        assert stages == {mesh.coords(rank)["pp"]}, line
        assert line.count("_update") == 1, line
    expected_losses, _ = unpipelined(dp, tp)
    np.testing.assert_allclose(losses, expected_losses, rtol=LOSS_RTOL)


# --- memory: plan-memory plus what the runtime holds between stage programs ------------


def _gpt_step(layers: int = 4, remat: str = "everything"):
    from pipeline_case import HEADS, train_gpt

    params = train_gpt.init_params(64, 8, 32, layers)
    mesh = dist.Mesh(axes=["pp", "dp", "tp"], shape=(2, 1, 1))
    args = __import__("argparse").Namespace(
        lr=1e-3, zero=0, heads=HEADS, layers=layers, remat=remat
    )
    step = train_gpt.make_step(mesh, params, args)
    return step, step.init(params)


@pytest.mark.parametrize("kind", ["gpipe", "1f1b"])
def test_pipelined_memory_holds_the_residuals_the_schedule_keeps(kind: str) -> None:
    step, state = _gpt_step()
    m = 4
    with schedule.options(pipeline_microbatches=m, pipeline_schedule=kind):
        memory = step.memory(state, *batch())
    assert memory.peak_bytes == max(r.peak_bytes for r in memory.ranks)
    for r in memory.ranks:
        (per_microbatch,) = r.residuals_per_microbatch.values()
        kept = m if kind == "gpipe" else len(memory.ranks) - r.pipeline_rank
        assert r.saved_bytes == kept * per_microbatch
        # a program's peak plus at least the residuals, parameters and optimizer state
        assert r.peak_bytes > max(r.program_peaks.values())
        assert r.peak_bytes >= r.saved_at_worst + r.model_states.optimizer_state
    with schedule.options(pipeline_microbatches=m, pipeline_schedule="1f1b"):
        one_f_one_b = step.memory(state, *batch()).peak_bytes
    with schedule.options(pipeline_microbatches=m, pipeline_schedule="gpipe"):
        assert step.memory(state, *batch()).peak_bytes > one_f_one_b


def test_remat_nothing_keeps_only_block_inputs_between_stage_programs() -> None:
    from test_remat import block, params_for

    mesh = dist.mesh({"pp": 2})

    def make(remat):
        @graph.training_step(optimizer=optim.SGD(lr=0.1), mesh=mesh, remat=remat)
        def step(params, x, y):
            for i, p in enumerate(params):
                if i == 2:
                    graph.stage()
                x = block(p, x)
            loss = op.mean((x - y) ** 2)
            return graph.backward(loss), {"loss": loss}

        return step

    x, y = torch.randn(32, 16), torch.randn(32, 16)
    m, width = 2, 16
    act = (32 // m) * width * 4  # one 16-wide microbatch activation
    stats = {}
    for remat in ("everything", "nothing"):
        step = make(remat)
        with schedule.options(pipeline_microbatches=m, pipeline_schedule="gpipe"):
            stats[remat] = step.memory(step.init(params_for(4, 16, 64)), x, y)
    nothing, everything = stats["nothing"], stats["everything"]
    # stage 0 keeps what it sends (block 2's output) and block 2's input: block 1 reads
    # the batch, nothing else of either block is kept
    assert nothing.ranks[0].residuals_per_microbatch == {0: 2 * act}
    assert nothing.ranks[0].saved_bytes == m * 2 * act
    for r in range(2):
        assert nothing.ranks[r].saved_bytes < everything.ranks[r].saved_bytes
    assert nothing.peak_bytes < everything.peak_bytes


@pytest.mark.parametrize(
    ("kind", "remat"), [("gpipe", "everything"), ("1f1b", "nothing"), ("zb-h1", "everything")]
)
def test_pipelined_memory_matches_what_the_runtime_keeps(
    kind: str, remat: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    step, state = _gpt_step(remat=remat)
    most: dict[int, int] = {}
    compute = PipelineExecutor.compute

    def recording(self, st, action):
        compute(self, st, action)
        live = {id(t): t for values in st.saved.values() for t in values[0]}  # member 0
        held = sum(t.nbytes for t in live.values())
        most[st.pipeline_rank] = max(most.get(st.pipeline_rank, 0), held)

    monkeypatch.setattr(PipelineExecutor, "compute", recording)
    with schedule.options(pipeline_microbatches=4, pipeline_schedule=kind):
        memory = step.memory(state, *batch())
        step(state, *batch())
    assert most == {r.pipeline_rank: r.saved_bytes for r in memory.ranks}


@pytest.mark.parametrize("pipelined", [False, True])
@pytest.mark.parametrize(
    ("dtype", "precision", "reported"),
    [
        (torch.float64, None, torch.float64),
        (torch.float32, None, torch.float32),
        (torch.float32, "bf16", torch.float32),
        (torch.float32, "fp16", torch.float32),
        (torch.float32, "fp8", torch.float32),
    ],
)
def test_metrics_are_0d_tensors_at_least_float32(
    pipelined: bool, dtype: torch.dtype, precision: str | None, reported: torch.dtype
) -> None:
    """The loss comes back as a 0-d tensor in the step's dtype widened to float32 (a
    float64 step's in float64, a bf16 step's in float32), pipelined or not; a pipelined
    float64 step's loss equals the float64 unpipelined one to 1e-12."""
    params = {k: v.to(dtype) for k, v in _mlp_params(2).items()}
    mesh = dist.Mesh(axes=["pp", "dp"], shape=(2, 2)) if pipelined else dist.mesh({"dp": 2})

    @graph.training_step(optimizer=optim.SGD(lr=0.1), mesh=mesh, precision=precision)
    def step(p, x, y):
        h = op.tanh(op.tanh(x @ p["w0"]) @ p["w1"])
        loss = op.mean((h - y) * (h - y))
        return graph.backward(loss), {"loss": loss}

    g = torch.Generator().manual_seed(4)
    x, y = (torch.randn(8, 16, generator=g, dtype=dtype) for _ in range(2))
    with schedule.options(pipeline_microbatches=2):
        loss = step(step.init({k: v.clone() for k, v in params.items()}), x, y)["loss"]
    assert isinstance(loss, torch.Tensor) and loss.shape == () and loss.dtype == reported
    if dtype == torch.float64:
        h = torch.tanh(torch.tanh(x @ params["w0"]) @ params["w1"])
        assert abs(float(loss) - float(((h - y) ** 2).mean())) <= 1e-12


def test_a_pipelined_step_takes_a_dict_batch() -> None:
    """A batch that is a pytree (here a dict) is split leaf by leaf: the step equals the
    one taking the same tensors as separate arguments (float64, 1e-12); a leaf that is
    not a tensor is an error naming it."""
    params = {k: v.double() for k, v in _mlp_params(2).items()}
    mesh = dist.Mesh(axes=["pp", "dp"], shape=(2, 2))

    def model(p, x, y):
        h = op.tanh(op.tanh(x @ p["w0"]) @ p["w1"])
        loss = op.mean((h - y) * (h - y))
        return graph.backward(loss), {"loss": loss}

    by_dict = graph.training_step(
        lambda p, batch: model(p, batch["x"], batch["y"]), optimizer=optim.SGD(lr=0.1), mesh=mesh
    )
    by_args = graph.training_step(model, optimizer=optim.SGD(lr=0.1), mesh=mesh)
    g = torch.Generator().manual_seed(6)
    x, y = (torch.randn(8, 16, generator=g, dtype=torch.float64) for _ in range(2))
    states = [step.init({k: v.clone() for k, v in params.items()}) for step in (by_dict, by_args)]
    with schedule.options(pipeline_microbatches=2):
        a = by_dict(states[0], {"x": x, "y": y})["loss"]
        b = by_args(states[1], x, y)["loss"]
        with pytest.raises(TesseraError, match=r"batch argument \[0\]\['y'\] is a float"):
            by_dict(states[0], {"x": x, "y": 1.0})
    assert abs(float(a) - float(b)) <= 1e-12
    for k in params:
        torch.testing.assert_close(states[0].params[k], states[1].params[k], rtol=0, atol=1e-12)


def test_pipelined_memory_counts_the_reduction_program_of_clipping() -> None:
    """With clipping the update is split (a reduction program, then the update reading
    the global norm): the model states are the same bytes as without (parameters, the
    gradients summed over microbatches, AdamW's state) and the reduction program's peak
    is among each rank's program peaks."""
    params = _mlp_params(2)
    mesh = dist.Mesh(axes=["pp", "dp"], shape=(2, 2))
    stats = []
    for clip in (None, 1.0):

        @graph.training_step(optimizer=optim.AdamW(lr=0.1), mesh=mesh, clip_grad_norm=clip)
        def step(p, x, y):
            h = op.tanh(x @ p["w0"])
            graph.stage()
            loss = op.mean((op.tanh(h @ p["w1"]) - y) ** 2)
            return graph.backward(loss), {"loss": loss}

        x, y = torch.randn(8, 16), torch.randn(8, 16)
        with schedule.options(pipeline_microbatches=2):
            stats.append(step.memory(step.init(params), x, y))
    plain, clipped = stats
    assert [r.model_states for r in clipped.ranks] == [r.model_states for r in plain.ranks]
    assert plain.ranks[0].model_states.grads == 16 * 16 * 4  # w0's f32 gradient
    for rank in clipped.ranks:
        assert any(name.endswith("_reduce") for name in rank.program_peaks), rank.program_peaks
