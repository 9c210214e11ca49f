"""Sharded checkpoints of a training state, written with ``torch.distributed.checkpoint``.

``step.save(state, path)`` writes every state tensor (parameters, optimizer state) as
the pieces the ranks hold: under ``tessera run`` each process writes the pieces only it
holds (of a piece several ranks hold, the lowest such rank writes it), on the virtual
mesh the whole tensors. Each piece is a DCP entry named ``<tensor>|<start>:<stop>,…``
(its box in the global tensor); ``tessera.json`` lists the tensors, their shapes, dtypes
and pieces, the step count and the torch RNG state's entry. ``step.restore(state, path)``
reads into a state built by ``step.init`` on *any* mesh: each rank reads the saved pieces
that overlap its own piece and copies the overlaps in (resharding on load), so a state
saved on dp 2 × tp 2 resumes on dp 4, tp 2 on tp 4, processes on the virtual mesh.

Saves are atomic: the pieces go to ``.<name>.tmp`` beside ``path``, which replaces
``path`` (a rename) only once complete, so an interrupted save leaves the previous
checkpoint loadable. A missing checkpoint, a missing or truncated storage file, a tensor
the checkpoint lacks or saved with another shape or dtype is an error naming it.

Trust model. DCP's ``.metadata`` is a pickle, which can run code when read, so nothing in a
checkpoint is read before it is checked. A save writes ``tessera-manifest.json``: the
format, the step and every file's relative path, size and SHA-256, with an HMAC-SHA256
under the saving user's secret key (:func:`tessera.cache_location.secret_key`). A restore
reads the manifest first (JSON), refuses one whose HMAC does not verify, hashes every file
and compares it, refuses files the manifest does not list (and symbolic links), and only
then lets DCP read ``.metadata`` — through an unpickler that resolves only DCP's metadata
classes, torch sizes, dtypes and layouts (anything else is refused before it is called).
A checkpoint without a manifest is refused. So a checkpoint this user saved (same key:
same cache root, e.g. the same machine or a shared home) restores; one that was changed
since, or forged, is refused before anything of it runs. A checkpoint from elsewhere
(another user or machine: its HMAC cannot verify) is refused unless
``trust_unverified=True``: its files are then still checked against its manifest, which
guards against corruption in transit only — not against whoever wrote the manifest — and
its metadata is still read by the restricted unpickler (tensors by ``torch.load`` with
``weights_only=True``). Files are checked, then read: someone who can write into the
checkpoint directory during the restore is outside this model.
"""

from __future__ import annotations

import builtins
import functools
import hashlib
import io
import json
import os
import pickle
import shutil
import threading
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as tdist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

from tessera import cache_location
from tessera.backends import distributed
from tessera.backends.layout import block
from tessera.dist.tensor import DistTensor
from tessera.errors import TesseraError
from tessera.training import fault_injection

MANIFEST = "tessera.json"
SIGNED = "tessera-manifest.json"
EXTRA = "extra.json"  # the caller's JSON state (a data loader's position), signed with the rest
FORMAT = 1
_DOMAIN = b"tessera-checkpoint-manifest"
Box = tuple[tuple[int, int], ...]


def _box(leaf: Any, rank: int | None) -> tuple[Box, torch.Tensor]:
    """The box of the global tensor this process holds of ``leaf``, and that piece."""
    if isinstance(leaf, DistTensor):
        assert rank is not None
        return _box_of(leaf, rank), leaf.local(rank)
    return tuple((0, int(n)) for n in leaf.shape), leaf


def _box_of(leaf: DistTensor, rank: int) -> Box:
    slices = block(rank, leaf.sharding, leaf.mesh, tuple(leaf.shape))
    return tuple(
        (s.start or 0, n if s.stop is None else s.stop)
        for s, n in zip(slices, leaf.shape, strict=True)
    )


def _writes(leaf: Any, rank: int | None) -> bool:
    """Whether this rank writes its piece: the lowest rank holding that box does."""
    if not isinstance(leaf, DistTensor):
        return True
    mine = _box_of(leaf, rank)  # type: ignore[arg-type]
    return all(_box_of(leaf, r) != mine for r in range(rank))  # type: ignore[arg-type]


