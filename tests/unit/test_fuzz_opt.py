"""The ``tessera-opt`` fuzzer: a small campaign finds no traceback and no hang, and the
fuzzer itself tells tracebacks, hangs and diagnostics apart."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tessera.tools.fuzz import fuzz, load_seeds
from tessera.tools.fuzz.mutations import MUTATIONS, mutate
from tessera.tools.fuzz.opt_worker import OptWorker, Run
from tessera.tools.fuzz.verdict import ACCEPTED, CLEAN, HANG, TRACEBACK, UNLOCATED, judge

LIT = Path(__file__).resolve().parents[1] / "lit"
INPUTS = 300
SEED = 18


def test_a_small_campaign_finds_no_traceback_and_no_hang(tmp_path):
    report = fuzz(load_seeds(LIT), INPUTS, SEED, deadline=20.0, findings=tmp_path)
    assert report.inputs == INPUTS
    assert not report.sites[TRACEBACK] and not report.sites[HANG], (
        f"{report.table()}\n(inputs and outputs in {tmp_path}; rerun with "
        f"python benchmarks/fuzz_opt.py --inputs {INPUTS} --seed {SEED})"
    )
    assert report.kinds[CLEAN] > INPUTS // 2  # the inputs reach the parser and verifiers
    assert report.kinds[ACCEPTED] > INPUTS // 20  # and some reach the passes


def test_seeds_come_with_their_lit_pipelines():
    seeds = load_seeds(LIT)
    by_source = {s.source: s for s in seeds}
    tile = by_source["passes/lower-schedule-to-tile-shared.mlir"]
    assert () in tile.pipelines
    assert ("-p", "lower-schedule-to-tile{block=64}", "-t", "triton") in tile.pipelines
    pieces = [s for s in seeds if s.source == "dialects/schedule/invalid.mlir"]
    assert len(pieces) > 10  # one seed per --split-input-file piece


def test_mutations_are_reproducible_and_change_the_input():
    text = (LIT / "passes" / "cse.mlir").read_bytes()
    for name, (mutation, _) in MUTATIONS.items():
        first = mutation(text, text, random.Random(1))
        assert first == mutation(text, text, random.Random(1)), name
    changed = sum(mutate(text, text, random.Random(i))[0] != text for i in range(50))
    assert changed >= 45


@pytest.mark.parametrize(
    ("run", "kind", "site"),
    [
        (Run(1, stderr="in.mlir:3:5: error: graph.neg: bad\n"), CLEAN, ""),
        (Run(1, stderr="tessera-opt: error: bad\n"), UNLOCATED, ""),
        (  # the input's text quoted under a diagnostic is not the tool's output
            Run(1, stderr="in.mlir:6:1: error: bad\n// CHECK-NOT: internal error\n^\n"),
            CLEAN,
            "",
        ),
        (Run(0, stdout="builtin.module {}\n"), ACCEPTED, ""),
        (Run(2), TRACEBACK, "exit status 2"),
        (Run(None, died="worker exited with status -11"), TRACEBACK, "worker died"),
        (Run(None, stack='  File "/x/y.py", line 7 in spin\n'), HANG, "hang at /x/y.py:7 (spin)"),
        (
            Run(
                1,
                stderr="tessera-opt: internal error in pass 'cse': IndexError: no\n"
                "Traceback (most recent call last):\n"
                '  File "/x/a.py", line 3, in f\n    g()\n'
                '  File "/x/b.py", line 9, in g\n    [][1]\n'
                "IndexError: no\n",
            ),
            TRACEBACK,
            "IndexError at /x/b.py:9 (g)",
        ),
    ],
)
def test_verdicts(run, kind, site):
    verdict = judge(run)
    assert verdict.kind == kind
    assert verdict.site.startswith(site)


def test_the_worker_survives_a_hang():
    worker = OptWorker()
    program = (LIT / "passes" / "cse.mlir").read_bytes()
    try:
        fine = worker.run(program, ["-p", "cse"], deadline=60.0)
        assert fine.exit_code == 0 and "func.return" in fine.stdout
        hung = worker.run(program, ["-p", "cse"], deadline=0.0001)  # too little time
        assert hung.hung and judge(hung).kind == HANG
        again = worker.run(program, ["-p", "cse"], deadline=60.0)  # a fresh worker
        assert again.exit_code == 0 and worker.restarts == 1
    finally:
        worker.close()
