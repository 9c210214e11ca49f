"""The compile driver: every stage of a compiled program is reproduced by ``tessera-opt``
given the previous stage's text and the stage's ``-p`` string, so the pipeline a
``ts.jit`` function runs is exactly the declared one."""

from __future__ import annotations

import contextlib
import dataclasses
import io
from pathlib import Path

import pytest
import torch

import tessera as ts
from tessera import dist, graph, op, optim, schedule
from tessera.driver import STAGES, CompileConfig, pipeline_string, previous_stage, stage_passes
from tessera.tools.opt import main as tessera_opt


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


@pytest.mark.parametrize("program", [megatron_mlp, training_step, grad_with_options])
def test_tessera_opt_reproduces_every_stage(program, tmp_path: Path) -> None:
    lowered = program()
    for stage in STAGES[1:]:
        previous = lowered.as_text(previous_stage(stage))
        assert (
            replay(previous, lowered.pipeline(stage), tmp_path).strip()
            == lowered.as_text(stage).strip()
        ), f"stage {stage!r} differs when replayed with tessera-opt"


def test_pipeline_string_is_the_declared_stages() -> None:
    lowered = grad_with_options()
    assert lowered.pipeline() == ",".join(lowered.pipeline(stage) for stage in STAGES[1:])
    assert lowered.pipeline("graph") == "canonicalize,cse,dce"
    assert lowered.pipeline("schedule").startswith("bucket-gradients{bucket_bytes=1024}")
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
