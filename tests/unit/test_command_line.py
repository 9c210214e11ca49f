"""The console scripts as a new user meets them: ``--version``, ``tessera-opt --help``'s
pass list, and the commands ``tessera plan launch`` prints, which must run."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from tessera.passes import _PASSES, pass_summaries

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent  # where tessera, tessera-opt and torchrun are


def _env(**extra: str) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "TESSERA_BACKEND")
    }
    return env | extra


@pytest.mark.parametrize("tool", ["tessera", "tessera-opt"])
def test_version_prints_the_version_and_exits_0(tool: str) -> None:
    result = subprocess.run(
        [str(BIN / tool), "--version"], capture_output=True, text=True, timeout=120, env=_env()
    )
    assert result.returncode == 0, result.stderr
    assert f"Tessera {version('tessera')}".lower() in result.stdout.lower(), result.stdout


def _option_paragraphs(module: str, cls: str) -> list[str]:
    """The paragraphs of a pass class's docstring that describe an option (````name``: ...``)."""
    source = Path(ROOT / (module.replace(".", "/") + ".py")).read_text()
    node = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == cls)
    paragraphs = (" ".join(p.split()) for p in (ast.get_docstring(node) or "").split("\n\n"))
    return [p for p in paragraphs if re.match(r"``[\w-]+``:", p)]


def test_help_gives_each_pass_its_own_description() -> None:
    """Not an option's text (``shard-partition`` was described by its ``context`` option)."""
    result = subprocess.run(
        [str(BIN / "tessera-opt"), "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(),
    )
    assert result.returncode == 0, result.stderr
    summaries = pass_summaries()
    for flag, (module, cls) in _PASSES.items():
        summary = summaries[flag]
        assert re.search(rf"^  {re.escape(flag)} +{re.escape(summary)}$", result.stdout, re.M), flag
        for paragraph in _option_paragraphs(module, cls):
            text = re.sub(r"^``[\w-]+``:\s*", "", paragraph)
            assert summary.lower() != text.lower(), (flag, summary)
    assert summaries["shard-partition"].startswith(
        "Rewrites each sharded function into the program one rank runs"
    )


def _launch(*args: str) -> dict:
    import contextlib
    import io

    from tessera.plan.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["launch", "--model", "llama3-8b", "--json", *args]) == 0
    return json.loads(out.getvalue())


def test_what_plan_launch_prints_runs_over_processes() -> None:
    """The single-node torchrun command ``launch`` prints for tp 2 with sequence
    parallelism, run as printed (1 step of a 1-layer GPT, reference kernels)."""
    plan = _launch("--gpus", "2", "--tp", "2", "--global-batch", "4",
                   "examples/train_gpt.py", "--steps", "1", "--layers", "1")  # fmt: skip
    command = plan["torchrun_single_node"]
    assert "--sequence-parallel" in command and "--micro-batch=1" in command, command
    assert not plan["notes"], plan["notes"]
    command = command.replace(" torchrun ", f" {BIN}/torchrun ", 1)
    result = subprocess.run(
        ["bash", "-c", command], cwd=ROOT, capture_output=True, text=True, timeout=300,
        env=_env(TESSERA_KERNELS="reference", OMP_NUM_THREADS="1"),
    )  # fmt: skip
    assert result.returncode == 0, f"{command}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    assert result.stdout.rstrip().splitlines()[-1] == "OK", result.stdout[-3000:]


def test_what_plan_launch_prints_for_a_pipeline_runs() -> None:
    """pp 2 x dp 2 x tp 2 with ZeRO-1 (the default), sequence parallelism and full
    recomputation: the printed script arguments, on the virtual mesh."""
    plan = _launch("--gpus", "8", "--pp", "2", "--tp", "2", "--dp", "2", "--global-batch", "8",
                   "--remat", "full", "examples/train_gpt.py", "--steps", "1", "--layers", "2")  # fmt: skip
    words = plan["torchrun_single_node"].split()
    script = words[next(i for i, w in enumerate(words) if w.endswith(".py")) :]
    assert "--remat=nothing" in script and "--schedule=1f1b" in script, script
    assert "--zero=1" in script and "--sequence-parallel" in script and not plan["notes"], plan
    result = subprocess.run(
        [sys.executable, *script], cwd=ROOT, capture_output=True, text=True, timeout=300,
        env=_env(TESSERA_KERNELS="reference"),
    )  # fmt: skip
    assert result.returncode == 0, f"{script}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    assert "mesh pp 2 x dp 2 x tp 2" in result.stdout and "4 microbatches" in result.stdout
    assert result.stdout.rstrip().splitlines()[-1] == "OK", result.stdout[-3000:]


def test_launch_notes_what_the_script_cannot_run() -> None:
    plan = _launch("--gpus", "16", "--pp", "2", "--tp", "8", "--zero", "3", "train.py")
    assert any("do not support ZeRO-3" in note for note in plan["notes"]), plan["notes"]


def _setup_env_installs(tmp_path: Path, gpu: bool) -> list[str]:
    """The pip commands ``scripts/setup-env.sh`` runs in a fresh venv without torch (a fake
    venv whose pip logs its arguments and fails for the first index tried)."""
    venv, tools = tmp_path / "venv", tmp_path / "tools"
    (venv / "bin").mkdir(parents=True)
    tools.mkdir()
    log = tmp_path / "pip.log"
    (venv / "bin" / "python").write_text("#!/bin/sh\nexit 1\n")  # `import torch` fails
    (venv / "bin" / "pip").write_text(
        f'#!/bin/sh\necho "$*" >> {log}\n[ "$(wc -l < {log})" -gt 1 ]\n'
    )  # the first install fails: the fallback runs
    for tool in ("python", "pip"):
        (venv / "bin" / tool).chmod(0o755)
    if gpu:
        (tools / "nvidia-smi").write_text("#!/bin/sh\nexit 0\n")
        (tools / "nvidia-smi").chmod(0o755)
    env = _env(TESSERA_VENV=str(venv), PATH=f"{tools}:/usr/bin:/bin")
    result = subprocess.run(
        ["bash", str(ROOT / "scripts" / "setup-env.sh")], capture_output=True, text=True,
        timeout=60, env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return log.read_text().splitlines()


def test_setup_env_takes_the_cpu_build_of_torch_first_without_a_gpu(tmp_path: Path) -> None:
    if Path("/proc/driver/nvidia").exists():
        pytest.skip("this machine has an NVIDIA driver")
    first, second, *_ = _setup_env_installs(tmp_path, gpu=False)
    assert first == "install --quiet torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
    assert second == "install --quiet torch==2.13.0"


def test_setup_env_takes_the_cuda_build_of_torch_first_with_a_gpu(tmp_path: Path) -> None:
    first, second, *_ = _setup_env_installs(tmp_path, gpu=True)
    assert first == "install --quiet torch==2.13.0"
    assert (
        second == "install --quiet torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
    )
