"""Faults and recovery: ``tessera run --max-restarts``, preemption, background saves.

The over-processes tests run ``examples/train_gpt.py`` (a 2-layer tiny GPT, dp 2,
deterministic numerics) under ``tessera run -n 2`` with faults injected by
``TESSERA_FAULT_INJECT`` (:mod:`tessera.training.fault_injection`), checkpointing every
step. Their reference is an uninterrupted run of the same script on the virtual mesh in
this process: deterministic numerics make the virtual mesh and processes bit-identical,
so the interrupted job's final checkpoint must hold exactly the reference's tensors.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from example_modules import load_example

from tessera.errors import TesseraError
from tessera.training import CheckpointManager, checkpoint, fault_injection
from tessera.training.preemption import Preemption

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--dp", "2", "--tp", "1", "--layers", "2", "--deterministic", "--log-every", "1"]


def tessera_run(*args: str, faults: str, limit: float = 300.0) -> subprocess.CompletedProcess[str]:
    """``tessera run ARGS`` with ``TESSERA_FAULT_INJECT=faults``, bounded in time."""
    env = {
        k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "TESSERA_BACKEND")
    }
    env |= {"TESSERA_FAULT_INJECT": faults, "TESSERA_KERNELS": "reference", "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "tessera.tools.launch", "run", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=limit, env=env, cwd=ROOT)


def tensors(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint at ``path``, whole (read on the virtual mesh)."""
    described = json.loads((path / checkpoint.MANIFEST).read_text())["tensors"]
    names = sorted(described)
    leaves = [
        torch.zeros(described[n]["shape"], dtype=getattr(torch, described[n]["dtype"]))
        for n in names
    ]
    checkpoint.restore(leaves, names, path)
    return dict(zip(names, leaves, strict=True))


def assert_identical(path: Path, reference: Path) -> None:
    got, expected = tensors(path), tensors(reference)
    assert got.keys() == expected.keys()
    different = [n for n in got if not torch.equal(got[n], expected[n])]
    assert not different, f"{path} differs from {reference} in {different}"


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[float]]:
    """The uninterrupted run: 5 steps on the virtual mesh, checkpointed at the end."""
    root = tmp_path_factory.mktemp("reference")
    records = load_example("train_gpt").main([*TINY, "--steps", "5", "--save", str(root)])
    return root / "step_5", [r["loss"] for r in records["records"]]


def test_faults_in_steps_and_saves_are_restarted_and_lose_nothing(
    tmp_path: Path, reference: tuple[Path, list[float]]
) -> None:
    """One job, restarted twice: a rank SIGKILLed mid-step, then a save failing with a
    full disk (ENOSPC); each restart resumes from the newest complete checkpoint, and the
    end is bit-identical to the uninterrupted run's. (A rank killed during a save and a
    corrupted newest checkpoint, one launch each, are ``benchmarks/faults.py``'s; a
    corrupted newest checkpoint skipped is also ``test_checkpoint_policy``'s.)"""
    faults = "kill:rank=1:step=2:attempt=0,save-enospc:rank=0:step=3:attempt=1"
    save = tmp_path / "ckpt"
    args = [*TINY, "--steps", "5", "--save", str(save), "--checkpoint-every", "1"]
    result = tessera_run(
        "-n", "2", "--max-restarts", "2", "examples/train_gpt.py", *args, faults=faults
    )
    assert result.returncode == 0, result.stderr[-4000:]
    restarts = re.findall(r"tessera run: examples/train_gpt.py failed: (.*); restarting every "
                          r"rank \(restart (\d) of 2\)", result.stderr)  # fmt: skip
    assert [n for _, n in restarts] == ["1", "2"], result.stderr[-4000:]
    causes = [cause for cause, _ in restarts]
    assert causes[0].startswith("rank 1 was killed by SIGKILL (exit code 137)"), causes
    assert causes[1].startswith("rank 0 failed with exit code 1: TesseraError: saving step 3"), (
        causes
    )
    assert "No space left on device" in causes[1], causes
    resumed = re.findall(r"resumed from step (\d)", result.stdout)
    assert resumed == ["2", "2"], result.stdout
    assert_identical(save / "step_5", reference[0])


