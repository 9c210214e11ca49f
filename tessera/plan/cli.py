"""``tessera plan recommend | validate | launch``: choose, check and launch a strategy.

    tessera plan recommend --model llama3-70b --gpus 64 --cluster dgx_h100 --seq 8192 --global-batch 1024
    tessera plan validate  --model llama3-70b --gpus 64 --cluster dgx_h100 --tp 3 --pp 4 --dp 5
    tessera plan launch    --model llama3-70b --gpus 64 --cluster dgx_h100 --tp 8 --pp 2 --dp 4 train.py

``validate`` exits 1 when the configuration is invalid (one line per violation), 2 on a
usage error; ``--json`` prints machine-readable output instead of tables.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from tessera.errors import TesseraError
from tessera.plan.estimate import Estimate
from tessera.plan.launch import slurm_script, torchrun_multi, torchrun_single, unsupported
from tessera.plan.models import PRESETS, ModelSpec, load_model
from tessera.plan.strategy import (
    CLUSTERS,
    PRECISIONS,
    REMAT,
    SCHEDULES,
    Strategy,
    cluster_topology,
)

EP_NOTE = "expert parallelism is priced analytically (all-to-all cost model); MoE layers are compiled as their active dense MLP"


def default_jobs() -> int:
    """The CPUs this process may run on (its affinity), at most 8."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    return max(1, min(8, cpus))


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="tessera plan", description=__doc__.splitlines()[0])
    commands = top.add_subparsers(dest="command", required=True)
    for name, text in (
        ("recommend", "rank strategies by simulated step time"),
        ("validate", "check one strategy; exit 1 with a message per violation"),
        ("launch", "print torchrun commands and a SLURM script for a strategy"),
    ):
        sub = commands.add_parser(name, help=text, description=text)
        sub.add_argument("--model", required=True,
                         help=f"a preset ({', '.join(PRESETS)}), 'key=value,...', a JSON file of those fields or a Hugging Face config.json")  # fmt: skip
        sub.add_argument("--gpus", type=int, required=True)
        sub.add_argument("--cluster", default="dgx_h100", choices=CLUSTERS)
        sub.add_argument("--seq", type=int, help="sequence length (default: the model's)")
        sub.add_argument("--global-batch", type=int, default=1024, help="sequences per step")
        sub.add_argument("--json", action="store_true", help="JSON instead of tables")
        fixed = name != "recommend"
        for axis in ("dp", "tp", "pp", "cp", "ep"):
            sub.add_argument(
                f"--{axis}", type=int, default=None if not fixed or axis == "dp" else 1
            )
        sub.add_argument("--zero", type=int, default=None if not fixed else 1)
        sub.add_argument("--micro-batch", type=int, default=None if not fixed else 1)
        sub.add_argument("--schedule", choices=SCHEDULES, default=None if not fixed else "1f1b")
        sub.add_argument("--virtual", type=int, default=None if not fixed else 1)
        sub.add_argument("--remat", choices=REMAT, default=None if not fixed else "none")
        sub.add_argument("--precision", choices=PRECISIONS, default=None if not fixed else "bf16")
        sub.add_argument("--no-sp", action="store_true", help="no sequence parallelism")
        if name == "recommend":
            sub.add_argument("--top", type=int, default=10)
            sub.add_argument("--price", type=float, default=2.5, help="USD per GPU-hour")
            sub.add_argument(
                "--pareto-gpus",
                type=int,
                nargs="*",
                default=None,
                help="GPU counts besides --gpus for the Pareto front of GPUs x "
                "step time x cost (default: half and twice --gpus)",
            )
            sub.add_argument("--no-pareto", action="store_true",
                             help="search --gpus only (no Pareto front over GPU counts)")  # fmt: skip
            sub.add_argument("--dry-run", action="store_true",
                             help="compile the best plan at reduced width; run one step")  # fmt: skip
            sub.add_argument(
                "--jobs", type=int, default=default_jobs(),
                help="processes compiling layer programs in parallel (default: the CPUs "
                "this process may use, at most 8)",
            )  # fmt: skip
        if name == "launch":
            sub.add_argument("script")
            sub.add_argument("script_args", nargs=argparse.REMAINDER)
    return top


