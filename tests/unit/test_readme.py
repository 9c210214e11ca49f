"""The README is true: every command of its ```sh blocks and every ```python block runs
as a new user runs it, and the outputs it shows are what the programs print.

Commands run from the repository root under bash, with ``.venv/bin/`` replaced by the
directory of the Python running the tests (the repository's ``.venv/bin`` under
``scripts/test.sh``). ``COMMANDS`` says how each README command is run here: as written,
or reduced where it is recursive or too slow for the unit tests (the substitutions are
listed next to it), or by a named test elsewhere that already runs it (no second run).
A ```sh command in README.md that is not in ``COMMANDS``, or an entry of ``COMMANDS`` that
is no longer in README.md, fails ``test_every_readme_command_is_covered``.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
BIN = Path(sys.executable).parent  # where .venv/bin/python, tessera and tessera-opt are
IR = ROOT / "examples" / "ir"


@dataclass(frozen=True)
class Run:
    """One command to run (``.venv/bin/`` as in the README) and what it must print."""

    command: str
    kernels: str = "reference"  # TESSERA_KERNELS: Triton's interpreter is slow on a CPU
    last_line: str | None = "OK"  # the last line of stdout, if given
    expect: tuple[str, ...] = ()  # substrings of stdout
    check: Callable[[str], None] | None = None  # more checks of stdout
    timeout: float = 240.0


def _header_stripped(path: Path) -> str:
    return "".join(line for line in path.read_text().splitlines(True) if not line.startswith("//"))


def _one_tanh(out: str) -> None:
    assert out.count("graph.tanh") == 1, out


def _is_the_shipped_partitioned_program(out: str) -> None:
    assert out.strip() == _header_stripped(IR / "megatron_mlp.partitioned.mlir").strip()


def _lists_the_passes(out: str) -> None:
    for flag in ("canonicalize", "cse", "shard-propagate", "insert-collectives", "shard-partition"):
        assert f"\n  {flag} " in out, flag
    assert "bucket_bytes: int = 26214400" in out  # and their options


def _triton_source(out: str) -> None:
    kernels = re.findall(r"^# --- kernel @(\w+)", out, re.MULTILINE)
    assert kernels and out.count("@triton.jit") == len(kernels), out[:2000]
    assert any("matmul" in k for k in kernels), kernels


def _gpt_block(out: str) -> None:
    assert "graph.attention" in out and "graph.layer_norm" in out, out[-3000:]


def _megatron_mlp(out: str) -> None:
    assert out.count("collective: all_reduce over ['tp']") == 1, out[-3000:]
    assert "graph.partitioned" in out


def _zero_2(out: str) -> None:
    assert "mesh 2 x 2, ZeRO-2" in out and "reduce_scatter[dp]" in out, out[-3000:]


DEMO_CHECKS = {
    "examples/gpt_block.py": _gpt_block,
    "examples/megatron_mlp.py": _megatron_mlp,
    "examples/train_gpt.py": _zero_2,
}


def _demo() -> tuple[Run, ...]:
    """``scripts/demo.sh`` less its set-up (the tests run inside it), each program
    reduced: ``--steps 10`` -> ``--steps 2`` (the loss must decrease, so 2 at least)."""
    lines = (ROOT / "scripts" / "demo.sh").read_text().split('cd "$root"\n', 1)[1].splitlines()
    runs = []
    for line in (line.strip() for line in lines):
        if not line or line.startswith("#"):
            continue
        assert line.startswith("python examples/"), (
            f"scripts/demo.sh: cover {line!r} in test_readme.py"
        )
        command = ".venv/bin/" + line.replace(' "$@"', "").replace("--steps 10", "--steps 2")
        kernels = "reference" if "train_gpt" in line else "triton"
        runs.append(Run(command, kernels=kernels, check=DEMO_CHECKS.get(line.split()[1])))
    assert len(runs) == 3, runs
    return tuple(runs)


AS_WRITTEN = "as written"
COMMANDS: dict[str, tuple[Run, ...] | str] = {
    # as written: compiles (nothing runs) a 2- and an 8-layer training step
    ".venv/bin/python benchmarks/compile_time.py --layers 2 8 --stages schedule tile triton": (
        Run(
            ".venv/bin/python benchmarks/compile_time.py --layers 2 8 --stages schedule tile triton",
            last_line=None,
            expect=("distinct kernels", "| 8 |"),
        ),
    ),
    "bash scripts/demo.sh": _demo(),
    # Recursive: CI runs it (.ci/run). Here: it parses, and the tools it calls are installed.
    "bash scripts/test.sh": (
        Run("bash -n scripts/test.sh && test -x .venv/bin/ruff && test -x .venv/bin/lint-imports && test -x .venv/bin/lit", last_line=None),
    ),
    # --steps 50 -> 2; the one README training through the generated (interpreted) kernels
    ".venv/bin/python examples/train_gpt.py --steps 50": (
        Run(".venv/bin/python examples/train_gpt.py --steps 2", kernels="triton", expect=("mesh 2 x 2, ZeRO-0",)),
    ),
    # --steps 10 -> 2
    ".venv/bin/python examples/train_gpt.py --zero 3 --steps 10": (
        Run(".venv/bin/python examples/train_gpt.py --zero 3 --steps 2", expect=("mesh 2 x 2, ZeRO-3",)),
    ),
    # --steps 10 -> 2
    ".venv/bin/python examples/train_gpt.py --remat nothing --steps 10": (
        Run(".venv/bin/python examples/train_gpt.py --remat nothing --steps 2", expect=("ZeRO-0, remat nothing",)),
    ),
    # --steps 10 -> 2
    ".venv/bin/python examples/train_gpt.py --precision bf16 --steps 10": (
        Run(".venv/bin/python examples/train_gpt.py --precision bf16 --steps 2", expect=("remat everything, bf16",)),
    ),
    ".venv/bin/python examples/train_gpt.py --precision fp8 --steps 10": (
        Run(".venv/bin/python examples/train_gpt.py --precision fp8 --steps 2", expect=("remat everything, fp8",)),
    ),
    # the same job with --steps 2 (and `python -m tessera.tools.launch run` for .venv/bin/tessera run)
    ".venv/bin/tessera run -n 4 examples/train_gpt.py --steps 5": (
        "tests/unit/test_distributed.py::test_train_gpt_over_four_processes"
    ),
    # the same job with --steps 5, --layers 2, --deterministic, faults injected
    ".venv/bin/tessera run -n 2 --max-restarts 3 examples/train_gpt.py --dp 2 --tp 1 --steps 50 --checkpoint-every 5 --save ckpt": (
        "tests/unit/test_faults.py::test_faults_in_steps_and_saves_are_restarted_and_lose_nothing"
    ),
    # as written, through .venv/bin/tessera, with the output's lines checked
    ".venv/bin/tessera run -n 4 examples/distributed_mlp.py": (
        "tests/unit/test_distributed.py::test_readme_example_with_the_console_script"
    ),
    # --steps 5 -> 2, --layers 2 -> 1: still pp x dp x tp = 2 x 2 x 2 processes, 4 microbatches, ZB-H1
    ".venv/bin/tessera run -n 8 examples/train_gpt.py --pp 2 --dp 2 --tp 2 --microbatches 4 --schedule zb-h1 --steps 5": (
        Run(
            ".venv/bin/tessera run -n 8 examples/train_gpt.py --pp 2 --dp 2 --tp 2 --microbatches 4 --schedule zb-h1 --steps 2 --layers 1",
            expect=("mesh pp 2 x dp 2 x tp 2, zb-h1 schedule, 4 microbatches, 2 stages",),
        ),
    ),
    # --steps 20 -> 2, --layers 2 -> 1 (reference kernels: the example test runs Triton's)
    ".venv/bin/python examples/train_moe.py --steps 20": (
        Run(".venv/bin/python examples/train_moe.py --steps 2 --layers 1", expect=("mesh dp 2 x ep 2 x tp 1",)),
    ),
    # --steps 500 -> 3, --warmup 30 -> 1, --eval-every 50 -> 2, --sample 200 -> 20; the log
    # and the plot in a temporary directory (the committed docs/train_llama.png is not rewritten)
    "TESSERA_KERNELS=reference .venv/bin/python examples/train_llama.py --steps 500 --batch 16 --seq 128 --lr-schedule warmup_cosine --warmup 30 --eval-every 50 --log /tmp/shakespeare.jsonl --plot docs/train_llama.png": (
        Run(
            'd=$(mktemp -d) && TESSERA_KERNELS=reference .venv/bin/python examples/train_llama.py --steps 3 --batch 16 --seq 128 --lr-schedule warmup_cosine --warmup 1 --eval-every 2 --sample 20 --no-progress --log "$d/log.jsonl" --plot "$d/curve.png" && test "$(wc -l < "$d/log.jsonl")" -eq 3 && test -s "$d/curve.png" && rm -r "$d"',
            last_line=None, expect=("step 3: train loss", ", val loss ", "--- sample (greedy, ", "tokens/s with the KV cache) ---\nROMEO."),
        ),
    ),
    # the same job with --steps 2 --layers 1 (and `python -m tessera.tools.launch run`)
    ".venv/bin/tessera run -n 4 examples/train_moe.py --steps 3": (
        "tests/unit/test_distributed.py::test_train_moe_over_four_processes"
    ),
    ".venv/bin/tessera-opt examples/ir/duplicate_tanh.mlir -p canonicalize,cse": (
        Run(AS_WRITTEN, last_line=None, check=_one_tanh),
    ),
    ".venv/bin/tessera-opt examples/ir/megatron_mlp.mlir -p shard-propagate,insert-collectives,shard-partition": (
        Run(AS_WRITTEN, last_line=None, check=_is_the_shipped_partitioned_program),
    ),
    ".venv/bin/tessera-opt --help": (Run(AS_WRITTEN, last_line=None, check=_lists_the_passes),),
    # the same campaign (300 inputs, seed 18), asserting no traceback and no hang
    ".venv/bin/python benchmarks/fuzz_opt.py --inputs 300 --seed 18": (
        "tests/unit/test_fuzz_opt.py::test_a_small_campaign_finds_no_traceback_and_no_hang"
    ),
    ".venv/bin/tessera-opt examples/ir/megatron_mlp.partitioned.mlir -p lower-graph-to-schedule,lower-schedule-to-tile -t triton": (
        Run(AS_WRITTEN, last_line=None, check=_triton_source),
    ),
    # the search reduced to tp 8 and bf16 (a tenth of the candidates), Pareto front included
    ".venv/bin/tessera plan recommend --model llama3-70b --gpus 64 --cluster dgx_h100 --seq 8192 --global-batch 1024": (
        Run(
            ".venv/bin/tessera plan recommend --model llama3-70b --gpus 64 --cluster dgx_h100 --seq 8192 --global-batch 1024 --tp 8 --precision bf16 --top 3",
            last_line=None, expect=("rank  strategy", "dp8 tp8", "Pareto front over 64, 32, 128 GPUs"),
        ),
    ),
    # as written; its exit status must be 1 and its messages name the broken rules
    ".venv/bin/tessera plan validate  --model llama3-70b --gpus 64 --cluster dgx_h100 --tp 3 --pp 4 --dp 5": (
        Run(
            ".venv/bin/tessera plan validate  --model llama3-70b --gpus 64 --cluster dgx_h100 --tp 3 --pp 4 --dp 5 2>&1; test $? -eq 1",
            last_line=None, expect=("invalid: tp 3 does not divide the 64 attention heads", "= 60, but the cluster has 64 GPUs"),
        ),
    ),
    ".venv/bin/tessera plan launch    --model llama3-70b --gpus 64 --cluster dgx_h100 --tp 8 --pp 2 --dp 4 train.py": (
        Run(AS_WRITTEN, last_line=None, expect=("torchrun --nnodes=8 --nproc-per-node=8", "#SBATCH --nodes=8")),
    ),
    # the same 16 cells, each asserted to match torch or to be refused by name
    ".venv/bin/python benchmarks/feature_matrix.py --pairwise": (
        "tests/unit/test_feature_matrix.py::test_cell_matches_torch_or_is_refused_by_name"
    ),
    # the same ports, their numbers checked, the printed lines and "OK" asserted
    ".venv/bin/python examples/manual_regions.py": (
        "tests/unit/test_manual_regions.py::test_main_prints_ok_for_every_port"
    ),
    ".venv/bin/python benchmarks/planner.py --no-search": (
        Run(AS_WRITTEN, last_line=None, expect=("Llama 3 405B", "DeepSeek-V3", "mean |error|")),
    ),
}  # fmt: skip


def readme_commands() -> list[str]:
    """Every command of the README's ```sh blocks, its trailing comment removed."""
    commands = []
    for block in re.findall(r"```sh\n(.*?)```", README, re.DOTALL):
        for line in block.splitlines():
            command = re.sub(r"\s+#.*$", "", line).strip()
            if command and not command.startswith("#"):
                commands.append(command)
    return commands


