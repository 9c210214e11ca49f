"""One rank of ``tessera run``: runs a script as ``__main__`` and records how it ended.

``python -m tessera.tools.worker script.py [args...]`` runs ``script.py`` as a script
would run (``sys.argv``, ``sys.path[0]``). Every way the script can end is recorded:

- an uncaught exception: written, with its traceback, to torchrun's error file instead
  of stderr (``tessera run`` prints each distinct traceback once for the job and names
  the ranks that failed); a :class:`~tessera.errors.DistributedError` also records the
  rank that caused it;
- ``sys.exit(n)`` with ``n`` not 0: recorded with the line that called it;
- a clean end, or ``sys.exit(0)``: the rank waits for the others at exit, and leaves at
  once if one is stuck waiting for it, which then names it
  (:mod:`tessera.backends.liveness`).

A failure is also published on the job's liveness channel at once, so that peers blocked
in a collective with this rank name it, and the process is bounded to end within
:data:`EXIT_BOUND_S` seconds (a user's thread or exit handler cannot keep a failed rank,
and the job, alive). Without an error file (not under a launcher) the exception
propagates as usual.
"""

from __future__ import annotations

import faulthandler
import json
import os
import runpy
import sys
import threading
import time
import traceback
from typing import Any

from tessera import environment
from tessera.backends import liveness
from tessera.errors import TesseraError

EXIT_BOUND_S = 10.0  # a failed rank ends within this many seconds, whatever its threads do


_TESSERA_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "")


def _script_traceback(error: BaseException, script: str) -> str:
    """The traceback from the script's first frame on (the worker's and runpy's frames
    left out). A Tessera error says what went wrong at the user's line: Tessera's own
    frames are left out too (``TESSERA_DEBUG=1`` keeps them)."""
    tb, path = error.__traceback__, os.path.abspath(script)
    while tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename) != path:
        tb = tb.tb_next
    tb = tb or error.__traceback__
    report = traceback.TracebackException(type(error), error, tb)
    if isinstance(error, TesseraError) and not environment.debug():
        kept = [f for f in report.stack if not f.filename.startswith(_TESSERA_DIR)]
        report.stack = traceback.StackSummary.from_list(kept or report.stack[:1])
    return "".join(report.format())


def exit_code(code: Any) -> int:
    """The process exit code of ``sys.exit(code)``."""
    if code is None:
        return 0
    if isinstance(code, bool) or not isinstance(code, int):
        return 1  # sys.exit("message") prints the message and exits with 1
    return code & 0xFF


def _record(path: str, message: str, trace: str, ending: liveness.Ending) -> None:
    """Writes the error file in torchrun's format; ``extraInfo.tessera`` holds what the
    launcher's report reads (how the rank ended, the line, the rank that caused it)."""
    tessera = {"kind": ending.kind, "code": ending.code, "at": ending.at}
    if ending.cause is not None:
        tessera["cause_rank"], tessera["cause"] = ending.cause.rank, ending.cause.reason
    data = {
        "message": {
            "message": message,
            "extraInfo": {
                "py_callstack": trace,
                "timestamp": str(int(time.time())),
                "tessera": tessera,
            },
        }
    }
    # written whole, then renamed: torchrun's agent reads the file when the process has
    # ended, and it may stop (SIGTERM) this rank while it writes (another rank failed first)
    partial = f"{path}.{os.getpid()}.tmp"
    with open(partial, "w") as file:
        json.dump(data, file)
    os.replace(partial, path)


def _fail(ending: liveness.Ending, error_file: str | None, message: str, trace: str) -> None:
    """Records a failure everywhere it is read and bounds the time left to exit."""
    liveness.note_ending(ending)
    sys.stdout.flush()
    if error_file:
        _record(error_file, message, trace, ending)
    code = ending.code or 1
    timer = threading.Timer(EXIT_BOUND_S, os._exit, (code,))
    timer.daemon = True
    timer.start()


def main() -> None:
    if len(sys.argv) < 2:
        print("usage: python -m tessera.tools.worker script.py [args...]", file=sys.stderr)
        sys.exit(2)
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
    faulthandler.enable(all_threads=True)  # a crash prints every thread's stack
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exit_:
        code = exit_code(exit_.code)
        at = liveness.failure_line(exit_)
        if code == 0:
            liveness.note_ending(liveness.Ending("clean", 0, at=at))
            return
        text = f"sys.exit({exit_.code!r})"
        _fail(liveness.Ending("exit", code, text, at), error_file, text, "")
        raise
    except Exception as error:
        if not error_file:
            raise
        message = f"{type(error).__name__}: {error}"
        cause_rank = getattr(error, "cause_rank", None)
        cause = None if cause_rank is None else liveness.Blame(cause_rank, error.cause)  # type: ignore[attr-defined]
        ending = liveness.Ending("failed", 1, message, liveness.failure_line(error), cause)
        _fail(ending, error_file, message, _script_traceback(error, script))
        sys.exit(1)


if __name__ == "__main__":
    main()
