"""The fuzzer's seeds: the IR inputs of the lit tests, each with the pass pipelines its
file's RUN lines apply to it.

A file run with ``--split-input-file`` gives one seed per ``// -----`` piece. Every seed
is also fuzzed without passes (parse and verify only): ``[]`` is always among its
``pipelines``.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

_RUN = re.compile(r"^\s*//\s*RUN:(.*)$", re.MULTILINE)


@dataclass(frozen=True)
class Seed:
    """One IR input of a lit file and the ``tessera-opt`` arguments to try it with."""

    source: str  # the lit file, relative to the corpus root
    text: str
    pipelines: tuple[tuple[str, ...], ...]  # tessera-opt arguments besides the input file


def load_seeds(root: Path) -> list[Seed]:
    """The seeds of every ``.mlir`` file under ``root`` (sorted by path)."""
    seeds: list[Seed] = []
    for path in sorted(root.rglob("*.mlir")):
        if "Output" in path.parts:  # lit's scratch files
            continue
        text = path.read_text(encoding="utf-8")
        runs = _RUN.findall(text)
        pipelines = tuple(dict.fromkeys([(), *(_pipeline(run) for run in runs)]))
        pieces = text.split("// -----") if any("--split-input-file" in r for r in runs) else [text]
        source = str(path.relative_to(root))
        seeds += [Seed(source, piece, pipelines) for piece in pieces if piece.strip()]
    return seeds


def _pipeline(run: str) -> tuple[str, ...]:
    """The pass and target arguments of the first ``tessera-opt`` of a RUN line."""
    command = run.split("|")[0]
    try:
        words = shlex.split(command)
    except ValueError:  # an unbalanced quote: not a command we can read
        return ()
    if "tessera-opt" not in words:
        return ()
    args: list[str] = []
    for flag, value in zip(words, [*words[1:], ""], strict=True):
        if flag in ("-p", "--passes", "-t", "--target") and value:
            args += [flag, value]
    return tuple(args)
