"""A checkpoint policy: save every K steps to ``root/step_<k>``, keep the newest N, resume
from the newest complete one.

Each save is :meth:`TrainingStep.save` (:mod:`tessera.training.checkpoint`): the files go
to a hidden sibling ``.step_<k>.tmp``, renamed to ``step_<k>`` only once complete and
signed, with the caller's JSON state (a data loader's position) inside the same directory,
so a crash mid-save never leaves a ``step_<k>`` that looks complete. After a save, older
checkpoints beyond the newest ``keep_last`` are deleted, as are later-numbered ones (a
run this one replaces, e.g. after resuming past a corrupt checkpoint) and leftover
temporaries. :func:`latest` returns the newest ``step_<k>`` whose signed manifest verifies,
warning about (and skipping) each newer one that does not: partial or corrupted.
"""

from __future__ import annotations

import re
import shutil
import warnings
from pathlib import Path
from typing import Any, Protocol

import torch.distributed as tdist

from tessera.errors import TesseraError
from tessera.training import checkpoint

_NAME = re.compile(r"step_(\d+)")
_LEFTOVER = re.compile(r"\.step_\d+\.(tmp|old)")


class _Step(Protocol):
    def save(
        self,
        state: Any,
        path: str | Path,
        *,
        extra: dict[str, Any] | None = None,
        blocking: bool = True,
    ) -> checkpoint.PendingSave | None: ...

    def restore(self, state: Any, path: str | Path, *, trust_unverified: bool = False) -> Any: ...


def checkpoints(root: str | Path) -> list[tuple[int, Path]]:
    """The ``step_<k>`` directories under ``root`` (complete or not), oldest first."""
    base = Path(root)
    if not base.is_dir():
        return []
    found = [(int(m[1]), p) for p in base.iterdir() if (m := _NAME.fullmatch(p.name))]
    return sorted(f for f in found if f[1].is_dir())


def latest(root: str | Path, *, trust_unverified: bool = False) -> Path | None:
    """The newest checkpoint under ``root`` that verifies (``None`` if none); each newer
    one that does not (a missing or failing manifest) is skipped with a warning."""
    for _, path in reversed(checkpoints(root)):
        try:
            checkpoint.verify(path, trust_unverified=trust_unverified)
        except TesseraError as error:
            warnings.warn(f"skipping {error}; trying an older one", stacklevel=2)
            continue
        return path
    return None


def _rank0() -> bool:
    return not (tdist.is_available() and tdist.is_initialized()) or tdist.get_rank() == 0


class CheckpointManager:
    """Saves a training state to ``root/step_<k>`` every ``every`` steps (0: only when
    :meth:`save` is called), keeping the newest ``keep_last``.

    With ``async_save=True`` a save copies the state and returns while a background
    thread writes it (``step.save(..., blocking=False)``); the next save, :meth:`wait`
    and :meth:`restore` wait for it first, so at most one is in flight, and rotation
    happens once it is complete (signed and renamed into place)."""

    def __init__(
        self, root: str | Path, *, every: int = 0, keep_last: int = 3, async_save: bool = False
    ) -> None:
        if every < 0 or keep_last < 1:
            raise TesseraError(
                f"CheckpointManager needs every >= 0 and keep_last >= 1, found {every}, {keep_last}"
            )
        self.root, self.every, self.keep_last = Path(root), every, keep_last
        self.async_save = async_save
        self._pending: tuple[checkpoint.PendingSave, int] | None = None

    def due(self, step: int) -> bool:
        """Whether the state after ``step`` steps is saved (a multiple of ``every``)."""
        return self.every > 0 and step > 0 and step % self.every == 0

    def save(self, step: _Step, state: Any, extra: dict[str, Any] | None = None) -> Path:
        """Saves ``state`` (and the JSON ``extra``) as ``root/step_<state.step>``, then
        rotates; returns the checkpoint's path. A collective under ``tessera run``."""
        self.wait()
        path = self.root / f"step_{state.step}"
        self.root.mkdir(parents=True, exist_ok=True)
        if self.async_save:
            pending = step.save(state, path, extra=extra, blocking=False)
        else:  # a step whose save takes no ``blocking`` works as before
            pending = step.save(state, path, extra=extra)
        if pending is not None:
            self._pending = (pending, state.step)
        elif _rank0():
            self._rotate(state.step)
        return path

    def wait(self) -> Path | None:
        """Waits for the save in flight (with ``async_save``), rotates, and returns its
        path (``None`` when none was in flight); raises its error if it failed."""
        if self._pending is None:
            return None
        (pending, saved), self._pending = self._pending, None
        path = pending.wait()
        if _rank0():
            self._rotate(saved)
        return path

    def _rotate(self, saved: int) -> None:
        found = checkpoints(self.root)
        older = [p for k, p in found if k < saved]
        doomed = [p for k, p in found if k > saved] + older[
            : max(0, len(older) - self.keep_last + 1)
        ]
        doomed += [p for p in self.root.iterdir() if _LEFTOVER.fullmatch(p.name)]
        for path in doomed:
            shutil.rmtree(path, ignore_errors=True)

    def restore(
        self, step: _Step, state: Any, *, trust_unverified: bool = False
    ) -> dict[str, Any] | None:
        """Fills ``state`` from the newest complete checkpoint under ``root`` and returns
        its ``extra``; ``None`` (``state`` untouched) when there is none."""
        self.wait()
        path = latest(self.root, trust_unverified=trust_unverified)
        if path is None:
            return None
        step.restore(state, path, trust_unverified=trust_unverified)
        return checkpoint.read_extra(path)


def resolve(path: str | Path) -> Path:
    """``path`` itself if it is a checkpoint, else the newest complete one under it (a
    :class:`CheckpointManager`'s root); ``path`` when neither (restoring it then says why)."""
    source = Path(path)
    if (source / checkpoint.SIGNED).exists() or not checkpoints(source):
        return source
    return latest(source) or source
