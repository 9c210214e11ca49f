"""Faults injected into a training job, and how it recovers; the stall of a checkpoint save.

Each fault runs ``examples/train_gpt.py`` (a 2-layer tiny GPT, dp 2, deterministic
numerics, a checkpoint every step) as ``tessera run -n 2 --max-restarts 1`` with one
``TESSERA_FAULT_INJECT`` fault (:mod:`tessera.training.fault_injection`) at step 3 of 6.
A preempted job (SIGTERM) is not restarted by the launcher: it is launched again, as a
scheduler would. The table says, per fault: whether the job recovered (it ended with
the final checkpoint bit-identical to an uninterrupted run's on the virtual mesh), the
steps lost (trained, then trained again after the restart), and the time to recover
(from the fault-injection line to the restarted job's ``resumed from step`` line:
stopping the ranks, a new rendezvous, importing, compiling, restoring).

The second table times 8 steps of a 4-matrix MLP (1024 x 1024 each, AdamW: 48 MiB of
state) on the virtual mesh with a checkpoint every 2 steps: blocking, or in the
background (``CheckpointManager(async_save=True)``: the state is copied and the steps
go on while a thread writes it). *Loop held by a save* is the time the save call takes
before the loop goes on (the stall); the last column includes waiting for the last save.

    python benchmarks/faults.py             # both tables
    python benchmarks/faults.py --stall     # the save stall only
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT / "tests" / "unit"))

TINY = ["--dp", "2", "--tp", "1", "--layers", "2", "--deterministic", "--log-every", "1"]
STEPS = 6
FAULTS = (
    ("SIGKILL a rank mid-step", "kill:rank=1:step=3", []),
    ("the signing rank killed during a save", "save-kill:rank=0:step=3", []),
    ("disk full (ENOSPC) during a save", "save-enospc:rank=0:step=3", []),
    ("newest checkpoint corrupted", "save-corrupt:rank=0:step=3", []),
    ("a rank hangs (--timeout 20)", "hang:rank=1:step=3", ["--timeout", "20"]),
    ("SIGTERM to the job (preemption)", "term:rank=0:step=3", []),
)


def _launch(faults: str, save: Path, launcher: list[str]) -> tuple[int, list[tuple[float, str]]]:
    """One ``tessera run``: its exit code and its output lines with their arrival times."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    env |= {"TESSERA_FAULT_INJECT": faults, "TESSERA_KERNELS": "reference", "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "tessera.tools.launch", "run", "-n", "2", *launcher]
    command += ["examples/train_gpt.py", *TINY, "--steps", str(STEPS), "--save", str(save)]
    command += ["--checkpoint-every", "1"]
    lines: list[tuple[float, str]] = []
    with subprocess.Popen(
        command, cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    ) as job:
        timer = threading.Timer(600, job.kill)  # no benchmark hangs
        timer.start()
        assert job.stdout is not None
        for line in job.stdout:
            lines.append((time.monotonic(), line.rstrip()))
        code = job.wait()
        timer.cancel()
    return code, lines


def _first(lines: list[tuple[float, str]], pattern: str) -> tuple[float, re.Match[str]] | None:
    for at, line in lines:
        if found := re.search(pattern, line):
            return at, found
    return None


def fault_table(reference: Path, args: argparse.Namespace) -> list[tuple[str, str, str, str]]:
    from test_faults import tensors

    expected = tensors(reference)
    rows = []
    for name, faults, launcher in FAULTS:
        if args.only and args.only not in faults:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            save = Path(tmp) / "ckpt"
            _, lines = _launch(faults, save, ["--max-restarts", "1", *launcher])
            if faults.startswith("term"):  # preempted: launched again
                lines += _launch("", save, [])[1]
            hit = _first(lines, r"fault injection: .*(?:at step |saving step |/step_)(\d+)")
            resumed = _first(lines, r"resumed from step (\d+)")
            final = save / f"step_{STEPS}"
            same = final.is_dir() and all(
                torch.equal(t, expected[n]) for n, t in tensors(final).items()
            )
            if args.verbose and hit is not None:  # the job's own lines, timed from the fault
                for at, line in lines:
                    if line.startswith(("tessera run:", "fault injection:", "resumed from")):
                        print(f"  {at - hit[0]:+7.1f} s  {line[:160]}", flush=True)
            if hit is None or resumed is None:
                rows.append((name, "no", "-", "-"))
                print("\n".join(line for _, line in lines[-30:]), file=sys.stderr)
                continue
            # the state had hit[1] steps; a failed save of it loses the step
            lost = max(0, int(hit[1][1]) - int(resumed[1][1]))
            recovered = "yes" if same else "no (final state differs)"
            rows.append((name, recovered, str(lost), f"{resumed[0] - hit[0]:.1f}"))
            print(f"{name}: {rows[-1][1:]}", flush=True)
    return rows


def stall_table(steps: int = 8, every: int = 2) -> list[tuple[str, float, float, float]]:
    """Per mode: the median step time, the median time the loop is held by a save call,
    and the whole run's time until the last save is complete."""
    from tessera import dist, graph, op, optim
    from tessera.training import CheckpointManager

    @graph.training_step(optimizer=optim.AdamW(lr=1e-3), mesh=dist.mesh({"dp": 1}))
    def step(params, x):
        h = x
        for i in range(4):
            h = op.gelu(h @ params[f"w{i}"])
        loss = op.mean(h * h)
        return graph.backward(loss), {"loss": loss}

    params = {f"w{i}": torch.randn(1024, 1024) / 32 for i in range(4)}
    state = step.init(params)
    x = torch.randn(16, 1024)
    step(state, x)  # compile
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for mode in ("no save", "blocking save", "background save"):
            manager = CheckpointManager(
                Path(tmp) / mode.replace(" ", "_"), every=every, keep_last=2,
                async_save=mode == "background save",
            )  # fmt: skip
            stepping, saving = [], []
            start = time.perf_counter()
            for _ in range(steps):
                begin = time.perf_counter()
                step(state, x)
                stepping.append(time.perf_counter() - begin)
                if mode != "no save" and manager.due(state.step):
                    begin = time.perf_counter()
                    manager.save(step, state)
                    saving.append(time.perf_counter() - begin)
            manager.wait()
            total = time.perf_counter() - start
            median = statistics.median
            rows.append((mode, 1e3 * median(stepping), 1e3 * median(saving or [0.0]), total))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stall", action="store_true", help="the save stall table only")
    parser.add_argument("--only", default=None, help="only the faults whose spec holds this")
    parser.add_argument("--verbose", action="store_true", help="print each job's own lines")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if not args.stall:
        import train_gpt

        with tempfile.TemporaryDirectory() as tmp:
            train_gpt.main([*TINY, "--steps", str(STEPS), "--save", tmp])
            rows = fault_table(Path(tmp) / f"step_{STEPS}", args)
        print("\n| fault injected | recovered | steps lost | time to recover (s) |")
        print("|---|---|---:|---:|")
        for row in rows:
            print("| " + " | ".join(row) + " |")
    stall = stall_table()
    print(
        "\n| checkpoint every 2 steps | step, median (ms) | loop held by a save, median (ms) "
        "| 8 steps, last save complete (s) |"
    )
    print("|---|---:|---:|---:|")
    for mode, step_ms, save_ms, total in stall:
        print(f"| {mode} | {step_ms:.0f} | {save_ms:.0f} | {total:.2f} |")


if __name__ == "__main__":
    main()