def test_a_preempted_job_saves_and_resumes_on_another_world_size(
    tmp_path: Path, reference: tuple[Path, list[float]]
) -> None:
    """SIGTERM to the launcher (``term``: as a scheduler preempts a job) after step 1: the
    ranks agree on a step boundary, save there and exit; the launcher says so. The run
    resumed on the virtual mesh, dp 2, ends bit-identical; resumed on dp 1, its losses
    match the reference's to 1e-5 (other summation order). The job saves every step in
    the background (``--async-save``), the preemption's save after the one in flight."""
    save = tmp_path / "ckpt"
    args = ["examples/train_gpt.py", *TINY, "--steps", "5", "--save", str(save)]
    args += ["--checkpoint-every", "1", "--async-save"]  # background saves over processes
    result = tessera_run("-n", "2", *args, faults="term:rank=0:step=1")
    assert result.returncode == 128 + signal.SIGTERM, result.stderr[-4000:]
    found = re.search(r"preempted by SIGTERM after step (\d): saved (\S+)", result.stdout)
    assert found, result.stdout + result.stderr[-3000:]
    assert "stopped by SIGTERM" in result.stderr
    k = int(found[1])
    assert 1 <= k < 5 and Path(found[2]) == save / f"step_{k}"
    assert all(checkpoint.verify(save / f"step_{j}") == j for j in range(max(1, k - 2), k + 1))
    train_gpt = load_example("train_gpt")
    dp1 = train_gpt.main([*TINY, "--dp", "1", "--resume", str(save / f"step_{k}"),
                          "--steps", str(5 - k)])["records"]  # fmt: skip
    assert [r["step"] for r in dp1] == list(range(k + 1, 6))
    torch.testing.assert_close([r["loss"] for r in dp1], reference[1][k:], rtol=1e-5, atol=0)
    rest = train_gpt.main([*TINY, "--steps", "5", "--save", str(save)])["records"]
    assert [r["loss"] for r in rest] == reference[1][k:]
    assert_identical(save / "step_5", reference[0])


class Step:
    """A step's ``save`` over a list of named tensors (what the manager calls)."""

    def __init__(self, tensors: dict[str, torch.Tensor]) -> None:
        self.tensors = tensors

    def save(
        self, state: State, path: Path, *, extra: object = None, blocking: bool = True
    ) -> checkpoint.PendingSave | None:
        names = sorted(self.tensors)
        leaves = [self.tensors[n] for n in names]
        return checkpoint.save(leaves, names, state.step, path, blocking=blocking)


class State:
    def __init__(self, step: int) -> None:
        self.step = step


def test_a_background_save_holds_the_state_when_saved_and_rotates_once_complete(
    tmp_path: Path,
) -> None:
    """``async_save``: the state changing while the file is written does not reach the
    checkpoint (it was copied), which equals a blocking save's; rotation keeps the
    newest ``keep_last`` once each save completes."""
    w = {"w": torch.arange(6.0).reshape(2, 3), "b": torch.ones(4)}
    blocking = CheckpointManager(tmp_path / "sync", every=1, keep_last=2)
    background = CheckpointManager(tmp_path / "async", every=1, keep_last=2, async_save=True)
    for k in (1, 2, 3):
        blocking.save(Step(w), State(k))  # type: ignore[arg-type]
        background.save(Step(w), State(k))  # type: ignore[arg-type]
        w["w"].add_(1.0)  # the next step, while the background save may still be writing
    assert background.wait() == tmp_path / "async" / "step_3"
    assert sorted(p.name for p in (tmp_path / "async").iterdir()) == ["step_2", "step_3"]
    for k in (2, 3):
        assert_identical(tmp_path / "async" / f"step_{k}", tmp_path / "sync" / f"step_{k}")
    assert torch.equal(tensors(tmp_path / "async" / "step_3")["w"], w["w"] - 1.0)


