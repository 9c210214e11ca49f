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

``--max-restarts N`` is torch elastic's: after a failure the agent stops every rank,
runs a new rendezvous round and starts them all again, up to N times; a training script
that checkpoints with ``--save DIR`` resumes from the newest complete checkpoint there.
Each restart prints one line naming the failure (the same summary as above) and the
restart count; after N restarts the last failure is reported as above, saying so.
``--nnodes MIN:MAX`` and the ``--rdzv-*`` options are passed to torchrun (an elastic
job over several machines); without ``--rdzv-endpoint`` the rendezvous is on 127.0.0.1.
SIGTERM (a scheduler preempting the job) goes on to every rank, which have 30 s to save
(:mod:`tessera.training.preemption`) before torchrun SIGKILLs them.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

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
    run.add_argument(
        "--max-restarts",
        type=int,
        default=0,
        help="restart every rank after a failure, up to this many times (torch elastic)",
    )
    run.add_argument("--nnodes", default="1", help="machines, N or MIN:MAX (torchrun's)")
    run.add_argument("--node-rank", type=int, default=None, help="this machine's rank (torchrun's)")
    run.add_argument("--rdzv-backend", default="c10d", help="rendezvous backend (torchrun's)")
    run.add_argument(
        "--rdzv-endpoint",
        default=None,
        help="rendezvous HOST:PORT (default 127.0.0.1, a free port)",
    )
    run.add_argument("--rdzv-id", default=None, help="the job's rendezvous id (default: random)")
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


@contextlib.contextmanager
def _announcing_restarts(script: str, max_restarts: int) -> Iterator[list[int]]:
    """While torchrun runs: before each restart, prints the failure and the count. (The
    agent only logs "attempts left"; the failed run's result is seen by wrapping its
    ``_monitor_workers``, the restart by wrapping ``_restart_workers``.) Yields a list
    holding the number of restarts made."""
    from torch.distributed.elastic.agent.server.api import WorkerState
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    restarts: list[int] = [0]
    last: list[Any] = [None]
    monitor, restart = LocalElasticAgent._monitor_workers, LocalElasticAgent._restart_workers

    def monitored(agent: Any, group: Any) -> Any:
        result = monitor(agent, group)
        last[0] = result if result.state in (WorkerState.FAILED, WorkerState.UNHEALTHY) else None
        return result

    def restarting(agent: Any, group: Any) -> None:
        if last[0] is not None:
            restarts[0] += 1
            summary = Report(last[0].failures).summary() if last[0].failures else "unhealthy"
            print(
                f"tessera run: {script} failed: {summary}; restarting every rank "
                f"(restart {restarts[0]} of {max_restarts})",
                file=sys.stderr,
                flush=True,
            )
            last[0] = None
            _end_survivors(agent)
        restart(agent, group)

    LocalElasticAgent._monitor_workers = monitored  # type: ignore[method-assign]
    LocalElasticAgent._restart_workers = restarting  # type: ignore[method-assign]
    try:
        yield restarts
    finally:
        LocalElasticAgent._monitor_workers = monitor  # type: ignore[method-assign]
        LocalElasticAgent._restart_workers = restart  # type: ignore[method-assign]


SURVIVOR_GRACE_S = 3.0  # before a restart, the ranks still running get this long to end


def _end_survivors(agent: Any) -> None:
    """Before a restart: the ranks still running (most end within a second of a peer's
    failure, through the liveness channel) get :data:`SURVIVOR_GRACE_S` seconds to record
    how they ended, then SIGKILL. A failed job has nothing left to save, and torchrun's own
    stop (SIGTERM, then SIGKILL 30 s later) would wait for a hung rank, or for one whose
    SIGTERM handler waits for a step boundary (:mod:`tessera.training.preemption`)."""
    handlers = getattr(getattr(agent, "_pcontext", None), "subprocess_handlers", None) or {}
    processes = [h.proc for h in handlers.values()]
    deadline = time.monotonic() + SURVIVOR_GRACE_S
    for process in processes:
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                process.kill()


def run(
    nproc: int,
    script: str,
    args: Sequence[str],
    timeout: float | None = None,
    *,
    max_restarts: int = 0,
    nnodes: str = "1",
    node_rank: int | None = None,
    rdzv_backend: str = "c10d",
    rdzv_endpoint: str | None = None,
    rdzv_id: str | None = None,
) -> int:
    """Runs ``script`` as ``nproc`` ranks (restarting them all after a failure, up to
    ``max_restarts`` times); returns the worst rank's exit code."""
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    if nproc < 1:
        print(f"tessera run: -n must be at least 1, found {nproc}", file=sys.stderr)
        return 2
    if max_restarts < 0:
        print(
            f"tessera run: --max-restarts must be at least 0, found {max_restarts}", file=sys.stderr
        )
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
        f"--nnodes={nnodes}",
        f"--nproc-per-node={nproc}",
        f"--rdzv-backend={rdzv_backend}",
        f"--rdzv-endpoint={rdzv_endpoint or f'127.0.0.1:{_free_port()}'}",
        f"--rdzv-id={rdzv_id or uuid.uuid4()}",
        f"--max-restarts={max_restarts}",
        "--monitor-interval=0.1",
        *([f"--node-rank={node_rank}"] if node_rank is not None else []),
        "-m",
        "tessera.tools.worker",
        script,
        *args,
    ]
    try:
        with _announcing_restarts(script, max_restarts) as restarts:
            torchrun.run(torchrun.parse_args(argv))
    except ChildFailedError as error:
        report = Report(error.failures)
        for ranks, trace in report.tracebacks():
            print(f"tessera run: {ranks_text(ranks)}'s error:\n{trace}", file=sys.stderr)
        after = (
            f" after {restarts[0]} restart{'' if restarts[0] == 1 else 's'} (--max-restarts {max_restarts})"
            if max_restarts
            else ""
        )
        print(f"tessera run: {script} failed{after}: {report.summary()}", file=sys.stderr)
        return report.exit_code()
    except SignalException as stop:
        print(
            f"tessera run: {script} stopped by {stop.sigval.name}: every rank was sent "
            f"{stop.sigval.name} and had 30 s to save and exit",
            file=sys.stderr,
        )
        return 128 + int(stop.sigval)
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
        return run(
            args.nproc,
            args.script,
            script_args,
            args.timeout,
            max_restarts=args.max_restarts,
            nnodes=args.nnodes,
            node_rank=args.node_rank,
            rdzv_backend=args.rdzv_backend,
            rdzv_endpoint=args.rdzv_endpoint,
            rdzv_id=args.rdzv_id,
        )
    return 2


if __name__ == "__main__":
    sys.exit(main())
