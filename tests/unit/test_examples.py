"""The examples and the README's quick start run and agree with torch, through the
generated Triton kernels (Triton's interpreter on a CPU), as users run them."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
RTOL, ATOL = 1e-5, 1e-5  # f32


def load_example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        f"example_{name}", ROOT / "examples" / f"{name}.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(autouse=True)
def triton_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """Examples (and the scripts they start) run the generated kernels, the default."""
    monkeypatch.setenv("TESSERA_KERNELS", "triton")


mlp_example = load_example("mlp")
gpt_example = load_example("gpt_block")


@pytest.mark.parametrize(("batch", "d_in", "d_hidden", "d_out"), [(8, 32, 128, 16), (5, 7, 13, 3)])
def test_mlp_matches_torch(batch: int, d_in: int, d_hidden: int, d_out: int) -> None:
    args = mlp_example.random_inputs(batch, d_in, d_hidden, d_out, seed=1)
    out = mlp_example.mlp(*args)
    torch.testing.assert_close(out, mlp_example.torch_mlp(*args), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize(
    ("batch", "seq", "dim", "heads"),
    [(2, 16, 64, 4), (3, 7, 48, 3), (1, 1, 32, 2)],  # includes T not a power of two, and T = 1
)
def test_gpt_block_matches_torch(batch: int, seq: int, dim: int, heads: int) -> None:
    params = gpt_example.init_params(dim, seed=2)
    x = torch.randn((batch, seq, dim), generator=torch.Generator().manual_seed(3))
    out = gpt_example.gpt_block(x, params, heads)
    assert out.shape == (batch, seq, dim)
    torch.testing.assert_close(
        out, gpt_example.torch_gpt_block(x, params, heads), rtol=RTOL, atol=ATOL
    )


def test_gpt_block_is_causal() -> None:
    """Changing the last token leaves every earlier position's output unchanged."""
    params = gpt_example.init_params(32, seed=4)
    x = torch.randn((1, 6, 32), generator=torch.Generator().manual_seed(5))
    y = x.clone()
    y[:, -1] += 1.0
    a, b = gpt_example.gpt_block(x, params, 2), gpt_example.gpt_block(y, params, 2)
    torch.testing.assert_close(a[:, :-1], b[:, :-1], rtol=0, atol=0)
    assert not torch.allclose(a[:, -1], b[:, -1])


def test_gpt_block_script() -> None:
    result = subprocess.run(
        [sys.executable, "examples/gpt_block.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "graph.softmax" in result.stdout
    assert "graph.layer_norm" in result.stdout
    assert result.stdout.rstrip().endswith("OK")


def test_gpt_block_main_exits_nonzero_on_mismatch(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    reference = gpt_example.torch_gpt_block
    monkeypatch.setattr(gpt_example, "torch_gpt_block", lambda *a: reference(*a) + 1e-3)
    with pytest.raises(SystemExit) as exit_info:
        gpt_example.main(["--seq", "4", "--dim", "32", "--heads", "2"])
    assert exit_info.value.code == 1
    assert "MISMATCH" in capsys.readouterr().out


def test_mlp_main_prints_ir_and_ok(capsys: pytest.CaptureFixture[str]) -> None:
    mlp_example.main()
    out = capsys.readouterr().out
    assert "graph.gelu" in out
    assert out.rstrip().endswith("OK")


def test_readme_python_blocks_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every ```python block of the README runs (files they write go to a temporary dir)."""
    monkeypatch.chdir(tmp_path)
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, re.DOTALL)
    assert len(blocks) >= 2, "README.md should show the quick start and sharding"
    for block in blocks:
        exec(compile(block, "README.md", "exec"), {"__name__": "readme"})


def test_megatron_example_inserts_one_all_reduce(capsys: pytest.CaptureFixture[str]) -> None:
    import sys

    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import megatron_mlp
    finally:
        sys.path.pop(0)
    sys.argv = ["megatron_mlp.py"]
    megatron_mlp.main()
    out = capsys.readouterr().out
    assert out.count("collective: all_reduce over ['tp']") == 1
    assert "graph.partitioned" in out and out.rstrip().endswith("OK")


def test_readme_tessera_opt_example(tmp_path: Path) -> None:
    """The README's ``tessera-opt file.mlir -p canonicalize,cse`` removes the duplicate op."""
    from tessera.passes import get_all_passes

    missing = {"canonicalize", "cse"} - set(get_all_passes())
    if missing:
        pytest.skip(f"passes not registered yet: {sorted(missing)}")
    readme = (ROOT / "README.md").read_text()
    match = re.search(r"```mlir\n(.*?)```", readme, re.DOTALL)
    assert match, "README.md has no ```mlir block"
    source = tmp_path / "file.mlir"
    source.write_text(match.group(1))
    result = subprocess.run(
        [sys.executable, "-m", "tessera.tools.opt", str(source), "-p", "canonicalize,cse"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("graph.tanh") == 1, result.stdout


def test_train_gpt_on_a_virtual_mesh_matches_torch(capsys: pytest.CaptureFixture[str]) -> None:
    """Two AdamW steps of the GPT on a 2 x 2 mesh, through the generated Triton kernels."""
    train_gpt = load_example("train_gpt")
    train_gpt.main(["--steps", "2"])
    out = capsys.readouterr().out
    assert "mesh 2 x 2" in out and "all_reduce[dp]" in out and out.rstrip().endswith("OK")
