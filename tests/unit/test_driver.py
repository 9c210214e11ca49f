"""The compile driver: every stage of a compiled program is reproduced by ``tessera-opt``
given the previous stage's text and the stage's ``-p`` string, so the pipeline a
``ts.jit`` function runs is exactly the declared one; a gradient program's backward is
the driver's ``autodiff`` stage; the config holds what the user's context managers and
a training step's options set when the program was traced."""

from __future__ import annotations

import contextlib
import dataclasses
import io
from pathlib import Path

import pytest
import torch

import tessera as ts
from tessera import dist, graph, numerics, op, optim, schedule
from tessera.driver import (
    STAGES,
    CompileConfig,
    pipeline_string,
    previous_stage,
    program_stages,
    stage_passes,
)
from tessera.precision import Precision
from tessera.tools.opt import main as tessera_opt
from tessera.transforms.remat import RematPolicy


def replay(text: str, pipeline: str, tmp_path: Path) -> str:
    source = tmp_path / "in.mlir"
    source.write_text(text)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert tessera_opt([str(source), "-p", pipeline]) == 0
    return out.getvalue()


def megatron_mlp() -> ts.Lowered:
    mesh = dist.mesh({"dp": 2, "tp": 2})
    batch = dist.ShardSpec(partition=(0,), mesh_axes=("dp",))
    cols = dist.ShardSpec(partition=(1,), mesh_axes=("tp",))
    rows = dist.ShardSpec(partition=(0,), mesh_axes=("tp",))
    f = ts.jit(lambda x, w1, w2: op.gelu(x @ w1) @ w2, mesh=mesh, in_shardings=(batch, cols, rows))
    return f.lower(torch.randn(16, 64), torch.randn(64, 128), torch.randn(128, 64))


def training_step() -> ts.Lowered:
    mesh = dist.mesh({"dp": 2, "tp": 2})
    cols = dist.ShardSpec(partition=(1,), mesh_axes=("tp",))
    rows = dist.ShardSpec(partition=(0,), mesh_axes=("tp",))

    @graph.training_step(
        optimizer=optim.AdamW(lr=1e-3), mesh=mesh, zero=2, param_shardings={"w1": cols, "w2": rows}
    )
    def step(params, x, y):
        out = op.gelu(x @ params["w1"]) @ params["w2"]
        loss = op.mean((out - y) * (out - y))
        return graph.backward(loss), {"loss": loss}

    state = step.init({"w1": torch.randn(32, 64) / 6, "w2": torch.randn(64, 32) / 8})
    return step.lower(state, torch.randn(16, 32), torch.randn(16, 32))


def grad_with_options() -> ts.Lowered:
    mesh = dist.mesh({"dp": 2})
    batch = dist.ShardSpec(partition=(0,), mesh_axes=("dp",))
    loss = ts.grad(lambda w, x: op.sum(op.tanh(x @ w)), mesh=mesh, in_shardings=(None, batch))
    with schedule.options(bucket_bytes=1024, collective_algorithms=False):
        return loss.lower(torch.randn(16, 16), torch.randn(32, 16))


def checkpointed_loss(params, x):
    """A tanh MLP whose first layer is a ``graph.checkpoint`` block, its loss and an aux value."""
    h = graph.checkpoint(lambda h: op.tanh(h @ params["w1"]))(x)
    y = op.gelu(h @ params["w2"])
    return op.mean(y * y), {"h_sum": op.sum(h)}


def torch_checkpointed_loss(params, x):
    h = torch.tanh(x @ params["w1"])
    y = torch.nn.functional.gelu(h @ params["w2"])
    return (y * y).mean(), {"h_sum": h.sum()}


def grad_with_aux() -> ts.Lowered:
    g = torch.Generator().manual_seed(0)
    params = {"w1": torch.randn(8, 16, generator=g), "w2": torch.randn(16, 4, generator=g)}
    grads = ts.grad(checkpointed_loss, argnums=(1, 0), has_aux=True, kernels="reference")
    return grads.lower(params, torch.randn(6, 8, generator=g))


@pytest.mark.parametrize("program", [megatron_mlp, training_step, grad_with_options, grad_with_aux])
def test_tessera_opt_reproduces_every_stage(program, tmp_path: Path) -> None:
    lowered = program()
    for stage in STAGES[1:]:
        previous = lowered.as_text(previous_stage(stage))
        assert (
            replay(previous, lowered.pipeline(stage), tmp_path).strip()
            == lowered.as_text(stage).strip()
        ), f"stage {stage!r} differs when replayed with tessera-opt"


def test_a_gradient_program_replays_from_its_traced_forward(tmp_path: Path) -> None:
    """``ts.grad`` traces the forward only; the pipeline string, from its ``autodiff``
    stage on, replays the traced text to the driver's module at every stage."""
    lowered = grad_with_aux()
    traced = lowered.as_text("traced")
    assert "graph.transpose" not in traced  # no backward op yet: the forward returns
    assert "-> (tensor<f32>, tensor<f32>)" in traced  # the loss and the aux value
    assert lowered.pipeline("autodiff") == (
        'autodiff{function="checkpointed_loss" in_place=true remat="nothing" '
        "results=2,3,4,1 wrt=2,0,1}"
    )
    assert lowered.pipeline().startswith(lowered.pipeline("autodiff") + ",canonicalize,")
    stages = program_stages(lowered.config)
    assert stages == STAGES
    for index, stage in enumerate(stages[1:], start=1):
        replayed = replay(traced, lowered.pipeline(*stages[1 : index + 1]), tmp_path)
        assert replayed.strip() == lowered.as_text(stage).strip(), f"stage {stage!r} differs"
    assert program_stages(megatron_mlp().config) == tuple(s for s in STAGES if s != "autodiff")


