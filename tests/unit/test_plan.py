"""``tessera plan`` (issue 22): the validator's rules, parameter counts against the
published totals, the memory estimate against a compiled step's ``memory()``, the CLI's
exit codes, and a recommended plan's dry run on the virtual mesh."""

from __future__ import annotations

import json

import pytest
import torch

from tessera import dist, graph, op, optim
from tessera.plan.cli import main
from tessera.plan.dryrun import dry_run
from tessera.plan.layer import LayerShape, layer_param_shapes, layer_shardings, transformer_layer
from tessera.plan.models import PRESETS, load_model
from tessera.plan.strategy import Strategy
from tessera.plan.validate import structural_violations

SMALL = "layers=2,hidden=64,heads=4,kv_heads=2,ffn=128,vocab=256,seq=32"


@pytest.mark.parametrize(
    ("name", "billions"),
    [("gpt3-175b", 175.0), ("llama3-8b", 8.0), ("llama3-70b", 70.6), ("llama3-405b", 405.0),
     ("mixtral-8x7b", 46.7), ("deepseek-v3", 671.0)],
)  # fmt: skip
def test_parameter_counts_match_the_published_totals(name: str, billions: float) -> None:
    """Within 1% of the papers' totals (DeepSeek-V3: 1%, its MLA modelled as GQA)."""
    assert PRESETS[name].params() / 1e9 == pytest.approx(billions, rel=0.01)


def test_validator_reports_each_violation() -> None:
    """The issue's example: 60 GPUs of 64, tp 3 dividing no head count, the batch."""
    model = PRESETS["llama3-70b"]
    found = structural_violations(model, Strategy(dp=5, tp=3, pp=4), 64, 1024, 8192)
    assert found == [
        "dp x tp x pp x cp = 5 x 3 x 4 x 1 = 60, but the cluster has 64 GPUs",
        "tp 3 does not divide the 64 attention heads",
        "tp 3 does not divide the 8 key/value heads",
        "tp 3 does not divide the MLP width 28672",
        "global batch 1024 is not a multiple of dp x micro_batch = 5 x 1 = 5",
    ]


def test_validator_rules_for_experts_sequence_and_stages() -> None:
    moe, dense = PRESETS["mixtral-8x7b"], PRESETS["llama3-8b"]
    assert structural_violations(moe, Strategy(dp=8, ep=3), 8, 64, 4096) == [
        "ep 3 does not divide the 8 experts",
        "ep 3 must divide dp 8 (experts are split over data-parallel ranks)",
    ]
    assert structural_violations(dense, Strategy(dp=2, ep=2), 2, 64, 4096) == [
        "ep 2 needs experts, but llama3-8b is a dense model"
    ]
    assert structural_violations(dense, Strategy(dp=1, cp=3, pp=1), 3, 64, 4096) == [
        "cp 3 does not divide the sequence length 4096"
    ]
    found = structural_violations(dense, Strategy(dp=1, pp=64), 64, 64, 4096)
    assert found == ["pp x virtual = 64 stages, but the model has only 32 layers"]
    assert structural_violations(dense, Strategy(dp=8, tp=8), 64, 64, 4096) == []


def test_custom_model_descriptions() -> None:
    model = load_model(SMALL)
    assert (model.layers, model.hidden, model.head_dim) == (2, 64, 16)
    assert load_model("base=llama3-8b,layers=4").layers == 4
    with pytest.raises(Exception, match="unknown model field 'hiden'"):
        load_model("hiden=3")