def test_every_readme_command_is_covered() -> None:
    commands = readme_commands()
    assert len(commands) >= 10, commands
    missing = [c for c in commands if c not in COMMANDS]
    assert not missing, f"README commands with no entry in test_readme.COMMANDS: {missing}"
    stale = [c for c in COMMANDS if c not in commands]
    assert not stale, f"test_readme.COMMANDS entries no longer in README.md: {stale}"


def test_commands_run_elsewhere_are_run_there() -> None:
    """A command covered by another test: that test exists and runs the same script."""
    for command, cover in COMMANDS.items():
        if isinstance(cover, str):
            path, name = cover.split("::")
            source = (ROOT / path).read_text()
            assert f"def {name}(" in source, cover
            body = source.split(f"def {name}(", 1)[1].split("\ndef ", 1)[0]
            words = shlex.split(command)
            script = next(w for w in words if w.endswith(".py"))
            assert Path(script).stem in body, (command, cover)
            if "-n" in words:  # `tessera run -n N`: the test runs as many ranks
                ranks = words[words.index("-n") + 1]
                assert re.search(rf'"-n",\s*"{ranks}"', body), (command, cover)  # any formatting


RUNS = [
    pytest.param(readme, run, id=readme if run.command == AS_WRITTEN else run.command)
    for readme, cover in COMMANDS.items()
    if not isinstance(cover, str)
    for run in cover
]


