"""``ts.jit`` runs generated Triton kernels by default: on one device, on the virtual mesh
and with the reference executor as an opt-in oracle. (Triton's interpreter on a CPU.)"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tessera as ts
from tessera import dist, op
from tessera.backends import schedule_runner
from tessera.jit_function import default_kernels

RTOL = 1e-4  # f32 with dots and reductions (relative to the largest reference value)


@pytest.fixture
def triton(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TESSERA_KERNELS", raising=False)


def close(got: torch.Tensor, want: torch.Tensor, rtol: float = RTOL) -> None:
    scale = want.abs().max().item() or 1.0
    assert (got.double() - want.double()).abs().max().item() <= rtol * scale


def layer(x, w1, b1, w2):
    return op.layer_norm(op.gelu(x @ w1 + b1) @ w2 + x)


def inputs(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(6, 24, generator=g),
        torch.randn(24, 40, generator=g) / 5,
        torch.randn(40, generator=g),
        torch.randn(40, 24, generator=g) / 6,
    )


def reference(x, w1, b1, w2):
    x64, w164, b164, w264 = (t.double() for t in (x, w1, b1, w2))
    h = torch.nn.functional.gelu(x64 @ w164 + b164) @ w264 + x64
    return torch.nn.functional.layer_norm(h, (h.shape[-1],))


def test_triton_is_the_default(triton: None) -> None:
    assert default_kernels() == "triton"
    f = ts.jit(layer)
    lowered = f.lower(*inputs())
    assert lowered.kernels == "triton"
    sources = lowered.triton_source()
    names = {
        k.kernel_name for k in lowered.module_at("schedule").walk() if k.name == "schedule.kernel"
    }
    assert (
        set(sources) == names and len(names) == 3
    )  # matmul+bias+gelu, matmul+residual, layer_norm
    assert all("@triton.jit" in s for s in sources.values())
    close(f(*inputs()), reference(*inputs()))


def test_kernels_run_through_the_triton_runner(
    triton: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No kernel falls back to the reference executor."""
    monkeypatch.setattr(schedule_runner, "reference_kernel", None)  # would fail if called
    close(ts.jit(layer)(*inputs(1)), reference(*inputs(1)))


def _reshape_then_transpose(x, w):
    shaped = op.reshape(x @ w, (4, 2, 8))
    return shaped, op.transpose(shaped, (1, 0, 2))


