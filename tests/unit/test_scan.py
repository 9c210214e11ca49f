"""graph.scan: a region looped over stacked inputs, traced and compiled once, equal to the
unrolled program (values and gradients, on one device and on a dp × tp mesh)."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

import tessera as ts
from tessera import dist, graph, op, optim
from tessera.errors import TraceError

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "examples"))
import comm_volume  # noqa: E402
import llama  # noqa: E402

MESH = dist.mesh({"dp": 2, "tp": 2})
LAYERS = 4
TOL = 1e-12  # float64: only summation order may differ


def layer(p, x):
    return x + op.matmul(op.gelu(op.matmul(x, p["w1"])), p["w2"])


def model(stacked, x):
    """The layers as one scan; each step also emits its input's sum (a stacked output)."""
    x, sums = graph.scan(lambda h, p: (layer(p, h), h.sum()), x, stacked)
    return (x * x).mean() + (sums * sums).sum()


def torch_model(stacked, x):
    total = 0.0
    for i in range(stacked["w1"].shape[0]):
        total = total + x.sum() ** 2
        x = x + torch.nn.functional.gelu(x @ stacked["w1"][i]) @ stacked["w2"][i]
    return (x * x).mean() + total


def _inputs(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    stacked = {
        "w1": torch.randn(LAYERS, 16, 32, generator=g, dtype=torch.float64) * 0.2,
        "w2": torch.randn(LAYERS, 32, 16, generator=g, dtype=torch.float64) * 0.2,
    }
    return stacked, torch.randn(8, 16, generator=g, dtype=torch.float64)


def _torch_grads(stacked, x):
    leaves = {k: v.clone().requires_grad_() for k, v in stacked.items()}
    h = x.clone().requires_grad_()
    torch_model(leaves, h).backward()
    return {k: v.grad for k, v in leaves.items()}, h.grad


def _check(grads, expected) -> None:
    (g, gx), (e, ex) = grads, expected
    assert max((g[k] - e[k]).abs().max().item() for k in g) < TOL
    assert (gx - ex).abs().max().item() < TOL


def _layers_as(
    mode: str, layers: int, block: Any, options: dict[str, Any]
) -> tuple[graph.TrainingStep, dict[str, torch.Tensor]]:
    """A training step of ``layers`` ``block`` layers (``comm_volume``'s Megatron layouts
    on ``MESH``) with ``options``, the layers unrolled, as region calls or as one scan
    over stacked parameters; and its parameters (width 32)."""
    if mode == "scan":

        def step(p, x):
            x, _ = graph.scan(lambda h, q: (block(h, q, 4), None), x, p)
            loss = op.mean(x * x)
            return graph.backward(loss), {"loss": loss}

        specs = comm_volume.stacked_layouts(MESH)
        params = comm_volume.stacked(comm_volume.layer_params(32, layers), layers)
    else:
        layout = comm_volume.layouts(MESH, False)[1]
        layer = graph.region(block) if mode == "regions" else block

        def step(p, x):
            for i in range(layers):
                x = layer(x, {n: p[f"{n}{i}"] for n in layout}, 4)
            loss = op.mean(x * x)
            return graph.backward(loss), {"loss": loss}

        specs = {f"{n}{i}": s for i in range(layers) for n, s in layout.items()}
        params = comm_volume.layer_params(32, layers)
    return graph.training_step(step, param_shardings=specs, **options), params


@pytest.mark.parametrize("kernels", ["reference", "triton"])
def test_values_and_gradients_equal_torch_on_one_device(kernels: str) -> None:
    stacked, x = _inputs()
    assert abs(float(ts.jit(model, kernels=kernels)(stacked, x)) - float(torch_model(stacked, x))) < TOL
    grads = ts.grad(model, argnums=(0, 1), kernels=kernels)(stacked, x)
    _check(grads, _torch_grads(stacked, x))


@pytest.mark.parametrize("kernels", ["reference", "triton"])
def test_gradients_on_a_dp_tp_mesh_equal_torch(kernels: str) -> None:
    stacked, x = _inputs(1)
    specs = {
        "w1": dist.ShardSpec(partition=(2,), mesh_axes=("tp",)),  # column-parallel per layer
        "w2": dist.ShardSpec(partition=(1,), mesh_axes=("tp",)),  # row-parallel per layer
    }
    grad = ts.jit(
        ts.grad(model, argnums=(0, 1)),
        mesh=MESH,
        in_shardings=(specs, dist.ShardSpec(partition=(0,), mesh_axes=("dp",))),
        kernels=kernels,
    )
    _check(grad(stacked, x), _torch_grads(stacked, x))
    text = grad.lower(stacked, x).as_text("schedule")
    assert text.count("schedule.scan @") == 2  # the forward, the backward (reverse)
    assert "all_gather %stacked" not in text  # the weights stay split: no gather
    assert text.count("func.func private @") == 2  # one step function each


def test_the_step_is_traced_once_and_the_program_does_not_grow_with_depth() -> None:
    texts = []
    for layers in (2, 16):
        stacked, x = _inputs()
        stacked = {k: v[:1].expand(layers, *v.shape[1:]).contiguous() for k, v in stacked.items()}
        texts.append(ts.grad(model, kernels="reference").lower(stacked, x).as_text("schedule"))
    assert abs(len(texts[1]) - len(texts[0])) < 0.02 * len(texts[0])


def test_training_step_from_a_scan_equals_the_unrolled_step() -> None:
    layers, results = 3, []
    x = torch.randn(4, 8, 32, generator=torch.Generator().manual_seed(5))
    for scan in (False, True):
        if scan:
            step = comm_volume.scan_training_step(MESH, 0, 4)
            params = comm_volume.stacked(comm_volume.layer_params(32, layers), layers)
        else:
            step = comm_volume.training_step(MESH, 0, layers, 4, True)
            params = comm_volume.layer_params(32, layers)
        state = step.init(params)
        losses = [float(step(state, x)["loss"]) for _ in range(2)]
        final = {k: torch.as_tensor(v) for k, v in state.params.items()}
        results.append((losses, final if scan else comm_volume.stacked(final, layers)))
    (unrolled_losses, unrolled), (scan_losses, scanned) = results
    assert unrolled_losses == pytest.approx(scan_losses, rel=1e-5)  # float32
    assert max((unrolled[k] - scanned[k]).abs().max().item() for k in unrolled) < 1e-5


def test_a_scan_step_updates_its_stacked_state_in_place() -> None:
    """AdamW updates a scan's stacked parameters and moments in the step, in place of the
    donated state, as the unrolled step does: the whole state was one region call whose
    results were new buffers, so the step held a second copy of parameters and moments
    (one device, 8 layers at width 512: peak 1030 MiB against the unrolled 676; now 772,
    the rest being the stacked residuals and gradients, live until the backward scan
    ends). Compiled, not run."""
    layers, width = 8, 512
    flat = comm_volume.layer_params(width, layers, materialize=False)
    x = torch.empty(8, 128, width)
    peaks, texts = [], []
    for scan in (False, True):
        if scan:
            step = comm_volume.scan_training_step(None, 0, 8)
            shapes = comm_volume.stacked({k: torch.empty(v.shape) for k, v in flat.items()}, layers)
        else:
            step = comm_volume.training_step(None, 0, layers, 8, False)
            shapes = flat
        lowered = step.lower(step.init({k: torch.empty(v.shape) for k, v in shapes.items()}), x)
        peaks.append(lowered.memory().peak_bytes)
        texts.append(lowered.as_text("graph"))
    state_copy = 3 * sum(v.numel() * 4 for v in flat.values())  # parameters and two moments
    assert "@_adamw_group" not in texts[1]
    assert peaks[0] < peaks[1] < peaks[0] + state_copy / 2, (peaks, state_copy)


@pytest.mark.parametrize("zero", [2, 3])
def test_zero_shards_a_scan_per_layer_as_unrolled(zero: int) -> None:
    """ZeRO-2/3 on a scan over stacked parameters: the stacks are sharded over dp along a
    dim other than the scanned one, each step reduce-scatters its layer's gradients and
    (ZeRO-3) gathers its layer's parameters, for the forward and again for the backward,
    as the unrolled step does; the scan's parameters after three steps equal the unrolled
    step's (float32: 1e-6). Before, ZeRO split the stacks along the layers, so the scan
    gathered whole stacks and all-reduced whole gradients: ZeRO-3's peak was above
    ZeRO-1's."""
    layers, dim = 4, 32
    x = torch.randn(8, 8, dim, generator=torch.Generator().manual_seed(5))
    found = {}
    for scan in (False, True):
        params = comm_volume.layer_params(dim, layers)
        if scan:
            params = comm_volume.stacked(params, layers)
            step = comm_volume.scan_training_step(MESH, zero, 4)
        else:
            step = comm_volume.training_step(MESH, zero, layers, 4, True)
        state = step.init(params)
        losses = [float(step(state, x)["loss"]) for _ in range(3)]
        kinds = Counter(
            (c.kind, c.mesh_axes) for c in step.lower(state, x).collectives()
        )
        final = {k: torch.as_tensor(v) for k, v in state.params.items()}
        found[scan] = (losses, final if scan else comm_volume.stacked(final, layers), kinds)
    (losses, unrolled, kinds), (scan_losses, scanned, scan_kinds) = found[False], found[True]
    assert scan_losses == pytest.approx(losses, rel=1e-6)
    assert max((unrolled[k] - scanned[k]).abs().max().item() for k in unrolled) < 1e-6
    assert scan_kinds["reduce_scatter", ("dp",)] == kinds["reduce_scatter", ("dp",)] > 0
    assert scan_kinds["all_reduce", ("dp",)] == kinds["all_reduce", ("dp",)] == 1  # the loss
    if zero == 3:  # per layer: its 10 parameters for the forward, again for the backward
        # all but the two layer norms' biases, which it does not read
        assert scan_kinds["all_gather", ("dp",)] == (10 + 8) * layers


def test_scan_zero_benchmark_moves_the_unrolled_bytes() -> None:
    """``benchmarks/scan_zero.py`` at toy size: under ZeRO-2 and ZeRO-3 the scan's dp
    collectives receive the unrolled step's bytes per rank (to 1%: the scan's step
    reduces the first layer's input gradient too; before, ZeRO-2 received 1.5× as much)."""
    import argparse

    import scan_zero

    args = argparse.Namespace(dim=64, heads=4, seq=16, batch=4, precision=None, accumulate=1)
    for zero in (2, 3):
        unrolled, scan = (scan_zero.measure(2, zero, f, args) for f in ("unrolled", "scan"))
        assert scan["moved"] == pytest.approx(unrolled["moved"], rel=0.01), (zero, unrolled, scan)


@pytest.mark.parametrize("zero", [0, 2, 3])
def test_region_and_scan_gradients_are_reduced_in_f32_as_unrolled(zero: int) -> None:
    """bf16 with f32 reductions and 2 microbatches, the layers unrolled, as region calls
    and as one scan: every form reduces the gradients over dp in f32 and receives the
    unrolled step's bytes for them under ZeRO-0 (the microbatches' sum all-reduced once,
    as DDP's ``no_sync``); under ZeRO-2/3 every form reduce-scatters each gradient (the
    region's and scan's per microbatch, as DeepSpeed's ZeRO-2 does; unrolled once, after
    the sum) and makes no dp all-reduce but the loss's. The losses of three steps agree
    (bf16 compute, f32 sums in other orders: 2e-3 relative). Before, a region call or
    scan all-reduced each gradient whole, in bf16, once per microbatch."""
    layers = 2
    options = {
        "zero": zero, "precision": "bf16", "accumulate": 2, "kernels": "reference",
        "mesh": MESH, "optimizer": optim.AdamW(lr=1e-3),
    }  # fmt: skip
    x = torch.randn(8, 8, 32, generator=torch.Generator().manual_seed(5))
    found, reduced = {}, {}
    for mode in ("unrolled", "regions", "scan"):
        train, params = _layers_as(mode, layers, comm_volume.transformer_layer, options)
        state = train.init(params)
        losses = [float(train(state, x)["loss"]) for _ in range(3)]
        moves = [c for c in train.lower(state, x).collectives() if "dp" in c.mesh_axes]
        found[mode] = losses
        # the gradients' (the loss's, a bf16 scalar, aside)
        reductions = [c for c in moves if c.kind in ("reduce_scatter", "all_reduce") and c.shape]
        assert {c.dtype for c in reductions} == {"f32"}, mode
        if zero == 0:
            reduced[mode] = sum(c.nbytes for c in reductions)
            continue
        scatters = [c for c in moves if c.kind == "reduce_scatter"]
        assert sum(c.kind == "all_reduce" for c in moves) == 1, (mode, moves)  # the loss
        per_microbatch = 2 if mode != "unrolled" else 1
        assert len(scatters) == per_microbatch * 10 * layers, (mode, len(scatters))
    if zero == 0:
        assert reduced["regions"] == reduced["scan"] == reduced["unrolled"], reduced
    assert found["regions"] == pytest.approx(found["unrolled"], rel=2e-3)
    assert found["scan"] == pytest.approx(found["unrolled"], rel=2e-3)


def test_zero3_of_a_scan_holds_one_layer_at_a_time() -> None:
    """The peak of a ZeRO-3 scan step (8 layers at width 256 on dp × tp = 2 × 2) is below
    its ZeRO-1 peak by at least half the parameters' bytes a rank no longer holds
    whole (ZeRO-1 keeps every parameter whole; ZeRO-3 one dp shard of each, and the
    whole of one layer while it computes). Compiled, not run."""
    layers, width = 8, 256
    shapes = comm_volume.stacked(
        {k: torch.empty(v.shape) for k, v in comm_volume.layer_params(width, layers, False).items()},
        layers,
    )
    peaks = {}
    for zero in (1, 3):
        step = comm_volume.scan_training_step(MESH, zero, 4)
        state = step.init({k: torch.empty(v.shape) for k, v in shapes.items()})
        peaks[zero] = step.lower(state, torch.empty(4, 64, width)).memory().peak_bytes
    per_rank = sum(v.numel() * 4 / (2 if v.dim() == 3 else 1) for v in shapes.values())  # tp
    assert peaks[3] < peaks[1] - per_rank / 2 / 2, (peaks, per_rank)


def test_llama_as_a_scan_equals_llama_unrolled() -> None:
    """The Llama example's loss and gradients, its layers a scan over stacked parameters
    (each step a checkpointed block), against the unrolled model, float64."""
    config = llama.LlamaConfig(layers=3)
    params = llama.init_params(config, dtype=torch.float64)
    g = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, config.vocab, (2, config.seq), generator=g)
    targets = torch.randint(0, config.vocab, (2, config.seq), generator=g)

    def unrolled(p, t, y):
        return llama.loss(p, t, y, config)

    def scanned(p, t, y):
        return llama.loss(p, t, y, config, scan=True)

    value, grads = ts.value_and_grad(unrolled, kernels="reference")(params, tokens, targets)
    stacked = llama.stacked_params(params, config)
    scan_value, scan_grads = ts.value_and_grad(scanned, kernels="reference")(stacked, tokens, targets)
    assert abs(float(value) - float(scan_value)) < TOL
    expected = llama.stacked_params(grads, config)
    assert max((scan_grads[k] - expected[k]).abs().max().item() for k in expected) < TOL


