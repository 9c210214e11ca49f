"""ts.jit with a mesh: in/out shardings, dist.tensor inputs, explicit collectives."""

from __future__ import annotations

import pytest
import torch

import tessera as ts
from tessera import dist, op

MESH = dist.Mesh(axes=["dp", "tp"], shape=(2, 4))
ROWS_DP = dist.ShardSpec(partition=(0,), mesh_axes=("dp",))
COLS_TP = dist.ShardSpec(partition=(1,), mesh_axes=("tp",))
ROWS_TP = dist.ShardSpec(partition=(0,), mesh_axes=("tp",))


def mlp(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    return op.gelu(x @ w1) @ w2


def _inputs(seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(16, 64, generator=g),
        torch.randn(64, 32, generator=g),
        torch.randn(32, 8, generator=g),
    )


def test_megatron_mlp_is_annotated_and_computes_the_global_result() -> None:
    f = ts.jit(mlp, mesh=MESH, in_shardings=(ROWS_DP, COLS_TP, ROWS_TP))
    x, w1, w2 = _inputs()
    lowered = f.lower(x, w1, w2)
    graph_text = lowered.as_text("graph")
    assert "graph.mesh @mesh axes = [dp = 2, tp = 4]" in graph_text
    assert (
        "%x: tensor<16x64xf32> {graph.sharding = #graph.sharding<@mesh, [[dp], []]>}" in graph_text
    )
    sharded = lowered.as_text("sharded")
    assert "#graph.sharding<@mesh, [[dp], [tp]]>" in sharded  # x @ w1 and gelu
    assert "#graph.sharding<@mesh, [[dp], []], partial = sum[tp]>" in sharded  # @ w2
    expected = torch.nn.functional.gelu(x @ w1) @ w2
    torch.testing.assert_close(f(x, w1, w2), expected, rtol=1e-5, atol=1e-5)


def test_dist_tensor_layout_becomes_the_input_sharding() -> None:
    f = ts.jit(mlp, mesh=MESH)
    x, w1, w2 = _inputs(1)
    args = (
        dist.tensor(x, layout=ROWS_DP, mesh=MESH),
        dist.tensor(w1, layout=COLS_TP, mesh=MESH),
        w2,
    )
    text = f.lower(*args).as_text("graph")
    assert "%w1: tensor<64x32xf32> {graph.sharding = #graph.sharding<@mesh, [[], [tp]]>}" in text
    assert "%w2: tensor<32x8xf32>) ->" in text  # unannotated: open
    torch.testing.assert_close(
        f(*args), torch.nn.functional.gelu(x @ w1) @ w2, rtol=1e-5, atol=1e-5
    )


def test_pytree_prefix_shardings_and_out_shardings() -> None:
    @ts.jit(mesh=MESH, in_shardings=({"w": COLS_TP, "b": None},), out_shardings=ROWS_TP)
    def layer(params: dict[str, torch.Tensor]) -> torch.Tensor:
        return params["w"] + params["b"]

    w, b = torch.randn(8, 12), torch.randn(12)
    text = layer.lower({"w": w, "b": b}).as_text("graph")
    assert (
        "%params_w: tensor<8x12xf32> {graph.sharding = #graph.sharding<@mesh, [[], [tp]]>}" in text
    )
    assert "graph.shard" in text and "#graph.sharding<@mesh, [[tp], []]>" in text
    torch.testing.assert_close(layer({"w": w, "b": b}), w + b)


def test_explicit_collectives_are_layout_statements() -> None:
    @ts.jit(mesh=MESH)
    def f(x: torch.Tensor) -> torch.Tensor:
        y = dist.all_gather(dist.shard(x, ROWS_TP), axis="tp", dim=0)
        return dist.all_reduce(y * 2, axis="dp", op="sum")

    x = torch.randn(8, 4)
    lowered = f.lower(x)
    assert "graph.all_reduce" in lowered.as_text("graph")
    # y * 2 is not partial over dp: the all_reduce states a layout it already has
    assert [c.kind for c in lowered.collectives()] == ["all_gather"]
    torch.testing.assert_close(f(x), x * 2)  # the global value is unchanged by layout


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"in_shardings": (ROWS_DP,)}, "need a mesh"),
        ({"mesh": MESH, "in_shardings": (ROWS_DP,)}, "1 entries for 3 positional arguments"),
        (
            {
                "mesh": MESH,
                "in_shardings": (dist.ShardSpec(partition=(1,), mesh_axes=("pp",)), None, None),
            },
            "unknown mesh axis 'pp'",
        ),
        (
            {
                "mesh": MESH,
                "in_shardings": (
                    dist.ShardSpec(partition=(0,), mesh_axes=(("dp", "tp"),)),
                    None,
                    ROWS_TP,
                ),
            },
            None,
        ),
        (
            {
                "mesh": MESH,
                "in_shardings": (
                    None,
                    None,
                    dist.ShardSpec(partition=(1,), mesh_axes=(("dp", "tp", "dp"),)),
                ),
            },
            "mesh axis 'dp' splits dim 1 and again dim 1",
        ),
        (
            {
                "mesh": MESH,
                "in_shardings": (dist.ShardSpec(partition=(2,), mesh_axes=("tp",)), None, None),
            },
            r"partition dim 2 \(split over 'tp'\) is out of range for a tensor of rank 2",
        ),
    ],
)
def test_bad_shardings_name_the_problem(kwargs: dict, message: str | None) -> None:
    x, w1, w2 = _inputs(2)
    if message is None:  # valid: dim 0 (16) over dp × tp (8)
        ts.jit(mlp, **kwargs).lower(x, w1, w2)
        return
    with pytest.raises(ts.ShardingError, match=message):
        ts.jit(mlp, **kwargs).lower(x, w1, w2)


