"""A fuzzing campaign: mutated seeds through ``tessera-opt``, counted by verdict.

Input ``i`` of a campaign depends only on the seed list and the random seed, so a
campaign is reproducible. Each traceback and hang is written (the first few per site) to
the findings directory as ``<kind>-<site number>-<input number>.mlir``, with a ``.txt``
beside it giving the command, the seed it came from and the output.
"""

from __future__ import annotations

import dataclasses
import random
import shlex
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tessera.passes import get_all_passes
from tessera.tools.fuzz.corpus import Seed
from tessera.tools.fuzz.mutations import mutate
from tessera.tools.fuzz.opt_worker import INPUT_NAME, OptWorker, Run
from tessera.tools.fuzz.verdict import ACCEPTED, CLEAN, HANG, TRACEBACK, UNLOCATED, Verdict, judge

EXAMPLES_PER_SITE = 3
PASS_SEED_WEIGHT = 3  # seeds that lit runs passes on are picked this much more often
ALL_PASSES = tuple(get_all_passes())
# the compile driver's passes in its order (tessera.driver), from graph IR to tile kernels
FULL_PIPELINE = (
    "canonicalize,cse,dce,shard-propagate,insert-collectives,shard-partition,"
    "lower-graph-to-schedule,overlap-comm,bucket-gradients,plan-memory,lower-schedule-to-tile"
)
OPTION_VALUES = ("0", "-1", "1", "3", "99999999999", "true", "nowhere", '""')


@dataclass
class Report:
    """Counts of a campaign: by verdict kind, and tracebacks and hangs by site."""

    inputs: int = 0
    seconds: float = 0.0
    kinds: Counter[str] = field(default_factory=Counter)
    sites: dict[str, Counter[str]] = field(
        default_factory=lambda: {TRACEBACK: Counter(), HANG: Counter()}
    )

    def add(self, verdict: Verdict) -> None:
        self.inputs += 1
        self.kinds[verdict.kind] += 1
        if verdict.kind in self.sites:
            self.sites[verdict.kind][verdict.site] += 1

    def table(self) -> str:
        """A Markdown table of the counts, then the sites of tracebacks and hangs."""
        columns = {
            "inputs": self.inputs,
            "clean diagnostics": self.kinds[CLEAN],
            "unlocated errors": self.kinds[UNLOCATED],
            "accepted": self.kinds[ACCEPTED],
            "tracebacks": self.kinds[TRACEBACK],
            "distinct traceback sites": len(self.sites[TRACEBACK]),
            "hangs": self.kinds[HANG],
            "seconds": f"{self.seconds:.0f}",
        }
        lines = [
            "| " + " | ".join(columns) + " |",
            "|" + "---:|" * len(columns),
            "| " + " | ".join(str(v) for v in columns.values()) + " |",
        ]
        for kind, title in ((TRACEBACK, "Tracebacks"), (HANG, "Hangs")):
            if self.sites[kind]:
                lines += ["", f"{title} by site:"]
                lines += [f"- {n} × {site}" for site, n in self.sites[kind].most_common()]
        return "\n".join(lines)


def fuzz(
    seeds: Sequence[Seed],
    inputs: int,
    seed: int = 0,
    deadline: float = 10.0,
    findings: Path | None = None,
    progress: Callable[[Report], None] | None = None,
) -> Report:
    """Runs ``inputs`` mutated inputs (random seed ``seed``), each with at most
    ``deadline`` seconds; writes tracebacks and hangs under ``findings`` if given."""
    rng = random.Random(seed)
    weights = [PASS_SEED_WEIGHT if len(s.pipelines) > 1 else 1 for s in seeds]
    report = Report()
    worker = OptWorker()
    site_numbers: dict[str, int] = {}
    examples: Counter[str] = Counter()
    start = time.perf_counter()
    try:
        for index in range(inputs):
            first, second = rng.choices(seeds, weights, k=2)
            data, mutations = mutate(first.text.encode(), second.text.encode(), rng)
            args = _arguments(first, second, rng)
            run = worker.run(data, args, deadline)
            verdict = judge(run)
            report.add(verdict)
            if findings is not None and verdict.kind in (TRACEBACK, HANG):
                number = site_numbers.setdefault(verdict.site, len(site_numbers))
                if examples[verdict.site] < EXAMPLES_PER_SITE:
                    examples[verdict.site] += 1
                    origin = (
                        f"{first.source} mutated by {', '.join(mutations)} (with {second.source})"
                    )
                    _write_finding(
                        findings,
                        f"{verdict.kind}-{number:03d}-{index:06d}",
                        data,
                        args,
                        verdict,
                        origin,
                        run,
                    )
            report.seconds = time.perf_counter() - start
            if progress is not None:
                progress(report)
    finally:
        worker.close()
    return report


def _arguments(first: Seed, second: Seed, rng: random.Random) -> list[str]:
    """Mostly a pipeline that lit runs on one of the two seeds; sometimes none (parse
    and verify only), one to three passes of any kind (bad input must not crash any
    pass), a pass option with an odd value, or the compile driver's whole pipeline."""
    draw = rng.random()
    if draw < 0.15:
        return []
    if draw < 0.3:
        return ["-p", ",".join(rng.choices(ALL_PASSES, k=rng.randint(1, 3)))]
    if draw < 0.35:  # a pass option with an odd value
        flag = rng.choice(ALL_PASSES)
        options = [f.name for f in dataclasses.fields(get_all_passes()[flag]())]
        if options:
            flag += f"{{{rng.choice(options)}={rng.choice(OPTION_VALUES)}}}"
        return ["-p", flag]
    if draw < 0.45:  # as far as the input goes: the whole compile, then Triton source
        return ["-p", FULL_PIPELINE, *(["-t", "triton"] if rng.random() < 0.5 else [])]
    pipelines = [p for p in (*first.pipelines, *second.pipelines) if p] or [()]
    return list(rng.choice(pipelines))


def _write_finding(
    directory: Path,
    name: str,
    data: bytes,
    args: list[str],
    verdict: Verdict,
    origin: str,
    run: Run,
) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{name}.mlir").write_bytes(data)
    command = shlex.join(["tessera-opt", f"{name}.mlir", *args])
    (directory / f"{name}.txt").write_text(
        f"{verdict.kind}: {verdict.site}\ncommand: {command}\nfrom: {origin}\n"
        f"(the input was run as {INPUT_NAME})\n\n--- stderr\n{run.stderr}\n--- stdout (end)\n"
        f"{run.stdout}\n--- stack\n{run.escaped or run.stack}\n",
        encoding="utf-8",
    )