def _key(path: str, box: Box) -> str:
    return f"{path}|{','.join(f'{a}:{b}' for a, b in box)}"


def save(
    leaves: Sequence[Any],
    paths: Sequence[str],
    step: int,
    where: str | Path,
    extra: dict[str, Any] | None = None,
    *,
    blocking: bool = True,
) -> PendingSave | None:
    """Writes the state ``leaves`` (named ``paths``) and ``step`` to ``where``, atomically;
    ``extra`` (JSON) goes into the same directory as ``extra.json``, under the manifest.

    With ``blocking=False`` the pieces are copied (to CPU memory) and a background thread
    writes them, over a process group of its own, while the caller goes on: the returned
    :class:`PendingSave` says when the checkpoint is complete (signed and renamed into
    place, as a blocking save leaves it). A failed write (a full disk) is a
    :class:`TesseraError` naming the checkpoint and the cause; the previous checkpoints
    are left intact."""
    target = Path(where)
    processes = tdist.is_available() and tdist.is_initialized()
    rank = tdist.get_rank() if processes else None
    entries: dict[str, torch.Tensor] = {}
    manifest: dict[str, Any] = {"step": step, "tensors": {}}
    for leaf, path in zip(leaves, paths, strict=True):
        box, local = _box(leaf, rank)
        if _writes(leaf, rank):
            piece = local.detach()
            entries[_key(path, box)] = (
                piece.contiguous() if blocking else piece.to("cpu", copy=True).contiguous()
            )
        manifest["tensors"][path] = {
            "shape": list(leaf.shape),
            "dtype": str(leaf.dtype).removeprefix("torch."),
            "pieces": sorted({_key(path, b) for b in _all_boxes(leaf)}),
        }
    if not processes or rank == 0:
        entries["rng|torch"] = torch.get_rng_state()
    if blocking:
        _write(entries, manifest, step, target, extra, processes, rank, None)
        return None
    group = _background_group() if processes else None
    pending = PendingSave(target)
    pending.start(_write, entries, manifest, step, target, extra, processes, rank, group)
    return pending


class PendingSave:
    """A checkpoint being written by a background thread (``save(..., blocking=False)``)."""

    def __init__(self, target: Path) -> None:
        self.target = target
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None

    def start(self, write: Any, *args: Any) -> None:
        def run() -> None:
            try:
                write(*args)
            except BaseException as error:  # re-raised by wait(), in the caller's thread
                self._error = error

        self._thread = threading.Thread(target=run, name=f"save {self.target.name}", daemon=True)
        self._thread.start()

    def done(self) -> bool:
        """Whether the write has ended (completed or failed)."""
        return self._thread is None or not self._thread.is_alive()

    def wait(self) -> Path:
        """Blocks until the checkpoint is complete; returns its path, or raises the
        write's error."""
        if self._thread is not None:
            self._thread.join()
        if self._error is not None:
            raise self._error
        return self.target


@functools.cache
def _background_group() -> Any:
    """A gloo group of every rank for background saves, apart from the step's collectives
    (created once, by every rank at its first background save)."""
    return tdist.new_group(backend="gloo")