def test_indivisible_dim_is_named() -> None:
    f = ts.jit(lambda x: x * 2, mesh=MESH, in_shardings=(ROWS_TP,))
    with pytest.raises(
        ts.ShardingError, match="dim 0 of size 6 is not divisible by mesh axes tp=4"
    ):
        f(torch.randn(6, 4))


def test_collective_errors() -> None:
    @ts.jit(mesh=MESH)
    def unknown_axis(x: torch.Tensor) -> torch.Tensor:
        return dist.all_reduce(x, axis="pp")

    with pytest.raises(ts.ShardingError, match=r"unknown mesh axis 'pp'.*test_jit_sharding.py:\d+"):
        unknown_axis(torch.randn(4))

    @ts.jit
    def no_mesh(x: torch.Tensor) -> torch.Tensor:
        return dist.all_reduce(x, axis="dp")

    with pytest.raises(ts.TraceError, match="needs a device mesh"):
        no_mesh(torch.randn(4))

    with pytest.raises(ts.ShardingError, match="no mesh"):
        ts.jit(lambda x: x * 1)(dist.tensor(torch.randn(4), layout=ROWS_DP, mesh=MESH))


def test_schedule_stage_and_memory() -> None:
    """The scheduled program (kernels, start/wait) and its per-rank peak memory: sharding
    the weights over tp = 4 cuts the per-rank peak by more than half."""
    x, w1, w2 = _inputs(3)
    sharded = ts.jit(mlp, mesh=MESH, in_shardings=(ROWS_DP, COLS_TP, ROWS_TP)).lower(x, w1, w2)
    text = sharded.as_text("schedule")
    assert text.count("schedule.kernel") == 2
    assert "schedule.start all_reduce" in text and "schedule.wait" in text
    unsharded = ts.jit(mlp).lower(x, w1, w2)
    assert 0 < sharded.memory().peak_bytes < unsharded.memory().peak_bytes / 2
    weights = (w1.numel() + w2.numel()) * 4
    assert unsharded.memory().peak_bytes >= weights


# --- blocks along a sharded dim ---------------------------------------------------------------


