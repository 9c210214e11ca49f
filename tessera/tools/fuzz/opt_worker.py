"""A persistent process that runs ``tessera-opt`` in-process, one input at a time.

Starting ``tessera-opt`` costs about a second of imports, so the fuzzer keeps one worker
process that calls :func:`tessera.tools.opt.main` for each input with stdout and stderr
captured. An input that has not finished by its deadline is a hang: the worker writes
its stack shortly before the deadline (where it hangs), is killed and a fresh one
started. The worker's address space is limited, so that an input
asking for a huge allocation fails with ``MemoryError`` instead of exhausting the
machine.
"""

from __future__ import annotations

import contextlib
import faulthandler
import io
import multiprocessing
import os
import resource
import sys
import tempfile
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

STDOUT_LIMIT = 2048  # characters of stdout kept per input (its end)
STDERR_LIMIT = 65536  # and of stderr (where errors and tracebacks are)
MEMORY_LIMIT = 4 << 30  # bytes of address space a worker may use
INPUT_NAME = "input.mlir"


@dataclass(frozen=True)
class Run:
    """What one ``tessera-opt`` run did. ``exit_code`` is None for a hang, and
    ``escaped`` the traceback of an exception that left ``main`` (a bug in the tool)."""

    exit_code: int | None
    stdout: str = ""
    stderr: str = ""
    escaped: str | None = None
    died: str | None = None  # why the worker process died (a signal), if it did
    stack: str = ""  # for a hang: the worker's stack shortly before its deadline

    @property
    def hung(self) -> bool:
        return self.exit_code is None and self.died is None


class OptWorker:
    """Runs inputs through ``tessera-opt`` in a child process; restarts it after a hang."""

    def __init__(self) -> None:
        self._context = multiprocessing.get_context("spawn")
        self._process: Any = None
        self._connection: Connection | None = None
        self._hang_file = ""
        self.restarts = 0

    def run(self, data: bytes, args: list[str], deadline: float) -> Run:
        """Runs ``tessera-opt INPUT ARGS`` on ``data``, waiting at most ``deadline`` seconds
        (the first run also waits for the worker to start)."""
        if self._connection is None:
            self._start()
        assert self._connection is not None
        try:
            self._connection.send((data, args, deadline))
            if self._connection.poll(deadline):
                return self._connection.recv()
        except (EOFError, OSError, BrokenPipeError):
            pass
        died = self._stop()
        return Run(None, died=died, stack=_read(self._hang_file) if died is None else "")

    def close(self) -> None:
        if self._connection is not None:
            with contextlib.suppress(OSError, BrokenPipeError):
                self._connection.send(None)
            self._process.join(timeout=5)
            self._stop()

    def _start(self) -> None:
        parent, child = self._context.Pipe()
        self._process = self._context.Process(target=_serve, args=(child,), daemon=True)
        self._process.start()
        child.close()
        self._connection = parent
        self._hang_file = parent.recv()

    def _stop(self) -> str | None:
        """Kills the worker; returns why it had died already (None: it was alive)."""
        process, self._process = self._process, None
        if self._connection is not None:
            self._connection.close()
            self._connection = None
        died = None
        if process is not None:
            if process.is_alive():
                process.kill()
            else:
                died = f"worker exited with status {process.exitcode}"
            process.join()
            self.restarts += 1
        return died


def _serve(connection: Connection) -> None:
    """The worker's loop: receive (input, args), run ``tessera-opt``, send a :class:`Run`."""
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    os.environ["TESSERA_DEBUG"] = "1"  # internal errors come with their traceback
    from tessera.passes import get_all_passes
    from tessera.tools import opt

    directory = tempfile.mkdtemp(prefix="tessera-fuzz-")
    path = os.path.join(directory, INPUT_NAME)
    hang_file = os.path.join(directory, "hang.txt")
    for load_pass in get_all_passes().values():  # imports outside any input's deadline
        load_pass()
    connection.send(hang_file)
    while (request := connection.recv()) is not None:
        data, args, deadline = request
        with open(path, "wb") as file:
            file.write(data)
        with open(hang_file, "w") as stack:
            faulthandler.dump_traceback_later(max(deadline - 0.5, deadline * 0.8), file=stack)
            run = _run_once(opt.main, [path, *args])
            faulthandler.cancel_dump_traceback_later()
        connection.send(run)


def _run_once(main: Any, argv: list[str]) -> Run:
    stdout, stderr = io.StringIO(), io.StringIO()
    escaped = None
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            exit_code = main(argv)
        except SystemExit as exit_:
            exit_code = exit_.code if isinstance(exit_.code, int) else 1
        except BaseException:
            exit_code = -1
            escaped = traceback.format_exc()
    sys.stdout.flush()
    return Run(
        exit_code,
        _tail(stdout.getvalue(), STDOUT_LIMIT),
        _tail(stderr.getvalue(), STDERR_LIMIT),
        escaped,
    )


def _read(path: str) -> str:
    try:
        with open(path) as file:
            return file.read()
    except OSError:
        return ""


def _tail(text: str, limit: int) -> str:
    return text if len(text) <= limit else "...\n" + text[-limit:]