def _write(
    entries: dict[str, torch.Tensor],
    manifest: dict[str, Any],
    step: int,
    target: Path,
    extra: dict[str, Any] | None,
    processes: bool,
    rank: int | None,
    group: Any,
) -> None:
    """Writes staged pieces to ``.<name>.tmp``, signs them and renames it to ``target``."""
    temporary = target.parent / f".{target.name}.tmp"
    if not processes or rank == 0:
        shutil.rmtree(temporary, ignore_errors=True)  # a save interrupted before
        temporary.mkdir(parents=True)
    try:
        if processes:
            tdist.barrier(group=group)
        with warnings.catch_warnings():  # "assuming the intent is to save in a single process"
            warnings.simplefilter("ignore", UserWarning)
            dcp.save(entries, checkpoint_id=temporary, no_dist=not processes, process_group=group)
        fault_injection.in_save(step, str(temporary))
        if not processes or rank == 0:
            (temporary / MANIFEST).write_text(json.dumps(manifest, indent=1))
            if extra is not None:
                (temporary / EXTRA).write_text(json.dumps(extra))
            _sign(temporary, step)
    except OSError as error:
        raise TesseraError(
            f"saving step {step} to {target} failed: {error.strerror or error} "
            f"({error.filename or temporary}); the checkpoints saved before it are intact"
        ) from error
    except RuntimeError as error:  # a collective of the save: name the rank that caused it
        if not processes:
            raise
        raise distributed.failure(distributed.runtime(), f"saving step {step}", error) from None
    if not processes or rank == 0:
        previous = previous_of(target)
        if target.exists():
            shutil.rmtree(previous, ignore_errors=True)
            os.replace(target, previous)
        # else a save that crashed between these two renames left its last good
        # checkpoint as `previous`: it stays until the new one is in place
        os.replace(temporary, target)
        shutil.rmtree(previous, ignore_errors=True)
    if processes:
        try:
            tdist.barrier(group=group)
        except RuntimeError as error:
            raise distributed.failure(distributed.runtime(), f"saving step {step}", error) from None
    fault_injection.after_save(step, str(target))


def previous_of(target: Path) -> Path:
    """Where a save keeps the checkpoint it replaces while it renames the new one into
    place (``.<name>.old`` beside it)."""
    return target.parent / f".{target.name}.old"


def _all_boxes(leaf: Any) -> list[Box]:
    if not isinstance(leaf, DistTensor):
        return [tuple((0, int(n)) for n in leaf.shape)]
    return [_box_of(leaf, r) for r in range(leaf.mesh.size)]


def _parse(key: str) -> Box:
    """The box of a piece's entry name (``()`` for a scalar)."""
    text = key.split("|", 1)[1]
    return tuple((int(a), int(b)) for a, b in (part.split(":") for part in text.split(",") if part))


def restore(
    leaves: Sequence[Any],
    paths: Sequence[str],
    where: str | Path,
    *,
    trust_unverified: bool = False,
) -> int:
    """Fills the state ``leaves`` in place from the checkpoint at ``where`` (any mesh's);
    returns the saved step count. Its files are checked first (see the module docstring;
    ``trust_unverified`` accepts a manifest this user's key did not sign)."""
    source = Path(where)
    previous = previous_of(source)
    if not source.exists() and (previous / MANIFEST).exists():
        warnings.warn(
            f"checkpoint {source} is missing: a save was interrupted between replacing it "
            f"and renaming the new one into place; restoring the last good checkpoint, "
            f"{previous}",
            stacklevel=2,
        )
        source = previous
    manifest_path = source / MANIFEST
    if not source.is_dir():
        raise TesseraError(
            f"no checkpoint at {source}: {manifest_path} is missing (not a completed save)"
        )
    step = verify(source, trust_unverified=trust_unverified)
    manifest = json.loads(manifest_path.read_text())
    if manifest.get("step") != step:
        raise TesseraError(f"checkpoint {source}: {MANIFEST} and {SIGNED} disagree on the step")
    processes = tdist.is_available() and tdist.is_initialized()
    rank = tdist.get_rank() if processes else None
    wanted: dict[str, torch.Tensor] = {}
    plans = []
    for leaf, path in zip(leaves, paths, strict=True):
        saved = manifest["tensors"].get(path)
        if saved is None:
            raise TesseraError(
                f"checkpoint {source} has no tensor {path} (it holds {sorted(manifest['tensors'])})"
            )
        dtype = str(leaf.dtype).removeprefix("torch.")
        if saved["shape"] != list(leaf.shape) or saved["dtype"] != dtype:
            raise TesseraError(
                f"checkpoint {source}: tensor {path} was saved as {saved['dtype']}"
                f"{saved['shape']}, the state needs {dtype}{list(leaf.shape)}"
            )
        box, local = _box(leaf, rank)
        for key in saved["pieces"]:
            piece = _parse(key)
            overlap = _overlap(piece, box)
            if overlap is not None:
                shape = [b - a for a, b in piece]
                wanted[key] = torch.empty(shape, dtype=leaf.dtype)
                plans.append((local, box, piece, overlap, key))
    missing = sorted(set(manifest["tensors"]) - set(paths))
    if missing:
        raise TesseraError(
            f"checkpoint {source} holds tensors this state does not have: {missing} "
            f"(another model or optimizer?)"
        )
    wanted["rng|torch"] = torch.empty_like(torch.get_rng_state())
    _check_storage(source, wanted)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(wanted, storage_reader=_Reader(source), no_dist=not processes)
    torch.set_rng_state(wanted.pop("rng|torch"))
    with torch.no_grad():
        for local, box, piece, overlap, key in plans:
            into = tuple(slice(a - o, b - o) for (a, b), (o, _) in zip(overlap, box, strict=True))
            out = tuple(slice(a - o, b - o) for (a, b), (o, _) in zip(overlap, piece, strict=True))
            local[into].copy_(wanted[key][out])
    return int(manifest["step"])


