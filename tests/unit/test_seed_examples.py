"""The seeds' distributed examples (chapter 7 of the programming guide) run as written."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import tessera as ts
from tessera import dist, op

ROOT = Path(__file__).resolve().parents[2]


def test_chapter7_weight_sharded_by_rows_and_columns_over_a_2d_mesh() -> None:
    """7.2-7.4: a 4 × 4 (tp × dp) mesh, W split by rows over tp and columns over dp,
    ``Y = op.matmul(W, X)`` then ``dist.all_reduce(Y, axis="dp")``; compared to numpy in
    float64 (f32 arithmetic over K = 1024: rtol 1e-4, atol 1e-4)."""
    mesh = dist.Mesh(axes=["tp", "dp"], devices=range(16))
    assert mesh.layout == "tp × dp mesh, 4 × 4"
    rng = np.random.default_rng(0)
    w_data = rng.standard_normal((1024, 1024)).astype(np.float32) / 32
    x = rng.standard_normal((1024, 16)).astype(np.float32)
    layout = dist.ShardSpec(partition=("row", "col"), mesh_axes=("tp", "dp"))
    W = dist.tensor(w_data, layout=layout, mesh=mesh, dtype="f32")

    @ts.jit(mesh=mesh)
    def project(W: np.ndarray, X: np.ndarray) -> np.ndarray:
        Y_local = op.matmul(W, X)
        return dist.all_reduce(Y_local, axis="dp")

    lowered = project.lower(W, x)
    assert [(c.kind, c.mesh_axes) for c in lowered.collectives()] == [("all_reduce", ("dp",))]
    assert "tensor<256x256xf32>" in lowered.as_text("partitioned")  # each rank's block of W
    Y = project(W, x)
    np.testing.assert_allclose(np.asarray(Y), w_data.astype(np.float64) @ x, rtol=1e-4, atol=1e-4)


def test_comm_volume_benchmark_matches_megatron_minimum() -> None:
    """Exactly two all-reduces of [B/dp, T, C] per layer forward (ratio 1.00)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import comm_volume
    finally:
        sys.path.pop(0)
    for dp, tp in ((1, 4), (2, 2)):
        row = comm_volume.measure(dp, tp, batch=4, seq=8, dim=32, heads=4)
        assert row["ratio"] == 1.0, row
        assert row["collectives"] == "2× all_reduce[tp]", row
        assert row["error"] < 1e-4, row


@pytest.mark.parametrize(
    ("dp", "tp", "zero", "regions"),
    [(4, 1, 0, False), (4, 1, 1, False), (4, 1, 2, False), (4, 1, 3, False), (1, 4, 0, False),
     (2, 2, 3, False), (4, 1, 3, True), (1, 4, 0, True), (2, 2, 3, True)],
)  # fmt: skip
def test_comm_volume_training_matches_the_formulas(
    dp: int, tp: int, zero: int, regions: bool
) -> None:
    """A training step's volume equals the analytic formula (DP, ZeRO stages, TP), and the
    sharded step computes what the single-device step does (f32, 1e-5). Built from
    ``graph.region`` calls (2 layers), ZeRO-3 gathers again only what the backward reads,
    as unrolled (``dce`` drops a region backward's unread operands)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import comm_volume
    finally:
        sys.path.pop(0)
    layers = 2 if regions else 1
    row = comm_volume.measure_training(
        dp, tp, zero, (4, 512, 2048, 16), (4, 8, 32, 4), layers=layers, regions=regions
    )
    assert row["ratio"] == pytest.approx(1.0, rel=1e-12), row
    if regions:
        return
    if dp == 1:  # Megatron: two all-reduces forward, one backward (the input's gradient is
        # dead) and the first layer norm's weight and bias gradients, nothing else
        assert row["collectives"] == "5× all_reduce[tp]", row
    assert row["error"] < 1e-5, row
