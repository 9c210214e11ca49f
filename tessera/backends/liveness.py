"""The job's liveness channel: what every rank is doing, and how each one ended.

gloo and NCCL see a peer only through its connections. A rank that dies ends its peers'
collectives at once, but their error cannot say which rank died; and a rank that is
alive but will never come (it hangs in the user's code, or it exited cleanly and waits
for the others at exit) leaves its peers waiting until the timeout. So every rank
publishes, in the job's key-value store (the TCPStore at ``MASTER_ADDR:MASTER_PORT``
that torchrun's agent hosts), under a key prefix of its own job:

- a **heartbeat**, every :data:`BEAT_S` seconds from a daemon thread: whether the main
  thread waits in a collective (which one, with which ranks, since when) or runs the
  user's code (at which line of it), and its process id;
- its **exit**: a failure (an exception, ``sys.exit(n)``), recorded before the process
  ends, or a clean exit.

A rank whose collective fails asks :meth:`Liveness.blame` which member caused it (one
that recorded its exit, one whose process is gone, one that never reached the
collective). A rank that exits cleanly waits for the others in :meth:`Liveness.leave`
(never in a collective, which would pair with whatever collective a peer is in) until it
is told to leave: by the last rank to get there, by a rank that failed, or by a peer
that has waited :data:`GRACE_S` seconds for it in a collective. Then its connections
close and that peer's collective fails at once, naming it.

The store is the default process group's (the TCPStore torchrun's agent hosts, already
connected); if it is unreachable the channel goes quiet and errors say less, and every
wait stays bounded by the timeout.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import socket
import sys
import sysconfig
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from types import FrameType, TracebackType
from typing import Any

BEAT_S = 0.5  # how often a rank publishes its heartbeat
STALE_S = 5.0  # a heartbeat older than this: the rank is stuck outside Python, or dead
GRACE_S = 2.0  # a peer waiting this long for a rank that reached its exit: it exited early
POLL_S = 0.1  # how often a leaving rank looks at the store


@dataclass(frozen=True)
class Blame:
    """The rank that caused a collective to fail, and what it did."""

    rank: int
    reason: str  # a phrase following "rank N", e.g. "hung at job.py:12 in main"


@dataclass(frozen=True)
class Ending:
    """How a process ends: ``kind`` is ``"failed"`` (an uncaught exception), ``"exit"``
    (``sys.exit`` with a non-zero code) or ``"clean"``; ``at`` is the user's line it
    ended at, when known; ``cause``, the rank that made it fail, when another one did."""

    kind: str
    code: int | None = None
    message: str = ""
    at: str | None = None
    cause: Blame | None = None

    def entry(self) -> dict[str, Any]:
        entry: dict[str, Any] = {"kind": self.kind, "code": self.code, "message": self.message}
        entry["at"], entry["t"] = self.at, time.time()
        if self.cause is not None:
            entry["cause_rank"], entry["cause"] = self.cause.rank, self.cause.reason
        return entry


@dataclass
class _Waiting:
    what: str
    members: tuple[int, ...]
    since: float


class Liveness:
    """This rank's side of the job's liveness channel (see the module docstring)."""

    def __init__(self, store: Any, rank: int, world_size: int):
        self.store = store
        self.rank = rank
        self.world_size = world_size
        self.host = socket.gethostname()
        self._waiting: _Waiting | None = None
        self._main = threading.main_thread().ident
        self._stop = threading.Event()
        self._woken: set[int] = set()  # peers this rank told to leave
        self._publish()
        self._thread = threading.Thread(target=self._beat, name="tessera-heartbeat", daemon=True)
        self._thread.start()

    @staticmethod
    def of_process_group(rank: int, world_size: int) -> Liveness | None:
        """The channel of this job, in the store of the default process group (the
        TCPStore torchrun's agent hosts, connected already; thread-safe), or None when
        there is none."""
        import torch.distributed as tdist

        try:
            store = tdist.distributed_c10d._get_default_store()
            return Liveness(tdist.PrefixStore("tessera/", store), rank, world_size)
        except Exception:
            return None

    # --- what this rank does ----------------------------------------------------------------

    @contextlib.contextmanager
    def waiting(self, what: str, members: Sequence[int]) -> Iterator[None]:
        """Marks the main thread as waiting in ``what`` with ``members`` (cheap: the
        heartbeat thread publishes it)."""
        self._waiting = _Waiting(what, tuple(members), time.time())
        try:
            yield
        finally:
            self._waiting = None

    def record_exit(self, ending: Ending) -> None:
        """Publishes how this rank ends (before the process ends); a failure also tells
        every rank waiting at its exit to leave."""
        with contextlib.suppress(Exception):
            self.store.set(f"exit/{self.rank}", json.dumps(ending.entry()))
            if ending.kind != "clean":
                self._tell_to_leave(range(self.world_size))
            self.store.add("exits", 1)  # answered after the sets before it are applied

    def leave(self, ending: Ending, timeout: float) -> None:
        """A clean exit: waits (at most ``timeout`` seconds) until it is told to leave:
        by the last rank to reach its exit, by a rank that failed, or by a peer that has
        waited :data:`GRACE_S` seconds for this one in a collective (this rank exited
        early). So no rank closes connections a peer still needs, and none waits for a
        rank that will not come."""
        self._stop.set()
        self.record_exit(ending)
        deadline = time.monotonic() + timeout
        try:
            if self.store.add("left", 1) >= self.world_size:
                self._tell_to_leave(range(self.world_size))
            while time.monotonic() < deadline and not self.store.check([f"leave/{self.rank}"]):
                time.sleep(POLL_S)
        except Exception:
            return

    def close(self) -> None:
        self._stop.set()

    # --- what the others do -----------------------------------------------------------------

    def blame(self, members: Sequence[int], what: str, timed_out: bool) -> Blame | None:
        """The member of a failed collective ``what`` that caused it: one that recorded
        a failure (a failure it caused itself first), one whose process ended without a
        record, one that exited cleanly, then (when the collective timed out) one that
        never reached it."""
        peers = [m for m in members if m != self.rank]
        try:
            exits = {p: e for p in peers if (e := self._read(f"exit/{p}")) is not None}
            beats = self._beats_of(peers)
        except Exception:
            return None
        failed = {r: e for r, e in exits.items() if e["kind"] != "clean"}
        if failed:  # a rank that failed on its own first, else the cause another one named
            rank, entry = min(failed.items(), key=lambda i: ("cause_rank" in i[1], i[0]))
            if "cause_rank" in entry:
                return Blame(int(entry["cause_rank"]), str(entry["cause"]))
            return Blame(rank, _ended(entry))
        for rank, beat in beats.items():
            gone = beat.get("host") == self.host and _process_gone(int(beat.get("pid", 0)))
            if gone and rank not in exits:
                return Blame(rank, "ended without saying why (killed?)")
        if exits:  # a clean exit (it completed its part of any collective it was in)
            rank = min(exits)
            return Blame(rank, _ended(exits[rank]))
        now = time.time()
        for rank in peers:
            beat = beats.get(rank)
            if beat is None:
                if timed_out:
                    return Blame(rank, "never reached Tessera's runtime")
                continue
            if now - float(beat["t"]) > STALE_S:
                return Blame(rank, f"stopped responding {now - float(beat['t']):.0f} s before "
                                   f"(stuck outside Python?) at {beat.get('at')}")  # fmt: skip
            if timed_out and not beat.get("waiting"):
                return Blame(rank, f"hung at {beat.get('at')}")
        if timed_out:
            for rank, beat in beats.items():
                if beat.get("waiting") and beat["waiting"] != what:
                    return Blame(rank, f"was waiting in {beat['waiting']} instead")
        return None

    def failed_peer(self) -> int | None:
        """A peer that failed (recorded a failure, or whose process on this host is gone
        without a record), or None: e.g. to tell the launcher stopping the ranks left
        after a failure from a job being preempted."""
        peers = [r for r in range(self.world_size) if r != self.rank]
        try:
            exits = {p: e for p in peers if (e := self._read(f"exit/{p}")) is not None}
            failed = [r for r, e in exits.items() if e["kind"] != "clean"]
            if failed:
                return min(failed)
            for rank, beat in self._beats_of(peers).items():
                here = rank not in exits and beat.get("host") == self.host
                if here and _process_gone(int(beat.get("pid", 0))):
                    return rank
        except Exception:
            return None
        return None

    # --- internals --------------------------------------------------------------------------

    def _tell_to_leave(self, ranks: Iterable[int]) -> None:
        for rank in ranks:
            self.store.set(f"leave/{rank}", "1")

    def _wake_early_leavers(self) -> None:
        """While the main thread has waited :data:`GRACE_S` seconds in a collective, tells
        the members that reached their exit meanwhile to leave (this rank then fails at
        once, naming them, instead of at the timeout)."""
        waiting = self._waiting
        if waiting is None or time.time() - waiting.since < GRACE_S:
            return
        for rank in waiting.members:
            if rank == self.rank or rank in self._woken:
                continue
            entry = self._read(f"exit/{rank}")
            if entry is not None and entry["kind"] == "clean":
                self._woken.add(rank)
                self._tell_to_leave([rank])

    def _beats_of(self, ranks: Sequence[int]) -> dict[int, dict[str, Any]]:
        return {r: b for r in ranks if (b := self._read(f"beat/{r}")) is not None}

    def _read(self, key: str) -> dict[str, Any] | None:
        if not self.store.check([key]):
            return None
        return json.loads(self.store.get(key))

    def _publish(self) -> None:
        waiting = self._waiting
        frames = sys._current_frames()
        frame = frames.get(self._main) if self._main is not None else None
        beat = {
            "t": time.time(),
            "pid": os.getpid(),
            "host": self.host,
            "at": user_line(frame),
            "waiting": waiting.what if waiting else None,
            "members": list(waiting.members) if waiting else [],
            "since": waiting.since if waiting else None,
        }
        self.store.set(f"beat/{self.rank}", json.dumps(beat))
        self.store.add("beats", 1)  # a store's set is not answered: this one is, after it

    def _beat(self) -> None:
        while not self._stop.wait(BEAT_S):
            try:
                self._publish()
                self._wake_early_leavers()
            except Exception:
                return  # the store is gone: the job is ending


# --- this process's exit -------------------------------------------------------------------

_channel: Liveness | None = None  # this process's, once it joined a job
_ending: Ending | None = None  # how this process ends, once known


def channel() -> Liveness | None:
    return _channel


def note_ending(ending: Ending) -> None:
    """Notes how this process is about to end (by the worker, or the excepthook). A
    failure is published at once, so that the peers it leaves waiting name this rank."""
    global _ending
    _ending = ending
    if _channel is not None and ending.kind != "clean":
        _channel.record_exit(ending)


def install(liveness: Liveness | None, timeout: float) -> None:
    """Makes ``liveness`` this process's channel and arranges its exit: an uncaught
    exception is noted as a failure; at exit, a process that did not fail waits for the
    others (:meth:`Liveness.leave`, at most ``timeout`` seconds) and leaves the process
    group; one that failed ends at once, without tearing down a process group that may
    have a collective in flight (gloo can crash doing so); its peers' collectives fail
    when its connections close."""
    global _channel
    _channel = liveness
    previous = sys.excepthook

    def hook(kind: type[BaseException], value: BaseException, trace: TracebackType | None) -> None:
        if not isinstance(value, SystemExit):
            note_ending(Ending("failed", 1, f"{kind.__name__}: {value}", at=failure_line(value)))
        previous(kind, value, trace)

    def at_exit() -> None:
        import torch.distributed as tdist

        ending = _ending or Ending("clean")  # the code is not known here (sys.exit(n)?)
        if _channel is not None and ending.kind == "clean":
            _channel.leave(ending, timeout)
        if _channel is not None:
            _channel.close()
        if ending.kind != "clean":  # no teardown of a group with a collective in flight
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(ending.code or 1)
        if tdist.is_initialized():
            with contextlib.suppress(Exception):
                tdist.destroy_process_group()

    sys.excepthook = hook
    atexit.register(at_exit)


def failure_line(error: BaseException) -> str | None:
    """The user's line where ``error`` was raised (or ``sys.exit`` called)."""
    trace = error.__traceback__
    if trace is None:
        return None
    while trace.tb_next is not None:
        trace = trace.tb_next
    return user_line(trace.tb_frame)


def _ended(entry: dict[str, Any]) -> str:
    """How a rank ended, from its exit record."""
    at = f" at {entry['at']}" if entry.get("at") else ""
    if entry["kind"] == "clean":
        code = f" with code {entry['code']}" if entry.get("code") is not None else ""
        return f"exited{code}{at} before the others were done"
    if entry["kind"] == "exit":
        return f"exited with code {entry['code']}{at}"
    return f"failed: {entry['message']}"


def _process_gone(pid: int) -> bool:
    """Whether process ``pid`` of this host has ended (or is a zombie)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return False


_LIBRARY_DIRS = tuple(
    os.path.join(os.path.realpath(p), "")
    for p in {
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))),  # tessera/
        sysconfig.get_paths()["stdlib"],
        sysconfig.get_paths()["purelib"],
        sysconfig.get_paths()["platlib"],
    }
)


def user_line(frame: FrameType | None = None) -> str | None:
    """``file:line in function`` of the innermost frame of the user's code (outside
    Tessera, the standard library and installed packages) of ``frame``'s stack (by
    default the caller's)."""
    frame = frame if frame is not None else sys._getframe(1)
    innermost = frame
    while frame is not None:
        path = os.path.realpath(frame.f_code.co_filename)
        if not path.startswith(_LIBRARY_DIRS) and not frame.f_code.co_filename.startswith("<"):
            return _where(frame)
        frame = frame.f_back
    return _where(innermost) if innermost is not None else None


def _where(frame: FrameType) -> str:
    name = os.path.basename(frame.f_code.co_filename)
    return f"{name}:{frame.f_lineno} in {frame.f_code.co_name}"


__all__ = [
    "BEAT_S", "GRACE_S", "STALE_S", "Blame", "Ending", "Liveness",
    "channel", "failure_line", "install", "note_ending", "user_line",
]  # fmt: skip
