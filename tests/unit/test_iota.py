"""``op.iota`` / ``graph.iota``: indices computed where they are read, checked against
numpy on one device and on a dp x tp mesh (each rank's slice starting at its own global
index), in the reference and in the generated Triton kernels; exact (integers, and
floats below 2**24)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from user_errors import raised_at_marked_line

import tessera as ts
from tessera import dist, op
from tessera.errors import ShapeError

MESH_SPEC = dist.ShardSpec(partition=(0, 1), mesh_axes=("dp", "tp"))


def numpy_iota(shape: tuple[int, ...], dimension: int) -> np.ndarray:
    view = [1] * len(shape)
    view[dimension] = shape[dimension]
    return np.broadcast_to(np.arange(shape[dimension]).reshape(view), shape)


@pytest.mark.parametrize("kernels", ["reference", "triton"])
@pytest.mark.parametrize("sharded", [False, True], ids=["one-device", "dp2xtp2"])
def test_iota_equals_numpy(kernels: str, sharded: bool) -> None:
    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.integers(0, 12, (4, 12)))

    def f(x):
        hits = op.equal(x, op.iota((4, 12), 1))  # read in place by the compare
        return hits, op.iota((4, 12), 0, "f32") * 2 + x, op.iota((2, 3, 4), -1, "i32")

    mesh = dist.mesh({"dp": 2, "tp": 2}) if sharded else None
    shardings = (MESH_SPEC,) if sharded else None
    hits, scaled, small = ts.jit(f, mesh=mesh, in_shardings=shardings, kernels=kernels)(x)
    np.testing.assert_array_equal(np.asarray(hits), x.numpy() == numpy_iota((4, 12), 1))
    np.testing.assert_array_equal(
        np.asarray(scaled), numpy_iota((4, 12), 0).astype(np.float32) * 2 + x.numpy()
    )
    np.testing.assert_array_equal(np.asarray(small), numpy_iota((2, 3, 4), 2))
    assert torch.as_tensor(np.asarray(small)).dtype == torch.int32


def test_split_iota_takes_each_ranks_start() -> None:
    """The partitioned program gives the split iota this rank's first index."""
    x = torch.zeros(4, 12, dtype=torch.int64)
    jitted = ts.jit(
        lambda x: op.equal(x, op.iota((4, 12), 1)),
        mesh=dist.mesh({"dp": 2, "tp": 2}),
        in_shardings=(MESH_SPEC,),
    )
    text = jitted.lower(x).as_text("partitioned")
    (line,) = [line for line in text.splitlines() if "graph.iota" in line]
    assert "graph.iota %" in line and "tensor<2x6xi64>" in line, line


def test_one_hot_gradient_program_has_no_arange_constant() -> None:
    """Cross-entropy's backward compares labels against an iota, not a dense constant."""
    logits = torch.randn(4, 1000, dtype=torch.float64)
    labels = torch.randint(0, 1000, (4,))
    jitted = ts.jit(ts.grad(lambda z, y: op.cross_entropy(z, y)))
    text = jitted.lower(logits, labels).as_text()
    assert "graph.iota" in text
    assert "dense<[0, 1, 2" not in text
    expected = torch.softmax(logits, -1) - torch.nn.functional.one_hot(labels, 1000)
    torch.testing.assert_close(jitted(logits, labels), expected / 4, rtol=1e-12, atol=1e-12)


def test_iota_errors_name_the_problem_and_the_line() -> None:
    raised_at_marked_line(
        lambda x: op.iota((2, 3), 2),  # <- dimension
        ShapeError, "dimension 2 is out of range for shape [2, 3]", __file__, "dimension",
    )  # fmt: skip
    raised_at_marked_line(
        lambda x: op.iota((2, 3), 0, "bool"),  # <- bool
        ShapeError, "expected an integer or float result", __file__, "bool",
    )  # fmt: skip
