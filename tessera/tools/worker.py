"""One rank of ``tessera run``: runs a script as ``__main__`` and records its error.

``python -m tessera.tools.worker script.py [args...]`` runs ``script.py`` as a script
would run (``sys.argv``, ``sys.path[0]``), writing an uncaught exception to torchrun's
error file so that ``tessera run`` can report which rank failed and why.
"""

from __future__ import annotations

import os
import runpy
import sys

from torch.distributed.elastic.multiprocessing.errors import record


@record
def _run(script: str) -> None:
    runpy.run_path(script, run_name="__main__")


def main() -> None:
    if len(sys.argv) < 2:
        print("usage: python -m tessera.tools.worker script.py [args...]", file=sys.stderr)
        sys.exit(2)
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    try:
        _run(script)
    except BaseException as error:
        if isinstance(error, SystemExit):
            raise
        rank = os.environ.get("RANK", "?")
        print(
            f"tessera: rank {rank} failed: {type(error).__name__}: {error}",
            file=sys.stderr,
            flush=True,
        )
        raise


if __name__ == "__main__":
    main()