@pytest.mark.parametrize(("tp", "sp"), [(1, False), (4, False), (4, True)])
def test_saved_activations_against_megatron(tp: int, sp: bool) -> None:
    """The per-rank values the compiled GPT layer's forward kernels make and its backward
    kernels read, against Korthikanti et al. 2022 (§4.2, eqs. 2–4): ``s·b·h·(10 + 24/t)``
    bytes per layer with tensor parallelism, ``34·s·b·h/t`` with sequence parallelism
    (their ``5·a·s²·b/t`` of attention scores absent: the fused attention recomputes
    them). The compiled layer has no dropout masks (-2sbh) but keeps flash attention's
    output (+2sbh) and its f32 log-sum-exp (``4·a·s·b/t`` bytes): within 1%."""
    from tessera.plan.layer import lowered_layer, saved_activations

    s, b, h, a = 2048, 1, 4096, 32
    model = load_model(f"layers=2,hidden={h},heads={a},kv_heads={a},ffn={4 * h},vocab=8,mlp=gelu")
    gradient = lowered_layer(LayerShape.of(model, s, b, tp, 1, sp))
    saved, _ = saved_activations(gradient.module_at("schedule"), gradient.name)
    sbh, lse = s * b * h, 4 * a * s * b / tp
    megatron = sbh * 34 / tp if sp else sbh * (10 + 24 / tp)
    assert saved == pytest.approx(megatron + lse, rel=0.01)


@pytest.mark.parametrize("cp", [1, 2])
def test_sequence_parallel_saves_sharded_activations_with_context_parallelism(cp: int) -> None:
    """A GQA/SwiGLU layer under sequence parallelism (tp 2) and context parallelism keeps
    its residual-width activations split over tp, as without cp: Megatron's SP saves the
    sequence-sharded input of each column-parallel block and re-gathers it in the
    backward. Per rank, with ``s`` the rank's tokens (``seq / cp``), ``S`` the sequence
    and 2-byte items: five ``s·h/t`` values (the layer input, the first norm's two
    results, the residual sum and the second norm's output) and its ``s/t`` statistics,
    q and the attention output (``s·a·d/t`` each), the cp-gathered k and v
    (``S·g·d/t`` each), the SwiGLU's four ``s·f/t`` values, and the attention's f32
    log-sum-exp (``a·s/t``). A gathered activation saved instead (the norms computed on
    the tp-gathered sequence) keeps ``t`` times more of the first."""
    from tessera.plan.layer import lowered_layer, saved_activations

    h, a, g, d, f, seq, t = 64, 4, 2, 16, 128, 64, 2
    shape = LayerShape(h, a, g, d, f, "swiglu", seq, 1, t, cp, sp=True)
    lowered = lowered_layer(shape)
    saved, _ = saved_activations(lowered.module_at("schedule"), lowered.name)
    s = seq // cp
    elements = 5 * s * h // t + s // t + 2 * s * a * d // t + 2 * seq * g * d // t + 4 * s * f // t
    assert saved == 2 * elements + 4 * a * s // t


