"""Layer stacks: a training step whose layers are calls of one ``graph.region`` keeps
their parameters stacked and rolls the calls into one ``graph.scan``
(``tessera.training.layer_stacks``, ``tessera.frontend.roll_regions``). Each test
compares against the same step with its layers unrolled (float32: 1e-5 relative), and
checks that the layers did (or, where they cannot, did not) become one scan."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from tessera import dist, graph, op, optim

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import comm_volume

MESH = dist.mesh({"dp": 2, "tp": 2})
LAYOUT = comm_volume.layouts(MESH, False)[1]
NAMES = list(LAYOUT)


def _step(
    layers: int, regions: bool, extra: Any = None, table: bool = False, **options: Any
) -> graph.TrainingStep:
    """``layers`` transformer layers (width 32, Megatron layouts on dp × tp), as region
    calls or unrolled, under a mean-square loss plus ``extra(params, hidden states)``;
    with ``table`` every layer also reads one tensor made from the batch."""
    block = comm_volume.transformer_layer
    if table:

        def block(x: Any, p: Any, heads: int, shift: Any) -> Any:  # type: ignore[misc]
            return comm_volume.transformer_layer(x + shift, p, heads)

    layer = graph.region(block) if regions else block

    def step(p: Any, x: Any) -> Any:
        hidden = []
        shift = op.mean(x, axis=0) * 0.5 if table else None
        for i in range(layers):
            args = (shift,) if table else ()
            x = layer(x, {n: p[f"{n}{i}"] for n in NAMES}, 4, *args)
            hidden.append(x)
        loss = op.mean(x * x)
        if extra is not None:
            loss = loss + extra(p, hidden)
        return graph.backward(loss), {"loss": loss}

    options = {"optimizer": optim.AdamW(lr=1e-2), "kernels": "reference"} | options
    specs = {f"{n}{i}": s for i in range(layers) for n, s in LAYOUT.items()}
    return graph.training_step(step, mesh=MESH, param_shardings=specs, **options)


def _trained(step: graph.TrainingStep, layers: int, steps: int = 2) -> tuple[list[float], Any, Any]:
    """Losses of ``steps`` steps, the final parameters and the step's graph (compiled
    to the ``graph`` stage: dead ops removed)."""
    state = step.init(comm_volume.layer_params(32, layers))
    x = torch.randn(4, 8, 32, generator=torch.Generator().manual_seed(5))
    text = step.lower(state, x).as_text("graph")
    losses = [float(step(state, x)["loss"]) for _ in range(steps)]
    params = step.state_dict(state)["params"]
    return losses, {k: torch.as_tensor(v).clone() for k, v in params.items()}, text


def _step_function(text: str) -> str:
    return text.split("func.func private")[0]


def _rolled(text: str) -> bool:
    """Whether the step's layers are one scan (its forward and its backward), no call."""
    return (
        text.count("_scan_fwd(") == 1 and text.count("_scan_bwd(") == 1 and "graph.call @" not in text
    )


def _agree(layers: int, **step_options: Any) -> tuple[str, str]:
    """Trains the step unrolled and from regions; checks they agree; returns the traced
    step functions (unrolled, regions)."""
    unrolled = _trained(_step(layers, False, **step_options), layers)
    regions = _trained(_step(layers, True, **step_options), layers)
    assert regions[0] == pytest.approx(unrolled[0], rel=1e-5)
    for name, value in unrolled[1].items():
        torch.testing.assert_close(regions[1][name], value, rtol=1e-5, atol=1e-6)
    return _step_function(unrolled[2]), _step_function(regions[2])


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_region_layers_become_one_scan_over_stacked_parameters(zero: int) -> None:
    layers = 3
    unrolled, text = _agree(layers, zero=zero)
    assert _rolled(text)
    # the step takes each of the ten kinds of layer parameter as one stack of 3
    (signature,) = [line for line in text.splitlines() if "func.func @step(" in line]
    (unrolled_signature,) = [line for line in unrolled.splitlines() if "func.func @step(" in line]
    assert signature.count("%params") == 10 and unrolled_signature.count("%params") == 30