TOOL_DIRS = {".hypothesis", ".pytest_cache", ".ruff_cache", "__pycache__", ".lit_test_times.txt"}


def _root_entries() -> set[str]:
    """The repository root's entries, less the caches the test tools themselves write."""
    return {p.name for p in ROOT.iterdir()} - TOOL_DIRS


@pytest.mark.parametrize(("readme", "run"), RUNS)
def test_readme_command(readme: str, run: Run) -> None:
    """Runs as written (or reduced), from the repository root, and leaves nothing there."""
    command = (readme if run.command == AS_WRITTEN else run.command).replace(
        ".venv/bin/", f"{BIN}/"
    )
    env = {
        k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "TESSERA_BACKEND")
    }
    env["TESSERA_KERNELS"] = run.kernels
    before = _root_entries()
    result = subprocess.run(
        ["bash", "-c", command],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=run.timeout,
    )
    assert result.returncode == 0, f"{command}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    left = sorted(_root_entries() - before)
    assert not left, f"{command} left {left} in the repository root"
    out = result.stdout
    if run.last_line is not None:
        assert out.rstrip().splitlines()[-1] == run.last_line, out[-3000:]
    for text in run.expect:
        assert text in out, out[-3000:]
    if run.check is not None:
        run.check(out)


# --- Python blocks, and the outputs the README shows ----------------------------------------


