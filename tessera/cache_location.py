"""Where Tessera keeps its on-disk caches, and whether that place is safe to read.

One root, ``TESSERA_CACHE_DIR`` (default ``~/.cache/tessera``), holds ``triton/`` (kernel
sources by content hash), ``autotune/`` (block configurations chosen on a GPU) and
``programs/`` (compiled programs, :mod:`tessera.program_cache`). Cached files become
code or IR that runs, so a directory another user could write to is not used: it must
belong to the current user and grant no write permission to group or others.

:func:`secret_key` is this user's key (``keys/hmac-sha256.key``, mode 0600, created on
first use): the program cache and checkpoint manifests carry an HMAC-SHA256 under it, so
a file is read back only when this user's Tessera wrote it.
"""

from __future__ import annotations

import functools
import hmac
import os
import secrets
import stat
import tempfile
import warnings
from pathlib import Path

from tessera import environment
from tessera.errors import TesseraError

KEY_FILE = "hmac-sha256.key"
_KEY_BYTES = 32


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


class SecretKeyError(TesseraError):
    """The per-user secret key is unusable (not private, not the user's, or malformed)."""


def secret_key() -> bytes:
    """This user's secret key for HMAC-SHA256 (``keys/hmac-sha256.key`` under the cache
    root), created atomically with mode 0600 on first use. A key file readable by group
    or others, or owned by another user, is refused (:class:`SecretKeyError`), never used."""
    return _key(str(cache_directory("keys") / KEY_FILE))


@functools.cache
def _key(where: str) -> bytes:
    path = Path(where)
    try:
        return _read_or_create(path)
    except OSError as error:
        raise SecretKeyError(f"Tessera's secret key {path}: {error.strerror or error}") from None


def _read_or_create(path: Path) -> bytes:
    if not path.exists():
        temporary = path.with_name(f".{KEY_FILE}.{os.getpid()}.tmp")
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(descriptor, secrets.token_bytes(_KEY_BYTES))
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
        try:
            os.link(temporary, path)  # fails when another process made the key first
        except FileExistsError:
            pass
        finally:
            temporary.unlink(missing_ok=True)
    descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    try:
        info = os.fstat(descriptor)
        if hasattr(os, "getuid") and info.st_uid != os.getuid():
            raise SecretKeyError(
                f"Tessera's secret key {path} belongs to another user (uid {info.st_uid}); "
                f"remove it (a new one is made)"
            )
        if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise SecretKeyError(
                f"Tessera's secret key {path} is readable or writable by group or others "
                f"(mode {stat.S_IMODE(info.st_mode):o}); it may be known to others: remove it "
                f"(a new one is made) or chmod 600 it"
            )
        key = os.read(descriptor, _KEY_BYTES + 1)
    finally:
        os.close(descriptor)
    if len(key) != _KEY_BYTES:
        raise SecretKeyError(f"Tessera's secret key {path} is not {_KEY_BYTES} bytes; remove it")
    return key


def mac(*parts: bytes) -> bytes:
    """HMAC-SHA256 of ``parts`` (each length-prefixed) under :func:`secret_key`."""
    tag = hmac.new(secret_key(), digestmod="sha256")
    for part in parts:
        tag.update(len(part).to_bytes(8, "little"))
        tag.update(part)
    return tag.digest()


def verify(tag: bytes, *parts: bytes) -> bool:
    """Whether ``tag`` is :func:`mac` of ``parts`` (compared in constant time)."""
    return hmac.compare_digest(tag, mac(*parts))


__all__ = [
    "SecretKeyError",
    "cache_directory",
    "cache_root",
    "mac",
    "private_directory",
    "secret_key",
    "verify",
]
