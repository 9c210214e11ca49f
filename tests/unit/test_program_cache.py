"""The on-disk program cache (``tessera.program_cache``): a second trace of the same
program reads every stage instead of compiling it and computes the same results; a
damaged file, another configuration or an unsafe directory never yields a wrong program."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import tessera as ts
from tessera import dist, numerics, op, program, schedule
from tessera.driver import STAGES
from tessera.program_cache import ProgramCache
from tessera.transforms.remat import RematPolicy


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(root))
    monkeypatch.setenv("TESSERA_PROGRAM_CACHE", "1")
    from tessera import cache_location

    cache_location._usable.cache_clear()
    yield root
    cache_location._usable.cache_clear()


def _layer(x, w1, w2):
    return op.layer_norm(op.gelu(x @ w1) @ w2 + x)


MESH = dist.mesh({"dp": 2, "tp": 2})
SPECS = (
    dist.ShardSpec(partition=(0,), mesh_axes=("dp",)),
    dist.ShardSpec(partition=(1,), mesh_axes=("tp",)),
    dist.ShardSpec(partition=(0,), mesh_axes=("tp",)),
)


def _inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(8, 16, generator=g),
        torch.randn(16, 32, generator=g) / 4,
        torch.randn(32, 16, generator=g) / 6,
    )


def _reference(x, w1, w2):
    x, w1, w2 = (t.double() for t in (x, w1, w2))
    h = torch.nn.functional.gelu(x @ w1) @ w2 + x
    return torch.nn.functional.layer_norm(h, (16,))


def _jit(**options):
    return ts.jit(_layer, mesh=MESH, in_shardings=SPECS, kernels="reference", **options)


def _compile_all(lowered):
    return {stage: str(lowered.module_at(stage)) for stage in STAGES[1:]}


def test_a_second_trace_reads_every_stage(cache, monkeypatch):
    lowered = _jit().lower(*_inputs())
    first = _compile_all(lowered)
    # every stage but the traced one (and autodiff: not a gradient program) is stored
    assert len(list((cache / "programs").rglob("*.bin"))) == len(STAGES) - 2
    _jit()(*_inputs())  # a call also stores the per-rank layouts
    assert len(list((cache / "programs").rglob("layouts.bin"))) == 1

    def no_compiling(*args, **kwargs):
        raise AssertionError("a cached stage was compiled again")

    monkeypatch.setattr(program, "run_stage", no_compiling)
    lowered = _jit().lower(*_inputs())
    got = lowered(*_inputs(1))
    assert "partitioned" not in lowered._stages  # the layouts were read, not derived
    assert _compile_all(lowered) == first
    torch.testing.assert_close(got.double(), _reference(*_inputs(1)), rtol=1e-5, atol=1e-5)


def test_another_configuration_or_program_is_compiled(cache):
    _compile_all(_jit().lower(*_inputs()))
    keys = {p.parent.name for p in (cache / "programs").rglob("*.bin")}
    with schedule.options(overlap=False):  # another pipeline: another key
        _compile_all(_jit().lower(*_inputs()))
    x, w1, w2 = _inputs()
    _compile_all(_jit().lower(x[:4], w1, w2))  # another shape: another program
    assert len({p.parent.name for p in (cache / "programs").rglob("*.bin")} - keys) == 2


def test_the_key_covers_the_whole_configuration(cache):
    """Configurations that differ only in the numerics mode, or only in the remat policy
    (neither changes the pass pipeline of this program), are cached apart."""
    base = _jit().lower(*_inputs())
    with numerics.mode_of("deterministic"):
        deterministic = _jit().lower(*_inputs())
    remat = ProgramCache(base.module, base.config.replace(remat=RematPolicy("matmuls")))
    assert deterministic.config == base.config.replace(numerics="deterministic")
    assert deterministic.pipeline() == base.pipeline()
    digests = {base.digest(), deterministic.digest(), bytes.fromhex(remat.key)}
    assert len(digests) == 3
    for lowered in (base, deterministic):
        _compile_all(lowered)
    assert len({p.parent.name for p in (cache / "programs").rglob("*.bin")}) == 2


@pytest.mark.filterwarnings("ignore:Tessera's program cache ignores")  # once per process
@pytest.mark.parametrize("damage", ["flip", "truncate", "empty"])
def test_a_damaged_file_is_recompiled_not_loaded(cache, damage):
    first = _compile_all(_jit().lower(*_inputs()))
    (path,) = (cache / "programs").rglob("schedule.bin")
    data = path.read_bytes()
    if damage == "flip":
        data = data[:-10] + bytes([data[-10] ^ 0xFF]) + data[-9:]
    elif damage == "truncate":
        data = data[: len(data) // 2]
    else:
        data = b""
    path.write_bytes(data)
    lowered = _jit().lower(*_inputs())
    assert str(lowered.module_at("schedule")) == first["schedule"]
    assert path.read_bytes() != data  # stored again, intact


def test_an_unsafe_directory_is_not_used(cache):
    cache.mkdir(parents=True)
    os.chmod(cache, 0o777)
    with pytest.warns(UserWarning, match="writable by group or others"):
        _compile_all(_jit().lower(*_inputs()))
    assert not (cache / "programs").exists()


def test_a_second_process_reads_the_first_ones_program(cache):
    """Two processes (as two ranks of a job would) trace the same program: the second
    compiles nothing."""
    script = textwrap.dedent(
        """
        import sys, torch
        sys.path.insert(0, sys.argv[1])
        import test_program_cache as t
        from tessera import program
        if sys.argv[2] == "second":
            def no_compiling(*a, **k):
                raise SystemExit("compiled again")
            program.run_stage = no_compiling
        got = t._jit()(*t._inputs(1))
        err = (got.double() - t._reference(*t._inputs(1))).abs().max().item()
        print(f"error {err:.2e}")
        """
    )
    env = {**os.environ, "TESSERA_CACHE_DIR": str(cache), "TESSERA_PROGRAM_CACHE": "1"}
    here = os.path.dirname(__file__)
    for which in ("first", "second"):
        done = subprocess.run(
            [sys.executable, "-c", script, here, which],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        assert float(done.stdout.split()[-1]) < 1e-5


def test_triton_sources_are_read_not_emitted_again(cache, monkeypatch):
    def small(x, w):
        return op.softmax(op.gelu(x @ w), axis=-1)

    x, w = torch.randn(8, 16), torch.randn(16, 32)
    sources = ts.jit(small, kernels="triton").lower(x, w).triton_source()
    assert len(list((cache / "programs").rglob("triton.bin"))) == 1
    from tessera.backends.triton import compiled_kernel, emit

    def no_emitting(*args, **kwargs):
        raise AssertionError("a cached source was emitted again")

    monkeypatch.setattr(emit, "emit_module", no_emitting)
    monkeypatch.setattr(compiled_kernel, "emit_kernel", no_emitting)
    lowered = ts.jit(small, kernels="triton").lower(x, w)
    assert lowered.triton_source() == sources
    want = torch.softmax(torch.nn.functional.gelu(x.double() @ w.double()), dim=-1)
    torch.testing.assert_close(lowered(x, w).double(), want, rtol=1e-4, atol=1e-5)
