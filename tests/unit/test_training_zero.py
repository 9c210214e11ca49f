"""``graph.training_step``: one compiled step per call, parameters updated in place, and
ZeRO stages 0-3 over dp — each checked against torch.optim in float64, by the
collectives the passes insert and by the per-rank memory of parameters, gradients and
optimizer state (analytic formulas)."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
import torch.nn.functional as F
from xdsl.dialects import func

import tessera as ts
from tessera import dist, graph, op, optim
from tessera.ir import schedule
from tessera.ir.abstract import aval

DP, TP = 2, 2
C, H, B = 8, 32, 64  # model width, hidden width, batch (tokens)
COLUMNS = dist.ShardSpec(partition=(1,), mesh_axes=("tp",))
ROWS = dist.ShardSpec(partition=(0,), mesh_axes=("tp",))


def init(seed: int = 0) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    params = {
        "w1": torch.randn(C, H, generator=g) / C**0.5,
        "b1": 0.1 * torch.randn(H, generator=g),
        "w2": torch.randn(H, C, generator=g) / H**0.5,
    }
    return params, torch.randn(B, C, generator=g), torch.randn(B, C, generator=g)


def make_step(zero: int, mesh: dist.Mesh | None, kernels: str = "reference") -> graph.TrainingStep:
    @graph.training_step(
        optimizer=optim.AdamW(lr=1e-2, weight_decay=0.1),
        mesh=mesh,
        zero=zero,
        param_shardings={
            "w1": COLUMNS,
            "b1": dist.ShardSpec(partition=(0,), mesh_axes=("tp",)),
            "w2": ROWS,
        }
        if mesh is not None
        else None,
        kernels=kernels,
    )
    def step(p, x, y):
        out = op.gelu(x @ p["w1"] + p["b1"]) @ p["w2"]
        loss = op.mean((out - y) * (out - y))
        return graph.backward(loss), {"loss": loss}

    return step


def torch_steps(params, x, y, steps: int) -> tuple[list[float], dict[str, torch.Tensor]]:
    ref = {k: v.double().clone().requires_grad_() for k, v in params.items()}
    opt = torch.optim.AdamW(ref.values(), lr=1e-2, weight_decay=0.1)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = ((F.gelu(x.double() @ ref["w1"] + ref["b1"]) @ ref["w2"] - y.double()) ** 2).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, ref


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_zero_stage_trains_like_torch_adamw_in_place(zero: int) -> None:
    params, x, y = init()
    expected_losses, expected = torch_steps(params, x, y, steps=3)
    step = make_step(zero, dist.mesh({"dp": DP, "tp": TP}))
    originals = dict(params)
    state = step.init(params)
    losses = [float(step(state, x, y)["loss"]) for _ in range(3)]
    # tolerance: f32 program vs float64 torch over three AdamW steps
    assert losses == pytest.approx(expected_losses, rel=1e-5)
    for name, tensor in state.params.items():
        assert tensor is originals[name]  # updated in place, not replaced
        torch.testing.assert_close(tensor.double(), expected[name].detach(), rtol=1e-5, atol=1e-6)
    assert state.step == 3
    assert float(state.opt_state["step"]) == 3.0


def test_triton_kernels_and_single_device_agree_with_torch() -> None:
    params, x, y = init(1)
    expected_losses, _ = torch_steps(params, x, y, steps=2)
    for step in (
        make_step(2, dist.mesh({"dp": DP, "tp": TP}), "triton"),
        make_step(0, None, "triton"),
    ):
        state = step.init({k: v.clone() for k, v in params.items()})
        losses = [float(step(state, x, y)["loss"]) for _ in range(2)]
        assert losses == pytest.approx(expected_losses, rel=1e-5)


def _dp_collectives(zero: int) -> Counter[str]:
    params, x, y = init()
    step = make_step(zero, dist.mesh({"dp": DP, "tp": TP}))
    infos = step.lower(step.init(params), x, y).collectives()
    return Counter(i.kind for i in infos if i.mesh_axes == ("dp",) and i.shape != ())


@pytest.mark.parametrize(
    ("zero", "expected"),
    [
        (0, {"all_reduce": 3}),  # the three gradients
        (1, {"all_reduce": 3, "all_gather": 3}),  # + the updated parameters
        (2, {"reduce_scatter": 3, "all_gather": 3}),
        # each parameter gathered for the forward, and w2 again for the backward's input
        # gradient (that of w1's matmul is not needed, and a bias's reads no bias)
        (3, {"all_gather": 4, "reduce_scatter": 3}),
    ],
)
def test_zero_stage_inserts_the_expected_dp_collectives(
    zero: int, expected: dict[str, int]
) -> None:
    assert _dp_collectives(zero) == Counter(expected)


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_zero_memory_matches_the_zero_paper(zero: int) -> None:
    """Per-rank bytes (f32, AdamW: two moments and a step count): parameters Ψ, gradients
    Ψ, state 2Ψ, each divided by dp once its stage shards it; Ψ is the tp shard."""
    params, x, y = init()
    step = make_step(zero, dist.mesh({"dp": DP, "tp": TP}))
    memory = step.memory(step.init(params), x, y).model_states
    psi = sum(v.numel() for v in params.values()) * 4 // TP
    assert memory is not None
    assert memory.params == (psi // DP if zero >= 3 else psi)
    assert memory.grads == (psi // DP if zero >= 2 else psi)
    assert memory.optimizer_state == (2 * psi // DP if zero >= 1 else 2 * psi) + 4


def test_donated_update_takes_the_place_of_its_inputs() -> None:
    """plan-memory lets an elementwise update write over a donated argument."""

    def update(p, m, g):
        m = m * 0.9 + g
        return p - m * 0.1, m

    args = [torch.randn(256, 256) for _ in range(3)]
    kept = ts.jit(update, kernels="reference").lower(*args).memory().peak_bytes
    donated = (
        ts.jit(update, kernels="reference", donate_argnums=(0, 1)).lower(*args).memory().peak_bytes
    )
    size = 256 * 256 * 4
    assert kept == 5 * size  # three arguments and two results
    assert donated == 3 * size  # the results reuse p's and m's buffers


def test_training_step_errors_name_the_problem() -> None:
    params, x, y = init()
    with pytest.raises(ts.ShardingError, match="data-parallel axis 'dp'"):
        make_step(2, dist.mesh({"tp": 4}))
    with pytest.raises(ts.TesseraError, match="zero must be one of"):
        graph.training_step(lambda p, x: None, optimizer=optim.SGD(), zero=4)
    with pytest.raises(ts.TesseraError, match="optimizer object"):
        graph.training_step(lambda p, x: None, optimizer=optim.adamw)

    @graph.training_step(optimizer=optim.SGD(lr=0.1), mesh=dist.mesh({"dp": 2}))
    def no_metrics(p, x, y):
        return graph.backward(op.mean(x @ p["w1"]))

    with pytest.raises(ts.TraceError, match=r"must return \(grads, metrics\)"):
        no_metrics(no_metrics.init(params), x, y)

    @graph.training_step(
        optimizer=optim.SGD(),
        mesh=dist.mesh({"dp": 2}),
        param_shardings=dist.ShardSpec(partition=(0,), mesh_axes=("dp",)),
    )
    def split_over_dp(p, x, y):
        return graph.backward(op.mean(x @ p["w1"])), {}

    with pytest.raises(ts.ShardingError, match="use zero=3"):
        split_over_dp(split_over_dp.init(params), x, y)

    with pytest.raises(ts.TraceError, match=r"only valid inside @graph\.training_step"):
        ts.jit(lambda w: graph.backward(op.sum(w)))(torch.ones(3))


def test_sgd_momentum_training_step_on_a_dp_mesh() -> None:
    params, x, y = init(2)
    ref = {k: v.double().clone().requires_grad_() for k, v in params.items()}
    opt = torch.optim.SGD(ref.values(), lr=0.05, momentum=0.9)

    @graph.training_step(
        optimizer=optim.SGD(lr=0.05, momentum=0.9), mesh=dist.mesh({"dp": 4}), zero=1
    )
    def step(p, x, y):
        out = op.gelu(x @ p["w1"] + p["b1"]) @ p["w2"]
        return graph.backward(op.mean((out - y) * (out - y))), {}

    state = step.init(params)
    for _ in range(3):
        step(state, x, y)
        opt.zero_grad()
        (
            (F.gelu(x.double() @ ref["w1"] + ref["b1"]) @ ref["w2"] - y.double()) ** 2
        ).mean().backward()
        opt.step()
    for name in params:
        torch.testing.assert_close(
            state.params[name].double(), ref[name].detach(), rtol=1e-5, atol=1e-6
        )


def _gathered_live_at_once(layers: int, zero: int) -> tuple[int, int]:
    """For a chain of ``layers`` 64 × 64 matmuls on dp 4: the most bytes of dp-gathered
    parameters live at once in the schedule (each from its gather's start to its last
    reader), and how many gathers the schedule has."""
    width = 64

    @graph.training_step(
        optimizer=optim.SGD(lr=0.1), mesh=dist.mesh({"dp": 4}), zero=zero, kernels="reference"
    )
    def chain(p, x, y):
        h = x
        for i in range(layers):
            h = op.gelu(h @ p[f"w{i}"])
        return graph.backward(op.mean((h - y) * (h - y))), {}

    params = {f"w{i}": torch.randn(width, width) for i in range(layers)}
    x = torch.randn(512, width)
    module = chain.lower(chain.init(params), x, x).module_at("schedule")
    (function,) = [f for f in module.ops if isinstance(f, func.FuncOp)]
    ops = list(function.body.block.ops)
    live = []  # (first index, last index, bytes)
    for i, start in enumerate(ops):
        if isinstance(start, schedule.StartOp) and start.collective_name == "all_gather":
            (wait,) = [use.operation for use in start.results[0].uses]
            readers = [ops.index(use.operation) for use in wait.results[0].uses]
            live.append((i, max(readers), aval(wait.results[0]).nbytes))
    most = max(sum(n for a, b, n in live if a <= i <= b) for i in range(len(ops)))
    return most, len(live)


def test_zero3_holds_two_gathered_parameters_at_most() -> None:
    """ZeRO-3 gathers each parameter where its layer needs it, prefetching one ahead, and
    again for the backward: at most two whole parameters live at once, however deep the
    model (it was every parameter, gathered in one bucket at the start and kept for the
    backward)."""
    for layers in (4, 8):
        most, gathers = _gathered_live_at_once(layers, zero=3)
        assert most == 2 * 64 * 64 * 4
        assert gathers == 2 * layers - 1  # the first layer's backward reads no weight


def test_zero3_gathers_in_the_compute_dtype_for_each_microbatch() -> None:
    """bf16 compute and two microbatches: each parameter is cast, then gathered in bf16
    (half the bytes of its f32 master), for each microbatch's forward and again for its
    backward (w2 only: the backward reads neither w1 nor b1), so none stays whole from
    one microbatch to the next."""
    params, x, y = init()

    @graph.training_step(
        optimizer=optim.AdamW(lr=1e-2),
        mesh=dist.mesh({"dp": DP, "tp": TP}),
        zero=3,
        precision="bf16",
        accumulate=2,
        param_shardings={"w1": COLUMNS, "b1": ROWS, "w2": ROWS},
        kernels="reference",
    )
    def step(p, x, y):
        out = op.gelu(x @ p["w1"] + p["b1"]) @ p["w2"]
        return graph.backward(op.mean((out - y) * (out - y))), {}

    infos = step.lower(step.init(params), x, y).collectives()
    gathers = [i for i in infos if i.kind == "all_gather" and i.mesh_axes == ("dp",)]
    assert len(gathers) == 2 * (3 + 1)
    assert {i.dtype for i in gathers} == {"bf16"}