def test_memory_estimate_against_the_compiled_step() -> None:
    """The planner's per-rank memory for a 2-layer model (hidden 256, sequence 128) on
    dp 2 x tp 2, two sequences per rank, against ``memory()`` of the compiled float32
    training step of the same layers (its f32 parameters, gradients and AdamW moments are
    16 B per parameter, as the planner counts bf16 mixed precision): model states within
    1%, activations (peak less model states) within 15% and the peak within 10%. The
    layer is profiled in float32 here, as the step runs. Both compile for a DGX H100
    without link latency (``BANDWIDTH_BOUND``): the toy layer stands for a large one, whose
    sharding decisions its bytes make, not its collectives' latency."""
    import dataclasses

    from machines import BANDWIDTH_BOUND

    from tessera.plan.estimate import memory
    from tessera.plan.layer import profile_layer
    from tessera.topology import load_topology

    h, seq, batch = 256, 128, 4
    model = load_model(f"layers=2,hidden={h},heads=4,kv_heads=2,ffn={2 * h},vocab=1,"
                       f"seq={seq},tied_embeddings=1")  # fmt: skip
    s = Strategy(dp=2, tp=2, zero=0, sp=False, micro_batch=batch // 2)
    shape = dataclasses.replace(LayerShape.of(model, seq, 2, 2, 1), dtype="float32")
    machine = load_topology(BANDWIDTH_BOUND)
    estimate = memory(model, s, profile_layer(shape, machine), machine, batch)

    _, specs = layer_shardings(shape)
    params = {
        f"{n}{i}": torch.randn(size)
        for i in range(2)
        for n, size in layer_param_shapes(shape).items()
    }

    def step(p, x):
        for i in range(2):
            x = transformer_layer(x, {n: p[f"{n}{i}"] for n in specs}, 4, 2, "swiglu")
        loss = op.mean(x * x)
        return graph.backward(loss), {"loss": loss}

    shardings = {f"{n}{i}": specs[n] for i in range(2) for n in specs}
    training = graph.training_step(
        step,
        optimizer=optim.AdamW(lr=1e-3),
        mesh=dist.mesh({"dp": 2, "tp": 2}, topology=BANDWIDTH_BOUND),
        param_shardings=shardings,
    )
    state = training.init(params)
    compiled = training.lower(state, torch.randn(batch, seq, h)).memory()
    assert compiled.model_states is not None
    states = compiled.model_states.total
    assert estimate.model_states == pytest.approx(states, rel=0.01)
    assert estimate.activations == pytest.approx(compiled.peak_bytes - states, rel=0.15)
    assert estimate.total == pytest.approx(compiled.peak_bytes, rel=0.1)


def test_cli_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--model", "llama3-70b", "--gpus", "64", "--cluster", "dgx_h100"]
    assert main(["validate", *args, "--tp", "3", "--pp", "4", "--dp", "5"]) == 1
    assert "tp 3 does not divide the 64 attention heads" in capsys.readouterr().err
    assert main(["validate", *args, "--tp", "8", "--pp", "2", "--dp", "4", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["valid"] is True
    assert main(["launch", *args, "--tp", "8", "--pp", "2", "--dp", "4", "train.py"]) == 0
    out = capsys.readouterr().out
    assert "torchrun --nnodes=8 --nproc-per-node=8" in out and "#SBATCH --nodes=8" in out
    assert main(["validate", "--model", "nope", "--gpus", "8"]) == 2


def test_recommend_finds_a_plan() -> None:
    """A small model on 8 GPUs: recommend exits 0 with a ranked, feasible plan."""
    assert (
        main(["recommend", "--model", SMALL, "--gpus", "8", "--global-batch", "16", "--json"]) == 0
    )


def test_dry_run_of_a_recommended_plan() -> None:
    """The search's best plan and its best FP8 plan, compiled at reduced width, each run one
    training step in their precision on the virtual mesh with a finite loss."""
    from tessera.plan.search import search
    from tessera.topology import dgx_h100

    model = load_model(SMALL)
    result = search(model, dgx_h100(), 8, 16, 32, finalists=2, fix={"remat": "none"})
    assert result.best is not None
    fp8 = next(e.strategy for e in result.ranked if e.strategy.precision == "fp8")
    for strategy in {result.best.strategy, fp8}:
        run = dry_run(model, strategy)
        assert torch.isfinite(torch.tensor(run.loss)), strategy


def test_fp8_is_planned_only_where_training_runs_it() -> None:
    """FP8 plans need FP8 tensor cores (none on A100: dropped by the search, a violation
    for validate) and every planned precision is one ``graph.training_step`` takes."""
    from tessera.plan.search import search
    from tessera.plan.strategy import PRECISIONS, Strategy
    from tessera.plan.validate import validate
    from tessera.precision import Precision
    from tessera.topology import dgx_a100

    assert all(Precision.of(p).compute == p for p in PRECISIONS)
    model = load_model(SMALL)
    result = search(model, dgx_a100(), 8, 16, 32, fix={"precision": "fp8"})
    assert result.best is None and result.dropped["the device has no FP8 tensor cores"] > 0
    found, _ = validate(model, Strategy(dp=8, precision="fp8"), dgx_a100(), 8, 16, 32)
    assert any("FP8 tensor cores" in f for f in found)


F64_LAYER = """
from tessera import op


def f64_layer(x, p, heads, kv_heads, mlp, residual=None):
    h = op.astype(x, "float64") @ op.astype(p["wq"], "float64")  # no fp8 matmul takes f64
    return x + op.astype(h, x.dtype) @ p["wo"]
"""


def test_fp8_is_planned_only_for_layers_that_run_in_fp8(tmp_path) -> None:
    """A model whose layer has an op fp8 training cannot run (an f64 matmul) gets no FP8
    plan on an H100 (dropped by the search, a violation for validate); the built-in layer
    and the parallel block example run in fp8."""
    from tessera.plan.layer import fp8_unsupported
    from tessera.plan.search import search
    from tessera.plan.validate import validate
    from tessera.topology import dgx_h100

    path = tmp_path / "f64_block.py"
    path.write_text(F64_LAYER)
    model = load_model(f"{SMALL},layer={path}:f64_layer")
    assert "fp8 matmul" in (fp8_unsupported(model.layer, model.mlp) or "")
    assert fp8_unsupported("", "swiglu") is None
    assert fp8_unsupported("examples/plan_parallel_block.py:parallel_block", "swiglu") is None
    result = search(model, dgx_h100(), 8, 16, 32, fix={"precision": "fp8"})
    assert result.best is None and result.dropped["the model's ops do not all run in FP8"] > 0
    found, _ = validate(model, Strategy(dp=8, precision="fp8"), dgx_h100(), 8, 16, 32)
    assert any("does not run in fp8" in f for f in found), found


def test_parallel_layer_compiles_give_the_serial_ranking() -> None:
    """``jobs=2`` compiles the screening's layer programs in two forked workers: the
    ranking (strategies, step times, memory) equals the serial search's, exactly."""
    from tessera.plan import estimate, layer
    from tessera.plan.search import search
    from tessera.topology import dgx_h100

    model = load_model(SMALL)

    def ranking(jobs: int) -> tuple[list[tuple[object, ...]], int]:
        layer._PROFILES.clear(), layer._LOWERED.clear(), layer._PREFETCHED.clear()
        estimate._profile.cache_clear()
        result = search(model, dgx_h100(), 8, 16, 32, finalists=2, jobs=jobs)
        rows = [(e.strategy, e.step_s, e.memory, e.parts) for e in result.ranked]
        return rows, result.compiled_programs

    serial = ranking(1)
    parallel = ranking(2)
    assert layer._PREFETCHED, "the workers compiled nothing"
    assert parallel == serial


def test_zero3_prices_its_gathers_and_buffers() -> None:
    """ZeRO-3 gathers every layer's parameters twice per microbatch and reduce-scatters
    its gradients: against ZeRO-1 on the same layout its step is no shorter, its exposed
    communication at least one layer's gather and reduce-scatter, and it holds three
    layers' gathered parameters besides its 1/dp share."""
    from tessera.plan.estimate import estimate
    from tessera.plan.strategy import cluster_topology

    model = PRESETS["llama3-8b"]
    topology = cluster_topology("dgx_h100", 64)
    one = estimate(model, Strategy(dp=64, zero=1), topology, 256, 4096)
    three = estimate(model, Strategy(dp=64, zero=3), topology, 256, 4096)
    assert three.step_s > one.step_s
    assert three.exposed_comm_s > 0
    layer = model.dense_layer_params()
    share = model.params() / 64
    assert three.memory.params == pytest.approx(2 * share + 3 * 2 * layer, rel=0.01)


def test_a_tessera_layer_function_as_the_model(capsys: pytest.CaptureFixture[str]) -> None:
    """``layer=file.py:function``: the planner compiles the user's Tessera block (here the
    parallel attention + MLP block: one layer norm, no mid-block residual, so fewer saved
    activations than the sequential block), recommends a plan and dry-runs it."""
    from tessera.plan.layer import profile_layer
    from tessera.topology import dgx_h100

    parallel = load_model(SMALL + ",layer=examples/plan_parallel_block.py:parallel_block")
    shapes = [LayerShape.of(m, 32, 1, 2, 1) for m in (load_model(SMALL), parallel)]
    sequential, block = (profile_layer(shape, dgx_h100()) for shape in shapes)
    assert block.stash_bytes < sequential.stash_bytes
    model = SMALL + ",layer=examples/plan_parallel_block.py:parallel_block"
    args = ["recommend", "--model", model, "--gpus", "4", "--global-batch", "8"]
    assert main([*args, "--no-pareto", "--dry-run", "--json", "--precision", "bf16"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ranked"] and out["dry_run"] is not None
    assert main(["validate", "--model", SMALL + ",layer=nowhere:f", "--gpus", "1"]) == 2
    assert "cannot import 'nowhere'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("schedule", "virtual", "pp", "m"), [("1f1b", 1, 4, 64), ("interleaved", 2, 4, 48), ("zb-h1", 1, 8, 96)]
)  # fmt: skip
def test_pipeline_extension_matches_the_full_simulation(
    schedule: str, virtual: int, pp: int, m: int
) -> None:
    """The estimate simulates at most 4·pp microbatches and extends the makespan at the
    busiest rank's pace: within 0.5% of simulating all ``m`` (uneven stages, p2p time)."""
    from tessera.perf.pipeline_simulate import simulate_pipeline
    from tessera.plan.estimate import _simulated_pipeline
    from tessera.transforms.pipeline_schedules import pipeline_schedule

    stages = pp * virtual
    forward = [1.0 + 0.1 * (i % 3) for i in range(stages)]
    backward = [2.0 * f for f in forward]
    s = Strategy(dp=1, pp=pp, schedule=schedule, virtual=virtual)
    makespan, _ = _simulated_pipeline(s, m, forward, backward, 0.05)
    actions = pipeline_schedule(schedule, pp, m, virtual)
    if schedule == "zb-h1":
        halves = [b / 2 for b in backward]
        full = simulate_pipeline(actions, forward, halves, halves, 0.05)
    else:
        full = simulate_pipeline(actions, forward, backward, 0.0, 0.05)
    assert makespan == pytest.approx(full.makespan_s, rel=0.005)


@pytest.mark.parametrize(
    "strategy",
    [
        Strategy(dp=16, tp=4, zero=1),
        Strategy(dp=4, tp=8, pp=2, schedule="interleaved", virtual=2, remat="full"),
        Strategy(dp=8, tp=2, pp=4, schedule="1f1b", sp=True),
    ],
    ids=["dp-tp", "pp-interleaved-remat", "pp-1f1b-sp"],
)
def test_step_breakdown_sums_to_the_step(strategy: Strategy) -> None:
    """The planner's explanation of a step (compute, recomputation, exposed
    communication, bubble, data-parallel reduction, optimizer) adds up to the predicted
    step time, every part non-negative; recomputation is one forward per layer and
    microbatch exactly when remat=full, and there is a bubble exactly with a pipeline."""
    from tessera.plan.estimate import BREAKDOWN, estimate
    from tessera.plan.strategy import cluster_topology

    model = PRESETS["llama3-8b"]
    result = estimate(model, strategy, cluster_topology("dgx_h100", 64), 256, 4096)
    parts = result.breakdown
    assert set(parts) == set(BREAKDOWN)
    assert sum(parts.values()) == pytest.approx(result.step_s, rel=1e-9)
    assert all(v >= -1e-12 for v in parts.values()), parts
    assert (parts["recompute"] > 0) == (strategy.remat == "full")
    assert (parts["bubble"] > 0) == (strategy.pp > 1)
    if strategy.remat == "full":
        m = strategy.microbatches(256)
        layers = -(-model.layers // (strategy.pp * strategy.virtual)) * strategy.virtual
        forward = result.parts["layer_forward"]
        assert parts["recompute"] == pytest.approx(m * layers * forward, rel=1e-9)
    assert result.headroom_bytes == int(0.9 * result.memory.capacity) - result.memory.total


def test_the_layer_compiles_for_the_clusters_machine() -> None:
    """The planner compiles a layer's tp group on the cluster's first ranks: 16-way tensor
    parallelism stays inside one NVLink domain on a GB200 NVL72 (one-level algorithms)
    but crosses InfiniBand on two DGX H100s (two-level: hierarchical); clusters that
    differ only outside the group share one compiled program."""
    from tessera.plan import layer
    from tessera.plan.strategy import cluster_topology

    model = load_model("layers=2,hidden=512,heads=16,kv_heads=16,ffn=2048,vocab=8")
    shape = LayerShape.of(model, 256, 1, 16, 1)

    def algorithms(cluster: str, gpus: int) -> set[str]:
        lowered = layer.lowered_layer(shape, cluster_topology(cluster, gpus))
        starts = [o for o in lowered.module_at("schedule").walk() if o.name == "schedule.start"]
        assert starts, "the tp layer has collectives"
        return {o.properties["algorithm"].data for o in starts if "algorithm" in o.properties}

    nvl72, dgx = algorithms("gb200_nvl72", 72), algorithms("dgx_h100", 16)
    assert "hierarchical" in dgx and "hierarchical" not in nvl72, (nvl72, dgx)
    machine = layer.layer_machine(cluster_topology("dgx_h100", 64), 16)
    assert machine.num_devices == 16 and [lk.group_size for lk in machine.levels] == [8, 16]

    small = LayerShape.of(model, 256, 1, 8, 1)
    before = layer.compiled_count()
    layer.lowered_layer(small, cluster_topology("dgx_h100", 32))
    layer.lowered_layer(small, cluster_topology("dgx_h100", 128))
    assert layer.compiled_count() == before + 1


MOE = "layers=4,hidden=512,heads=8,kv_heads=8,ffn=1024,vocab=1024,seq=256,experts=16,top_k=4"


def test_node_limited_routing_and_fp8_dispatch_price_the_all_to_all() -> None:
    """An MoE layer's expert all-to-alls, against ``collective_time`` on the same group:
    each pass moves the microbatch's token copies twice (dispatch, combine); with
    ``route_groups`` and an expert group spanning nodes a token crosses at most that many
    nodes (DeepSeek-V3 §3.2.2), and under FP8 one of the two moves is in FP8."""
    from tessera.perf.collective_cost import collective_time
    from tessera.plan.estimate import estimate
    from tessera.plan.models import load_model
    from tessera.plan.strategy import cluster_topology, dp_group

    topology = cluster_topology("dgx_h100", 16)
    s = Strategy(dp=16, ep=16, zero=1)
    group = dp_group(s, 16)  # two nodes
    tokens = 256
    for route_groups, copies in ((0, 4), (2, 2)):
        model = load_model(f"{MOE},route_groups={route_groups}")
        for precision, low in (("bf16", 2), ("fp8", 1)):
            result = estimate(model, Strategy(dp=16, ep=16, zero=1, precision=precision),
                              topology, 64, 256)  # fmt: skip
            elements = tokens * copies * 512
            expected = sum(
                collective_time(topology, "all_to_all", elements * b, group).time_s
                for b in (low, 2)
            )
            assert result.parts["all_to_all"] == pytest.approx(expected, rel=1e-12)


def test_overlapped_all_to_alls_hide_behind_the_other_microbatch() -> None:
    """``moe_overlap`` (DualPipe): a layer's forward and backward all-to-alls hide behind
    the other microbatch's forward and backward compute; only what outlasts it stays
    exposed, and the compute runs on the SMs the communication leaves. It needs ep and
    pp, and ``tessera plan`` says Tessera's pipeline does not run it."""
    from tessera.plan.estimate import OVERLAP_COMM_SM_SHARE, estimate
    from tessera.plan.launch import unsupported
    from tessera.plan.models import load_model
    from tessera.plan.strategy import cluster_topology

    model = load_model(MOE)
    topology = cluster_topology("dgx_h100", 32)
    plain = Strategy(dp=16, pp=2, ep=16, zero=1)
    overlap = Strategy(dp=16, pp=2, ep=16, zero=1, moe_overlap=True)
    a, b = (estimate(model, s, topology, 128, 256) for s in (plain, overlap))
    one_pass, f, w = (a.parts[k] for k in ("all_to_all", "layer_forward", "layer_backward"))
    microbatches, layers = 128 // 16, 2  # per pipeline, per stage
    hidden = 2 * one_pass - max(0.0, 2 * one_pass - (f + w))
    assert hidden > 0
    assert a.breakdown["exposed_comm"] - b.breakdown["exposed_comm"] == pytest.approx(
        microbatches * layers * hidden, rel=1e-9
    )
    slower = (f + w) * (1 / (1 - OVERLAP_COMM_SM_SHARE) - 1)
    assert b.breakdown["compute"] - a.breakdown["compute"] == pytest.approx(
        microbatches * layers * slower, rel=1e-6
    )
    assert "moe_overlap" in " ".join(unsupported(overlap))
    assert any(
        "moe_overlap" in v for v in structural_violations(model, Strategy(dp=16, ep=16, moe_overlap=True), 16, 64, 256)
    )
