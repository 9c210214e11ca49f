"""Where Tessera keeps its on-disk caches, and whether that place is safe to read.

One root, ``TESSERA_CACHE_DIR`` (default ``~/.cache/tessera``), holds ``triton/`` (kernel
sources by content hash), ``autotune/`` (block configurations chosen on a GPU) and
``programs/`` (compiled programs, :mod:`tessera.program_cache`). Cached files become
code or IR that runs, so a directory another user could write to is not used: it must
belong to the current user and grant no write permission to group or others.
"""

from __future__ import annotations

import functools
import os
import stat
import tempfile
import warnings
from pathlib import Path

from tessera import environment


def cache_root() -> Path:
    """The root of Tessera's caches (``TESSERA_CACHE_DIR``, default ``~/.cache/tessera``)."""
    return environment.cache_dir()


def private_directory(path: Path) -> str | None:
    """Creates ``path`` (mode 0700) when missing; returns why it is unsafe to trust, or
    None when it is the current user's and not writable by group or others."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = path.stat()
    except OSError as error:
        return f"{path}: {error.strerror or error}"
    if not stat.S_ISDIR(info.st_mode):
        return f"{path} is not a directory"
    if hasattr(os, "getuid") and info.st_uid != os.getuid():
        return f"{path} belongs to another user (uid {info.st_uid})"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{path} is writable by group or others (mode {stat.S_IMODE(info.st_mode):o})"
    return None


def cache_directory(name: str) -> Path:
    """``name`` under the cache root, created private; when the root or it is not safe
    (:func:`private_directory`), a private temporary directory for this process instead,
    with a warning that says why."""
    return _usable(str(cache_root()), name)


@functools.cache
def _usable(root: str, name: str) -> Path:
    for path in (Path(root), Path(root) / name):
        problem = private_directory(path)
        if problem is not None:
            fallback = Path(tempfile.mkdtemp(prefix=f"tessera-{name}-"))
            warnings.warn(
                f"Tessera does not use its cache: {problem}; this process uses {fallback}",
                stacklevel=3,
            )
            return fallback
    return Path(root) / name


__all__ = ["cache_directory", "cache_root", "private_directory"]
