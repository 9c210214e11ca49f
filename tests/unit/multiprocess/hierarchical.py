"""Run under ``tessera run -n 4 hierarchical.py TOPOLOGY_JSON``: hierarchical collectives
over gloo, on a machine of 2 domains x 2 devices (the JSON file).

1. A row-parallel matmul on a tp=4 mesh lowered for that machine: the cost model marks
   its all_reduce ``hierarchical`` with ``domain = 2``; the result equals the flat
   all-reduce's (``collective_algorithms=False``) and the virtual mesh's.
2. Hand-written schedules of every hierarchical collective (all_reduce sum, mean, max,
   min on sizes that need padding; reduce_scatter; all_gather; all_to_all along both
   dims; on 1-D and 2-D meshes, in
   both axis orders so that domains are not always the consecutive ranks): each rank's
   result equals the virtual mesh's hierarchical and flat results (exactly for max, min,
   all_gather and integer-valued inputs; up to the order of additions for random ones).

Every rank prints ``rank R OK``.
"""

from __future__ import annotations

import os
import sys

import torch
from xdsl.context import Context
from xdsl.dialects.builtin import Builtin
from xdsl.dialects.func import Func
from xdsl.parser import Parser

import tessera as ts
from tessera import dist, op, schedule
from tessera.backends import distributed
from tessera.backends.distributed import run_rank
from tessera.backends.launch_plan import run_virtual
from tessera.ir import graph
from tessera.ir import schedule as schedule_ir

RANK, WORLD = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
EXACT = {"rtol": 0.0, "atol": 0.0}
CLOSE32 = {"rtol": 1e-5, "atol": 1e-5}  # only the order of additions differs
PHASED: list[str] = []  # the collectives issued as hierarchical phases over gloo


def _count_phased():
    issue = distributed._issue_hierarchical

    def counting(op, *args):
        PHASED.append(op.collective_name)
        return issue(op, *args)

    distributed._issue_hierarchical = counting


_count_phased()


def virtual(fn, *args):
    os.environ["TESSERA_BACKEND"] = "virtual"
    try:
        return fn(*args)
    finally:
        del os.environ["TESSERA_BACKEND"]


def check_jit(topology: str) -> None:
    mesh = dist.mesh({"tp": 4})
    cols = dist.ShardSpec(partition=(1,), mesh_axes=("tp",))
    rows = dist.ShardSpec(partition=(0,), mesh_axes=("tp",))
    g = torch.Generator().manual_seed(5)
    x, w = torch.randn(24, 40, generator=g), torch.randn(40, 9, generator=g)
    with schedule.options(topology=topology):
        f = ts.jit(op.matmul, mesh=mesh, in_shardings=(cols, rows))
        text = f.lower(x, w).as_text("schedule")
        assert "algorithm = hierarchical, domain = 2" in text, text
        PHASED.clear()
        hierarchical = f(x, w).full()
        assert PHASED == ["all_reduce"], PHASED
        oracle = virtual(f, x, w)
    with schedule.options(topology=topology, collective_algorithms=False):
        flat_f = ts.jit(op.matmul, mesh=mesh, in_shardings=(cols, rows))
        assert "algorithm" not in flat_f.lower(x, w).as_text("schedule")
        flat = flat_f(x, w).full()
    torch.testing.assert_close(hierarchical, flat, **CLOSE32)
    torch.testing.assert_close(hierarchical, oracle, **CLOSE32)
    torch.testing.assert_close(hierarchical, x @ w, **CLOSE32)
    print(f"rank {RANK}: jit all_reduce[tp] hierarchical matches flat and virtual", flush=True)


def start(name: str, collective: str, value: str, axes: str, props: str, t: str, r: str) -> str:
    return (
        f"  %{name}h = schedule.start {collective} %{value} {{axes = [{axes}]{props}, "
        f"algorithm = hierarchical, domain = 2}} : {t} -> !schedule.handle<{r}>\n"
        f"  %{name} = schedule.wait %{name}h : !schedule.handle<{r}> -> {r}\n"
    )


