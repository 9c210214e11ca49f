"""Run under ``tessera run -n 2|4``: every rank checks ``.full()`` of sharded programs
against the virtual mesh and torch eager, then prints ``rank R OK``.

2 ranks: the Megatron MLP on a 1-D tp mesh (global and ``dist.tensor.from_local``
arguments). 4 ranks: the MLP on a 2 x 2 (dp x tp) mesh and the Megatron transformer
layer of ``benchmarks/comm_volume.py`` on 2 x 2 and 1-D tp=4 meshes.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

import tessera as ts
from tessera import dist, op
from tessera.dist.tensor import DistTensor

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
from comm_volume import layouts, transformer_layer

RANK, WORLD = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
TOL = {"rtol": 1e-5, "atol": 1e-5}


def virtual(fn: Any, *args: Any) -> Any:
    """``fn(*args)`` on the virtual mesh (all ranks in this process)."""
    os.environ["TESSERA_BACKEND"] = "virtual"
    try:
        return fn(*args)
    finally:
        del os.environ["TESSERA_BACKEND"]


def check(name: str, got: torch.Tensor, oracle: torch.Tensor, eager: torch.Tensor) -> None:
    torch.testing.assert_close(got, oracle, **TOL, msg=lambda m: f"{name} vs virtual: {m}")
    torch.testing.assert_close(got, eager, **TOL, msg=lambda m: f"{name} vs eager: {m}")
    print(
        f"rank {RANK}: {name}: max error vs eager {(got - eager).abs().max().item():.1e}",
        flush=True,
    )


def mlp(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    return op.gelu(x @ w1) @ w2


def check_mlp(mesh: dist.Mesh, local_args: bool = False) -> None:
    g = torch.Generator().manual_seed(1)
    x, w1, w2 = (
        torch.randn(8, 16, generator=g),
        torch.randn(16, 32, generator=g),
        torch.randn(32, 16, generator=g),
    )
    batch = (
        dist.ShardSpec(partition=(0,), mesh_axes=("dp",))
        if "dp" in mesh.axis_names
        else dist.ShardSpec(replicate=True)
    )
    cols = dist.ShardSpec(partition=("col",), mesh_axes=("tp",))
    rows = dist.ShardSpec(partition=("row",), mesh_axes=("tp",))
    f = ts.jit(mlp, mesh=mesh, in_shardings=(batch, cols, rows))
    eager = F.gelu(x @ w1) @ w2
    oracle = virtual(f, x, w1, w2)
    if local_args:  # each rank builds its arguments from its own shards
        specs = (batch, cols, rows)
        whole = [
            dist.tensor(a, layout=s, mesh=mesh) for a, s in zip((x, w1, w2), specs, strict=True)
        ]
        args = [
            DistTensor.from_local(w.local(RANK).clone(), s, mesh)
            for w, s in zip(whole, specs, strict=True)
        ]
        result = f(*args)
    else:
        result = f(x, w1, w2)
    run = f.lower(x, w1, w2).last_run
    assert run is not None and [c.kind for c in run.collectives] == ["all_reduce"], run
    assert tuple(result.shape) == tuple(eager.shape), result
    check(
        f"mlp on {mesh}{' from local shards' if local_args else ''}", result.full(), oracle, eager
    )


def eager_layer(x: torch.Tensor, p: dict[str, torch.Tensor], heads: int) -> torch.Tensor:
    batch, seq, dim = x.shape

    def split_heads(t: torch.Tensor) -> torch.Tensor:
        return t.reshape(batch, seq, heads, dim // heads).transpose(1, 2)

    h = F.layer_norm(x, (dim,), p["ln1_w"], p["ln1_b"])
    q, k, v = (split_heads(h @ p[n]) for n in ("wq", "wk", "wv"))
    scores = (q @ k.transpose(-1, -2)) * (1.0 / (dim // heads) ** 0.5)
    causal = torch.tril(torch.ones(seq, seq, dtype=torch.bool))
    attention = torch.softmax(torch.where(causal, scores, torch.tensor(-1e9)), dim=-1) @ v
    x = x + attention.transpose(1, 2).reshape(batch, seq, dim) @ p["wo"]
    h = F.layer_norm(x, (dim,), p["ln2_w"], p["ln2_b"])
    return x + F.gelu(h @ p["w1"]) @ p["w2"]


def check_layer(mesh: dist.Mesh) -> None:
    batch, seq, dim, heads = 4, 8, 32, 4
    g = torch.Generator().manual_seed(2)
    x = torch.randn(batch, seq, dim, generator=g)
    p = {n: torch.randn(dim, dim, generator=g) / dim**0.5 for n in ("wq", "wk", "wv", "wo")}
    p |= {
        "w1": torch.randn(dim, 4 * dim, generator=g) / dim**0.5,
        "w2": torch.randn(4 * dim, dim, generator=g) / (4 * dim) ** 0.5,
    }
    p |= {n: 1 + 0.1 * torch.randn(dim, generator=g) for n in ("ln1_w", "ln2_w")}
    p |= {n: 0.1 * torch.randn(dim, generator=g) for n in ("ln1_b", "ln2_b")}
    x_spec, p_specs = layouts(mesh, "dp" in mesh.axis_names)
    layer = ts.jit(
        transformer_layer, static_argnums=2, mesh=mesh, in_shardings=(x_spec, p_specs, None)
    )
    oracle = virtual(layer, x, p, heads)
    result = layer(x, p, heads)
    kinds = [c.kind for c in layer.lower(x, p, heads).last_run.collectives]
    assert kinds == ["all_reduce", "all_reduce"], kinds
    check(f"transformer layer on {mesh}", result.full(), oracle, eager_layer(x, p, heads))


COLLECTIVES = """
graph.mesh @mesh axes = [dp = 2, tp = 2]
func.func @f(%x: tensor<8x12xf32>, %h: tensor<4x6xbf16>) -> (tensor<2x6xf32>, tensor<4x6xbf16>, tensor<4x6xbf16>, tensor<8x12xf32>) attributes {graph.partitioned} {
  %a = graph.all_reduce %x {axes = [tp], kind = mean} : tensor<8x12xf32>
  %b = graph.all_gather %a {axes = [tp, dp], dim = 0} : tensor<8x12xf32> -> tensor<32x12xf32>
  %c = graph.reduce_scatter %b {axes = [tp, dp], dim = 1, kind = max} : tensor<32x12xf32> -> tensor<32x3xf32>
  %d = graph.all_to_all %c {axes = [dp], split_dim = 0, concat_dim = 1} : tensor<32x3xf32> -> tensor<16x6xf32>
  %e = graph.all_slice %d {axes = [tp], dim = 0} : tensor<16x6xf32> -> tensor<8x6xf32>
  %f = graph.reduce_scatter %e {axes = [dp, tp], dim = 0, kind = sum} : tensor<8x6xf32> -> tensor<2x6xf32>
  %g = graph.all_reduce %f {axes = [dp], kind = min} : tensor<2x6xf32>
  %k = graph.broadcast %h {axes = [dp], src = 1} : tensor<4x6xbf16>
  %m = graph.all_reduce %h {axes = [dp, tp], kind = sum} : tensor<4x6xbf16>
  %p = graph.all_reduce %x {axes = [tp, dp], kind = prod} : tensor<8x12xf32>
  func.return %g, %k, %m, %p : tensor<2x6xf32>, tensor<4x6xbf16>, tensor<4x6xbf16>, tensor<8x12xf32>
}
"""


def check_collectives() -> None:
    """Every collective kind, on 1- and 2-axis groups (both axis orders), per rank equal
    to the virtual mesh's result for that rank (up to summation order)."""
    from xdsl.context import Context
    from xdsl.dialects.builtin import Builtin
    from xdsl.dialects.func import Func
    from xdsl.parser import Parser

    from tessera.backends.distributed import run_rank
    from tessera.backends.virtual import run_partitioned
    from tessera.ir.graph import Graph
    from tessera.passes.lower_graph_to_schedule import LowerGraphToSchedulePass

    context = Context()
    for dialect in (Builtin, Func, Graph):
        context.load_dialect(dialect)
    module = Parser(context, COLLECTIVES).parse_module()
    mesh = dist.Mesh(axes=["dp", "tp"], shape=(2, 2))
    g = torch.Generator().manual_seed(3)
    rank_args = [
        [torch.randn(8, 12, generator=g), torch.randn(4, 6, generator=g).bfloat16()]
        for _ in range(WORLD)
    ]
    expected = run_partitioned(module, "f", mesh, rank_args)[RANK]
    scheduled = module.clone()
    LowerGraphToSchedulePass().apply(context, scheduled)
    got, run = run_rank(scheduled, "f", mesh, rank_args[RANK])
    assert len(run.collectives) == 9, run.collectives
    for index, (a, b) in enumerate(zip(got, expected, strict=True)):
        torch.testing.assert_close(
            a, b, rtol=1e-6, atol=1e-6, msg=lambda m, i=index: f"result {i}: {m}"
        )
    print(f"rank {RANK}: every collective kind matches the virtual mesh", flush=True)


def main() -> None:
    if WORLD == 2:
        check_mlp(dist.Mesh(axes=["tp"], shape=(2,)))
        check_mlp(dist.Mesh(axes=["tp"], shape=(2,)), local_args=True)
    elif WORLD == 4:
        check_collectives()
        check_mlp(dist.Mesh(axes=["dp", "tp"], shape=(2, 2)))
        check_layer(dist.Mesh(axes=["dp", "tp"], shape=(2, 2)))
        check_layer(dist.Mesh(axes=["tp"], shape=(4,)))
    else:
        raise SystemExit(f"run with 2 or 4 ranks, not {WORLD}")
    print(f"rank {RANK} OK", flush=True)


if __name__ == "__main__":
    main()