def test_the_autodiff_stage_computes_torch_autograd_gradients() -> None:
    """The gradients, loss and aux value of ``ts.value_and_grad`` and ``ts.grad``
    (checkpointed block recomputed) equal torch.autograd's, in float64, to 1e-10."""
    g = torch.Generator().manual_seed(1)
    params = {
        "w1": torch.randn(8, 16, generator=g, dtype=torch.float64),
        "w2": torch.randn(16, 4, generator=g, dtype=torch.float64),
    }
    x = torch.randn(6, 8, generator=g, dtype=torch.float64)
    leaves = [t.clone().requires_grad_() for t in (params["w1"], params["w2"], x)]
    loss, aux = torch_checkpointed_loss({"w1": leaves[0], "w2": leaves[1]}, leaves[2])
    dw1, dw2, dx = torch.autograd.grad(loss, leaves)
    tolerance = {"rtol": 1e-10, "atol": 1e-12}

    grads = ts.grad(checkpointed_loss, argnums=(1, 0), has_aux=True, kernels="reference")
    (got_dx, got_dparams), got_aux = grads(params, x)
    torch.testing.assert_close(got_dx, dx, **tolerance)
    torch.testing.assert_close(got_dparams["w1"], dw1, **tolerance)
    torch.testing.assert_close(got_dparams["w2"], dw2, **tolerance)
    torch.testing.assert_close(got_aux["h_sum"], aux["h_sum"].detach(), **tolerance)

    value_and_grad = ts.value_and_grad(lambda p, x: checkpointed_loss(p, x)[0], kernels="reference")
    got_loss, got = value_and_grad(params, x)
    torch.testing.assert_close(got_loss, loss.detach(), **tolerance)
    torch.testing.assert_close(got["w1"], dw1, **tolerance)
    torch.testing.assert_close(got["w2"], dw2, **tolerance)
    assert "results" not in value_and_grad.lower(params, x).pipeline("autodiff")


def test_a_backward_that_cannot_be_built_fails_when_traced() -> None:
    """The autodiff stage of a ``ts.grad`` program runs when it is traced: an op without
    a VJP is a TesseraError from ``lower``, as it is inside traced code."""
    inner = ts.grad(lambda q: op.sum(op.attention(q, q, q)))
    outer = ts.grad(lambda q: op.sum(inner(q)))
    with pytest.raises(ts.TesseraError, match="attention_backward is not differentiable"):
        outer.lower(torch.randn(1, 2, 8, 4))


def test_the_config_holds_what_the_context_managers_set() -> None:
    """The user's schedule options and numerics mode are read into the config when the
    program is traced (a call in another mode traces again); a training step records its
    remat and precision; collective-matmul's simulation prices the config's numerics."""
    f = ts.jit(lambda x: op.sum(x * x))
    x = torch.randn(4)
    with numerics.mode_of("deterministic"), schedule.options(collective_matmul=True):
        lowered = f.lower(x)
        config = f.compile_config()
    assert config == lowered.config
    assert (lowered.config.numerics, lowered.config.schedule.collective_matmul) == (
        "deterministic",
        True,
    )
    # no topology option: the pass prices the graph.mesh symbol's (else DGX H100s)
    assert 'collective-matmul{chunks=0 numerics="deterministic"}' in (
        lowered.pipeline("schedule")
    )
    assert f.lower(x).config == CompileConfig(kernels=lowered.config.kernels)
    assert f.trace_count == 2

    @graph.training_step(optimizer=optim.SGD(lr=0.1), remat="matmuls", precision="bf16",
                         numerics="deterministic")  # fmt: skip
    def step(params, x):
        return graph.backward(op.sum(op.tanh(x @ params["w"]))), {}

    state = step.init({"w": torch.randn(4, 4)})
    config = step.lower(state, torch.randn(2, 4)).config
    assert config.remat == RematPolicy("matmuls")
    assert config.precision == Precision("bf16")
    assert config.numerics == "deterministic"


def test_pipeline_string_is_the_declared_stages() -> None:
    lowered = grad_with_options()
    assert lowered.pipeline() == ",".join(lowered.pipeline(stage) for stage in STAGES[1:])
    assert lowered.pipeline("graph") == "canonicalize,cse,dce"
    assert lowered.pipeline("schedule").startswith(
        "hoist-all-gathers,bucket-gradients{bucket_bytes=1024}"
    )
    assert "choose-collective-algorithms" not in lowered.pipeline()
    default = CompileConfig()
    assert pipeline_string(default).split(",")[:6] == [
        "canonicalize",
        "cse",
        "dce",
        "shard-propagate",
        "insert-collectives",
        "shard-partition",
    ]
    assert stage_passes("traced", default) == []


def test_compile_config_is_immutable_and_checked() -> None:
    config = CompileConfig(kernels="reference")
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.kernels = "triton"  # type: ignore[misc]
    with pytest.raises(ts.TesseraError, match="kernels must be one of"):
        CompileConfig(kernels="cuda")
    with pytest.raises(ts.TesseraError, match="unknown stage"):
        stage_passes("optimized", config)
