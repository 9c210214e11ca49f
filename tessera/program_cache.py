"""The on-disk cache of compiled programs: each stage's module, keyed by content.

A program's key is the SHA-256 of Tessera's own source code, the whole compile
configuration (every pass with its options, as ``pipeline_string`` spells them, and
every field of :class:`~tessera.driver.CompileConfig`: mesh, kernels, schedule options,
numerics mode, remat, precision, autodiff) and the traced module (:func:`tessera.ir.serialize.dumps`). A stage's module is stored
as ``programs/<key>/<stage>.bin`` under the cache root (and what a call reads besides:
the per-rank layouts of the arguments and results, ``layouts.bin``, and the Triton
source of every tile kernel, ``triton.bin``), in the serialized form, behind a
header holding an HMAC-SHA256 of the program key, the file's name and its data under the
user's secret key (:func:`tessera.cache_location.secret_key`). A file whose HMAC does not
verify (damaged, forged, copied from another user or another program's entry) is never
deserialized: it is removed, a warning says so (once per process), and the stage is
compiled again; the Triton sources that become code are part of the authenticated data.
With the key unusable (not private), the cache is off, with a warning. The module form
itself names no code (:mod:`tessera.ir.serialize`). So every rank of a job and every
later process that traces the same program reads its stages instead of compiling them:
a change to the program, the configuration or Tessera itself changes the key.

``TESSERA_PROGRAM_CACHE=0`` turns the cache off (compiling is then always done).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import hmac
import json
import os
import warnings
from pathlib import Path
from typing import Any

from xdsl.dialects.builtin import ModuleOp

from tessera import cache_location, environment
from tessera.cache_location import cache_directory
from tessera.driver import STAGES, CompileConfig, pipeline_string
from tessera.ir import serialize
from tessera.ir.sharding import Sharding

_MAGIC = b"tessera-program-hmac\n"
_TAG = 32
_warned: set[str] = set()


def _warn_once(kind: str, message: str) -> None:
    if kind not in _warned:
        _warned.add(kind)
        warnings.warn(message, stacklevel=4)


def enabled() -> bool:
    return environment.program_cache()


@functools.cache
def code_version() -> str:
    """The SHA-256 of Tessera's Python sources (any change to the compiler is a new key)."""
    root = Path(__file__).parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


class ProgramCache:
    """The stored stages of one traced program under one configuration."""

    def __init__(self, traced: ModuleOp, config: CompileConfig):
        self.traced = traced
        self.config = config
        self._key: str | None = None

    @property
    def key(self) -> str:
        if self._key is None:
            digest = hashlib.sha256()
            for part in (
                code_version(),
                pipeline_string(self.config, STAGES[1:]),
                repr(self.config),
            ):
                digest.update(part.encode())
                digest.update(b"\0")
            digest.update(serialize.dumps(self.traced))
            self._key = digest.hexdigest()
        return self._key

    def _path(self, stage: str) -> Path:
        return cache_directory("programs") / self.key[:2] / self.key / f"{stage}.bin"

    def load(self, stage: str) -> ModuleOp | None:
        """The stored module of ``stage``, or None (not stored, or not intact)."""
        payload = self._read(stage)
        if payload is None:
            return None
        try:
            return serialize.loads(payload)
        except serialize.SerializeError:
            self._path(stage).unlink(missing_ok=True)
            return None

    def store(self, stage: str, module: ModuleOp) -> None:
        """Writes ``stage``'s module (atomically; a failure only costs compiling again)."""
        with contextlib.suppress(serialize.SerializeError):  # not storable: compile again
            self._write(stage, serialize.dumps(module))

    def load_layouts(self) -> tuple[list[Sharding], list[Sharding]] | None:
        """The stored per-rank layouts of the arguments and results, or None."""
        payload = self._read("layouts")
        if payload is None:
            return None
        try:
            args, results = json.loads(payload)
            return [_sharding(s) for s in args], [_sharding(s) for s in results]
        except (ValueError, TypeError):
            self._path("layouts").unlink(missing_ok=True)
            return None

    def store_layouts(self, layouts: tuple[list[Sharding], list[Sharding]]) -> None:
        plain = [[[list(s.dims), list(s.partial)] for s in side] for side in layouts]
        self._write("layouts", json.dumps(plain).encode())

    def load_sources(self) -> dict[str, str] | None:
        """The stored Triton source of every tile kernel, or None."""
        payload = self._read("triton")
        if payload is None:
            return None
        try:
            sources = json.loads(payload)
        except ValueError:
            sources = None
        if not isinstance(sources, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in sources.items()
        ):
            self._path("triton").unlink(missing_ok=True)
            return None
        return sources

    def store_sources(self, sources: dict[str, str]) -> None:
        self._write("triton", json.dumps(sources).encode())

    def _mac(self, name: str, payload: bytes) -> bytes | None:
        """The HMAC of ``payload`` as this entry's ``name``, or None (no usable key)."""
        try:
            return cache_location.mac(_MAGIC, self.key.encode(), name.encode(), payload)
        except cache_location.SecretKeyError as error:
            _warn_once("key", f"Tessera's program cache is off: {error}")
            return None

    def _read(self, name: str) -> bytes | None:
        path = self._path(name)
        try:
            data = path.read_bytes()
        except OSError:
            return None
        header = len(_MAGIC) + _TAG
        payload = data[header:]
        expected = self._mac(name, payload)
        if expected is None:
            return None
        if data[: len(_MAGIC)] != _MAGIC or not hmac.compare_digest(
            data[len(_MAGIC) : header], expected
        ):
            _warn_once(
                "hmac",
                f"Tessera's program cache ignores {path}: its HMAC does not verify under "
                f"this user's key (damaged, or not written by this user's Tessera); "
                f"compiling again",
            )
            path.unlink(missing_ok=True)
            return None
        return payload

    def _write(self, name: str, payload: bytes) -> None:
        tag = self._mac(name, payload)
        if tag is None:
            return
        path = self._path(name)
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            temporary = path.with_suffix(f".{os.getpid()}.tmp")
            temporary.write_bytes(_MAGIC + tag + payload)
            temporary.replace(path)
        except OSError:
            pass


def _sharding(plain: Any) -> Sharding:
    dims, partial = plain
    return Sharding(
        tuple(tuple(str(a) for a in d) for d in dims),
        tuple((str(a), str(k)) for a, k in partial),
    )


__all__ = ["ProgramCache", "code_version", "enabled"]
