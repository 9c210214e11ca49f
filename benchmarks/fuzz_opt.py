"""Fuzz ``tessera-opt`` with mutated lit inputs; print the verdict counts as a table.

    python benchmarks/fuzz_opt.py --inputs 5000 --seed 1 --findings /tmp/tessera-fuzz

Every traceback and hang is written to ``--findings`` (the first few per site) with the
command that reproduces it. See :mod:`tessera.tools.fuzz`.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from tessera.tools.fuzz import Report, fuzz, load_seeds

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--inputs", type=int, default=1000, help="how many inputs to run")
    parser.add_argument("--seed", type=int, default=0, help="random seed")
    parser.add_argument("--deadline", type=float, default=10.0, help="seconds per input")
    parser.add_argument("--findings", type=Path,
                        default=Path(tempfile.gettempdir()) / "tessera-fuzz-findings",
                        help="where to write the inputs that crash or hang")  # fmt: skip
    parser.add_argument("--corpus", type=Path, default=ROOT / "tests" / "lit",
                        help="the lit tests whose IR inputs are the seeds")  # fmt: skip
    args = parser.parse_args()

    seeds = load_seeds(args.corpus)
    print(f"{len(seeds)} seeds from {args.corpus}; {args.inputs} inputs, seed {args.seed}")

    def progress(report: Report) -> None:
        if report.inputs % 500 == 0:
            print(
                f"  {report.inputs} inputs, {report.seconds:.0f} s: {dict(report.kinds)}",
                flush=True,
            )

    report = fuzz(seeds, args.inputs, args.seed, args.deadline, args.findings, progress)
    print(report.table())
    if report.sites["traceback"] or report.sites["hang"]:
        print(f"\nInputs and outputs of the tracebacks and hangs: {args.findings}")
    return 1 if report.sites["traceback"] or report.sites["hang"] else 0


if __name__ == "__main__":
    sys.exit(main())
