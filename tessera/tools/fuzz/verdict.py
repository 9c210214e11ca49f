"""What a fuzzed run of ``tessera-opt`` counts as.

- ``clean``: exit status 1 with a located diagnostic (``FILE:LINE:COL: error: ...``);
- ``unlocated``: exit status 1 with an error that names no line (a weaker diagnostic);
- ``accepted``: exit status 0;
- ``traceback``: a Python traceback or ``tessera-opt: internal error`` starting a line of
  the output (not the input quoted under a diagnostic), an exception that left ``main``,
  an exit status other than 0 and 1, or a worker that died;
- ``hang``: no answer by the deadline.

A traceback's *site* is where it was raised: its exception type and innermost frame in
Tessera's code (or, if none, its innermost frame), so that one bug is one site.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

import tessera
from tessera.tools.fuzz.opt_worker import Run

CLEAN, UNLOCATED, ACCEPTED, TRACEBACK, HANG = "clean", "unlocated", "accepted", "traceback", "hang"
KINDS = (CLEAN, UNLOCATED, ACCEPTED, TRACEBACK, HANG)

_PACKAGE = os.path.dirname(os.path.abspath(tessera.__file__)) + os.sep
_FUZZER = os.path.join(_PACKAGE, "tools", "fuzz") + os.sep
_LOCATED = re.compile(r"^\S+:\d+:\d+: error: ", re.MULTILINE)
# at the start of a line: not the input's text quoted under an error
_INTERNAL = re.compile(r"^tessera-opt: internal error", re.MULTILINE)
_TRACEBACK = re.compile(r"^Traceback \(most recent call last\)", re.MULTILINE)
_LOCATION = re.compile(r"^\S+:\d+:\d+: error: ")
_FRAME = re.compile(r'File "([^"]+)", line (\d+),? in (\S+)')
_EXCEPTION = re.compile(  # the line naming the exception: ``Type`` or ``Type: message``
    r"^((?:\w+\.)*[A-Z]\w*)(?::|$)", re.MULTILINE
)


@dataclass(frozen=True)
class Verdict:
    kind: str
    site: str = ""  # for tracebacks and hangs: where


def judge(run: Run) -> Verdict:
    if run.died is not None:
        return Verdict(TRACEBACK, f"worker died ({run.died})")
    if run.hung:
        return Verdict(HANG, _site(run.stack, innermost_first=True) if run.stack else "unknown")
    output = run.stderr + run.stdout
    trace = run.escaped or _traceback_in(output)
    if trace is not None:
        return Verdict(TRACEBACK, _site(trace, innermost_first=False))
    if (internal := _INTERNAL.search(output)) is not None:  # without a traceback: a pass
        first, *rest = output[internal.start() :].split("\n")  # made invalid IR
        if first.endswith(":") and rest:  # then the verifier's error, at its op
            first += " " + _LOCATION.sub("", rest[0])
        return Verdict(TRACEBACK, re.sub(r"\d+", "N", first))
    if run.exit_code not in (0, 1):
        return Verdict(TRACEBACK, f"exit status {run.exit_code}")
    if run.exit_code == 0:
        return Verdict(ACCEPTED)
    return Verdict(CLEAN if _LOCATED.search(run.stderr) else UNLOCATED)


def _traceback_in(output: str) -> str | None:
    found = _TRACEBACK.search(output)
    return output[found.start() :] if found is not None else None


def _site(trace: str, innermost_first: bool) -> str:
    """``Type at file:line (function)`` of the innermost frame in Tessera's code, then
    ``<- file:line (function)`` of the innermost frame if it is elsewhere."""
    frames = _FRAME.findall(trace)
    if innermost_first:  # faulthandler's order
        frames.reverse()
    if not frames:
        return trace.strip().split("\n")[-1][:120]
    ours = [f for f in frames if f[0].startswith(_PACKAGE) and not f[0].startswith(_FUZZER)]
    exceptions = _EXCEPTION.findall(trace)
    kind = "hang" if innermost_first else exceptions[-1] if exceptions else "exception"
    site = f"{kind} at {_frame(*(ours or frames)[-1])}"
    if ours and ours[-1] != frames[-1]:
        site += f" <- {_frame(*frames[-1])}"
    return site


def _frame(path: str, line: str, function: str) -> str:
    if path.startswith(_PACKAGE):
        path = "tessera/" + path[len(_PACKAGE) :]
    elif (index := path.rfind(os.sep + "site-packages" + os.sep)) >= 0:
        path = path[index + len("/site-packages/") :]
    return f"{path}:{line} ({function})"
