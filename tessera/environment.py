"""Tessera's environment variables, each read and validated in one place.

Every ``TESSERA_*`` setting (and the launcher's ``RANK`` / ``WORLD_SIZE``) is declared
here with what it accepts. A value Tessera does not understand is an error that names
the variable, the value found and the values accepted, never silently ignored:

    >>> os.environ["TESSERA_KERNELS"] = "tritonn"
    >>> kernels()
    EnvironmentVariableError: TESSERA_KERNELS='tritonn' is not valid: expected one of triton, reference

The variables are read at each call (tests and users may change them between calls);
each read is a dictionary lookup and a comparison, cheap enough for a call path.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from tessera.errors import TesseraError

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


class EnvironmentVariableError(TesseraError):
    """An environment variable holds a value Tessera does not accept."""


def _invalid(name: str, value: str, expected: str) -> EnvironmentVariableError:
    return EnvironmentVariableError(f"{name}={value!r} is not valid: expected {expected}")


def _raw(name: str) -> str | None:
    """The variable's value with surrounding blanks removed; None when unset or empty."""
    value = os.environ.get(name)
    if value is None or not value.strip():
        return None
    return value.strip()


def flag(name: str, default: bool) -> bool:
    """A yes/no setting: ``1/true/yes/on`` or ``0/false/no/off`` (any case)."""
    value = _raw(name)
    if value is None:
        return default
    if value.lower() in _TRUE:
        return True
    if value.lower() in _FALSE:
        return False
    raise _invalid(name, value, f"one of {', '.join(_TRUE)} or {', '.join(_FALSE)}")


def choice(name: str, choices: tuple[str, ...], default: str) -> str:
    """One of ``choices`` (compared without case)."""
    value = _raw(name)
    if value is None:
        return default
    if value.lower() in choices:
        return value.lower()
    raise _invalid(name, value, f"one of {', '.join(choices)}")


def seconds(name: str, default: float) -> float:
    """A positive, finite number of seconds."""
    value = _raw(name)
    if value is None:
        return default
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not math.isfinite(number) or number <= 0:
        raise _invalid(name, value, "a positive, finite number of seconds")
    return number


def integer(name: str, default: int | None, minimum: int = 0) -> int | None:
    """A whole number of at least ``minimum``."""
    value = _raw(name)
    if value is None:
        return default
    try:
        number = int(value)
    except ValueError:
        raise _invalid(name, value, f"a whole number of at least {minimum}") from None
    if number < minimum:
        raise _invalid(name, value, f"a whole number of at least {minimum}")
    return number


# --- Tessera's settings ---------------------------------------------------------------

KERNEL_CHOICES = ("triton", "reference")
BACKEND_CHOICES = ("auto", "virtual")
DEVICE_CHOICES = ("cpu", "cuda")
DEFAULT_TIMEOUT_S = 60.0


def kernels() -> str:
    """``TESSERA_KERNELS``: generated Triton kernels (default) or the reference executor."""
    return choice("TESSERA_KERNELS", KERNEL_CHOICES, "triton")


NUMERICS_CHOICES = ("fast", "deterministic")


def numerics() -> str:
    """``TESSERA_NUMERICS``: the default numerics policy, ``fast`` (the default) or
    ``deterministic`` (see :mod:`tessera.numerics`)."""
    return choice("TESSERA_NUMERICS", NUMERICS_CHOICES, "fast")


def backend() -> str:
    """``TESSERA_BACKEND``: ``auto`` (processes under a launcher, else the virtual mesh;
    the default) or ``virtual`` (the virtual mesh even under a launcher)."""
    return choice("TESSERA_BACKEND", BACKEND_CHOICES, "auto")


def device() -> str:
    """``TESSERA_DEVICE``: where ranks of a multi-process run compute, ``cpu`` (gloo,
    the default) or ``cuda`` (NCCL)."""
    return choice("TESSERA_DEVICE", DEVICE_CHOICES, "cpu")


def timeout() -> float:
    """``TESSERA_TIMEOUT``: seconds a rank waits for the others (default 60)."""
    return seconds("TESSERA_TIMEOUT", DEFAULT_TIMEOUT_S)


def autotune() -> bool:
    """``TESSERA_AUTOTUNE``: whether Triton block sizes are tuned on a GPU (default yes)."""
    return flag("TESSERA_AUTOTUNE", True)


FP8_DOTS_CHOICES = ("auto", "on", "off")


def fp8_dots() -> str:
    """``TESSERA_FP8_DOTS``: whether fp8 matmuls (``precision="fp8"``) multiply in fp8 in the
    generated Triton kernels: ``auto`` (the default: on a GPU of compute capability 8.9 or
    later, not under Triton's interpreter), ``on`` (also in the interpreter: tests) or
    ``off`` (f32 dots of the dequantised operands everywhere)."""
    return choice("TESSERA_FP8_DOTS", FP8_DOTS_CHOICES, "auto")


def program_cache() -> bool:
    """``TESSERA_PROGRAM_CACHE``: whether compiled programs are cached on disk (default yes)."""
    return flag("TESSERA_PROGRAM_CACHE", True)


def debug() -> bool:
    """``TESSERA_DEBUG``: tracebacks with internal errors (default no)."""
    return flag("TESSERA_DEBUG", False)


def cache_dir() -> Path:
    """``TESSERA_CACHE_DIR``: the root of the on-disk caches (default ``~/.cache/tessera``)."""
    value = _raw("TESSERA_CACHE_DIR")
    if value is None:
        return Path.home() / ".cache" / "tessera"
    if "\0" in value:
        raise _invalid("TESSERA_CACHE_DIR", value, "a directory path (it holds a NUL byte)")
    return Path(value).expanduser()


def fault_inject() -> str | None:
    """``TESSERA_FAULT_INJECT``: faults a test injects (:mod:`tessera.training.fault_injection`,
    which parses it); None (the default) when unset."""
    return _raw("TESSERA_FAULT_INJECT")


def world_size() -> int:
    """``WORLD_SIZE`` (set by launchers): the number of ranks, 1 when unset."""
    size = integer("WORLD_SIZE", 1, minimum=1)
    assert size is not None
    return size


def rank() -> int | None:
    """``RANK`` (set by launchers): this process's rank, below ``WORLD_SIZE``; None when unset."""
    value = integer("RANK", None, minimum=0)
    if value is not None and value >= world_size():
        raise _invalid("RANK", str(value), f"a rank below WORLD_SIZE={world_size()}")
    return value


__all__ = [
    "DEFAULT_TIMEOUT_S",
    "EnvironmentVariableError",
    "autotune",
    "backend",
    "cache_dir",
    "debug",
    "device",
    "fault_inject",
    "flag",
    "fp8_dots",
    "kernels",
    "program_cache",
    "rank",
    "timeout",
    "world_size",
]
