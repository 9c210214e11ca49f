"""How long the planner's strategy search takes, cold: each run is a fresh process with the
program cache off (``TESSERA_PROGRAM_CACHE=0``), so every layer program is compiled.

For each model, GPU count and ``--jobs`` value it runs ``tessera plan recommend
--no-pareto --json`` ``--repeat`` times and prints the median and the range of the
search's own seconds (``search_seconds``: enumeration, layer compiles, screening and the
finalists' simulations; not the interpreter's start-up), the layer programs compiled and
the process's wall seconds.

    python benchmarks/planner_time.py                                   # llama3-405b, 1024
    python benchmarks/planner_time.py --model llama3-70b --gpus 64 --jobs 1 2 --repeat 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def one_search(model: str, gpus: int, jobs: int) -> tuple[float, int, float]:
    """(search seconds, layer programs compiled, process wall seconds) of one cold run."""
    command = [
        sys.executable, "-m", "tessera.tools.launch", "plan", "recommend", "--model", model,
        "--gpus", str(gpus), "--no-pareto", "--json", "--jobs", str(jobs),
    ]  # fmt: skip
    env = {**os.environ, "TESSERA_PROGRAM_CACHE": "0", "PYTHONPATH": str(ROOT)}
    started = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    wall = time.perf_counter() - started
    report = json.loads(done.stdout)
    return report["search_seconds"], report["compiled_programs"], wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="llama3-405b")
    parser.add_argument("--gpus", type=int, default=1024)
    parser.add_argument("--jobs", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(f"{args.model} on {args.gpus} GPUs, {args.repeat} cold runs each; os.cpu_count()={os.cpu_count()}")
    print("| jobs | search s (median) | min | max | layer programs | process wall s (median) |")
    print("|---:|---:|---:|---:|---:|---:|")
    for jobs in args.jobs:
        runs = [one_search(args.model, args.gpus, jobs) for _ in range(args.repeat)]
        seconds = [r[0] for r in runs]
        print(
            f"| {jobs} | {statistics.median(seconds):.1f} | {min(seconds):.1f} | "
            f"{max(seconds):.1f} | {runs[0][1]} | {statistics.median(r[2] for r in runs):.1f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
