"""graph.region: one outlined function per distinct signature, compiled once, equal to
the unrolled program (values and gradients, on one device and on a dp × tp mesh)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import tessera as ts
from tessera import dist, graph, op, optim
from tessera.errors import TraceError

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import comm_volume

MESH = dist.mesh({"dp": 2, "tp": 2})
ROWS_DP = dist.ShardSpec(partition=(0,), mesh_axes=("dp",))
COLS_TP = dist.ShardSpec(partition=(1,), mesh_axes=("tp",))
ROWS_TP = dist.ShardSpec(partition=(0,), mesh_axes=("tp",))
LAYERS = 3
TOL = 1e-12  # float64, same ops in the same order: only summation order may differ


def mlp_layer(p: dict, x):
    return x + op.matmul(op.gelu(op.matmul(x, p["w1"])), p["w2"])


def torch_layer(p: dict, x: torch.Tensor) -> torch.Tensor:
    return x + torch.nn.functional.gelu(x @ p["w1"]) @ p["w2"]


def _params(seed: int = 0) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [
        {
            "w1": torch.randn(16, 32, generator=g, dtype=torch.float64) * 0.2,
            "w2": torch.randn(32, 16, generator=g, dtype=torch.float64) * 0.2,
        }
        for _ in range(LAYERS)
    ]


def _loss(layer):
    def loss(params, x):
        for p in params:
            x = layer(p, x)
        return (x * x).mean()

    return loss


def _torch_grads(params, x):
    leaves = [{k: v.clone().requires_grad_() for k, v in p.items()} for p in params]
    _loss(torch_layer)(leaves, x).backward()
    return [{k: v.grad for k, v in p.items()} for p in leaves]


def _max_difference(a, b) -> float:
    return max((a[i][k] - b[i][k]).abs().max().item() for i in range(len(a)) for k in a[i])


def test_calls_share_one_traced_function() -> None:
    x = torch.randn(8, 16, dtype=torch.float64)
    traced = 0

    def counted(p, x):
        nonlocal traced
        traced += 1
        return mlp_layer(p, x)

    lowered = ts.jit(_loss(graph.region(counted)), kernels="reference").lower(_params(), x)
    text = lowered.as_text("traced")
    assert traced == 1
    assert text.count("graph.call @counted(") == LAYERS
    assert text.count("func.func private @counted(") == 1


@pytest.mark.parametrize("kernels", ["reference", "triton"])
def test_values_and_gradients_equal_torch_on_one_device(kernels: str) -> None:
    params, x = _params(), torch.randn(8, 16, dtype=torch.float64)
    loss = _loss(graph.region(mlp_layer))
    value = ts.jit(loss, kernels=kernels)(params, x)
    assert abs(float(value) - float(_loss(torch_layer)(params, x))) < TOL
    grads = ts.grad(loss, kernels=kernels)(params, x)
    assert _max_difference(grads, _torch_grads(params, x)) < TOL


@pytest.mark.parametrize("kernels", ["reference", "triton"])
def test_gradients_on_a_dp_tp_mesh_equal_torch(kernels: str) -> None:
    params, x = _params(1), torch.randn(8, 16, dtype=torch.float64)
    specs = [{"w1": COLS_TP, "w2": ROWS_TP}] * LAYERS
    grad = ts.jit(
        ts.grad(_loss(graph.region(mlp_layer))),
        mesh=MESH,
        in_shardings=(specs, ROWS_DP),
        kernels=kernels,
    )
    assert _max_difference(grad(params, x), _torch_grads(params, x)) < TOL
    sharded = grad.lower(params, x).as_text("partitioned")
    # every layer's forward and backward run one function each: Megatron's tp
    # all-reduce appears once in the forward's body, not once per layer
    assert sharded.count("func.func private @mlp_layer_fwd(") == 1
    assert sharded.count("func.func private @mlp_layer_bwd(") == 1
    assert sharded.count("graph.call @mlp_layer_fwd(") == LAYERS


def test_a_region_is_specialized_per_layout_of_its_arguments() -> None:
    params, x = _params(2), torch.randn(8, 16, dtype=torch.float64)
    sharded_specs = [{"w1": COLS_TP, "w2": ROWS_TP}, {"w1": None, "w2": None}, {"w1": COLS_TP, "w2": ROWS_TP}]
    forward = ts.jit(
        _loss(graph.region(mlp_layer)), mesh=MESH, in_shardings=(sharded_specs, ROWS_DP),
        kernels="reference",
    )  # fmt: skip
    text = forward.lower(params, x).as_text("sharded")
    assert text.count("func.func private @mlp_layer") == 2  # tp-split and replicated weights
    assert abs(float(forward(params, x)) - float(_loss(torch_layer)(params, x))) < TOL


def test_checkpointed_region_and_region_of_checkpoint_give_the_same_gradients() -> None:
    params, x = _params(3), torch.randn(8, 16, dtype=torch.float64)
    expected = _torch_grads(params, x)
    for layer in (
        graph.region(graph.checkpoint(mlp_layer)),
        graph.checkpoint(graph.region(mlp_layer)),
    ):
        grads = ts.grad(_loss(layer), kernels="reference")(params, x)
        assert _max_difference(grads, expected) < TOL


def test_nested_regions() -> None:
    params, x = _params(4), torch.randn(8, 16, dtype=torch.float64)
    inner = graph.region(lambda w, h: op.gelu(op.matmul(h, w)))

    @graph.region
    def layer(p, x):
        return x + op.matmul(inner(p["w1"], x), p["w2"])

    grads = ts.grad(_loss(layer), kernels="reference")(params, x)
    assert _max_difference(grads, _torch_grads(params, x)) < TOL


@pytest.mark.parametrize("scan_layers", [False, True])
@pytest.mark.parametrize("zero", [0, 3])
def test_training_step_from_regions_equals_the_unrolled_step(zero: int, scan_layers: bool) -> None:
    """Also under ZeRO-3, whose backward gathers each parameter again: a backward region
    call reads its own gather. The layers as region calls, or (``scan_layers``) stacked
    and rolled into one scan."""
    layers, heads = 2, 4
    layout = comm_volume.layouts(MESH, False)[1]
    states, gathers = [], []
    for regions in (False, True):
        step = comm_volume.training_step(
            MESH, zero, layers, heads, True, regions, scan_layers=scan_layers
        )
        params = comm_volume.layer_params(32, layers)
        state = step.init(params)
        x = torch.randn(4, 8, 32, generator=torch.Generator().manual_seed(5))
        gathers.append(sum(c.kind == "all_gather" for c in step.lower(state, x).collectives()))
        losses = [float(step(state, x)["loss"]) for _ in range(2)]
        states.append((losses, {k: torch.as_tensor(v) for k, v in state.params.items()}))
    (unrolled_losses, unrolled), (region_losses, regions) = states
    if zero == 3:  # the backward gathers again the parameters it reads, regions or not
        # (a region's backward takes only the operands it reads: ``dce``); one more with
        # regions: the backward all layers share computes the input's gradient, which
        # reads the first norm's weight, a gradient the unrolled first layer never makes
        assert gathers[1] == gathers[0] + 1 and gathers[0] > len(params), gathers
    else:
        assert gathers[0] == gathers[1] == 0
    assert unrolled_losses == pytest.approx(region_losses, rel=1e-5)  # float32
    assert max((unrolled[k] - regions[k]).abs().max().item() for k in unrolled) < 1e-5
    assert layout  # the step is Megatron-sharded over tp


def test_optimizer_updates_each_layer_in_one_call() -> None:
    """Layers left as region calls (``scan_layers=False``; also layers no scan can give,
    tests/unit/test_layer_stacks.py)."""
    step = comm_volume.training_step(MESH, 0, 3, 4, True, regions=True, scan_layers=False)
    params = comm_volume.layer_params(32, 3)
    lowered = step.lower(step.init(params), torch.empty(4, 8, 32))
    text = lowered.as_text("graph")
    # the parameters one layer's call reads update in one call; one function for all layers
    assert text.count("func.func private @_adamw_group") == 1
    assert text.count("graph.call @_adamw_group") == 3
    # the gradients' and the new values' layouts are constraints of the calls, not ops
    step_text = text.split("func.func private")[0]
    assert step_text.count("graph.shard ") == 1  # the step count's: no call computes it
    assert step_text.count("graph.result_shardings") == 6  # each layer's backward and update


def test_sgd_state_less_optimizer_works_with_regions() -> None:
    params, x = _params(6), torch.randn(8, 16, dtype=torch.float64)

    @ts.jit(kernels="reference")
    def step(params, x):
        loss = _loss(graph.region(mlp_layer))(params, x)
        grads = graph.backward(loss, params)
        return optim.sgd(params, grads, lr=0.1)[0]

    updated = step(params, x)
    grads = _torch_grads(params, x)
    for new, old, g in zip(updated, params, grads, strict=True):
        for k in new:
            assert (new[k] - (old[k] - 0.1 * g[k])).abs().max().item() < TOL


def test_a_captured_tensor_is_an_error_naming_the_region() -> None:
    @ts.jit(kernels="reference")
    def f(x, w):
        @graph.region
        def uses_w(h):
            return op.matmul(h, w)

        return uses_w(x)

    with pytest.raises(TraceError, match=r"graph\.region uses_w uses a tensor it was not given"):
        f(torch.randn(2, 3), torch.randn(3, 3))


def test_stage_marks_inside_a_region_are_an_error() -> None:
    @graph.region
    def staged(x):
        graph.stage()
        return x * 2.0

    with pytest.raises(TraceError, match="between calls, not inside a region"):
        ts.jit(lambda x: staged(x), kernels="reference")(torch.randn(2))


def test_a_region_returning_a_number_is_an_error() -> None:
    with pytest.raises(TraceError, match="must return tensors it computed, found float"):
        ts.jit(lambda x: graph.region(lambda y: 1.0)(x), kernels="reference")(torch.randn(2))


def test_outside_tracing_a_region_runs_the_function() -> None:
    assert graph.region(lambda a, b: a + b)(2, 3) == 5


@pytest.mark.parametrize("marks", [True, False])
def test_pipelined_step_from_regions_equals_the_unrolled_one(marks: bool) -> None:
    """pp2 × dp2, 1F1B over two microbatches, stages cut at graph.stage() or where the
    cost model balances them (a call costs its callee's ops): the same losses and
    parameters as the unrolled step."""
    from tessera import schedule

    layers, names = 4, ("wq", "wk", "wv", "wo", "w1", "w2", "ln1_w", "ln1_b", "ln2_w", "ln2_b")
    mesh = dist.mesh({"pp": 2, "dp": 2})
    results = []
    for layer in (comm_volume.transformer_layer, graph.region(comm_volume.transformer_layer)):

        def step(p, x, layer=layer):
            for i in range(layers):
                if marks and i == layers // 2:
                    graph.stage()
                x = layer(x, {n: p[f"{n}{i}"] for n in names}, 4)
            loss = op.mean(x * x)
            return graph.backward(loss), {"loss": loss}

        train = graph.training_step(
            step, optimizer=optim.AdamW(lr=1e-3), mesh=mesh, kernels="reference"
        )
        state = train.init(comm_volume.layer_params(32, layers))
        x = torch.randn(8, 8, 32, generator=torch.Generator().manual_seed(7))
        with schedule.pipeline_microbatches(2, kind="1f1b"):
            losses = [float(train(state, x)["loss"]) for _ in range(2)]
        params = train.state_dict(state)["params"]
        results.append((losses, {k: torch.as_tensor(v) for k, v in params.items()}))
    (unrolled_losses, unrolled), (region_losses, regions) = results
    assert unrolled_losses == pytest.approx(region_losses, rel=1e-6)
    assert max((unrolled[k] - regions[k]).abs().max().item() for k in unrolled) < 1e-6


def test_collectives_simulation_and_memory_count_every_call() -> None:
    """A region's collectives are listed once per call, the simulator runs each call's
    kernels, and the memory plan counts call results and the callee's scratch: the
    numbers stay close to the unrolled program's (one more all-reduce: the first layer's
    backward also reduces the gradient of its input, which the unrolled program drops)."""
    numbers = []
    for regions in (False, True):
        step = comm_volume.training_step(MESH, 0, 3, 4, True, regions, scan_layers=False)
        lowered = step.lower(step.init(comm_volume.layer_params(64, 3)), torch.empty(4, 16, 64))
        infos = lowered.collectives()
        numbers.append(
            (len(infos), lowered.simulate().step_time_s, lowered.memory().peak_bytes)
        )
    (count, time, peak), (region_count, region_time, region_peak) = numbers
    assert region_count == count + 1
    assert 0.8 * time < region_time < 1.5 * time
    assert 0.8 * peak < region_peak < 1.25 * peak


def test_context_parallel_attention_inside_a_region_is_refused_by_name() -> None:
    """Ring or all-gather attention over a split sequence inside a region is not
    supported yet: an error naming it, not a wrong program."""
    mesh = dist.mesh({"cp": 2})

    @graph.region
    def attend(q, k, v):
        return op.attention(q, k, v, causal=True)

    seq = dist.ShardSpec(partition=(2,), mesh_axes=("cp",))
    f = ts.jit(attend, mesh=mesh, in_shardings=(seq, seq, seq), kernels="reference")
    q = torch.randn(1, 2, 8, 4)
    with pytest.raises(Exception, match=r"context parallelism\) inside graph\.region"):
        f(q, q, q)


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_region_calls_model_about_the_unrolled_step_time(zero: int) -> None:
    """Region calls cost the step little time in the model at any ZeRO stage (2 layers,
    width 256; was 1.51× unrolled under ZeRO-3): their residuals are not copied out of
    views (the backward redoes a transpose or reshape instead), ZeRO-3 prefetches the
    next call's parameter bucket while a call computes, and a bucket of gathers is
    copied out in one split, not one strided slice per parameter."""
    times = []
    for regions in (False, True):
        step = comm_volume.training_step(MESH, zero, 2, 4, True, regions, scan_layers=False)
        params = {k: torch.empty(v.shape) for k, v in comm_volume.layer_params(256, 2).items()}
        lowered = step.lower(step.init(params), torch.empty(4, 64, 256))
        times.append(lowered.simulate().step_time_s)
    unrolled, regions_time = times
    assert regions_time < 1.12 * unrolled, (zero, regions_time / unrolled)
