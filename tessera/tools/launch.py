"""``tessera run -n N script.py [args...]``: run a script as N ranks on this machine.

A thin wrapper over ``torch.distributed.run`` (torchrun): a standalone rendezvous on
127.0.0.1 at a free port, one process per rank, each running ``script.py`` under
:mod:`tessera.tools.worker` (which records a failing rank's error for the report). If a
rank raises or dies, torchrun stops the others; ``tessera run`` then names the failed
rank(s) and exits with the worst rank's exit code (128 + signal for a killed rank).
Plain ``torchrun --nproc-per-node N script.py`` works too.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import uuid
from collections.abc import Sequence


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tessera", description="Tessera command-line tools.")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser(
        "run",
        help="run a script as N ranks on this machine (wraps torch.distributed.run)",
        description=__doc__.splitlines()[0] if __doc__ else None,
    )
    run.add_argument("-n", "--nproc", type=int, required=True, help="number of ranks (processes)")
    run.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds a rank waits for the others in a collective before failing "
        "(sets TESSERA_TIMEOUT; default 60)",
    )
    run.add_argument("script", help="the Python script every rank runs")
    run.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")
    return parser


def _exit_code(code: int) -> int:
    return 128 - code if code < 0 else code  # killed by signal s -> 128 + s, as shells report


def _message(failure: object) -> str:
    """The error a rank recorded (its uncaught exception), or ""."""
    message = getattr(failure, "message", "")
    if isinstance(message, dict):
        message = message.get("message", "")
    detail = str(message).strip()
    if detail.startswith(("To enable traceback", "Signal ")):
        return ""
    return detail.splitlines()[0] if detail else ""


def _code(failure: object) -> int:
    """The rank's exit code; a rank that recorded an error and was stopped while exiting
    counts as exit code 1."""
    code = int(getattr(failure, "exitcode", 1))
    return 1 if code == -signal.SIGTERM and _message(failure) else code


def _describe(rank: int, failure: object) -> str:
    code, detail = _code(failure), _message(failure)
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"rank {rank} was killed by {name} (exit code {_exit_code(code)})"
    if not detail:
        return f"rank {rank} exited with code {code}"
    return f"rank {rank} failed with exit code {code}: {detail}"


def _stopped(failure: object) -> bool:
    """Whether torchrun stopped this rank (SIGTERM) because another one failed."""
    return _code(failure) == -signal.SIGTERM


def _consequence(failure: object) -> bool:
    """Whether the rank failed because another one did (a Tessera collective error)."""
    message = getattr(failure, "message", "")
    message = message.get("message", "") if isinstance(message, dict) else str(message)
    return "another rank failed" in message


def _report(failures: dict[int, object], nproc: int) -> str:
    """The failed ranks, root causes first: ranks that failed on their own, then ranks
    whose collectives failed because of them, then ranks torchrun stopped."""
    ordered = sorted(failures.items(), key=lambda item: (_consequence(item[1]), item[0]))
    causes = {r: f for r, f in ordered if not _stopped(f)} or dict(ordered)
    stopped = [r for r in sorted(failures) if r not in causes]
    text = "; ".join(_describe(rank, failure) for rank, failure in causes.items())
    if stopped:
        text += (
            f"; ranks {stopped} were stopped"
            if len(stopped) > 1
            else f"; rank {stopped[0]} was stopped"
        )
    return text


def _worst(failures: dict[int, object]) -> int:
    """The exit code of the run: the worst failing rank's, ranks torchrun stopped aside."""
    causes = [f for f in failures.values() if not _stopped(f)] or list(failures.values())
    return max(_exit_code(_code(f)) for f in causes) or 1


def run(nproc: int, script: str, args: Sequence[str], timeout: float | None = None) -> int:
    """Runs ``script`` as ``nproc`` ranks; returns the worst rank's exit code."""
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    if nproc < 1:
        print(f"tessera run: -n must be at least 1, found {nproc}", file=sys.stderr)
        return 2
    if not os.path.isfile(script):
        print(f"tessera run: no such script: {script}", file=sys.stderr)
        return 2
    if timeout is not None:
        os.environ["TESSERA_TIMEOUT"] = str(timeout)
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # torchrun's default, without its banner
    argv = [
        "--nnodes=1",
        f"--nproc-per-node={nproc}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{_free_port()}",
        f"--rdzv-id={uuid.uuid4()}",
        "--max-restarts=0",
        "--monitor-interval=0.1",
        "-m",
        "tessera.tools.worker",
        script,
        *args,
    ]
    try:
        torchrun.run(torchrun.parse_args(argv))
    except ChildFailedError as error:
        print(f"tessera run: {script} failed: {_report(error.failures, nproc)}", file=sys.stderr)
        return _worst(error.failures)
    except KeyboardInterrupt:
        return 130
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "run":
        script_args = list(args.args)
        if script_args[:1] == ["--"]:
            script_args = script_args[1:]
        return run(args.nproc, args.script, script_args, args.timeout)
    return 2


if __name__ == "__main__":
    sys.exit(main())