def test_the_state_holds_each_layer_as_a_view_into_its_stack() -> None:
    layers = 3
    step = _step(layers, True)
    state = step.init(comm_volume.layer_params(32, layers))
    x = torch.randn(4, 8, 32)
    step(state, x)
    stacks = {name: state.params[f"{name}0"]._base for name in NAMES}
    for name, stack in stacks.items():
        assert stack is not None and stack.shape[0] == layers
        for i in range(layers):
            leaf = state.params[f"{name}{i}"]
            assert leaf._base is stack and torch.equal(leaf, stack[i])
    before = {k: v.clone() for k, v in state.params.items()}
    step(state, x)  # updated in place: the views see the new values
    assert all(not torch.equal(before[k], state.params[k]) for k in before)
    m = state.opt_state["m"]
    assert m["wq1"]._base is m["wq0"]._base  # the moments are stacked too


def test_a_tensor_every_layer_reads_is_carried_through_the_scan() -> None:
    _, text = _agree(3, table=True)
    assert _rolled(text)


def test_a_parameter_read_outside_the_layers_too_is_sliced_from_its_stack() -> None:
    def penalty(p: Any, hidden: Any) -> Any:
        return op.sum(p["w10"] * p["w10"]) * 1e-2

    _, text = _agree(3, extra=penalty)
    assert _rolled(text) and "graph.slice" in text


def test_layers_whose_outputs_are_read_elsewhere_stay_calls() -> None:
    """Each layer's output feeds the loss too: no scan can give it, so the layers stay
    region calls (updated one call per layer), with the same values."""

    def every_layer(p: Any, hidden: Any) -> Any:
        return sum(op.mean(h) for h in hidden[:-1]) * 0.1

    _, text = _agree(3, extra=every_layer)
    assert "graph.scan" not in text and text.count("graph.call @transformer_layer_fwd(") == 3
    assert text.count("graph.call @_adamw_group(") == 3


def test_a_weight_decay_mask_that_differs_between_layers_keeps_them_calls() -> None:
    only_first = optim.AdamW(lr=1e-2, weight_decay_mask=lambda name: name == "wq0")
    _, text = _agree(3, optimizer=only_first)
    assert "graph.scan" not in text


def test_a_weight_decay_mask_alike_in_every_layer_applies_to_the_stacks() -> None:
    matrices = optim.AdamW(lr=1e-2, weight_decay=0.5, weight_decay_mask=lambda n: n[0] == "w")
    _, text = _agree(3, optimizer=matrices)
    assert _rolled(text)


@pytest.mark.parametrize("zero", [2, 3])
def test_every_option_at_once_rolls_and_agrees(zero: int) -> None:
    """ZeRO-2/3, bf16, clipping, accumulation and a warmup-cosine schedule (bf16 compute:
    losses to 1e-2 relative, as tests/unit/test_scan.py's)."""
    layers = 3
    options = {
        "zero": zero, "precision": "bf16", "clip_grad_norm": 0.5, "accumulate": 2,
        "optimizer": optim.AdamW(lr=optim.schedules.warmup_cosine(1e-3, 2, 10)),
    }  # fmt: skip
    found = []
    for regions in (False, True):
        step = _step(layers, regions, **options)
        state = step.init(comm_volume.layer_params(32, layers))
        x = torch.randn(8, 8, 32, generator=torch.Generator().manual_seed(5))
        text = _step_function(step.lower(state, x).as_text("graph"))
        found.append([float(step(state, x)["loss"]) for _ in range(3)])
    assert text.count("_scan_fwd(") == 2  # one per microbatch
    assert found[1] == pytest.approx(found[0], rel=1e-2)