PYTHON_BLOCKS = re.findall(r"```python\n(.*?)```", README, re.DOTALL)


@pytest.mark.parametrize(
    "block", PYTHON_BLOCKS, ids=[f"python-block-{i}" for i in range(len(PYTHON_BLOCKS))]
)
def test_readme_python_block(block: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every ```python block runs (through the generated Triton kernels, the default), and
    leaves nothing in the directory it runs in (a user runs it from the repository root):
    what it writes goes to the temporary directory."""
    monkeypatch.setenv("TESSERA_KERNELS", "triton")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)  # tempfile.gettempdir() reads TMPDIR again
    with contextlib.redirect_stdout(io.StringIO()):
        exec(compile(block, "README.md", "exec"), {"__name__": "readme"})
    left = [p.name for p in cwd.iterdir()]
    assert not left, f"the block left {left} where it ran"


def test_quick_start_prints_what_the_readme_shows(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TESSERA_KERNELS", "triton")
    quick_start = next(b for b in PYTHON_BLOCKS if "@ts.jit\ndef layer" in b)
    shown = re.search(r"It prints:\n\n```\n(.*?)```", README, re.DOTALL)
    assert shown, "README.md: no output block after 'It prints:'"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(quick_start, "README.md", "exec"), {"__name__": "readme"})
    printed = [line.strip() for line in out.getvalue().splitlines()]
    assert printed[0] == "builtin.module {" and printed[-1] == "}"  # "(inside a builtin.module)"
    assert printed[1:-1] == [line.strip() for line in shown.group(1).splitlines()]


def test_readme_mlir_block_is_the_shipped_file() -> None:
    match = re.search(r"```mlir\n// (examples/ir/\S+)\n(.*?)```", README, re.DOTALL)
    assert match, "README.md: the ```mlir block should start with // <its path>"
    assert (ROOT / match.group(1)).read_text() == match.group(2)


def test_shipped_ir_is_what_the_readme_program_traces() -> None:
    """examples/ir/megatron_mlp*.mlir are the README's sharded mlp (scripts/example_ir.py)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import example_ir
    finally:
        sys.path.pop(0)
    assert example_ir.main(["--check"]) == 0, "run .venv/bin/python scripts/example_ir.py"


# --- "Multiple processes": a failing job reports its error once ------------------------------


def test_launcher_names_ranks_that_failed_alike_together() -> None:
    from types import SimpleNamespace

    from tessera.tools.report import Report

    def failure(code: int, message: str = "") -> SimpleNamespace:
        return SimpleNamespace(exitcode=code, message={"message": message} if message else "")

    same = {r: failure(1, "ValueError: bad input") for r in range(4)}
    assert Report(same).summary() == "ranks 0-3 failed with exit code 1: ValueError: bad input"
    mixed = {0: failure(2), 1: failure(-15), 2: failure(2), 3: failure(-15)}
    assert Report(mixed).summary() == "ranks 0, 2 exited with code 2; ranks 1, 3 were stopped"


def test_a_failing_job_prints_its_traceback_once(tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text('def main():\n    raise ValueError("bad input")\n\n\nmain()\n')
    env = {
        k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "TESSERA_BACKEND")
    }
    result = subprocess.run(
        [str(BIN / "tessera"), "run", "-n", "2", str(script)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    assert result.stderr.count("Traceback (most recent call last):") == 1, result.stderr
    assert result.stderr.count('raise ValueError("bad input")') == 1, result.stderr
    assert "tessera/tools/worker.py" not in result.stderr  # the script's frames only
    summary = result.stderr.strip().splitlines()[-1]
    assert summary.startswith(f"tessera run: {script} failed: ")
    assert "failed with exit code 1: ValueError: bad input" in summary