def program(mesh_axes: str, axes: str, dtype: str = "f32") -> str:
    """all_reduce (4 kinds, 5x7 and 3 elements: padded), reduce_scatter and all_gather over
    the 4 ranks, hierarchical with domains of 2."""
    a, v = f"tensor<5x7x{dtype}>", f"tensor<3x{dtype}>"
    m, s, big = f"tensor<4x8x{dtype}>", f"tensor<4x2x{dtype}>", f"tensor<16x8x{dtype}>"
    row, col = f"tensor<1x32x{dtype}>", f"tensor<16x2x{dtype}>"
    body = "".join(
        [
            start("s", "all_reduce", "x", axes, ", kind = sum", a, a),
            start("mn", "all_reduce", "x", axes, ", kind = mean", a, a),
            start("mx", "all_reduce", "x", axes, ", kind = max", a, a),
            start("mi", "all_reduce", "v", axes, ", kind = min", v, v),
            start("vs", "all_reduce", "v", axes, ", kind = sum", v, v),
            start("rs", "reduce_scatter", "m", axes, ", dim = 1, kind = sum", m, s),
            start("rm", "reduce_scatter", "m", axes, ", dim = 1, kind = mean", m, s),
            start("ag", "all_gather", "m", axes, ", dim = 0", m, big),
            start("aa", "all_to_all", "m", axes, ", split_dim = 0, concat_dim = 1", m, row),
            start("ab", "all_to_all", "m", axes, ", split_dim = 1, concat_dim = 0", m, col),
        ]
    )
    results = ["s", "mn", "mx", "mi", "vs", "rs", "rm", "ag", "aa", "ab"]
    types = [a, a, a, v, v, s, s, big, row, col]
    return (
        f"graph.mesh @mesh axes = [{mesh_axes}]\n"
        f"func.func @f(%x: {a}, %v: {v}, %m: {m}) -> ({', '.join(types)}) "
        f"attributes {{graph.partitioned}} {{\n{body}"
        f"  func.return {', '.join('%' + r for r in results)} : {', '.join(types)}\n}}\n"
    )


def flat_copy(module):
    copy = module.clone()
    for o in copy.walk():
        if isinstance(o, schedule_ir.StartOp):
            o.properties.pop("algorithm")
            o.properties.pop("domain")
    return copy


def check_schedules() -> None:
    context = Context()
    for dialect in (Builtin, Func, graph.Graph, schedule_ir.Schedule):
        context.load_dialect(dialect)
    cases = [
        ("tp = 4", "tp", dist.Mesh(axes=["tp"], shape=(4,))),
        ("dp = 2, tp = 2", "dp, tp", dist.Mesh(axes=["dp", "tp"], shape=(2, 2))),
        ("dp = 2, tp = 2", "tp, dp", dist.Mesh(axes=["dp", "tp"], shape=(2, 2))),  # [0, 2, 1, 3]
    ]
    for integers in (False, True):
        for mesh_axes, axes, mesh in cases:
            module = Parser(context, program(mesh_axes, axes)).parse_module()
            module.verify()
            g = torch.Generator().manual_seed(11)
            shapes = ((5, 7), (3,), (4, 8))
            rank_args = [
                [
                    torch.randint(-64, 64, s, generator=g).float()
                    if integers
                    else torch.randn(s, generator=g)
                    for s in shapes
                ]
                for _ in range(WORLD)
            ]
            hierarchical = run_virtual(module, "f", mesh, rank_args)[RANK]
            flat = run_virtual(flat_copy(module), "f", mesh, rank_args)[RANK]
            PHASED.clear()
            got, record = run_rank(module, "f", mesh, rank_args[RANK])
            assert PHASED == (
                ["all_reduce"] * 5 + ["reduce_scatter"] * 2 + ["all_gather"] + ["all_to_all"] * 2
            ), PHASED
            assert len(record.collectives) == 10, record.collectives
            names = ["sum", "mean", "max", "min", "sum(3)", "rs sum", "rs mean", "all_gather"]
            names += ["all_to_all 0->1", "all_to_all 1->0"]
            for name, x, h, f in zip(names, got, hierarchical, flat, strict=True):
                exact = integers or name in ("max", "min", "all_gather") or "all_to_all" in name
                tol = EXACT if exact else CLOSE32
                what = (
                    f"{name} ({'integer-valued' if integers else 'randn'}) over [{axes}] of {mesh}"
                )
                torch.testing.assert_close(
                    x, h, **tol, msg=lambda e, w=what: f"{w} vs virtual hierarchical: {e}"
                )
                torch.testing.assert_close(x, f, **tol, msg=lambda e, w=what: f"{w} vs flat: {e}")
    print(
        f"rank {RANK}: every hierarchical collective matches the virtual mesh and flat", flush=True
    )


def main(topology: str) -> None:
    check_jit(topology)
    check_schedules()
    print(f"rank {RANK} OK", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
