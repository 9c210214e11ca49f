"""One rank of ``tessera run``: runs a script as ``__main__`` and records its error.

``python -m tessera.tools.worker script.py [args...]`` runs ``script.py`` as a script
would run (``sys.argv``, ``sys.path[0]``). An uncaught exception is written, with its
traceback, to torchrun's error file instead of stderr: ``tessera run`` prints it once for
the job (when every rank fails the same way, the error would otherwise be printed once
per rank) and names the ranks that failed. Without an error file (not under a launcher)
the exception propagates as usual.
"""

from __future__ import annotations

import faulthandler
import json
import os
import runpy
import sys
import time
import traceback


def _script_traceback(error: BaseException, script: str) -> str:
    """The traceback from the script's first frame on (the worker's and runpy's frames
    left out)."""
    tb, path = error.__traceback__, os.path.abspath(script)
    while tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename) != path:
        tb = tb.tb_next
    tb = tb or error.__traceback__
    return "".join(traceback.format_exception(type(error), error, tb))


def _record(error: BaseException, script: str, path: str) -> None:
    """Writes ``error`` to ``path`` in torchrun's error-file format."""
    data = {
        "message": {
            "message": f"{type(error).__name__}: {error}",
            "extraInfo": {
                "py_callstack": _script_traceback(error, script),
                "timestamp": str(int(time.time())),
            },
        }
    }
    with open(path, "w") as file:
        json.dump(data, file)


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
        if exit_.code in (None, 0):
            return
        raise
    except Exception as error:
        if not error_file:
            raise
        sys.stdout.flush()
        _record(error, script, error_file)
        sys.exit(1)


if __name__ == "__main__":
    main()
