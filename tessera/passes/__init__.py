"""Tessera's passes, registered lazily by flag (the flag is the pass's ``name``).

Each pass lives in ``tessera/passes/<flag with underscores>.py``; importing a pass
module happens only when its flag is asked for.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import importlib.util
import re
from collections.abc import Callable
from pathlib import Path

from xdsl.passes import ModulePass

# flag -> (module, class name)
_PASSES: dict[str, tuple[str, str]] = {
    "autodiff": ("tessera.passes.autodiff", "AutodiffPass"),
    "canonicalize": ("tessera.passes.canonicalize", "CanonicalizePass"),
    "cse": ("tessera.passes.cse", "CSEPass"),
    "dce": ("tessera.passes.dce", "DCEPass"),
    "shard-propagate": ("tessera.passes.shard_propagate", "ShardPropagatePass"),
    "insert-collectives": ("tessera.passes.insert_collectives", "InsertCollectivesPass"),
    "shard-partition": ("tessera.passes.shard_partition", "ShardPartitionPass"),
    "unzigzag-attention": ("tessera.passes.unzigzag_attention", "UnzigzagAttentionPass"),
    "lower-graph-to-schedule": (
        "tessera.passes.lower_graph_to_schedule",
        "LowerGraphToSchedulePass",
    ),
    "overlap-comm": ("tessera.passes.overlap_comm", "OverlapCommPass"),
    "choose-collective-algorithms": (
        "tessera.passes.choose_collective_algorithms",
        "ChooseCollectiveAlgorithmsPass",
    ),
    "collective-matmul": ("tessera.passes.collective_matmul", "CollectiveMatmulPass"),
    "hoist-all-gathers": ("tessera.passes.hoist_all_gathers", "HoistAllGathersPass"),
    "bucket-gradients": ("tessera.passes.bucket_gradients", "BucketGradientsPass"),
    "plan-memory": ("tessera.passes.plan_memory", "PlanMemoryPass"),
    "lower-schedule-to-tile": ("tessera.passes.lower_schedule_to_tile", "LowerScheduleToTilePass"),
    "pipeline-schedule": ("tessera.passes.pipeline_schedule", "PipelineSchedulePass"),
}


def get_all_passes() -> dict[str, Callable[[], type[ModulePass]]]:
    """Factories of every Tessera pass, keyed by flag."""

    def factory(module: str, cls: str) -> Callable[[], type[ModulePass]]:
        return lambda: getattr(importlib.import_module(module), cls)

    return {flag: factory(module, cls) for flag, (module, cls) in _PASSES.items()}


def pass_summaries() -> dict[str, str]:
    """The first line of each pass class's (or module's) docstring, by flag, for ``--help``."""
    return {flag: _summary(flag, module, cls) for flag, (module, cls) in _PASSES.items()}


def pass_options() -> dict[str, list[str]]:
    """Each pass's options as ``name: type = default`` (``-p 'flag{name=value}'``), by
    flag. This imports every pass (for ``--help``); a pass that fails to import shows
    none."""
    options: dict[str, list[str]] = {}
    for flag, factory in get_all_passes().items():
        try:
            fields = dataclasses.fields(factory())
        except Exception:
            fields = ()
        options[flag] = [f"{f.name}: {_type_name(f.type)} = {f.default!r}" for f in fields]
    return options


def _type_name(annotation: object) -> str:
    if isinstance(annotation, str):
        return annotation
    return getattr(annotation, "__name__", str(annotation))


def _summary(flag: str, module: str, cls: str) -> str:
    """Read from the source, so that ``--help`` imports no pass (and survives a broken one).
    The class docstring's first paragraph, unless it describes an option (````name``: ...``,
    a name other than the flag): then the module's."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        return ""
    try:
        tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
    except (OSError, SyntaxError):
        return ""
    classes = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls]
    for doc in ((ast.get_docstring(classes[0]) if classes else None), ast.get_docstring(tree)):
        first_paragraph = " ".join((doc or "").split("\n\n")[0].split())
        named = re.match(r"^``([\w-]+)``:\s*", first_paragraph)
        if named and named.group(1) != flag:
            continue  # an option's description, not the pass's
        summary = (
            first_paragraph[named.end() :] if named else first_paragraph
        )  # the flag, said again
        if summary:
            return summary[:1].upper() + summary[1:]
    return ""