def test_a_carry_that_changes_shape_is_an_error() -> None:
    with pytest.raises(TraceError, match="the carry must keep its structure, shapes and dtypes"):
        ts.jit(lambda x, w: graph.scan(lambda h, v: (h.sum(), None), x, w)[0], kernels="reference")(
            torch.randn(3), torch.randn(2, 3)
        )


def test_xs_of_different_lengths_are_an_error() -> None:
    with pytest.raises(TraceError, match="xs must be tensors of one leading length"):
        ts.jit(
            lambda x, a, b: graph.scan(lambda h, v: (h, None), x, (a, b))[0], kernels="reference"
        )(torch.randn(3), torch.randn(2, 3), torch.randn(4, 3))


def test_a_step_must_return_carry_and_y() -> None:
    with pytest.raises(TraceError, match=r"must return \(carry, y\)"):
        ts.jit(lambda x, w: graph.scan(lambda h, v: h, x, w), kernels="reference")(
            torch.randn(3), torch.randn(2, 3)
        )


def test_outside_tracing_scan_runs_step_by_step() -> None:
    carry, ys = graph.scan(lambda c, x: (c + x, c * x), torch.zeros(2), torch.ones(3, 2))
    assert torch.equal(carry, torch.full((2,), 3.0))
    assert torch.equal(ys, torch.tensor([[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]]))


