"""``scripts/device_check.sh --dry-run``: every step of the GPU check, on the CPU at tiny
sizes, into one markdown file (about a minute on a 2-core machine)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SECTIONS = (
    "# Tessera device check",
    "## Environment",
    "## (a) GPU tests",
    "## (b) Generated kernels vs torch (benchmarks/kernels.py)",
    "## (c) Attention forward and backward vs torch SDPA",
    "## (d) GPT training step on one GPU: tokens/s and MFU",
    "## (e) CUDA graphs vs plain dispatch",
    "## Summary",
)


def test_the_dry_run_writes_every_section_without_a_failure(tmp_path: Path) -> None:
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable}
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "device_check.sh"), "--dry-run"],
        cwd=tmp_path,  # the script finds the repository itself
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    report = (tmp_path / "device_check.md").read_text()
    assert done.returncode == 0, report + done.stderr
    assert done.stdout == report  # echoed as written
    for section in SECTIONS:
        assert f"\n{section}" in f"\n{report}", section
    assert "FAILED" not in report
    assert report.count("skipped: no CUDA") == 2  # the GPU tests and benchmarks/kernels.py
    for row in ("| forward causal float32 |", "| backward causal float32 |", "| MLP forward |"):
        assert row in report, row
    assert "| n/a (no peak for this device) |" in report  # the GPT step's MFU on a CPU
    assert "every step passed" in report
