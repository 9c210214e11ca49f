"""Parsing and verifying a model-size module: what each verification check costs.

For each layer count, the GPT-like training step of ``compile_time.py`` is compiled
through every stage (``tessera.driver.STAGES``); each stage's text is parsed as
``tessera-opt`` parses it, then verified: xDSL's op verifiers (``module.verify()``) and
Tessera's module-wide checks (``tessera.ir.verifier``: dominance, sizes, shardings),
each timed alone (the least CPU time of ``--repeat`` runs). The compile driver verifies every stage this way, so the
checks' sum over the stages is what they add to a compile. Every check should grow
linearly with the layer count and cost a small fraction of parsing.

    python benchmarks/verify_time.py --layers 8 32 --write /tmp/verify-ir
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import comm_volume
import compile_time

from tessera import driver
from tessera.ir.dominance import check_dominance
from tessera.ir.limits import check_sizes
from tessera.ir.sharding_verifier import check_shardings
from tessera.tools.opt import TesseraOptMain

STAGES = tuple(driver.STAGES[1:])  # graph, sharded, partitioned, schedule, tile


def stage_texts(layers: int, dims: tuple[int, int, int, int]) -> dict[str, str]:
    """Each stage's text of the training step with ``layers`` layers."""
    batch, seq, dim, heads = dims
    shapes = comm_volume.layer_params(dim, layers, materialize=False)
    params = {k: torch.empty(v.shape) for k, v in shapes.items()}
    program = compile_time._program(layers, heads, forward=False)
    lowered = program.lower(program.init(params), torch.empty(batch, seq, dim))
    return {stage: lowered.as_text(stage) for stage in STAGES}


def best(repeat: int, run: Callable[[], object]) -> float:
    """The least CPU time of ``repeat`` runs (CPU time: other processes on a shared
    machine do not count)."""
    times = []
    for _ in range(repeat):
        began = time.process_time()
        run()
        times.append(time.process_time() - began)
    return min(times)


def measure(text: str, repeat: int) -> dict[str, float]:
    """Seconds to parse ``text`` and to run each check on the module."""
    opt = TesseraOptMain(args=["-"])  # its context has Tessera's dialects registered
    module = opt.parse_chunk(_Chunk(text), "mlir")
    assert module is not None
    return {
        "ops": sum(1 for _ in module.walk()),
        "parse s": best(repeat, lambda: opt.parse_chunk(_Chunk(text), "mlir")),
        "op verifiers s": best(repeat, module.verify),
        "dominance s": best(repeat, lambda: check_dominance(module)),
        "sizes s": best(repeat, lambda: check_sizes(module)),
        "shardings s": best(repeat, lambda: check_shardings(module)),
    }


class _Chunk:
    """What ``parse_chunk`` reads: bytes from ``read()``."""

    def __init__(self, text: str) -> None:
        self.data = text.encode()

    def read(self) -> bytes:
        return self.data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--repeat", type=int, default=3, help="best of this many runs")
    parser.add_argument("--write", type=Path, help="also write each stage's text here")
    parser.add_argument(
        "--dims", type=int, nargs=4, default=[4, 64, 256, 4], metavar=("B", "T", "C", "HEADS")
    )
    args = parser.parse_args()
    os.environ["TESSERA_PROGRAM_CACHE"] = "0"
    columns = ["ops", "parse s", "op verifiers s", "dominance s", "sizes s", "shardings s"]
    print("| layers | stage | " + " | ".join(columns) + " | checks / parse |")
    print("|---:|---|" + "---:|" * (len(columns) + 1))
    for layers in args.layers:
        for stage, text in stage_texts(layers, tuple(args.dims)).items():
            if args.write is not None:
                args.write.mkdir(parents=True, exist_ok=True)
                (args.write / f"{stage}-{layers}.mlir").write_text(text)
            row = measure(text, args.repeat)
            checks = row["dominance s"] + row["sizes s"] + row["shardings s"]
            cells = [f"{row[c]:.0f}" if c == "ops" else f"{row[c]:.3f}" for c in columns]
            print(
                f"| {layers} | {stage} | "
                + " | ".join(cells)
                + f" | {checks / row['parse s']:.1%} |"
            )


if __name__ == "__main__":
    main()