def test_the_compiled_step_does_not_grow_with_depth() -> None:
    """Schedule IR text and traced ops of the step at 4 and 16 layers: the same to 2%
    (each more layer adds only its place in the stacks' shapes)."""
    sizes = []
    for layers in (4, 16):
        step = _step(layers, True)
        state = step.init({k: torch.empty(v.shape) for k, v in comm_volume.layer_params(32, layers, False).items()})
        lowered = step.lower(state, torch.empty(4, 8, 32))
        sizes.append((len(lowered.as_text("schedule")), sum(1 for _ in lowered.module_at("graph").walk())))
    (text4, ops4), (text16, ops16) = sizes
    assert text16 < 1.02 * text4 and ops16 == ops4, sizes


def test_llama_layers_as_regions_roll_and_train_as_unrolled() -> None:
    """The Llama example (GQA, SwiGLU, RoPE; each layer a checkpointed block) as region
    calls on dp × tp with ZeRO-1 and remat: rolled into one scan, the same losses and
    parameters as the unrolled layers after two AdamW steps (float64: 1e-9)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
    import llama

    config = llama.LlamaConfig(layers=3)
    g = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, config.vocab, (4, config.seq), generator=g)
    targets = torch.randint(0, config.vocab, (4, config.seq), generator=g)
    found = []
    for regions in (False, True):

        def step(p: Any, t: Any, y: Any, regions: bool = regions) -> Any:
            loss = llama.loss(p, t, y, config, regions=regions)
            return graph.backward(loss), {"loss": loss}

        params = llama.init_params(config, dtype=torch.float64)
        train = graph.training_step(
            step, optimizer=optim.AdamW(lr=1e-2), mesh=MESH, zero=1, remat="nothing",
            param_shardings=llama.megatron_layout(params), kernels="reference",
        )  # fmt: skip
        state = train.init(params)
        text = _step_function(train.lower(state, tokens, targets).as_text("graph"))
        losses = [float(train(state, tokens, targets)["loss"]) for _ in range(2)]
        found.append((losses, {k: v.clone() for k, v in state.params.items()}, text))
    (losses, params, _), (region_losses, region_params, text) = found
    assert _rolled(text)
    assert region_losses == pytest.approx(losses, rel=1e-9)
    for name, value in params.items():
        torch.testing.assert_close(region_params[name], value, rtol=1e-9, atol=1e-12)


def test_an_error_in_the_step_function_names_the_users_line() -> None:
    """The first compile traces the forward once to find the layers; an error there is
    the step's own error, raised by its trace at the user's line, not a failure to find
    the layers."""
    layer = graph.region(comm_volume.transformer_layer)

    def step(p: Any, x: Any) -> Any:
        x = layer(x, {n: p[f"{n}0"] for n in NAMES}, 4)
        loss = op.mean(x @ p["w10"] @ p["w10"])  # [4, 8, 32] @ [32, 128] @ [32, 128]
        return graph.backward(loss), {"loss": loss}

    specs = {f"{n}0": s for n, s in LAYOUT.items()}
    train = graph.training_step(
        step, optimizer=optim.AdamW(lr=1e-2), mesh=MESH, param_shardings=specs,
        kernels="reference",
    )  # fmt: skip
    state = train.init(comm_volume.layer_params(32, 1))
    with pytest.raises(Exception, match=r"test_layer_stacks\.py:\d+") as error:
        train(state, torch.randn(4, 8, 32))
    assert "matmul" in str(error.value)


def test_a_layer_the_user_replaces_is_stacked_again() -> None:
    """A state leaf replaced between steps (here layer 1's ``wq``, set to zeros) is no
    longer a view into its stack: the next step stacks the layers again, with the new
    value, and agrees with the unrolled step given the same replacement."""
    layers, x = 3, torch.randn(4, 8, 32, generator=torch.Generator().manual_seed(1))
    found = []
    for regions in (False, True):
        step = _step(layers, regions)
        state = step.init(comm_volume.layer_params(32, layers))
        step(state, x)
        state.params["wq1"] = torch.zeros(32, 32)
        step(state, x)
        found.append({k: v.clone() for k, v in state.params.items()})
    stack = state.params["wq0"]._base
    assert stack is not None and state.params["wq1"]._base is stack
    for name, value in found[0].items():
        torch.testing.assert_close(found[1][name], value, rtol=1e-5, atol=1e-6)
