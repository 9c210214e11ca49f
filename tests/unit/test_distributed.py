"""The torch.distributed backend in real processes (gloo on 127.0.0.1) and ``tessera run``.

The scripts under ``tests/unit/multiprocess/`` run as 2 or 4 ranks: each rank checks its
``.full()`` results against the virtual mesh and torch eager, or misbehaves on purpose
(raises, is killed, hangs, runs a different program) and the run must end with a clear
error in bounded time. A few fast checks of the launcher and runtime helpers run in
process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from tessera import dist
from tessera.backends import distributed
from tessera.dist.tensor import DistTensor
from tessera.errors import ShardingError
from tessera.tools import launch

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "tests" / "unit" / "multiprocess"


def tessera_run(nproc: int, script: Path, *args: str, timeout: float = 60.0, limit: float = 90.0, kernels: str | None = None) -> subprocess.CompletedProcess[str]:
    """``tessera run -n nproc script args`` (through ``python -m``), with a hard wall limit."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "TESSERA_BACKEND")}
    if kernels is not None:
        env["TESSERA_KERNELS"] = kernels
    command = [sys.executable, "-m", "tessera.tools.launch", "run", "-n", str(nproc), "--timeout", str(timeout), str(script), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=limit, env=env, cwd=ROOT)


def test_two_ranks_agree_with_virtual_mesh_and_eager() -> None:
    """Megatron MLP on a 1-D tp=2 mesh, from global arguments and from local shards; every
    rank runs the generated Triton kernels (interpreted on a CPU)."""
    result = tessera_run(2, SCRIPTS / "agreement.py", kernels="triton", limit=180.0)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "rank 0 OK" in result.stdout and "rank 1 OK" in result.stdout


def test_four_ranks_agree_with_virtual_mesh_and_eager() -> None:
    """Every collective kind; the MLP on 2 x 2; the transformer layer on 2 x 2 and tp=4."""
    result = tessera_run(4, SCRIPTS / "agreement.py")
    assert result.returncode == 0, result.stderr[-3000:]
    for rank in range(4):
        assert f"rank {rank} OK" in result.stdout
        assert f"rank {rank}: every collective kind matches the virtual mesh" in result.stdout
    assert "transformer layer on Mesh(dp=2, tp=2)" in result.stdout


def test_collective_permutes_and_block_moves_over_four_processes() -> None:
    """Collective permutes (shifts, swaps, single pairs) per rank equal to numpy and the
    virtual mesh; chunk / concat along a sharded dim (blocks moved by permutes, nothing
    gathered) equal to torch eager."""
    result = tessera_run(4, SCRIPTS / "permute.py", limit=180.0)
    assert result.returncode == 0, result.stderr[-3000:]
    for rank in range(4):
        assert f"rank {rank} OK" in result.stdout
        assert f"rank {rank}: collective permutes over ['dp', 'tp'] of Mesh(dp=2, tp=2) match numpy" in result.stdout
        assert f"rank {rank}: block moves on Mesh(dp=2, tp=2) match torch eager" in result.stdout


