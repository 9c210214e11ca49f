"""Preemption: save at the next step boundary when the job is told to stop.

A scheduler preempting a job sends SIGTERM (some, SIGUSR1 first) and kills it a grace
period later; ``tessera run`` (torchrun's agent) passes SIGTERM on to every rank and
SIGKILLs them 30 s later. :class:`Preemption` turns those signals into a request: its
handler only sets a flag (nothing unsafe runs inside a signal handler), and the training
loop asks :meth:`Preemption.requested` at each step boundary, saves, and exits cleanly.
Under ``tessera run`` the ranks agree on the answer (an all-reduce of the flag over the
default process group, a few bytes per step), since a signal reaches them at different
points of a step and a save is a collective every rank must enter together. A second
signal, or no save within ``deadline_s`` of the first, ends the process as the signal
would have (exit code 128 + signal) with a message saying so. A signal that comes when a
peer has failed (the liveness channel says so) is not a preemption but the launcher
stopping the ranks left: it ends the process at once, as without the handler.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType
from typing import Any

import torch
import torch.distributed as tdist

from tessera.backends import distributed, liveness


class Preemption:
    """A signal-set flag that the ranks agree on at step boundaries."""

    def __init__(
        self,
        signals: Sequence[signal.Signals] = (signal.SIGTERM, signal.SIGUSR1),
        deadline_s: float = 25.0,
    ) -> None:
        self.signals, self.deadline_s = tuple(signals), deadline_s
        self.received: signal.Signals | None = None  # the first signal, in this process
        self._previous: dict[signal.Signals, Any] = {}
        self._timer: threading.Timer | None = None

    def install(self) -> Preemption:
        """Handles ``signals`` from now on (main thread only); returns ``self``."""
        for sig in self.signals:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def uninstall(self) -> None:
        """Restores the previous handlers and cancels the deadline."""
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()
        if self._timer is not None:
            self._timer.cancel()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        sig = signal.Signals(signum)
        channel = liveness.channel()
        if channel is not None and channel.failed_peer() is not None:
            # not a preemption: the launcher stops the ranks left after a failure (nothing
            # can be saved without the failed rank); end as the signal would
            signal.signal(sig, signal.SIG_DFL)
            os.kill(os.getpid(), sig)
            return
        if self.received is not None:  # a second signal: stop at once
            self._expire(sig, "a second signal")
        self.received = sig
        self._timer = threading.Timer(self.deadline_s, self._expire, (sig, "the deadline"))
        self._timer.daemon = True
        self._timer.start()

    def _expire(self, sig: signal.Signals, why: str) -> None:
        print(
            f"preemption: {sig.name} received, and {why} ({self.deadline_s:g} s) came "
            "before the checkpoint was saved: exiting without saving",
            file=sys.stderr,
            flush=True,
        )
        os._exit(128 + sig.value)

    def requested(self) -> signal.Signals | None:
        """The signal that asks this job to stop, agreed by every rank (a collective under
        ``tessera run``: every rank calls it at the same step boundary); None if none."""
        local = 0 if self.received is None else int(self.received.value)
        if tdist.is_available() and tdist.is_initialized():
            device = "cuda" if tdist.get_backend() == "nccl" else "cpu"
            flag = torch.tensor([local], dtype=torch.int64, device=device)
            try:
                tdist.all_reduce(flag, op=tdist.ReduceOp.MAX)
            except RuntimeError as error:  # a peer failed: name it
                what = "agreeing on a preemption request"
                raise distributed.failure(distributed.runtime(), what, error) from None
            local = int(flag.item())
        return signal.Signals(local) if local else None

    def saved(self) -> None:
        """The checkpoint is saved: the deadline no longer applies."""
        if self._timer is not None:
            self._timer.cancel()