def _block_bytes_received(lowered: ts.Lowered, mesh: dist.Mesh) -> int:
    """The busiest device's bytes received by collective permutes."""
    received = [0] * mesh.size
    for c in lowered.collectives():
        assert c.kind == "collective_permute", c
        for group in mesh.groups(c.mesh_axes):
            for position in c.receivers:
                received[group[position]] += c.nbytes
    return max(received)


def test_swiglu_with_a_fused_gate_up_projection_moves_blocks_not_the_whole_dim() -> None:
    """chunk(x @ w_fused, 2) with w_fused split by columns over tp = 4 (x @ w_fused is
    16 x 128: blocks of 32 columns; gate's and up's blocks of 16): rank r's gate block
    lies on rank r // 2, its up block on rank 2 + r // 2, so ranks receive 1, 2, 2, 1
    blocks of 16 x 16; nothing is gathered, and the down projection's partial sum is
    reduced once."""

    def swiglu(x: torch.Tensor, w_fused: torch.Tensor, w_down: torch.Tensor) -> torch.Tensor:
        gate, up = op.chunk(x @ w_fused, 2, axis=-1)
        return (op.silu(gate) * up) @ w_down

    g = torch.Generator().manual_seed(4)
    x, w_fused, w_down = (
        torch.randn(16, 32, generator=g),
        torch.randn(32, 128, generator=g),
        torch.randn(64, 32, generator=g),
    )
    mesh = dist.Mesh(axes=["tp"], shape=(4,))
    f = ts.jit(swiglu, mesh=mesh, in_shardings=(None, COLS_TP, ROWS_TP))
    lowered = f.lower(x, w_fused, w_down)
    kinds = [c.kind for c in lowered.collectives()]
    assert "all_gather" not in kinds and kinds.count("all_reduce") == 1, kinds
    permutes = [c for c in lowered.collectives() if c.kind == "collective_permute"]
    received = [0] * 4
    for c in permutes:
        for position in c.receivers:
            received[position] += c.nbytes
    assert received == [16 * 16 * 4 * blocks for blocks in (1, 2, 2, 1)]
    gate, up = (x @ w_fused).chunk(2, -1)
    torch.testing.assert_close(
        f(x, w_fused, w_down), (torch.nn.functional.silu(gate) * up) @ w_down, rtol=1e-4, atol=1e-4
    )


def test_concat_of_column_split_branches_keeps_the_split() -> None:
    """concat([x @ a, x @ b]) of two column-split branches stays split over tp: blocks
    move into place, nothing is gathered."""
    g = torch.Generator().manual_seed(5)
    x, a, b = (
        torch.randn(8, 16, generator=g),
        torch.randn(16, 32, generator=g),
        torch.randn(16, 64, generator=g),
    )
    f = ts.jit(
        lambda x, a, b: op.concat([x @ a, x @ b], axis=1),
        mesh=MESH,
        in_shardings=(ROWS_DP, COLS_TP, COLS_TP),
        out_shardings=dist.ShardSpec(partition=(0, 1), mesh_axes=("dp", "tp")),
    )
    lowered = f.lower(x, a, b)
    assert (
        0 < _block_bytes_received(lowered, MESH) <= 2 * 24 * 4 * 4
    )  # at most this rank's result block
    torch.testing.assert_close(f(x, a, b), torch.cat([x @ a, x @ b], 1), rtol=1e-5, atol=1e-5)


def test_pieces_that_do_not_divide_among_the_ranks_are_cut_from_the_whole_dim() -> None:
    """chunk(x, 4) of 8 columns split over tp = 4: pieces of 2 columns cannot be split 4
    ways, so the dim is gathered and each rank cuts its piece."""
    x = torch.randn(4, 8)
    mesh = dist.Mesh(axes=["tp"], shape=(4,))
    uneven = ts.jit(lambda x: op.chunk(x, 4, axis=1)[1] * 2, mesh=mesh, in_shardings=(COLS_TP,))
    assert [c.kind for c in uneven.lower(x).collectives()] == ["all_gather"]
    torch.testing.assert_close(uneven(x), x.chunk(4, 1)[1] * 2)
