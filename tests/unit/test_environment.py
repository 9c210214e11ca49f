"""Tessera's environment variables: each accepted value is read as documented, and any
other value is an error naming the variable, the value and what is accepted."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tessera import environment
from tessera.environment import EnvironmentVariableError

READERS = {
    "TESSERA_KERNELS": environment.kernels,
    "TESSERA_BACKEND": environment.backend,
    "TESSERA_DEVICE": environment.device,
    "TESSERA_TIMEOUT": environment.timeout,
    "TESSERA_AUTOTUNE": environment.autotune,
    "TESSERA_PROGRAM_CACHE": environment.program_cache,
    "TESSERA_DEBUG": environment.debug,
    "TESSERA_FP8_DOTS": environment.fp8_dots,
    "WORLD_SIZE": environment.world_size,
}


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("TESSERA_KERNELS", "reference", "reference"),
        ("TESSERA_KERNELS", " Triton ", "triton"),
        ("TESSERA_BACKEND", "virtual", "virtual"),
        ("TESSERA_DEVICE", "CUDA", "cuda"),
        ("TESSERA_TIMEOUT", "7.5", 7.5),
        ("TESSERA_AUTOTUNE", "off", False),
        ("TESSERA_AUTOTUNE", "Yes", True),
        ("TESSERA_PROGRAM_CACHE", "0", False),
        ("TESSERA_DEBUG", "1", True),
        ("TESSERA_FP8_DOTS", "On", "on"),
        ("WORLD_SIZE", "4", 4),
    ],
)
def test_accepted_values_are_read(monkeypatch, name, value, expected):
    monkeypatch.setenv(name, value)
    assert READERS[name]() == expected


@pytest.mark.parametrize("name", sorted(READERS))
def test_unset_or_empty_means_the_default(monkeypatch, name):
    monkeypatch.delenv(name, raising=False)
    default = READERS[name]()
    monkeypatch.setenv(name, "  ")
    assert READERS[name]() == default


@pytest.mark.parametrize(
    ("name", "value", "accepted"),
    [
        ("TESSERA_KERNELS", "tritonn", "one of triton, reference"),
        ("TESSERA_BACKEND", "nccl", "one of auto, virtual"),
        ("TESSERA_DEVICE", "gpu", "one of cpu, cuda"),
        ("TESSERA_AUTOTUNE", "maybe", "one of 1, true, yes, on or 0, false, no, off"),
        ("TESSERA_PROGRAM_CACHE", "2", "one of 1, true"),
        ("TESSERA_FP8_DOTS", "yes", "one of auto, on, off"),
        ("TESSERA_TIMEOUT", "nan", "a positive, finite number of seconds"),
        ("TESSERA_TIMEOUT", "inf", "a positive, finite number of seconds"),
        ("TESSERA_TIMEOUT", "-1", "a positive, finite number of seconds"),
        ("TESSERA_TIMEOUT", "0", "a positive, finite number of seconds"),
        ("TESSERA_TIMEOUT", "ten", "a positive, finite number of seconds"),
        ("WORLD_SIZE", "four", "a whole number of at least 1"),
        ("WORLD_SIZE", "0", "a whole number of at least 1"),
    ],
)
def test_other_values_name_the_variable_and_what_it_accepts(monkeypatch, name, value, accepted):
    monkeypatch.setenv(name, value)
    with pytest.raises(EnvironmentVariableError) as error:
        READERS[name]()
    message = str(error.value)
    assert f"{name}={value!r} is not valid" in message
    assert accepted in message


def test_rank_must_be_below_the_world_size(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    assert environment.rank() == 1
    monkeypatch.setenv("RANK", "2")
    with pytest.raises(EnvironmentVariableError, match="a rank below WORLD_SIZE=2"):
        environment.rank()
    monkeypatch.setenv("RANK", "-1")
    with pytest.raises(EnvironmentVariableError, match="RANK='-1' is not valid"):
        environment.rank()


def test_cache_dir_expands_the_home_directory(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("TESSERA_CACHE_DIR", "~/caches")
    assert environment.cache_dir() == tmp_path / "caches"
    monkeypatch.delenv("TESSERA_CACHE_DIR")
    assert environment.cache_dir() == tmp_path / ".cache" / "tessera"


def test_a_call_with_an_invalid_kernel_choice_fails_before_tracing(monkeypatch):
    import torch

    import tessera as ts

    monkeypatch.setenv("TESSERA_KERNELS", "cuda")
    f = ts.jit(lambda x: x + 1)
    with pytest.raises(EnvironmentVariableError, match="TESSERA_KERNELS='cuda'"):
        f(torch.ones(2))


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "0", "soon"])
def test_tessera_run_rejects_a_bad_timeout(value):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "tessera.tools.launch",
            "run",
            "-n",
            "2",
            "--timeout",
            value,
            "x.py",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "--timeout: expected a positive, finite number of seconds" in result.stderr
    assert "Traceback" not in result.stderr
