"""Run under ``tessera run -n 4``: collective permutes and the block moves built of
them, one process per rank over gloo, each rank checking its results against an
independent model (numpy, torch eager) and the virtual mesh, then printing ``rank R OK``.

- IR: permutes over tp and over (dp, tp) of a 2 x 2 mesh and over tp of a 1-D tp=4
  mesh: shifts, a swap next to ranks that keep their own value, a single pair (the
  others receive zeros);
- programs whose chunk / concat along a sharded dim move blocks by collective permutes
  (nothing gathered): a SwiGLU MLP with a fused gate/up projection (chunk in 2), a fused
  q/k/v projection chunked in 3, a concat of two column-split branches, on tp=4 and on
  a 2 x 2 (dp x tp) mesh.
"""

from __future__ import annotations

import os

import numpy as np
import torch
import torch.nn.functional as F
from xdsl.context import Context
from xdsl.dialects.builtin import Builtin
from xdsl.dialects.func import Func
from xdsl.parser import Parser

import tessera as ts
from tessera import dist, op
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


def numpy_permute(
    pairs: list[list[int]], group: list[int], values: list[np.ndarray]
) -> dict[int, np.ndarray]:
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
        numpy_permute(pairs["single"], group, [shifted.get(r, v) for r, v in enumerate(values)])[
            RANK
        ],
    ]
    for index, (a, b, want) in enumerate(zip(got, oracle, expected, strict=True)):
        np.testing.assert_array_equal(a.numpy(), want, err_msg=f"result {index}")
        np.testing.assert_array_equal(b.numpy(), want, err_msg=f"virtual result {index}")
    assert [c.kind for c in run.collectives] == ["collective_permute"] * 3, run.collectives
    print(
        f"rank {RANK}: collective permutes over {list(group_axes)} of {mesh} match numpy",
        flush=True,
    )


def virtual(fn, *args):  # type: ignore[no-untyped-def]
    """``fn(*args)`` on the virtual mesh (all ranks in this process)."""
    os.environ["TESSERA_BACKEND"] = "virtual"
    try:
        return fn(*args)
    finally:
        del os.environ["TESSERA_BACKEND"]


def swiglu(x, w_gate_up, w_down):  # type: ignore[no-untyped-def]
    gate, up = op.chunk(x @ w_gate_up, 2, axis=-1)
    return (op.silu(gate) * up) @ w_down


def fused_qkv(x, w_qkv):  # type: ignore[no-untyped-def]
    q, k, v = op.chunk(x @ w_qkv, 3, axis=-1)
    return op.softmax(q * k, axis=-1) * v


def branches(x, a, b):  # type: ignore[no-untyped-def]
    return op.tanh(op.concat([x @ a, x @ b], axis=-1))


def check_block_moves(mesh: dist.Mesh) -> None:
    g = torch.Generator().manual_seed(6)
    x, w = torch.randn(8, 16, generator=g), torch.randn(16, 64, generator=g) / 4
    w_down, w_qkv = torch.randn(32, 16, generator=g) / 6, torch.randn(16, 96, generator=g) / 4
    a, b = torch.randn(16, 16, generator=g) / 4, torch.randn(16, 32, generator=g) / 4
    batch = dist.ShardSpec(partition=(0,), mesh_axes=("dp",)) if "dp" in mesh.axis_names else None
    cols = dist.ShardSpec(partition=(1,), mesh_axes=("tp",))
    rows = dist.ShardSpec(partition=(0,), mesh_axes=("tp",))
    gate, up = (x @ w).chunk(2, -1)
    q, k, v = (x @ w_qkv).chunk(3, -1)
    programs = {
        "swiglu": (swiglu, (x, w, w_down), (batch, cols, rows), (F.silu(gate) * up) @ w_down),
        "fused qkv": (fused_qkv, (x, w_qkv), (batch, cols), torch.softmax(q * k, -1) * v),
        "concat of branches": (
            branches,
            (x, a, b),
            (batch, cols, cols),
            torch.tanh(torch.cat([x @ a, x @ b], -1)),
        ),
    }
    for name, (fn, args, specs, eager) in programs.items():
        f = ts.jit(fn, mesh=mesh, in_shardings=specs)
        oracle = virtual(f, *args)
        result = f(*args)
        kinds = {c.kind for c in f.lower(*args).last_run.collectives}
        assert "collective_permute" in kinds and "all_gather" not in kinds, (name, kinds)
        got = result.full()
        torch.testing.assert_close(
            got, oracle, rtol=1e-5, atol=1e-5, msg=lambda m, n=name: f"{n} vs virtual: {m}"
        )
        torch.testing.assert_close(
            got, eager, rtol=1e-4, atol=1e-4, msg=lambda m, n=name: f"{n} vs eager: {m}"
        )
    print(f"rank {RANK}: block moves on {mesh} match torch eager", flush=True)


def main() -> None:
    if WORLD != 4:
        raise SystemExit(f"run with 4 ranks, not {WORLD}")
    check_permutes({"dp": 2, "tp": 2}, ("tp",))
    check_permutes({"dp": 2, "tp": 2}, ("dp", "tp"))
    check_permutes({"tp": 4}, ("tp",))
    check_block_moves(dist.Mesh(axes=["tp"], shape=(4,)))
    check_block_moves(dist.Mesh(axes=["dp", "tp"], shape=(2, 2)))
    print(f"rank {RANK} OK", flush=True)


if __name__ == "__main__":
    main()