def _fixed(args: argparse.Namespace) -> dict[str, Any]:
    names = ("dp", "tp", "pp", "cp", "ep", "zero", "micro_batch", "schedule", "virtual",
             "remat", "precision")  # fmt: skip
    fix = {n: getattr(args, n) for n in names if getattr(args, n) is not None}
    if args.no_sp:
        fix["sp"] = False
    return fix


def _strategy(args: argparse.Namespace) -> Strategy:
    fix = _fixed(args)
    if "dp" not in fix:
        rest = fix["tp"] * fix["pp"] * fix["cp"]
        fix["dp"] = (
            args.gpus // rest
            if rest and args.gpus % rest == 0
            else max(1, args.gpus // max(1, rest))
        )
    return Strategy(**fix)


def table(rows: list[Estimate], price: float) -> str:
    head = ("rank", "strategy", "step s", "MFU", "tokens/s", "bubble", "exposed comm s",
            "memory GB", "$/step")  # fmt: skip
    lines = [head]
    for i, e in enumerate(rows, 1):
        cost = e.strategy.gpus * e.step_s / 3600 * price
        lines.append((str(i), e.strategy.label(), f"{e.step_s:.3f}", f"{e.mfu:.1%}",
                      f"{e.tokens_per_s:,.0f}", f"{e.bubble:.1%}", f"{e.exposed_comm_s:.3f}",
                      f"{e.memory.total / 1e9:.1f}", f"{cost:.3f}"))  # fmt: skip
    widths = [max(len(r[c]) for r in lines) for c in range(len(head))]

    def line(row: tuple[str, ...]) -> str:
        cells = zip(row, widths, strict=True)
        return "  ".join(c.ljust(w) if i == 1 else c.rjust(w) for i, (c, w) in enumerate(cells))

    return "\n".join(line(row) for row in lines)


def _recommend(args: argparse.Namespace, model: ModelSpec, seq: int) -> int:
    from tessera.plan.search import search

    fix = _fixed(args)
    front = []
    best_result = None
    others = args.pareto_gpus
    if others is None:
        others = [g for g in (args.gpus // 2, 2 * args.gpus) if g >= 1 and g != args.gpus]
    if args.no_pareto:
        others = []
    for gpus in [args.gpus, *dict.fromkeys(g for g in others if g != args.gpus)]:
        topology = cluster_topology(args.cluster, gpus)
        result = search(model, topology, gpus, args.global_batch, seq, fix=fix, jobs=args.jobs)
        if gpus == args.gpus:
            best_result = result
        if result.best:
            front.append(result.best)
    assert best_result is not None
    front = _pareto(front, args.price)
    dry = None
    if args.dry_run and best_result.best:
        from tessera.plan.dryrun import dry_run

        dry = dry_run(model, best_result.best.strategy)
    notes = [n for n in (model.note, EP_NOTE if model.is_moe else "") if n]
    if args.json:
        print(json.dumps({
            "model": model.name, "cluster": args.cluster, "gpus": args.gpus, "seq": seq,
            "global_batch": args.global_batch,
            "ranked": [e.to_dict() for e in best_result.ranked[: args.top]],
            "pareto": [{"gpus": e.strategy.gpus, "step_s": e.step_s,
                        "usd_per_step": e.strategy.gpus * e.step_s / 3600 * args.price,
                        "label": e.strategy.label()} for e in front],
            "dropped": dict(best_result.dropped), "candidates": best_result.candidates,
            "compiled_programs": best_result.compiled_programs,
            "search_seconds": best_result.seconds, "notes": notes,
            "dry_run": None if dry is None else {"loss": dry.loss, "strategy": dry.strategy.to_dict()},
        }, indent=2))  # fmt: skip
        return 0 if best_result.best else 1
    print(model.describe())
    print(f"{args.gpus} GPUs of {args.cluster}, sequence {seq}, global batch {args.global_batch}")
    print(f"{best_result.candidates} candidates, {len(best_result.ranked)} feasible, "
          f"{best_result.compiled_programs} layer programs compiled, "
          f"{best_result.seconds:.1f} s")  # fmt: skip
    if not best_result.ranked:
        print("no feasible strategy", file=sys.stderr)
    else:
        print(table(best_result.ranked[: args.top], args.price))
    if best_result.dropped:
        print("dropped:")
        for reason, count in best_result.dropped.most_common():
            print(f"  {count:6d}  {reason}")
    if front and others:
        counts = ", ".join(str(g) for g in [args.gpus, *others])
        print(f"Pareto front over {counts} GPUs (step time x cost; each count's best plan):")
        print(table(front, args.price))
    for note in notes:
        print(f"note: {note}")
    if dry is not None:
        print(f"dry run: {dry.strategy.label()} at hidden {dry.hidden}, {dry.layers} layers, "
              f"one step on the virtual mesh: loss {dry.loss:.4f}")  # fmt: skip
    return 0 if best_result.best else 1


def _pareto(points: list[Estimate], price: float) -> list[Estimate]:
    """Points no other beats in both step time and cost per step."""

    def cost(e: Estimate) -> float:
        return e.strategy.gpus * e.step_s * price

    return sorted(
        (p for p in points if not any(
            (q.step_s <= p.step_s and cost(q) <= cost(p)) and (q.step_s < p.step_s or cost(q) < cost(p))
            for q in points)),
        key=lambda e: e.strategy.gpus,
    )  # fmt: skip


def _validate(args: argparse.Namespace, model: ModelSpec, seq: int) -> int:
    from tessera.plan.validate import validate

    s = _strategy(args)
    topology = cluster_topology(args.cluster, max(args.gpus, s.gpus))
    problems, result = validate(model, s, topology, args.gpus, args.global_batch, seq)
    if args.json:
        print(json.dumps({"valid": not problems, "violations": problems,
                          "estimate": result.to_dict() if result else None}, indent=2))  # fmt: skip
    elif problems:
        for problem in problems:
            print(f"invalid: {problem}", file=sys.stderr)
    else:
        assert result is not None
        print(f"valid: {s.label()} on {args.gpus} GPUs of {args.cluster}")
        print(table([result], 2.5))
    return 1 if problems else 0


def _launch(args: argparse.Namespace, model: ModelSpec, seq: int) -> int:
    from tessera.plan.validate import structural_violations

    s = _strategy(args)
    problems = structural_violations(model, s, args.gpus, args.global_batch, seq)
    if problems:
        for problem in problems:
            print(f"invalid: {problem}", file=sys.stderr)
        return 1
    extra = list(args.script_args)
    batch = args.global_batch
    single = torchrun_single(s, args.cluster, args.script, extra, batch) if s.gpus <= 8 else None
    multi = torchrun_multi(s, args.cluster, args.script, extra, batch)
    slurm = slurm_script(s, args.cluster, args.script, extra, job=f"{model.name}-train",
                         global_batch=batch)  # fmt: skip
    notes = unsupported(s)
    if args.json:
        print(json.dumps({"strategy": s.to_dict(), "torchrun_single_node": single,
                          "torchrun_multi_node": multi, "slurm": slurm, "notes": notes},
                         indent=2))  # fmt: skip
        return 0
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    print(f"# plan: {s.label()}")
    if single:
        print("# single node:")
        print(single)
    print("# multi-node (run on every node, NODE_RANK and MASTER_ADDR set):")
    print(multi)
    print("# SLURM batch script:")
    print(slurm, end="")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        model = load_model(args.model)
        seq = args.seq or model.seq
        if args.command == "recommend":
            return _recommend(args, model, seq)
        if args.command == "validate":
            return _validate(args, model, seq)
        return _launch(args, model, seq)
    except TesseraError as error:
        print(f"tessera plan: {error}", file=sys.stderr)
        return 2
