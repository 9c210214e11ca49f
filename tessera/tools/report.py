"""What ``tessera run`` prints when a job fails: each distinct traceback once, then one
short line naming the rank that caused the failure first.

torchrun gives one failure per rank that ended badly: its exit code (negative for a
signal) and the error file :mod:`tessera.tools.worker` wrote (the message, the traceback
and, under ``extraInfo.tessera``, how the rank ended and which rank caused it). The
ranks fall in four groups, named in this order:

- **causes**: ranks that failed on their own (an exception, ``sys.exit(n)``, an exit
  code without a record, a signal other than torchrun's SIGTERM);
- **named causes**: ranks that another rank's error names as the cause although they
  did not fail on their own (a rank that exited with code 0 while others still waited
  for it, or hung until torchrun stopped it);
- **consequences**: ranks whose collective failed because of a cause;
- **stopped**: ranks torchrun stopped (SIGTERM) because another rank ended.
"""

from __future__ import annotations

import signal
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class RankEnd:
    """How one rank ended, as torchrun and the worker's error file tell."""

    rank: int
    exitcode: int  # torchrun's: negative when killed by a signal
    message: str = ""  # the first line of the recorded error
    trace: str = ""  # the recorded traceback
    kind: str | None = None  # "failed", "exit" (sys.exit(n)) or None (nothing recorded)
    at: str | None = None  # the user's line it ended at
    cause_rank: int | None = None  # the rank that made it fail
    cause: str = ""  # what that rank did

    @staticmethod
    def of(rank: int, failure: object) -> RankEnd:
        """From torchrun's ``ProcessFailure`` (``exitcode``, ``message``)."""
        message = getattr(failure, "message", "")
        extra = message.get("extraInfo", {}) if isinstance(message, dict) else {}
        text = message.get("message", "") if isinstance(message, dict) else str(message)
        text = str(text).strip()
        if text.startswith(("To enable traceback", "Signal ")):  # torchrun's own texts
            text = ""
        tessera = extra.get("tessera", {}) if isinstance(extra, dict) else {}
        tessera = tessera if isinstance(tessera, dict) else {}
        cause_rank = tessera.get("cause_rank")
        return RankEnd(
            rank=rank,
            exitcode=int(getattr(failure, "exitcode", 1)),
            message=text.splitlines()[0] if text else "",
            trace=str(extra.get("py_callstack", "")).rstrip() if isinstance(extra, dict) else "",
            kind=tessera.get("kind") or ("failed" if text else None),
            at=tessera.get("at"),
            cause_rank=int(cause_rank) if isinstance(cause_rank, int) else None,
            cause=str(tessera.get("cause", "")),
        )

    @property
    def code(self) -> int:
        """The exit code it failed with: a rank that recorded its failure and was stopped
        while exiting counts as exit code 1."""
        if self.exitcode == -signal.SIGTERM and self.kind is not None:
            return 1
        return self.exitcode

    @property
    def stopped(self) -> bool:
        """torchrun stopped it (SIGTERM) because another rank ended."""
        return self.code == -signal.SIGTERM

    @property
    def consequence(self) -> bool:
        """It failed because another rank did (a Tessera collective error)."""
        named = self.cause_rank is not None and self.cause_rank != self.rank
        return named or "another rank failed" in self.message


def shell_code(code: int) -> int:
    """A process exit code as shells report it: killed by signal s -> 128 + s."""
    return 128 - code if code < 0 else code


def ranks_text(ranks: Sequence[int]) -> str:
    """``rank 3``, ``ranks 0-7`` (consecutive) or ``ranks 0, 2, 5``."""
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if list(ranks) == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return "ranks " + ", ".join(str(r) for r in ranks)


def _describe(ranks: Sequence[int], end: RankEnd) -> str:
    """How ``ranks`` (which ended the same way as ``end``) failed on their own."""
    who, code = ranks_text(ranks), end.code
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        verb = "was" if len(ranks) == 1 else "were"
        return f"{who} {verb} killed by {name} (exit code {shell_code(code)})"
    if end.kind == "exit":
        return f"{who} exited with code {code}" + (f" at {end.at}" if end.at else "")
    if not end.message:
        return f"{who} exited with code {code}"
    return f"{who} failed with exit code {code}: {end.message}"


class Report:
    """The failed ranks of a job, grouped as the module docstring says."""

    def __init__(self, failures: dict[int, object]):
        ends = [RankEnd.of(r, f) for r, f in sorted(failures.items())]
        self.causes = [e for e in ends if not e.stopped and not e.consequence]
        self.consequences = [e for e in ends if not e.stopped and e.consequence]
        self.stopped = [e for e in ends if e.stopped]
        own = {e.rank for e in self.causes}
        self.named: dict[int, str] = {}  # rank -> what it did, as a consequence names it
        for end in self.consequences:
            if end.cause_rank is not None and end.cause_rank not in own:
                self.named.setdefault(end.cause_rank, end.cause)
        if not self.causes and not self.named:  # nothing else known: they are the causes
            self.causes, self.consequences = self.consequences, []
        self.stopped = [e for e in self.stopped if e.rank not in self.named]

    def summary(self) -> str:
        """One line: the causes (ranks that ended the same way together), the ranks that
        failed because of them, the ranks torchrun stopped."""
        groups: dict[tuple[int, str, str, str | None], list[int]] = {}
        for end in self.causes:
            groups.setdefault((end.code, end.kind or "", end.message, end.at), []).append(end.rank)
        by_rank = {e.rank: e for e in self.causes}
        parts = [_describe(ranks, by_rank[ranks[0]]) for ranks in groups.values()]
        parts += [f"rank {rank} {what}" for rank, what in sorted(self.named.items())]
        if self.consequences:
            whom = "it" if len(self.causes) + len(self.named) == 1 else "them"
            ranks = [e.rank for e in self.consequences]
            parts.append(f"{ranks_text(ranks)} failed waiting for {whom}")
        if self.stopped:
            ranks = [e.rank for e in self.stopped]
            parts.append(f"{ranks_text(ranks)} {'were' if len(ranks) > 1 else 'was'} stopped")
        return "; ".join(parts)

    def tracebacks(self) -> list[tuple[list[int], str]]:
        """Each distinct traceback once, with the ranks that recorded it: the causes',
        else (when no cause has one: a hang, an exit, a signal) the consequences', those
        that failed at the same place (they differ only in their rank) together."""
        ends = [e for e in self.causes if e.trace] or [e for e in self.consequences if e.trace]
        groups: dict[str, list[RankEnd]] = {}
        for end in ends:
            groups.setdefault(_place(end), []).append(end)
        return [([e.rank for e in group], group[0].trace) for group in groups.values()]

    def exit_code(self) -> int:
        """The job's exit code: the worst cause's (a named cause that exited 0 or was
        stopped has none: then the consequences')."""
        ends = self.causes or self.consequences or self.stopped
        return max((shell_code(e.code) for e in ends), default=1) or 1


def _place(end: RankEnd) -> str:
    """Where a traceback was raised: its frames and exception type, not its message,
    when the rank failed because of another one (those messages name their own rank)."""
    if not end.consequence:
        return end.trace
    lines = end.trace.splitlines()
    frames = [line for line in lines if line.startswith("  ")]
    kind = lines[-1].split(":", 1)[0] if lines else ""
    return "\n".join([*frames, kind])


__all__ = ["RankEnd", "Report", "ranks_text", "shell_code"]
