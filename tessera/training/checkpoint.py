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
"""

from __future__ import annotations

import json
import os
import shutil
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as tdist
import torch.distributed.checkpoint as dcp

from tessera.backends.layout import block
from tessera.dist.tensor import DistTensor
from tessera.errors import TesseraError

MANIFEST = "tessera.json"
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


def save(leaves: Sequence[Any], paths: Sequence[str], step: int, where: str | Path) -> None:
    """Writes the state ``leaves`` (named ``paths``) and ``step`` to ``where``, atomically."""
    target = Path(where)
    processes = tdist.is_available() and tdist.is_initialized()
    rank = tdist.get_rank() if processes else None
    temporary = target.parent / f".{target.name}.tmp"
    if not processes or rank == 0:
        shutil.rmtree(temporary, ignore_errors=True)  # a save interrupted before
        temporary.mkdir(parents=True)
    if processes:
        tdist.barrier()
    entries: dict[str, torch.Tensor] = {}
    manifest: dict[str, Any] = {"step": step, "tensors": {}}
    for leaf, path in zip(leaves, paths, strict=True):
        box, local = _box(leaf, rank)
        if _writes(leaf, rank):
            entries[_key(path, box)] = local.detach().contiguous()
        manifest["tensors"][path] = {
            "shape": list(leaf.shape),
            "dtype": str(leaf.dtype).removeprefix("torch."),
            "pieces": sorted({_key(path, b) for b in _all_boxes(leaf)}),
        }
    if not processes or rank == 0:
        entries["rng|torch"] = torch.get_rng_state()
    with warnings.catch_warnings():  # "assuming the intent is to save in a single process"
        warnings.simplefilter("ignore", UserWarning)
        dcp.save(entries, checkpoint_id=temporary, no_dist=not processes)
    if not processes or rank == 0:
        (temporary / MANIFEST).write_text(json.dumps(manifest, indent=1))
        previous = target.parent / f".{target.name}.old"
        shutil.rmtree(previous, ignore_errors=True)
        if target.exists():
            os.replace(target, previous)
        os.replace(temporary, target)
        shutil.rmtree(previous, ignore_errors=True)
    if processes:
        tdist.barrier()


def _all_boxes(leaf: Any) -> list[Box]:
    if not isinstance(leaf, DistTensor):
        return [tuple((0, int(n)) for n in leaf.shape)]
    return [_box_of(leaf, r) for r in range(leaf.mesh.size)]


def _parse(key: str) -> Box:
    """The box of a piece's entry name (``()`` for a scalar)."""
    text = key.split("|", 1)[1]
    return tuple((int(a), int(b)) for a, b in (part.split(":") for part in text.split(",") if part))


def restore(leaves: Sequence[Any], paths: Sequence[str], where: str | Path) -> int:
    """Fills the state ``leaves`` in place from the checkpoint at ``where`` (any mesh's);
    returns the saved step count."""
    source = Path(where)
    manifest_path = source / MANIFEST
    if not manifest_path.is_file():
        raise TesseraError(
            f"no checkpoint at {source}: {manifest_path} is missing (not a completed save)"
        )
    manifest = json.loads(manifest_path.read_text())
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
        dcp.load(wanted, checkpoint_id=source, no_dist=not processes)
    torch.set_rng_state(wanted.pop("rng|torch"))
    with torch.no_grad():
        for local, box, piece, overlap, key in plans:
            into = tuple(slice(a - o, b - o) for (a, b), (o, _) in zip(overlap, box, strict=True))
            out = tuple(slice(a - o, b - o) for (a, b), (o, _) in zip(overlap, piece, strict=True))
            local[into].copy_(wanted[key][out])
    return int(manifest["step"])


def _overlap(a: Box, b: Box) -> Box | None:
    box = tuple((max(x0, y0), min(x1, y1)) for (x0, x1), (y0, y1) in zip(a, b, strict=True))
    return None if any(lo >= hi for lo, hi in box) else box


def _check_storage(source: Path, wanted: dict[str, torch.Tensor]) -> None:
    """Each entry's storage file exists and holds its bytes (not truncated)."""
    try:
        metadata = dcp.FileSystemReader(source).read_metadata()
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
