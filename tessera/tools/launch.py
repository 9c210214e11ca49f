"""``tessera run -n N script.py [args...]``: run a script as N ranks on this machine.

A thin wrapper over ``torch.distributed.run`` (torchrun): a standalone rendezvous on
127.0.0.1 at a free port, one process per rank, each running ``script.py`` under
:mod:`tessera.tools.worker` (which records how the rank ended instead of printing its
traceback). If a rank raises, exits, dies or hangs, the job ends (torchrun stops the
others when one fails; :mod:`tessera.backends.liveness` ends the others' collectives
when one exits early or hangs); ``tessera run`` then
prints each distinct traceback once and one line naming the rank that caused the failure
first (:mod:`tessera.tools.report`), and exits with the worst cause's exit code (128 +
signal for a killed rank). Plain ``torchrun --nproc-per-node N script.py`` works too
(every rank then prints its own traceback).
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import socket
import sys
import uuid
from collections.abc import Sequence

from tessera.tools.report import Report, ranks_text


def _version() -> str:
    """The installed distribution's version (``pyproject.toml``'s)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tessera")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tessera", description="Tessera command-line tools.")
    parser.add_argument("--version", action="version", version=f"tessera {_version()}")
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
    plan = commands.add_parser(
        "plan",
        help="recommend, validate and launch a parallelism strategy (tessera plan --help)",
        add_help=False,
    )
    plan.add_argument("args", nargs=argparse.REMAINDER)
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
        report = Report(error.failures)
        for ranks, trace in report.tracebacks():
            print(f"tessera run: {ranks_text(ranks)}'s error:\n{trace}", file=sys.stderr)
        print(f"tessera run: {script} failed: {report.summary()}", file=sys.stderr)
        return report.exit_code()
    except KeyboardInterrupt:
        return 130
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["plan"]:
        from tessera.plan.cli import main as plan_main

        return plan_main(argv[1:])
    args = _parser().parse_args(argv)
    if args.command == "run":
        script_args = list(args.args)
        if script_args[:1] == ["--"]:
            script_args = script_args[1:]
        return run(args.nproc, args.script, script_args, args.timeout)
    return 2


if __name__ == "__main__":
    sys.exit(main())