def read_extra(where: str | Path) -> dict[str, Any]:
    """The ``extra`` JSON saved with the checkpoint at ``where`` (``{}`` if none); call it
    after :func:`restore` or :func:`verify` checked the directory."""
    path = Path(where) / EXTRA
    return json.loads(path.read_text()) if path.is_file() else {}


def _overlap(a: Box, b: Box) -> Box | None:
    box = tuple((max(x0, y0), min(x1, y1)) for (x0, x1), (y0, y1) in zip(a, b, strict=True))
    return None if any(lo >= hi for lo, hi in box) else box


def _check_storage(source: Path, wanted: dict[str, torch.Tensor]) -> None:
    """Each entry's storage file exists and holds its bytes (not truncated)."""
    try:
        metadata = _Reader(source).read_metadata()
    except Exception as error:
        raise TesseraError(
            f"checkpoint {source}: cannot read its metadata (.metadata): {error}"
        ) from None
    storage = metadata.storage_data
    for index, info in storage.items():  # type: ignore[union-attr]
        if index.fqn not in wanted:
            continue
        file = source / info.relative_path
        if not file.is_file():
            raise TesseraError(f"checkpoint {source}: {file.name} (tensor {index.fqn}) is missing")
        if file.stat().st_size < info.offset + info.length:
            raise TesseraError(
                f"checkpoint {source}: {file.name} is truncated: tensor {index.fqn} needs bytes "
                f"{info.offset}..{info.offset + info.length}, the file has {file.stat().st_size}"
            )


def _digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _files(directory: Path) -> dict[str, Path]:
    """Every entry under ``directory`` but the signed manifest, by relative path."""
    return {
        p.relative_to(directory).as_posix(): p
        for p in sorted(directory.rglob("*"))
        if p.name != SIGNED and not (p.is_dir() and not p.is_symlink())
    }


def _body_bytes(body: dict[str, Any]) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def _sign(directory: Path, step: int) -> None:
    """Writes ``tessera-manifest.json``: every file's size and SHA-256, the format and the
    step, with an HMAC under the user's key."""
    body = {
        "format": FORMAT,
        "step": step,
        "files": {
            name: {"size": path.stat().st_size, "sha256": _digest(path)}
            for name, path in _files(directory).items()
        },
    }
    tag = cache_location.mac(_DOMAIN, _body_bytes(body)).hex()
    (directory / SIGNED).write_text(json.dumps(body | {"hmac": tag}, indent=1))