def test_readme_example_with_the_console_script() -> None:
    """``tessera run -n 4 examples/distributed_mlp.py``, as the README shows it (Triton kernels)."""
    console = Path(sys.executable).parent / "tessera"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "TESSERA_BACKEND")}
    env["TESSERA_KERNELS"] = "triton"
    result = subprocess.run(
        [str(console), "run", "-n", "4", "examples/distributed_mlp.py"],
        capture_output=True, text=True, timeout=180, env=env, cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    for rank, coords in enumerate(["{'dp': 0, 'tp': 0}", "{'dp': 0, 'tp': 1}", "{'dp': 1, 'tp': 0}", "{'dp': 1, 'tp': 1}"]):
        assert f"rank {rank} {coords}: local result [8, 64] of [16, 64]" in result.stdout
    assert result.stdout.count("collectives: all_reduce[tp] f32[8, 64]") == 4
    assert result.stdout.rstrip().endswith("OK")


def test_raising_rank_fails_the_run_with_its_error() -> None:
    start = time.monotonic()
    result = tessera_run(2, SCRIPTS / "failures.py", "raise", timeout=20)
    if result.returncode != 1 and "Timed out waiting" in result.stderr:
        # Seen once in CI (2026-11-24, a loaded machine): the surviving rank sat in a gloo
        # send until gloo's own timeout and exited with 135 instead of a DistributedError.
        # Not understood yet (issue 18, item 6); one retry keeps CI meaningful meanwhile.
        warnings.warn(f"retrying after a gloo send timeout: {result.stderr[-500:]}", stacklevel=1)
        start = time.monotonic()
        result = tessera_run(2, SCRIPTS / "failures.py", "raise", timeout=20)
    assert time.monotonic() - start < 60
    assert result.returncode == 1
    summary = result.stderr.strip().splitlines()[-1]
    assert summary.startswith("tessera run: ") and "failed: rank 1 failed with exit code 1: ValueError: rank 1 fails on purpose" in summary
    # the surviving rank raised a clear error instead of hanging (or was stopped first)
    assert "DistributedError: rank 0" in result.stderr or "rank 0 was stopped" in summary


def test_killed_rank_ends_the_run_in_bounded_time() -> None:
    start = time.monotonic()
    result = tessera_run(2, SCRIPTS / "failures.py", "kill", timeout=20)
    assert time.monotonic() - start < 60
    assert result.returncode == 128 + 9
    assert "rank 1 was killed by SIGKILL (exit code 137)" in result.stderr.strip().splitlines()[-1]


def test_hanging_rank_times_out() -> None:
    start = time.monotonic()
    result = tessera_run(2, SCRIPTS / "failures.py", "hang", timeout=2)
    assert time.monotonic() - start < 45
    assert result.returncode == 1
    assert "rank 0 failed with exit code 1: DistributedError: rank 0: comparing the ranks' collectives" in result.stderr
    assert "within the timeout of 2 s (TESSERA_TIMEOUT)" in result.stderr


def test_different_programs_are_rejected_before_communicating() -> None:
    result = tessera_run(2, SCRIPTS / "failures.py", "mismatch", timeout=20)
    assert result.returncode == 1
    expected = "the ranks run different programs: collective #0 is all_reduce over ['tp'] f32[4, 4] on rank 0 but all_reduce over ['tp'] f32[6, 4] on rank 1"
    assert expected in result.stderr


# --- in-process helpers ---------------------------------------------------------------------


def test_launched_reads_the_launcher_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "WORLD_SIZE", "TESSERA_BACKEND"):
        monkeypatch.delenv(name, raising=False)
    assert not distributed.launched()
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert not distributed.launched()  # one process: the virtual mesh
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert distributed.launched()
    monkeypatch.setenv("TESSERA_BACKEND", "virtual")
    assert not distributed.launched()


def test_timeout_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TESSERA_TIMEOUT", raising=False)
    assert distributed.timeout_seconds() == distributed.DEFAULT_TIMEOUT_S
    monkeypatch.setenv("TESSERA_TIMEOUT", "7.5")
    assert distributed.timeout_seconds() == 7.5


def test_first_difference_names_the_collective_and_rank() -> None:
    text = distributed._first_difference([["a", "b"], ["a", "b"], ["a"]])
    assert text == "collective #1 is b on rank 0 but nothing (the program ends) on rank 2"


def test_launcher_report_puts_the_root_cause_first() -> None:
    def failure(code: int, message: str = "") -> SimpleNamespace:
        return SimpleNamespace(exitcode=code, message={"message": message} if message else "")

    failures = {
        0: failure(1, "DistributedError: rank 0: all_reduce failed: another rank failed, exited or ..."),
        1: failure(1, "ValueError: boom"),
        2: failure(-15),
    }
    report = launch._report(failures, 4)
    assert report.startswith("rank 1 failed with exit code 1: ValueError: boom; rank 0 failed")
    assert report.endswith("rank 2 was stopped")
    assert launch._worst(failures) == 1
    assert launch._worst({0: failure(-9), 1: failure(-15)}) == 137
    # a rank that recorded its error and was stopped while exiting is still the root cause
    late = {0: failures[0], 1: failure(-15, "ValueError: boom")}
    assert launch._report(late, 2).startswith("rank 1 failed with exit code 1: ValueError: boom; rank 0")
    assert launch._worst(late) == 1


def test_launcher_rejects_a_missing_script(capsys: pytest.CaptureFixture[str]) -> None:
    assert launch.main(["run", "-n", "2", "no/such/script.py"]) == 2
    assert "no such script" in capsys.readouterr().err


def test_dist_tensor_from_a_local_shard() -> None:
    mesh = dist.Mesh(axes=["dp", "tp"], shape=(2, 2))
    spec = dist.ShardSpec(partition=(0, 1), mesh_axes=("dp", "tp"))
    shard = torch.randn(3, 5)
    value = DistTensor.from_local(shard, spec, mesh, rank=2)
    assert value.shape == (6, 10) and value.dtype == torch.float32
    assert value.local(2) is shard
    with pytest.raises(ShardingError, match="holds rank 2's shard only"):
        value.local(1)
    with pytest.raises(ShardingError, match="built from rank 2's local shard"):
        _ = value.data


def test_train_gpt_over_four_processes() -> None:
    """``tessera run -n 4 examples/train_gpt.py``: a dp x tp training step per rank (gloo);
    every step's loss equals the torch single-device loop (the script checks it)."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "TESSERA_BACKEND")}
    command = [sys.executable, "-m", "tessera.tools.launch", "run", "-n", "4", "--timeout", "120", "examples/train_gpt.py", "--steps", "2"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=240, env=env, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "mesh 2 x 2" in result.stdout and result.stdout.rstrip().endswith("OK")

