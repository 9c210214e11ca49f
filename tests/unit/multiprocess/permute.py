"""Run under ``tessera run -n 4``: collective permutes, one process per rank over gloo,
each rank checking its results against an independent numpy model and the virtual
mesh, then printing ``rank R OK``: permutes over tp and over (dp, tp) of a 2 x 2 mesh
and over tp of a 1-D tp=4 mesh: shifts, a swap next to ranks that keep their own value,
a single pair (the others receive zeros).
"""

from __future__ import annotations

import os

import numpy as np
import torch
from xdsl.context import Context
from xdsl.dialects.builtin import Builtin
from xdsl.dialects.func import Func
from xdsl.parser import Parser

from tessera import dist
from tessera.backends.distributed import run_rank
from tessera.backends.virtual import run_partitioned
from tessera.ir.graph import Graph
from tessera.passes.lower_graph_to_schedule import LowerGraphToSchedulePass

RANK, WORLD = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])

PERMUTES = """
graph.mesh @mesh axes = [{axes}]
func.func @f(%x: tensor<3x4xf32>) -> (tensor<3x4xf32>, tensor<3x4xf32>, tensor<3x4xf32>) attributes {{graph.partitioned}} {{
  %a = graph.collective_permute %x {{axes = [{group}], pairs = {shift}}} : tensor<3x4xf32>
  %b = graph.collective_permute %x {{axes = [{group}], pairs = {swap}}} : tensor<3x4xf32>
  %c = graph.collective_permute %a {{axes = [{group}], pairs = {single}}} : tensor<3x4xf32>
  func.return %a, %b, %c : tensor<3x4xf32>, tensor<3x4xf32>, tensor<3x4xf32>
}}
"""


def patterns(n: int) -> dict[str, list[list[int]]]:
    return {
        "shift": [[p, (p + 1) % n] for p in range(n)],
        "swap": [[0, n - 1], [n - 1, 0], *([[p, p] for p in range(1, n - 1)])],
        "single": [[n - 1, 0]],
    }


def numpy_permute(pairs: list[list[int]], group: list[int], values: list[np.ndarray]) -> dict[int, np.ndarray]:
    out = {rank: np.zeros_like(values[rank]) for rank in group}
    for source, target in pairs:
        out[group[target]] = values[group[source]]
    return out


def check_permutes(axes: dict[str, int], group_axes: tuple[str, ...]) -> None:
    mesh = dist.Mesh(axes=list(axes), shape=tuple(axes.values()))
    groups = mesh.groups(group_axes)
    n = len(groups[0])
    pairs = patterns(n)
    text = PERMUTES.format(
        axes=", ".join(f"{a} = {s}" for a, s in axes.items()), group=", ".join(group_axes), **pairs
    )
    context = Context()
    for dialect in (Builtin, Func, Graph):
        context.load_dialect(dialect)
    module = Parser(context, text).parse_module()
    g = torch.Generator().manual_seed(5)
    rank_args = [[torch.randn(3, 4, generator=g)] for _ in range(WORLD)]
    oracle = run_partitioned(module, "f", mesh, rank_args)[RANK]
    scheduled = module.clone()
    LowerGraphToSchedulePass().apply(context, scheduled)
    got, run = run_rank(scheduled, "f", mesh, rank_args[RANK])
    values = [a[0].numpy() for a in rank_args]
    (group,) = [g for g in groups if RANK in g]
    shifted = numpy_permute(pairs["shift"], group, values)
    expected = [
        shifted[RANK],
        numpy_permute(pairs["swap"], group, values)[RANK],
        numpy_permute(pairs["single"], group, [shifted.get(r, v) for r, v in enumerate(values)])[RANK],
    ]
    for index, (a, b, want) in enumerate(zip(got, oracle, expected, strict=True)):
        np.testing.assert_array_equal(a.numpy(), want, err_msg=f"result {index}")
        np.testing.assert_array_equal(b.numpy(), want, err_msg=f"virtual result {index}")
    assert [c.kind for c in run.collectives] == ["collective_permute"] * 3, run.collectives
    print(f"rank {RANK}: collective permutes over {list(group_axes)} of {mesh} match numpy", flush=True)


def main() -> None:
    if WORLD != 4:
        raise SystemExit(f"run with 4 ranks, not {WORLD}")
    check_permutes({"dp": 2, "tp": 2}, ("tp",))
    check_permutes({"dp": 2, "tp": 2}, ("dp", "tp"))
    check_permutes({"tp": 4}, ("tp",))
    print(f"rank {RANK} OK", flush=True)


if __name__ == "__main__":
    main()
