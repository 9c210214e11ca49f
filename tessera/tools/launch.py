"""``tessera run -n N script.py [args...]``: run a script as N ranks on this machine.

A thin wrapper over ``torch.distributed.run`` (torchrun): a standalone rendezvous on
127.0.0.1 at a free port, one process per rank, each running ``script.py`` under
:mod:`tessera.tools.worker` (which records a failing rank's error and traceback for the
report instead of printing them). If a rank raises or dies, torchrun stops the others;
``tessera run`` then prints one traceback (the lowest root-cause rank's), names the failed
rank(s) in one line (ranks that failed with the same error together) and exits with the
worst rank's exit code (128 + signal for a killed rank). Plain ``torchrun
--nproc-per-node N script.py`` works too (every rank then prints its own traceback).
"""

from __future__ import annotations

import argparse
import logging
import math
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
        type=_seconds,
        default=None,
        help="seconds a rank waits for the others in a collective before failing "
        "(sets TESSERA_TIMEOUT; default 60)",
    )
    run.add_argument("script", help="the Python script every rank runs")
    run.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")
    return parser


def _seconds(text: str) -> float:
    """``--timeout``'s value: a positive, finite number of seconds."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(
            f"expected a positive, finite number of seconds, found {text!r}"
        )
    return value


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


def _ranks(ranks: Sequence[int]) -> str:
    """``rank 3``, ``ranks 0-7`` (consecutive) or ``ranks 0, 2, 5``."""
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if list(ranks) == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return "ranks " + ", ".join(str(r) for r in ranks)


def _describe(ranks: Sequence[int], failure: object) -> str:
    """How ``ranks`` (which failed the same way as ``failure``) failed."""
    who, code, detail = _ranks(ranks), _code(failure), _message(failure)
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        verb = "was" if len(ranks) == 1 else "were"
        return f"{who} {verb} killed by {name} (exit code {_exit_code(code)})"
    if not detail:
        return f"{who} exited with code {code}"
    return f"{who} failed with exit code {code}: {detail}"


def _traceback(failure: object) -> str:
    """The traceback a rank recorded, or ""."""
    message = getattr(failure, "message", "")
    if not isinstance(message, dict):
        return ""
    extra = message.get("extraInfo")
    return str(extra.get("py_callstack", "")).rstrip() if isinstance(extra, dict) else ""


def _stopped(failure: object) -> bool:
    """Whether torchrun stopped this rank (SIGTERM) because another one failed."""
    return _code(failure) == -signal.SIGTERM


def _consequence(failure: object) -> bool:
    """Whether the rank failed because another one did (a Tessera collective error)."""
    message = getattr(failure, "message", "")
    message = message.get("message", "") if isinstance(message, dict) else str(message)
    return "another rank failed" in message


def _causes(failures: dict[int, object]) -> dict[int, object]:
    """The failed ranks torchrun did not stop, root causes first: ranks that failed on
    their own, then ranks whose collectives failed because of them."""
    ordered = sorted(failures.items(), key=lambda item: (_consequence(item[1]), item[0]))
    return {r: f for r, f in ordered if not _stopped(f)} or dict(ordered)


def _report(failures: dict[int, object], nproc: int) -> str:
    """The failed ranks in one line, root causes first (ranks that failed the same way
    named together), then the ranks torchrun stopped."""
    causes = _causes(failures)
    stopped = [r for r in sorted(failures) if r not in causes]
    groups: dict[tuple[int, str], list[int]] = {}
    for rank, failure in causes.items():
        groups.setdefault((_code(failure), _message(failure)), []).append(rank)
    text = "; ".join(_describe(ranks, causes[ranks[0]]) for ranks in groups.values())
    if stopped:
        text += f"; {_ranks(stopped)} {'were' if len(stopped) > 1 else 'was'} stopped"
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
    # torchrun logs every rank it stops and every failure; the report below says it once
    logging.getLogger("torch.distributed.elastic.multiprocessing.api").setLevel(logging.CRITICAL)
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
        first = next(iter(_causes(error.failures).items()))
        trace = _traceback(first[1])
        if trace:
            print(f"tessera run: rank {first[0]}'s error:\n{trace}", file=sys.stderr)
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