def test_a_failed_background_save_is_raised_by_wait(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk during a background save: ``wait`` raises a TesseraError naming the
    checkpoint and the cause, and the previous checkpoint stays the newest."""
    manager = CheckpointManager(tmp_path, every=1, async_save=True)
    manager.save(Step({"w": torch.ones(2)}), State(1))  # type: ignore[arg-type]
    monkeypatch.setenv("TESSERA_FAULT_INJECT", "save-enospc:rank=0:step=2")
    manager.save(Step({"w": torch.ones(2)}), State(2))  # type: ignore[arg-type]
    with pytest.raises(TesseraError, match=r"saving step 2 to .*step_2 failed: No space left"):
        manager.wait()
    assert checkpoint.verify(tmp_path / "step_1") == 1 and not (tmp_path / "step_2").exists()


def test_fault_specs_are_parsed_or_rejected_by_name() -> None:
    assert fault_injection.parse("kill:rank=1:step=3, hang:rank=0:step=2:attempt=1") == [
        fault_injection.Fault("kill", 1, 3, 0),
        fault_injection.Fault("hang", 0, 2, 1),
    ]
    with pytest.raises(TesseraError, match="unknown fault 'explode'"):
        fault_injection.parse("explode:rank=1:step=3")
    with pytest.raises(TesseraError, match="needs rank=R and step=K"):
        fault_injection.parse("kill:rank=1")
    with pytest.raises(TesseraError, match="bad field 'step=x'"):
        fault_injection.parse("kill:rank=1:step=x")


def test_a_signal_requests_a_stop_and_the_handlers_are_restored() -> None:
    before = signal.getsignal(signal.SIGUSR1)
    preemption = Preemption(deadline_s=60).install()
    try:
        assert preemption.requested() is None
        os.kill(os.getpid(), signal.SIGUSR1)
        assert preemption.requested() is signal.SIGUSR1
        preemption.saved()
    finally:
        preemption.uninstall()
    assert signal.getsignal(signal.SIGUSR1) is before


def test_a_job_failing_every_time_stops_after_max_restarts() -> None:
    """A rank that exits with code 3 on every attempt: one restart, then the launcher
    fails with the cause and says how many restarts were made."""
    script = "tests/unit/multiprocess/failures.py"
    result = tessera_run("-n", "2", "--max-restarts", "1", script, "exit", faults="")
    assert result.returncode == 3, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("tessera run:")]
    assert lines[0].startswith(f"tessera run: {script} failed: rank 1 exited with code 3 at "
                               "failures.py:"), lines  # fmt: skip
    assert lines[0].endswith("; restarting every rank (restart 1 of 1)"), lines
    assert lines[-1].startswith(
        f"tessera run: {script} failed after 1 restart (--max-restarts 1): rank 1 exited with code 3"
    ), lines


def test_a_signal_saves_train_llama_at_the_next_step_and_the_stream_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGUSR1 during step 1 (raised when the step's log line is printed): the run saves
    after step 1 with the loader's position and stops; run again, it continues the same
    stream, with the uninterrupted run's losses bit for bit."""
    train_llama = load_example("train_llama")
    tiny = ["--layers", "1", "--no-progress", "--dim", "32", "--seq", "16", "--batch", "4",
            "--eval-every", "0", "--sample", "0", "--cache", str(tmp_path), "--steps", "3"]  # fmt: skip
    straight = [r["loss"] for r in train_llama.main(tiny)["records"]]
    said: list[str] = []

    def say(*text: object) -> None:
        said.append(" ".join(map(str, text)))
        if len(said) == 1:
            signal.raise_signal(signal.SIGUSR1)

    monkeypatch.setattr(train_llama, "say", say)
    save, handler = tmp_path / "ckpt", signal.getsignal(signal.SIGUSR1)
    first = train_llama.main([*tiny, "--save", str(save), "--log-every", "1"])["records"]
    assert said[-1].startswith(f"preempted by SIGUSR1 after step 1: saved {save / 'step_1'}")
    assert [r["step"] for r in first] == [1] and signal.getsignal(signal.SIGUSR1) is handler
    rest = train_llama.main([*tiny, "--save", str(save)])["records"]
    assert [r["loss"] for r in first + rest] == straight