def test_regions_and_scans_over_four_processes() -> None:
    """The same training step unrolled, as region calls (stacked and rolled into a scan,
    and kept as calls) and as a scan, each process running its rank's programs with gloo
    collectives: the four agree on every rank."""
    from test_distributed import SCRIPTS, tessera_run

    result = tessera_run(4, SCRIPTS / "regions.py", kernels="reference", limit=240.0, timeout=180.0)
    assert result.returncode == 0, result.stderr[-3000:]
    for rank in range(4):
        assert f"rank {rank}: unrolled, regions, calls and scan losses" in result.stdout


def test_zero3_regions_and_scans_over_four_processes() -> None:
    """The same under ZeRO-3: each process re-cuts its shards of the scan's stacks when
    the first trace finds them scanned (the stacks move from a split over the layers to
    a split inside each layer), and the four forms still agree on every rank."""
    from test_distributed import SCRIPTS, tessera_run

    result = tessera_run(
        4, SCRIPTS / "regions.py", "3", kernels="reference", limit=240.0, timeout=180.0
    )
    assert result.returncode == 0, result.stderr[-3000:]
    for rank in range(4):
        assert f"rank {rank}: unrolled, regions, calls and scan losses" in result.stdout


def test_every_training_option_at_once_agrees_unrolled_regions_and_scan() -> None:
    """ZeRO-2, bf16, clipping, accumulation, checkpointed layers and a warmup-cosine
    schedule on dp × tp: the layers unrolled, as region calls and as one scan give the
    same losses (bf16 compute: 1e-2 relative)."""
    layers = 3
    block = graph.checkpoint(comm_volume.transformer_layer)
    options = {
        "zero": 2, "precision": "bf16", "clip_grad_norm": 0.5, "accumulate": 2,
        "remat": "nothing", "kernels": "reference", "mesh": MESH,
        "optimizer": optim.AdamW(lr=optim.schedules.warmup_cosine(1e-3, 2, 10)),
    }  # fmt: skip
    found = {}
    for mode in ("unrolled", "regions", "scan"):
        train, params = _layers_as(mode, layers, block, options)
        state = train.init(params)
        x = torch.randn(8, 8, 32, generator=torch.Generator().manual_seed(5))
        found[mode] = [float(train(state, x)["loss"]) for _ in range(3)]
    assert found["regions"] == pytest.approx(found["unrolled"], rel=1e-2)
    assert found["scan"] == pytest.approx(found["unrolled"], rel=1e-2)


