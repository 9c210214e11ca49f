"""The torch.distributed backend in real processes (gloo on 127.0.0.1) and ``tessera run``.

The scripts under ``tests/unit/multiprocess/`` run as 2 or 4 ranks: each rank checks its
``.full()`` results against the virtual mesh and torch eager (or, for context-parallel
attention, torch autograd); or one misbehaves on
purpose (raises, exits with or without a code, is killed, hangs, runs a different
program) and the run must end in bounded time naming it first; or rank 0 saves the
trained model, which must equal the virtual mesh's. A few fast checks of the failure
report and the liveness channel run in process.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.distributed as tdist

from tessera import dist
from tessera.backends import distributed, liveness
from tessera.dist.tensor import DistTensor
from tessera.errors import ShardingError, TesseraError
from tessera.frontend import pytree
from tessera.tools import launch, worker
from tessera.tools.report import Report

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "tests" / "unit" / "multiprocess"


def tessera_run(
    nproc: int,
    script: Path,
    *args: str,
    timeout: float = 60.0,
    limit: float = 90.0,
    kernels: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """``tessera run -n nproc script args`` (through ``python -m``), with a hard wall limit."""
    env = {
        k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "TESSERA_BACKEND")
    }
    if kernels is not None:
        env["TESSERA_KERNELS"] = kernels
    command = [
        sys.executable,
        "-m",
        "tessera.tools.launch",
        "run",
        "-n",
        str(nproc),
        "--timeout",
        str(timeout),
        str(script),
        *args,
    ]
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


def test_vocab_parallel_programs_over_four_processes() -> None:
    """The embedding lookup and cross-entropy with the vocabulary split over tp, and their
    gradients, on a 2 x 2 (dp x tp) mesh: each process's kernels read its own position
    (graph.axis_index); results equal the virtual mesh and torch eager (float64)."""
    result = tessera_run(4, SCRIPTS / "vocab_parallel.py", kernels="triton", limit=240.0)
    assert result.returncode == 0, result.stderr[-3000:]
    for rank in range(4):
        assert f"rank {rank} OK" in result.stdout
        assert (
            f"rank {rank}: vocab-parallel cross-entropy gradient: max error vs eager"
            in result.stdout
        )


def test_context_parallel_attention_over_two_processes() -> None:
    """Sequence split over cp = 2, one rank per process (gloo): the forward's k and v
    all-gathers and the backward's dk and dv reduce-scatters, each rank's causal offset
    from its position, through the Triton kernels; results match torch autograd."""
    result = tessera_run(2, SCRIPTS / "context_parallel.py", kernels="triton", limit=180.0)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "rank 0 OK" in result.stdout and "rank 1 OK" in result.stdout


def test_collective_permutes_and_block_moves_over_four_processes() -> None:
    """Collective permutes (shifts, swaps, single pairs) per rank equal to numpy and the
    virtual mesh; chunk / concat along a sharded dim (blocks moved by permutes, nothing
    gathered) equal to torch eager."""
    result = tessera_run(4, SCRIPTS / "permute.py", limit=180.0)
    assert result.returncode == 0, result.stderr[-3000:]
    for rank in range(4):
        assert f"rank {rank} OK" in result.stdout
        assert (
            f"rank {rank}: collective permutes over ['dp', 'tp'] of Mesh(dp=2, tp=2) match numpy"
            in result.stdout
        )
        assert f"rank {rank}: block moves on Mesh(dp=2, tp=2) match torch eager" in result.stdout


def test_readme_example_with_the_console_script() -> None:
    """``tessera run -n 4 examples/distributed_mlp.py``, as the README shows it (Triton kernels)."""
    console = Path(sys.executable).parent / "tessera"
    env = {
        k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "TESSERA_BACKEND")
    }
    env["TESSERA_KERNELS"] = "triton"
    result = subprocess.run(
        [str(console), "run", "-n", "4", "examples/distributed_mlp.py"],
        capture_output=True, text=True, timeout=180, env=env, cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    for rank, coords in enumerate(
        ["{'dp': 0, 'tp': 0}", "{'dp': 0, 'tp': 1}", "{'dp': 1, 'tp': 0}", "{'dp': 1, 'tp': 1}"]
    ):
        assert f"rank {rank} {coords}: local result [8, 64] of [16, 64]" in result.stdout
    assert result.stdout.count("collectives: all_reduce[tp] f32[8, 64]") == 4
    assert result.stdout.rstrip().endswith("OK")


def _line_of(statement: str, script: Path = SCRIPTS / "failures.py") -> int:
    return next(
        i for i, line in enumerate(script.read_text().splitlines(), 1) if line.strip() == statement
    )


def misbehave(
    mode: str, nproc: int = 2, timeout: float = 30.0
) -> tuple[subprocess.CompletedProcess[str], float, str]:
    """``failures.py MODE`` as ``nproc`` ranks: the result, the seconds from rank 1's
    misbehaviour to the end of the job, and the summary line."""
    result = tessera_run(nproc, SCRIPTS / "failures.py", mode, timeout=timeout, kernels="reference")
    ended = time.time()
    found = re.search(r"rank 1 misbehaves at ([0-9.]+)", result.stdout)
    assert found, result.stdout + result.stderr[-3000:]
    summary = result.stderr.strip().splitlines()[-1]
    prefix = f"tessera run: {SCRIPTS / 'failures.py'} failed: "
    assert summary.startswith(prefix), result.stderr[-3000:]
    return result, ended - float(found.group(1)), summary.removeprefix(prefix)


EXITS = {  # mode: (exit code, how the summary names rank 1, first); "raise": below, on 4 ranks
    "exit": (3, f"rank 1 exited with code 3 at failures.py:{_line_of('sys.exit(3)')} in <module>"),
    "exit0": (
        1,
        f"rank 1 exited with code 0 at failures.py:{_line_of('sys.exit(0)')} in <module> before the others were done",
    ),
    "os_exit": (3, "rank 1 exited with code 3"),
    "kill": (137, "rank 1 was killed by SIGKILL (exit code 137)"),
}


@pytest.mark.parametrize("mode", list(EXITS))
def test_any_exit_of_a_rank_ends_the_job_at_once_naming_it(mode: str) -> None:
    """sys.exit(n), sys.exit(0) while rank 0 still expects rank 1 in a collective,
    os._exit(n), SIGKILL: the job ends in seconds (not the 30 s timeout) and the summary
    names rank 1 first, then rank 0 (which failed waiting for it, or was stopped by
    torchrun first). Before, sys.exit(n) and sys.exit(0) held rank 0 for the timeout and
    sys.exit(0) was not named."""
    result, seconds, summary = misbehave(mode)
    code, cause = EXITS[mode]
    assert seconds < 10, (seconds, result.stderr[-3000:])
    assert result.returncode == code, result.stderr[-3000:]
    assert summary in (f"{cause}; rank 0 failed waiting for it", f"{cause}; rank 0 was stopped"), (
        summary
    )


def test_a_hung_rank_is_named_at_the_timeout() -> None:
    """Rank 1 sleeps in the user's code while rank 0 waits in a collective: at the
    timeout the summary names rank 1 and its line (its heartbeat says where it is), not
    rank 0, which only waited."""
    result, seconds, summary = misbehave("hang", timeout=3)
    # the timeout and the ranks' start and teardown (16 s once on a loaded 2-core machine)
    assert seconds < 3 + 25, (seconds, result.stderr[-3000:])
    assert result.returncode == 1
    line = _line_of("time.sleep(120)")
    assert (
        summary == f"rank 1 hung at failures.py:{line} in <module>; rank 0 failed waiting for it"
    ), summary
    assert "it did not come within the timeout of 3 s (TESSERA_TIMEOUT)" in result.stderr


def test_a_raising_rank_ends_the_job_at_once_with_one_traceback_and_a_short_summary() -> None:
    """-n 4, rank 1 raises: the job ends in seconds (it used to wait for the whole
    timeout: the failed rank ran a gloo barrier at exit, which paired with the others'
    pending collective), its traceback is printed once and the others' errors are
    summarised (the line was ~1,200 characters, every rank's message in full)."""
    result, seconds, summary = misbehave("raise", nproc=4)
    assert seconds < 10 and result.returncode == 1, (seconds, result.stderr[-3000:])
    assert result.stderr.count("Traceback (most recent call last):") == 1, result.stderr
    assert summary.startswith(
        "rank 1 failed with exit code 1: ValueError: rank 1 fails on purpose; "
    )
    assert len(summary) < 200, summary


def test_different_programs_are_rejected_before_communicating() -> None:
    result, _, summary = misbehave("mismatch")
    assert result.returncode == 1
    expected = "the ranks run different programs: collective #0 is all_reduce over ['tp'] f32[4, 4] on rank 0 but all_reduce over ['tp'] f32[6, 4] on rank 1"
    assert expected in summary


def test_programs_with_the_same_collectives_are_compared_whole() -> None:
    """Rank 1 computes tanh(x) @ w, rank 0 x @ w: the same all_reduce, another program.
    The ranks compare a digest of the whole program and name the first differing line."""
    result, _, summary = misbehave("different")
    assert result.returncode == 1, result.stderr[-3000:]
    assert "rank 0: finished" not in result.stdout and "rank 1: finished" not in result.stdout
    # both ranks see the difference; on a busy machine one may be stopped before it says so
    assert re.match(
        r"ranks? 0(-1)? failed with exit code 1: DistributedError: @<lambda>: the ranks run "
        r"different programs: line ", summary,
    ), summary  # fmt: skip
    output = result.stdout + result.stderr  # the whole message (the summary is shortened)
    assert "matmul" in output and "tanh" in output and "on rank 0 but" in output, output[-3000:]


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


def _failure(
    exitcode: int, message: str = "", trace: str = "", **tessera: object
) -> SimpleNamespace:
    """A torchrun ProcessFailure as the worker's error file fills it."""
    if not (message or trace or tessera):
        return SimpleNamespace(exitcode=exitcode, message="")
    extra = {"py_callstack": trace, "tessera": tessera}
    return SimpleNamespace(exitcode=exitcode, message={"message": message, "extraInfo": extra})


def test_launcher_report_puts_the_root_cause_first() -> None:
    failures = {
        0: _failure(
            1, "DistributedError: rank 0: all_reduce failed: another rank failed, exited or ..."
        ),
        1: _failure(1, "ValueError: boom"),
        2: _failure(-15),
    }
    report = Report(failures)
    assert (
        report.summary()
        == "rank 1 failed with exit code 1: ValueError: boom; rank 0 failed waiting for it; rank 2 was stopped"
    )
    assert report.exit_code() == 1
    assert Report({0: _failure(-9), 1: _failure(-15)}).exit_code() == 137
    # a rank that recorded its error and was stopped while exiting is still the root cause
    late = Report({0: failures[0], 1: _failure(-15, "ValueError: boom")})
    assert (
        late.summary()
        == "rank 1 failed with exit code 1: ValueError: boom; rank 0 failed waiting for it"
    )
    assert late.exit_code() == 1


def test_launcher_report_names_the_rank_another_one_blamed() -> None:
    """A rank that hung (torchrun then stopped it) or exited 0 early is not a failure to
    torchrun: the rank that waited for it names it, and the report names it first."""
    trace = 'Traceback (most recent call last):\n  File "job.py", line 3, in <module>\n    f(x)\ntessera.errors.DistributedError: rank {r}: all_reduce failed: rank 1 hung at job.py:9'
    waited = {
        r: _failure(
            1,
            f"DistributedError: rank {r}: ...",
            trace.format(r=r),
            kind="failed",
            cause_rank=1,
            cause="hung at job.py:9",
        )
        for r in (0, 2, 3)
    }
    report = Report({**waited, 1: _failure(-15)})
    assert report.summary() == "rank 1 hung at job.py:9; ranks 0, 2, 3 failed waiting for it"
    assert report.exit_code() == 1
    # the waiting ranks' tracebacks differ only in their rank: printed once, together
    ((ranks, shown),) = report.tracebacks()
    assert ranks == [0, 2, 3] and shown == trace.format(r=0)
    exited = Report({0: waited[0]})  # rank 1 exited 0: torchrun has no failure for it
    assert exited.summary() == "rank 1 hung at job.py:9; rank 0 failed waiting for it"
    by_exit = Report(
        {
            1: _failure(3, "sys.exit(3)", kind="exit", code=3, at="job.py:4 in main"),
            0: _failure(-15),
        }
    )
    assert by_exit.summary() == "rank 1 exited with code 3 at job.py:4 in main; rank 0 was stopped"
    assert by_exit.exit_code() == 3


def test_liveness_blames_the_rank_that_exited_failed_or_hung() -> None:
    """Three ranks on one store (a TCPStore on 127.0.0.1, as torchrun's agent hosts)."""
    server = tdist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    ranks = [liveness.Liveness(tdist.PrefixStore("job/", server.clone()), r, 3) for r in range(3)]
    try:
        with ranks[0].waiting("all_reduce over ['tp']", [0, 1, 2]):
            ranks[2]._publish()  # rank 2 runs the user's code: not waiting
            ranks[1]._publish()
            ranks[0]._publish()
            assert ranks[1].blame([0, 1, 2], "all_reduce over ['tp']", timed_out=False) is None
            hung = ranks[1].blame([0, 1, 2], "all_reduce over ['tp']", timed_out=True)
            assert (
                hung is not None
                and hung.rank == 2
                and hung.reason.startswith("hung at test_distributed.py:")
            )
            ranks[2].record_exit(liveness.Ending("exit", 3, "sys.exit(3)", at="job.py:7 in main"))
            assert ranks[1].blame([0, 1, 2], "x", timed_out=False) == liveness.Blame(
                2, "exited with code 3 at job.py:7 in main"
            )
            # a rank that failed because of rank 2 points to it
            ranks[0].record_exit(
                liveness.Ending(
                    "failed",
                    1,
                    "DistributedError: ...",
                    cause=liveness.Blame(2, "hung at job.py:7"),
                )
            )
            assert ranks[1].blame([0, 1], "x", timed_out=False) == liveness.Blame(
                2, "hung at job.py:7"
            )
    finally:
        for rank in ranks:
            rank.close()


def test_liveness_blames_a_dead_rank_before_one_that_exited_cleanly() -> None:
    """Rank 1 exited cleanly (it finished its part), rank 2's process is gone without a
    record (killed): rank 0's failed collective is rank 2's doing."""
    server = tdist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    ranks = [liveness.Liveness(tdist.PrefixStore("job/", server.clone()), r, 3) for r in range(3)]
    try:
        ranks[1].record_exit(liveness.Ending("clean", 0, at="job.py:9 in main"))
        dead = subprocess.run(
            [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
        )
        ranks[2].close()
        ranks[2]._thread.join()  # its heartbeat stops: the one below stays
        beat = {
            "t": time.time(),
            "pid": int(dead.stdout),
            "host": ranks[2].host,
            "at": "job.py:5 in step",
            "waiting": None,
        }
        ranks[2].store.set("beat/2", json.dumps(beat))
        ranks[2].store.add("beats", 1)
        assert ranks[0].blame([0, 1, 2], "x", timed_out=False) == liveness.Blame(
            2, "ended without saying why (killed?)"
        )
        assert ranks[0].blame([0, 1], "x", timed_out=False) == liveness.Blame(
            1, "exited with code 0 at job.py:9 in main before the others were done"
        )
    finally:
        for rank in ranks:
            rank.close()


def test_a_leaving_rank_waits_for_the_others_but_not_for_one_that_waits_for_it() -> None:
    server = tdist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    ranks = [liveness.Liveness(tdist.PrefixStore("job/", server.clone()), r, 3) for r in range(3)]
    try:
        start = time.monotonic()
        ranks[0].leave(liveness.Ending("clean", 0), timeout=0.5)  # the others never come: bounded
        assert 0.5 <= time.monotonic() - start < 5
        with ranks[1].waiting("all_gather", [1, 2]):  # rank 1 waits for rank 2 in a collective
            start = time.monotonic()
            ranks[2].leave(liveness.Ending("clean", 0), timeout=30)  # rank 1's heartbeat wakes it
            assert liveness.GRACE_S - 1 < time.monotonic() - start < liveness.GRACE_S + 5
    finally:
        for rank in ranks:
            rank.close()


def test_tessera_errors_show_the_users_frames_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Tessera error says what went wrong at the user's line: the worker leaves
    Tessera's frames out of its traceback, unless TESSERA_DEBUG=1."""
    script = tmp_path / "job.py"
    script.write_text("from tessera import dist\n\ndist.Mesh(axes=['dp'], shape=(0,))\n")
    try:
        exec(compile(script.read_text(), str(script), "exec"), {})
    except Exception as caught:
        error = caught
    assert isinstance(error, TesseraError)
    monkeypatch.delenv("TESSERA_DEBUG", raising=False)
    package = str(ROOT / "tessera")
    short = worker._script_traceback(error, str(script))
    assert f'File "{script}", line 3' in short and package not in short
    monkeypatch.setenv("TESSERA_DEBUG", "1")
    assert package in worker._script_traceback(error, str(script))


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


def _checkpoint_script() -> Any:
    spec = importlib.util.spec_from_file_location(
        "multiprocess_checkpoint", SCRIPTS / "checkpoint.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _assert_same_state(saved: dict[str, Any], expected: dict[str, Any]) -> None:
    """Bit-identical: reference kernels, the same programs on the virtual mesh and on
    processes."""
    assert saved["step"] == expected["step"]
    got, got_tree = pytree.flatten((saved["params"], saved["opt_state"]))
    want, want_tree = pytree.flatten((expected["params"], expected["opt_state"]))
    assert got_tree == want_tree
    for a, b in zip(got, want, strict=True):
        assert a.shape == b.shape and torch.equal(a, b)


@pytest.mark.parametrize(("mode", "nproc"), [("zero3", 4), ("pipeline", 2)])
def test_a_saved_state_dict_holds_the_whole_model(mode: str, nproc: int, tmp_path: Path) -> None:
    """After training steps under ``tessera run`` (ZeRO-3 on dp x tp; a two-stage
    pipeline), rank 0 saves ``step.state_dict(state)``: the whole model and optimizer
    state, equal to the virtual mesh's, not each rank's shard over stale initial values.
    A state resumed from it trains on as the virtual mesh does."""
    result = tessera_run(
        nproc, SCRIPTS / "checkpoint.py", mode, str(tmp_path), timeout=60, kernels="reference"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert all(f"rank {r} OK" in result.stdout for r in range(nproc))
    script = _checkpoint_script()
    step = script.make_step(mode)
    params, x, y = script.initial()
    state = step.init(params)  # the virtual mesh: every rank in this process
    script.train(step, state, x, y, 2)
    _assert_same_state(torch.load(tmp_path / "two_steps.pt"), step.state_dict(state))
    assert not torch.equal(state.params["w0"], script.initial()[0]["w0"])  # it trained
    script.train(step, state, x, y, 1)
    _assert_same_state(torch.load(tmp_path / "three_steps.pt"), step.state_dict(state))


def test_train_moe_over_four_processes() -> None:
    """``tessera run -n 4 examples/train_moe.py``: expert parallelism over gloo, dp x ep
    = 2 x 2, the dispatch and combine all-to-alls between processes; every step's loss
    equals the float64 torch loop that routes the same way (the script checks it)."""
    env = {
        k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "TESSERA_BACKEND")
    }
    command = [
        sys.executable,
        "-m",
        "tessera.tools.launch",
        "run",
        "-n",
        "4",
        "--timeout",
        "300",
        "examples/train_moe.py",
        "--steps",
        "2",
        "--layers",
        "1",
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=420, env=env, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "all_to_all[ep]" in result.stdout and result.stdout.rstrip().endswith("OK"), (
        result.stdout[-2000:]
    )


def test_train_gpt_over_four_processes() -> None:
    """``tessera run -n 4 examples/train_gpt.py``: a dp x tp training step per rank (gloo);
    every step's loss equals the torch single-device loop (the script checks it)."""
    env = {
        k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "TESSERA_BACKEND")
    }
    command = [
        sys.executable,
        "-m",
        "tessera.tools.launch",
        "run",
        "-n",
        "4",
        "--timeout",
        "120",
        "examples/train_gpt.py",
        "--steps",
        "2",
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=240, env=env, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "mesh 2 x 2" in result.stdout and result.stdout.rstrip().endswith("OK")


def test_ring_attention_over_four_processes() -> None:
    """Ring attention (causal, zig-zag) over cp = 4, one rank per process (gloo): k/v
    blocks and dk/dv accumulators pass round the ring as send/recv pairs; results and
    gradients match torch autograd in float64, for inputs in natural order (relayout into
    zig-zag and back) and stored in zig-zag order (``zigzag=4``: ring shifts only)."""
    result = tessera_run(4, SCRIPTS / "ring_attention.py", limit=240.0)
    assert result.returncode == 0, result.stderr[-3000:]
    for rank in range(4):
        assert f"rank {rank} OK" in result.stdout


@pytest.mark.parametrize(
    ("precision", "mesh"),
    [("f32", "dp_tp"), ("bf16", "dp_tp"), ("fp16", "dp_tp"), ("bf16", "pp_dp"), ("fp16", "pp_dp")],
)
def test_remat_clipping_and_accumulation_over_processes_equal_the_virtual_mesh(
    precision: str, mesh: str, tmp_path: Path
) -> None:
    """A ZeRO-3 dp x tp step (or a ZeRO-2 pipelined pp x dp step) with recomputed blocks,
    clipping by global norm, accumulated microbatches, mixed precision and the
    deterministic numerics: four gloo processes train bit-identically to the virtual
    mesh (reference kernels), and every rank's metrics are plain values."""
    result = tessera_run(
        4,
        SCRIPTS / "training_options.py",
        str(tmp_path),
        precision,
        mesh,
        timeout=90,
        limit=150.0,
        kernels="reference",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    spec = importlib.util.spec_from_file_location(
        "multiprocess_training_options", SCRIPTS / "training_options.py"
    )
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    step = script.make_step(precision, mesh)
    params, x, y = script.initial()
    state = step.init(params)
    metrics = script.train(step, state, x, y)
    saved = torch.load(tmp_path / "state.pt")
    assert saved["metrics"] == metrics
    assert metrics[0][1] > 0.5  # the clipping is active
    _assert_same_state(saved["state"], step.state_dict(state))


def test_shard_map_regions_over_four_processes() -> None:
    """A dist.shard_map Megatron MLP (explicit all_reduce, ppermute) and its gradient,
    one rank per process, equal torch eager."""
    result = tessera_run(4, SCRIPTS / "shard_map.py", limit=180.0)
    assert result.returncode == 0, result.stderr[-3000:]
    for rank in range(4):
        assert f"rank {rank}: shard_map forward and gradient match torch eager" in result.stdout
