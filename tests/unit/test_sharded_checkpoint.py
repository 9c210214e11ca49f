"""Sharded checkpoints (``step.save`` / ``step.restore``, torch.distributed.checkpoint):
a state saved on one mesh resumes on another and continues with an uninterrupted run's
losses and parameters, bit for bit (reference kernels; the same programs up to the
layout, whose reductions add the same terms: checked equal); saves are atomic;
broken checkpoints are errors naming the tensor or the file."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tessera import dist, graph, op, optim
from tessera.errors import TesseraError

COLS = dist.ShardSpec(partition=(1,), mesh_axes=("tp",))
ROWS = dist.ShardSpec(partition=(0,), mesh_axes=("tp",))


def make_step(axes: dict[str, int], zero: int = 0):
    mesh = dist.mesh(axes)
    tp = "tp" in axes

    @graph.training_step(optimizer=optim.AdamW(lr=1e-2), mesh=mesh, zero=zero, kernels="reference",
                         param_shardings={"w1": COLS, "w2": ROWS} if tp else None)  # fmt: skip
    def step(p, x, y):
        loss = op.mean((op.gelu(x @ p["w1"]) @ p["w2"] - y) ** 2)
        return graph.backward(loss), {"loss": loss}

    return step


def init():
    g = torch.Generator().manual_seed(2)
    params = {"w1": torch.randn(8, 32, generator=g) / 3, "w2": torch.randn(32, 8, generator=g) / 6}
    return params, torch.randn(16, 8, generator=g), torch.randn(16, 8, generator=g)


def run(step, state, x, y, steps: int) -> list[float]:
    """The losses of ``steps`` steps (a process gathers its rank's value)."""
    losses = []
    for _ in range(steps):
        loss = step(state, x, y)["loss"]
        losses.append(float(loss.full() if hasattr(loss, "full") else loss))
    return losses


@pytest.mark.parametrize(
    ("saved_on", "resumed_on"),
    [
        ({"dp": 2, "tp": 2}, {"dp": 4}),
        ({"tp": 2}, {"tp": 4}),
        ({"dp": 2, "tp": 2}, {"dp": 2, "tp": 2}),
    ],
    ids=["dp2xtp2->dp4", "tp2->tp4", "same"],
)
def test_a_state_saved_on_one_mesh_resumes_on_another(saved_on, resumed_on, tmp_path: Path) -> None:
    params, x, y = init()
    whole = make_step(saved_on, zero=3 if "dp" in saved_on else 0)
    uninterrupted = whole.init({k: v.clone() for k, v in params.items()})
    expected = run(whole, uninterrupted, x, y, 4)

    first = make_step(saved_on, zero=3 if "dp" in saved_on else 0)
    state = first.init({k: v.clone() for k, v in params.items()})
    losses = run(first, state, x, y, 2)
    first.save(state, tmp_path / "ckpt")

    second = make_step(resumed_on, zero=3 if "dp" in resumed_on else 0)
    resumed = second.restore(
        second.init({k: torch.zeros_like(v) for k, v in params.items()}), tmp_path / "ckpt"
    )
    assert resumed.step == 2
    for name in ("m", "v"):
        for k in params:
            assert torch.equal(resumed.opt_state[name][k], state.opt_state[name][k])
    losses += run(second, resumed, x, y, 2)
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(expected), rtol=1e-6, atol=0)
    for k in params:
        torch.testing.assert_close(resumed.params[k], uninterrupted.params[k], rtol=1e-6, atol=1e-7)


