"""Test-only fault injection: ``TESSERA_FAULT_INJECT`` makes a rank misbehave on cue.

Off unless the variable is set (each hook is then one dictionary lookup). The value is
one or more faults separated by ``,``, each ``KIND:rank=R:step=K[:attempt=A]``: rank
``R`` misbehaves when its training state reaches step ``K`` (``K`` steps done), on the
``A``-th start of the job (``TORCHELASTIC_RESTART_COUNT``, 0 by default, so that a job
restarted by ``tessera run --max-restarts`` runs clean afterwards). The kinds:

- ``kill``: SIGKILL itself as step ``K + 1`` starts (a rank dying mid-step for its peers);
- ``exit``: ``os._exit(3)`` there;
- ``hang``: sleep there forever (the peers' timeout names the hung rank);
- ``term``: SIGTERM the launcher there (the job preempted, as a scheduler does: every
  rank then gets SIGTERM from the launcher);
- ``save-kill``: SIGKILL itself while saving step ``K``, after the data files are
  written and before the manifest is signed (a save cut short; on rank 0, which signs:
  another rank's data is complete once DCP's save returns on rank 0);
- ``save-corrupt``: once the save of step ``K`` is complete, flip a byte of its largest
  data file and SIGKILL itself (the newest checkpoint damaged on disk);
- ``save-enospc``: the save of step ``K`` fails with ``OSError(ENOSPC)`` after its data
  files are written, as a full disk refuses the last write (a simulation: no quota or
  tmpfs is available in the test container, and the writer's failure is what the job
  sees of a full disk either way).

The hooks are :func:`before_step` (``graph.training_step``'s call), :func:`in_save` and
:func:`after_save` (:func:`tessera.training.checkpoint.save`).
"""

from __future__ import annotations

import errno
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from tessera import environment
from tessera.errors import TesseraError

STEP_KINDS = ("kill", "exit", "hang", "term")
SAVE_KINDS = ("save-kill", "save-enospc")
SAVED_KINDS = ("save-corrupt",)


@dataclass(frozen=True)
class Fault:
    """One injected fault: what, on which rank, at which step, on which start of the job."""

    kind: str
    rank: int
    step: int
    attempt: int = 0


def parse(text: str) -> list[Fault]:
    """The faults of a ``TESSERA_FAULT_INJECT`` value; an error names what is wrong."""
    faults = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        kind, *fields = item.split(":")
        if kind not in STEP_KINDS + SAVE_KINDS + SAVED_KINDS:
            raise TesseraError(
                f"TESSERA_FAULT_INJECT: unknown fault {kind!r} in {item!r}: expected one of "
                f"{', '.join(STEP_KINDS + SAVE_KINDS + SAVED_KINDS)}"
            )
        values: dict[str, int] = {}
        for field in fields:
            name, _, value = field.partition("=")
            if name not in ("rank", "step", "attempt") or not value.isdigit():
                raise TesseraError(
                    f"TESSERA_FAULT_INJECT: bad field {field!r} in {item!r}: expected "
                    "rank=R, step=K or attempt=A (non-negative integers)"
                )
            values[name] = int(value)
        if "rank" not in values or "step" not in values:
            raise TesseraError(f"TESSERA_FAULT_INJECT: {item!r} needs rank=R and step=K")
        faults.append(Fault(kind, values["rank"], values["step"], values.get("attempt", 0)))
    return faults


def _due(kinds: tuple[str, ...], step: int) -> Fault | None:
    text = environment.fault_inject()
    if text is None:
        return None
    rank = environment.rank() or 0
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    for fault in parse(text):
        if (fault.kind, fault.rank, fault.step, fault.attempt) in (
            (k, rank, step, attempt) for k in kinds
        ):
            return fault
    return None


def before_step(step: int) -> None:
    """Called as a training step starts from state step ``step``."""
    fault = _due(STEP_KINDS, step)
    if fault is None:
        return
    print(f"fault injection: rank {fault.rank} {fault.kind} at step {step}", flush=True)
    if fault.kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif fault.kind == "exit":
        os._exit(3)
    elif fault.kind == "term":
        os.kill(os.getppid(), signal.SIGTERM)  # the launcher (torchrun's agent)
    elif fault.kind == "hang":
        while True:
            time.sleep(3600)


def in_save(step: int, where: str) -> None:
    """Called by a save of step ``step`` once its data files are written to ``where``."""
    fault = _due(SAVE_KINDS, step)
    if fault is None:
        return
    print(f"fault injection: rank {fault.rank} {fault.kind} saving step {step}", flush=True)
    if fault.kind == "save-kill":
        os.kill(os.getpid(), signal.SIGKILL)
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), where)


def after_save(step: int, where: str) -> None:
    """Called once the checkpoint of step ``step`` is complete at ``where``."""
    fault = _due(SAVED_KINDS, step)
    if fault is None:
        return
    largest = max(Path(where).glob("*.distcp"), key=lambda p: p.stat().st_size)
    with open(largest, "r+b") as file:
        file.seek(largest.stat().st_size // 2)
        byte = file.read(1)
        file.seek(-1, os.SEEK_CUR)
        file.write(bytes([byte[0] ^ 0xFF]))
    print(f"fault injection: rank {fault.rank} corrupted {largest}", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