def verify(source: Path, *, trust_unverified: bool = False) -> int:
    """Checks the checkpoint at ``source`` against its manifest (HMAC, then every file's
    size and SHA-256, no unlisted file); returns the step. Reads nothing but JSON and
    the bytes it hashes."""
    signed = source / SIGNED
    if not signed.is_file() or signed.is_symlink():
        raise TesseraError(
            f"checkpoint {source} has no {SIGNED}: refused (its files cannot be checked "
            f"before DCP's pickled .metadata is read; save it again with this Tessera)"
        )
    try:
        manifest = json.loads(signed.read_text())
        tag = bytes.fromhex(manifest.pop("hmac", None) or "")
        files = manifest["files"]
        step = manifest["step"]
        ok = manifest["format"] == FORMAT and isinstance(files, dict) and isinstance(step, int)
    except (ValueError, TypeError, KeyError, AttributeError, UnicodeDecodeError):
        ok = False
    if not ok:
        raise TesseraError(f"checkpoint {source}: {SIGNED} is not a Tessera manifest")
    if not cache_location.verify(tag, _DOMAIN, _body_bytes(manifest)) and not trust_unverified:
        raise TesseraError(
            f"checkpoint {source}: the HMAC of {SIGNED} does not verify under this user's "
            f"key: it was changed, forged, or saved by another user or machine; refused. "
            f"Pass trust_unverified=True only for a checkpoint you trust from elsewhere "
            f"(its files are then checked against its manifest, which guards against "
            f"corruption in transit, not against whoever wrote it)"
        )
    present = _files(source)
    unexpected = sorted(set(present) - set(files))
    if unexpected:
        raise TesseraError(
            f"checkpoint {source}: files its manifest does not list: {unexpected}; refused"
        )
    for name, expected in sorted(files.items()):
        path = present.get(name)
        if path is None:
            raise TesseraError(f"checkpoint {source}: {name} (in its manifest) is missing")
        if path.is_symlink() or not path.is_file():
            raise TesseraError(f"checkpoint {source}: {name} is not a plain file; refused")
        size = path.stat().st_size
        if not isinstance(expected, dict) or size != expected.get("size"):
            raise TesseraError(
                f"checkpoint {source}: {name} is truncated or changed: {size} bytes, its "
                f"manifest says {expected.get('size') if isinstance(expected, dict) else '?'}"
            )
        if _digest(path) != expected.get("sha256"):
            raise TesseraError(
                f"checkpoint {source}: {name} does not match its manifest's SHA-256 "
                f"(changed or corrupted); refused"
            )
    return step


@functools.cache
def _metadata_classes() -> dict[tuple[str, str], Any]:
    """The globals DCP's ``.metadata`` may name: exactly these (nothing is imported)."""
    import pathlib

    from torch.distributed.checkpoint import filesystem, metadata
    from torch.serialization import _get_layout

    allowed: list[Any] = [
        metadata.Metadata,
        metadata.MetadataIndex,
        metadata.StorageMeta,
        metadata.TensorProperties,
        metadata.TensorStorageMetadata,
        metadata.BytesStorageMetadata,
        metadata.ChunkStorageMetadata,
        metadata._MEM_FORMAT_ENCODING,
        filesystem._StorageInfo,
        torch.Size,
        _get_layout,
        pathlib.PosixPath,
        pathlib.PurePosixPath,
    ]
    table = {(c.__module__, c.__qualname__): c for c in allowed}
    table.update({("torch", n): v for n, v in vars(torch).items() if isinstance(v, torch.dtype)})
    table.update({("builtins", n): getattr(builtins, n) for n in _BUILTINS})
    return table


_BUILTINS = ("tuple", "list", "dict", "set", "frozenset", "int", "float", "str", "bytes")


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        found = _metadata_classes().get((module, name))
        if found is None:
            raise TesseraError(
                f"its .metadata names {module}.{name}, which DCP metadata never holds; refused"
            )
        return found


class _Reader(dcp.FileSystemReader):
    """DCP's file reader, reading ``.metadata`` with :class:`_MetadataUnpickler`."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        rank = kwargs.get("rank")
        name = ".metadata" if rank is None else f"__{rank}.metadata"
        data = (Path(self.path) / name).read_bytes()
        loaded = _MetadataUnpickler(io.BytesIO(data)).load()
        if not isinstance(loaded, Metadata):
            raise TesseraError(f"its .metadata holds a {type(loaded).__name__}, not DCP metadata")
        if getattr(loaded, "storage_meta", None) is None:
            loaded.storage_meta = StorageMeta()
        loaded.storage_meta.load_id = self.load_id
        return loaded