def test_an_interrupted_save_leaves_the_previous_checkpoint(tmp_path: Path, monkeypatch) -> None:
    params, x, y = init()
    step = make_step({"dp": 2})
    state = step.init({k: v.clone() for k, v in params.items()})
    run(step, state, x, y, 1)
    step.save(state, tmp_path / "ckpt")
    run(step, state, x, y, 1)
    import torch.distributed.checkpoint as dcp

    def crash(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(dcp, "save", crash)
    with pytest.raises(KeyboardInterrupt):
        step.save(state, tmp_path / "ckpt")
    monkeypatch.undo()
    again = step.restore(
        step.init({k: torch.zeros_like(v) for k, v in params.items()}), tmp_path / "ckpt"
    )
    assert again.step == 1  # the first save, whole
    step.save(state, tmp_path / "ckpt")  # a later save replaces it and cleans up
    assert step.restore(again, tmp_path / "ckpt").step == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def test_broken_checkpoints_are_errors_naming_the_tensor_or_file(tmp_path: Path) -> None:
    params, _, _ = init()
    step = make_step({"dp": 2})
    state = step.init({k: v.clone() for k, v in params.items()})
    with pytest.raises(TesseraError, match=r"restore: no checkpoint at .*nowhere"):
        step.restore(state, tmp_path / "nowhere")
    step.save(state, tmp_path / "ckpt")
    other = make_step({"dp": 2})
    bigger = other.init({"w1": torch.zeros(8, 64), "w2": torch.zeros(64, 8)})
    with pytest.raises(
        TesseraError,
        match=r"tensor params\['w1'\] was saved as float32\[8, 32\], the state needs float32\[8, 64\]",
    ):
        other.restore(bigger, tmp_path / "ckpt")
    extra = other.init({"w1": torch.zeros(8, 32), "w2": torch.zeros(32, 8), "b": torch.zeros(8)})
    with pytest.raises(TesseraError, match=r"has no tensor params\['b'\]"):
        other.restore(extra, tmp_path / "ckpt")
    (data,) = [p for p in (tmp_path / "ckpt").iterdir() if p.suffix == ".distcp"]
    data.write_bytes(data.read_bytes()[:100])
    with pytest.raises(TesseraError, match=rf"{data.name} is truncated or changed"):
        step.restore(state, tmp_path / "ckpt")
    data.unlink()
    with pytest.raises(TesseraError, match=rf"{data.name} \(in its manifest\) is missing"):
        step.restore(state, tmp_path / "ckpt")


def test_checkpoints_move_between_processes_and_the_virtual_mesh(tmp_path: Path) -> None:
    """Four gloo processes save on dp 2 x tp 2 (ZeRO-3, each its own pieces); the virtual
    mesh resumes on dp 4; four processes resume the virtual mesh's save on tp 4: both
    continue with the uninterrupted run's losses."""
    from test_distributed import SCRIPTS, tessera_run

    params, x, y = init()
    whole = make_step({"dp": 2, "tp": 2}, zero=3)
    expected = run(whole, whole.init({k: v.clone() for k, v in params.items()}), x, y, 4)

    saved = tessera_run(
        4, SCRIPTS / "sharded_checkpoint.py", "save", str(tmp_path), kernels="reference"
    )
    assert saved.returncode == 0, saved.stderr[-3000:]
    virtual = make_step({"dp": 4}, zero=3)
    state = virtual.restore(
        virtual.init({k: torch.zeros_like(v) for k, v in params.items()}), tmp_path / "ckpt"
    )
    torch.testing.assert_close(
        torch.tensor(run(virtual, state, x, y, 2)), torch.tensor(expected[2:]), rtol=1e-6, atol=0
    )

    first = make_step({"dp": 2})
    here = first.init({k: v.clone() for k, v in params.items()})
    run(first, here, x, y, 2)
    first.save(here, tmp_path / "ckpt")  # replaces the processes' checkpoint
    resumed = tessera_run(
        4, SCRIPTS / "sharded_checkpoint.py", "resume", str(tmp_path), kernels="reference"
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    result = torch.load(tmp_path / "resumed.pt")
    assert result["step"] == 4
    torch.testing.assert_close(
        torch.tensor(result["losses"]), torch.tensor(expected[2:]), rtol=1e-6, atol=0
    )


def test_a_crash_between_the_two_renames_loses_nothing(tmp_path: Path, monkeypatch) -> None:
    """A save that crashes after moving the old checkpoint aside (``.ckpt.old``) and
    before renaming the new one into place: restore finds the old one (with a warning
    naming it), and a second save that crashes at the same point does not delete it;
    the save after that completes and cleans up."""
    import os

    params, x, y = init()
    step = make_step({"dp": 2})
    state = step.init({k: v.clone() for k, v in params.items()})
    run(step, state, x, y, 1)
    step.save(state, tmp_path / "ckpt")  # the last good checkpoint: step 1
    run(step, state, x, y, 1)
    real_replace = os.replace

    def crash_on_the_second_rename(source, destination):
        if Path(destination).name == "ckpt":  # the new checkpoint's rename
            raise KeyboardInterrupt
        real_replace(source, destination)

    fresh = step.init({k: torch.zeros_like(v) for k, v in params.items()})
    for _ in range(2):  # two crashed saves in a row
        monkeypatch.setattr(os, "replace", crash_on_the_second_rename)
        with pytest.raises(KeyboardInterrupt):
            step.save(state, tmp_path / "ckpt")
        monkeypatch.undo()
        assert not (tmp_path / "ckpt").exists()
        with pytest.warns(UserWarning, match=r"ckpt is missing.*restoring .*\.ckpt\.old"):
            assert step.restore(fresh, tmp_path / "ckpt").step == 1
    step.save(state, tmp_path / "ckpt")
    assert step.restore(fresh, tmp_path / "ckpt").step == 2
    assert [p.name for p in tmp_path.iterdir() if not p.name.startswith(".ckpt.tmp")] == ["ckpt"]