def test_a_pipelined_step_of_one_scan_per_stage_equals_the_unrolled_one() -> None:
    """pp2 × dp2, 1F1B: each stage one scan over its half of the stacked layers."""
    from tessera import schedule

    layers, mesh = 4, dist.mesh({"pp": 2, "dp": 2})
    names = list(comm_volume.layouts(MESH, False)[1])

    def scanned(p, x):
        for half in ("first", "second"):
            if half == "second":
                graph.stage()
            x, _ = graph.scan(
                lambda h, q: (comm_volume.transformer_layer(h, q, 4), None), x, p[half]
            )
        loss = op.mean(x * x)
        return graph.backward(loss), {"loss": loss}

    def unrolled(p, x):
        for i in range(layers):
            if i == layers // 2:
                graph.stage()
            x = comm_volume.transformer_layer(x, {n: p[f"{n}{i}"] for n in names}, 4)
        loss = op.mean(x * x)
        return graph.backward(loss), {"loss": loss}

    flat = comm_volume.layer_params(32, layers)
    stacked = comm_volume.stacked(flat, layers)
    halves = {
        "first": {k: v[:2].clone() for k, v in stacked.items()},
        "second": {k: v[2:].clone() for k, v in stacked.items()},
    }
    found = []
    for fn, params in ((unrolled, flat), (scanned, halves)):
        train = graph.training_step(
            fn, optimizer=optim.AdamW(lr=1e-3), mesh=mesh, kernels="reference"
        )
        state = train.init(params)
        x = torch.randn(8, 8, 32, generator=torch.Generator().manual_seed(0))
        with schedule.pipeline_microbatches(2, kind="1f1b"):
            found.append([float(train(state, x)["loss"]) for _ in range(2)])
    assert found[1] == pytest.approx(found[0], rel=1e-6)