def test_a_reshape_kernel_runs_as_a_view_without_a_launch(triton: None) -> None:
    """The returned reshape of the matmul is its own kernel (the transpose reads through
    it); the runner returns a view of the matmul's output instead of copying it."""
    x, w = torch.randn(4, 8), torch.randn(8, 16)
    lowered = ts.jit(_reshape_then_transpose).lower(x, w)
    kernels = [k for k in lowered.module_at("schedule").walk() if k.name == "schedule.kernel"]
    reshape = next(k for k in kernels if k.kernel_name.endswith("reshape"))
    runner = lowered.kernel_runner()
    made = torch.randn(4, 16)
    (viewed,) = runner(reshape, [made], schedule_runner.KernelContext(dist.mesh({"d": 1}), 0))
    assert viewed.data_ptr() == made.data_ptr() and viewed.shape == (4, 2, 8)
    want = (x.double() @ w.double()).reshape(4, 2, 8)
    shaped, moved = lowered(x, w)
    torch.testing.assert_close(shaped.double(), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(moved.double(), want.transpose(0, 1), rtol=1e-5, atol=1e-5)


def _stack(x, weights):
    for w1, b1, w2 in weights:
        x = layer(x, w1, b1, w2)
    return x


def test_identical_layers_share_one_tile_kernel_each(triton: None) -> None:
    """Four identical layers compile to one layer's tile kernels (each schedule kernel
    names the shared one), and running them through the shared kernels is right."""
    x, *first = inputs(2)
    weights = [first] + [list(inputs(3 + i)[1:]) for i in range(3)]
    lowered = ts.jit(_stack).lower(x, weights)
    kernels = [k for k in lowered.module_at("tile").walk() if k.name == "schedule.kernel"]
    tiles = {k.kernel_name for k in lowered.module_at("tile").walk() if k.name == "tile.kernel"}
    assert len(kernels) == 12 and len(tiles) == 3
    assert {k.tile_kernel_name for k in kernels} == tiles
    assert set(lowered.triton_source()) == tiles
    want = x.double()
    for w in weights:
        want = reference(want, *w)
    close(lowered(x, weights), want)


def test_reference_kernels_on_request() -> None:
    f = ts.jit(layer, kernels="reference")
    assert f.lower(*inputs()).kernels == "reference"
    close(f(*inputs()), reference(*inputs()))
    with pytest.raises(ts.TesseraError, match="kernels must be one of"):
        ts.jit(layer, kernels="cuda")


def test_sharded_layer_on_the_virtual_mesh_through_triton(triton: None) -> None:
    mesh = dist.Mesh(axes=["dp", "tp"], shape=(2, 2))
    rows = dist.ShardSpec(partition=(0,), mesh_axes=("dp",))
    specs = (
        rows,
        dist.ShardSpec(partition=(1,), mesh_axes=("tp",)),
        dist.ShardSpec(partition=(0,), mesh_axes=("tp",)),
        dist.ShardSpec(partition=(0,), mesh_axes=("tp",)),
    )
    f = ts.jit(layer, mesh=mesh, in_shardings=specs)
    lowered = f.lower(*inputs(2))
    assert [c.kind for c in lowered.collectives()] == ["all_reduce"]  # Megatron: one per layer
    assert len(lowered.triton_source()) == 3
    close(f(*inputs(2)), reference(*inputs(2)))


def test_bfloat16_program(triton: None) -> None:
    x, w1, b1, w2 = (t.bfloat16() for t in inputs(3))
    got = ts.jit(layer)(x, w1, b1, w2)
    assert got.dtype == torch.bfloat16
    close(got.float(), reference(x.float(), w1.float(), b1.float(), w2.float()), rtol=3e-2)


def test_out_of_range_gather_indices_are_an_error_not_a_wrong_answer(triton: None) -> None:
    f = ts.jit(lambda table, ids: op.take(table, ids, axis=0) * 2)
    table = torch.randn(5, 3)
    close(f(table, torch.tensor([4, 0, -5])), table[[4, 0, 0]] * 2)
    with pytest.raises(ts.ExecutionError, match=r"indices must be in \[-5, 5\)"):
        f(table, torch.tensor([1, 5]))


def test_a_diagonal_sum_selects_with_a_boolean_not_an_integer(triton: None) -> None:
    """``einsum("aaa")`` masks with a scalar ``true``: Triton reads ``1`` as int32, and
    ``tl.where`` on an int32 condition is deprecated (an error here, by pyproject's filter)."""
    x = torch.randn(1, 1, 1)  # the mask of a size-1 diagonal folds to a constant
    f = ts.jit(lambda a: op.einsum("aaa", a))
    source = "".join(f.lower(x).triton_source().values())
    assert "tl.where(True," in source
    close(f(x), torch.einsum("aaa", x.double()))


def test_numpy_in_numpy_out(triton: None) -> None:
    got = ts.jit(lambda a: op.softmax(a * 3, axis=0))(np.arange(12, dtype=np.float32).reshape(4, 3))
    assert isinstance(got, np.ndarray)
    want = torch.softmax(torch.arange(12.0).reshape(4, 3).double() * 3, dim=0)
    close(torch.from_numpy(got), want)


def test_a_cached_kernel_file_changed_on_disk_is_rewritten_not_imported(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The import runs the cached file: code appended to it after it was written must not
    run; the file is rewritten from the source."""
    from tessera.backends.triton import compiled_kernel

    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(compiled_kernel, "_MODULES", {})
    source = "import triton\n\n@triton.jit\ndef k(x):\n    pass\n"
    compiled_kernel.load_source("k", source)
    (path,) = (tmp_path / "triton").glob("k_*.py")
    path.write_text(source + "raise SystemExit('tampered')\n")
    monkeypatch.setattr(compiled_kernel, "_MODULES", {})  # a new process
    assert compiled_kernel.load_source("k", source) is not None
    assert path.read_text() == source
