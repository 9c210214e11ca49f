"""The checkpoint policy (:mod:`tessera.training.checkpoint_policy`): saves to
``root/step_<k>`` keep exactly the newest N; :func:`latest` skips a partial or corrupt
checkpoint (with a warning naming it) and an interrupted save's leftovers; a train_gpt
run stopped after step 2 and continued from its checkpoint gives the uninterrupted
run's losses bit for bit."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from example_modules import load_example

from tessera.training import CheckpointManager, checkpoint, latest

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class State:
    w: torch.Tensor
    step: int


class TinyStep:
    """A step's save/restore over one tensor (no compiling: the policy only calls these)."""

    def save(self, state: State, path: str | Path, *, extra: dict[str, Any] | None = None) -> None:
        checkpoint.save([state.w], ["params.w"], state.step, path, extra)

    def restore(self, state: State, path: str | Path, *, trust_unverified: bool = False) -> State:
        state.step = checkpoint.restore(
            [state.w], ["params.w"], path, trust_unverified=trust_unverified
        )
        return state


def run(manager: CheckpointManager, steps: range) -> State:
    state = State(torch.zeros(3), 0)
    for k in steps:
        state.w.fill_(k)
        state.step = k
        if manager.due(k):
            manager.save(TinyStep(), state, extra={"position": 10 * k})
    return state


def names(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir())


def test_rotation_keeps_exactly_the_newest_n(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path, every=2, keep_last=3)
    run(manager, range(1, 12))
    assert names(tmp_path) == ["step_10", "step_6", "step_8"]
    assert latest(tmp_path) == tmp_path / "step_10"
    state = State(torch.zeros(3), 0)
    assert manager.restore(TinyStep(), state) == {"position": 100}
    assert state.step == 10 and state.w.tolist() == [10.0] * 3


def test_a_corrupt_latest_is_skipped_for_the_previous_one(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path, every=1, keep_last=3)
    run(manager, range(1, 4))
    storage = next(p for p in (tmp_path / "step_3").iterdir() if p.suffix == ".distcp")
    storage.write_bytes(storage.read_bytes()[:-4])  # truncated
    with pytest.warns(UserWarning, match=r"skipping checkpoint .*step_3: .*truncated"):
        assert latest(tmp_path) == tmp_path / "step_2"
    (tmp_path / "step_2" / checkpoint.SIGNED).unlink()  # a partial one: no manifest
    with pytest.warns(UserWarning) as caught:
        assert latest(tmp_path) == tmp_path / "step_1"
    messages = [str(w.message) for w in caught]
    assert len(messages) == 2 and "step_3" in messages[0] and "step_2 has no" in messages[1]
    assert "has no tessera-manifest.json" in str(caught[1].message)
    state = State(torch.zeros(3), 0)
    with pytest.warns(UserWarning):
        assert manager.restore(TinyStep(), state) == {"position": 10}
    assert state.step == 1
    state.step = 2  # continue from step 1: the later, broken ones are replaced
    manager.save(TinyStep(), state)
    assert names(tmp_path) == ["step_1", "step_2"]
    assert latest(tmp_path) == tmp_path / "step_2"


def test_an_interrupted_save_is_not_picked(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path, every=1, keep_last=2)
    run(manager, range(1, 3))
    leftover = tmp_path / ".step_7.tmp"  # a save that died before its rename
    leftover.mkdir()
    (leftover / "__0_0.distcp").write_bytes(b"partial")
    assert latest(tmp_path) == tmp_path / "step_2"
    edited = tmp_path / "step_2" / checkpoint.EXTRA  # a changed file: its hash no longer matches
    edited.write_text('{"position": 99}')  # same size
    with pytest.warns(UserWarning, match="step_2.*extra.json does not match"):
        assert latest(tmp_path) == tmp_path / "step_1"
    run(manager, range(3, 4))  # the next save clears the leftover
    assert names(tmp_path) == ["step_2", "step_3"] and latest(tmp_path) == tmp_path / "step_3"
    assert latest(tmp_path / "nothing") is None



def test_train_gpt_stopped_and_continued_matches_an_uninterrupted_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    train_gpt = load_example("train_gpt")
    tiny = ["--layers", "1", "--dp", "1", "--tp", "1", "--log-every", "1"]
    straight = train_gpt.main([*tiny, "--steps", "4"])["records"]
    ckpt = str(tmp_path / "ckpt")
    first = train_gpt.main([*tiny, "--steps", "2", "--checkpoint-every", "1", "--save", ckpt])
    assert names(tmp_path / "ckpt") == ["step_1", "step_2"]
    capsys.readouterr()
    rest = train_gpt.main([*tiny, "--steps", "4", "--save", ckpt, "--keep-last", "2"])
    out = capsys.readouterr().out
    assert "resumed from step 2" in out and "step   3  loss" in out, out
    assert [r["step"] for r in rest["records"]] == [3, 4]
    assert [r["loss"] for r in first["records"] + rest["records"]] == [r["loss"] for r in straight]
    assert names(tmp_path / "ckpt") == ["step_2", "step_4"]
