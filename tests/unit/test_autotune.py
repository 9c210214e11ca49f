"""Autotuning logic (CPU only): configuration spaces, candidate selection and caching, and
the interpreter's fixed default configuration. Timing is faked; the GPU path is measured
by ``benchmarks/kernels.py``."""

from __future__ import annotations

import pytest
import torch
from xdsl.dialects.builtin import StringAttr

import tessera as ts
import tessera.dist as dist
from tessera import op
from tessera.backends import launch_plan, schedule_runner
from tessera.backends.triton import autotune
from tessera.backends.triton.runtime import CompiledKernel, TritonKernels
from tessera.codegen.kernels import DEFAULT, BlockConfig, kernel_class
from tessera.errors import TesseraError
from tessera.ir import schedule


def _kernel(fn, *args):
    lowered = ts.jit(fn).lower(*args)
    module = lowered.module_at("schedule")
    (kernel,) = [k for k in module.walk() if isinstance(k, schedule.KernelOp)]
    return lowered, kernel


def _matmul(a, b):
    return a @ b


def _softmax(x):
    return op.softmax(x, axis=-1)


def _chain(x, a):
    return op.gelu(x * a + 1.0)


CASES = {
    "matmul": (_matmul, (torch.randn(96, 200).bfloat16(), torch.randn(200, 130).bfloat16())),
    "reduction": (_softmax, (torch.randn(50, 1000),)),
    "pointwise": (_chain, (torch.randn(300, 70), torch.randn(70))),
}


@pytest.fixture(autouse=True)
def _fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    autotune.clear_cache()
    yield
    autotune.clear_cache()


@pytest.mark.parametrize("kind", sorted(CASES))
def test_config_space_lowers(kind):
    fn, args = CASES[kind]
    _, kernel = _kernel(fn, *args)
    assert kernel_class(kernel) == kind
    space = autotune.config_space(kernel)
    assert space and all(isinstance(c, BlockConfig) for c in space)
    for config in space:
        lowered = autotune.lower(kernel, config)
        lowered.verify()
        assert lowered.num_warps.value.data == config.num_warps


def test_matmul_space_fits_shared_memory():
    _, kernel = _kernel(_matmul, torch.randn(64, 64), torch.randn(64, 64))  # f32: 4 bytes
    for c in autotune.config_space(kernel):
        assert c.num_stages * (c.block_m * c.block_k + c.block_k * c.block_n) * 4 <= 232448
    small = autotune.config_space(kernel, shared_memory=64 * 1024)
    assert small and len(small) < len(autotune.config_space(kernel))


def test_pointwise_and_reduction_threads_hold_a_few_elements():
    _, kernel = _kernel(_chain, *CASES["pointwise"][1])
    for c in autotune.config_space(kernel):
        assert 4 <= c.block // (32 * c.num_warps) <= 16
    _, kernel = _kernel(_softmax, torch.randn(64, 4096))
    rows = {c.row_elements // 4096 for c in autotune.config_space(kernel)}
    assert rows == {1, 2, 4}  # at most 16384 elements per program


def test_attention_space():
    configs = {(m, n, w, s) for m in (64, 128) for n in (64, 128) for w in (4, 8) for s in (2, 3)}
    assert set(autotune.ATTENTION_BLOCKS) == {64, 128} and len(configs) == 16


@pytest.mark.parametrize("kind", sorted(CASES))
def test_candidates_are_distinct_and_start_with_default(kind):
    fn, args = CASES[kind]
    _, kernel = _kernel(fn, *args)
    found = autotune.candidates(kernel)
    assert found[0][0] == DEFAULT
    keys = [(c.source, c.num_warps, c.num_stages, c.grid) for _, c in found]
    assert len(keys) == len(set(keys))
    assert found[0][1].source == CompiledKernel.from_tile(autotune.lower(kernel)).source


def test_choose_keeps_fastest_and_skips_failures():
    _, kernel = _kernel(CASES["matmul"][0], *CASES["matmul"][1])
    seen = []

    def measure(compiled):
        seen.append(compiled)
        if compiled.num_stages == 3:
            raise RuntimeError("out of resources: shared memory")
        return float(compiled.grid[0])  # fewest programs (largest tiles) fastest

    tuning = autotune.choose(kernel, "fake GPU", measure)
    assert tuning.failed and all(c.num_stages == 3 for c, _ in tuning.failed)
    assert tuning.compiled.num_stages != 3
    fastest = min(c.grid[0] for c in seen if c.num_stages != 3)
    assert tuning.compiled.grid[0] == fastest
    assert [ms for _, ms in tuning.timings] == sorted(ms for _, ms in tuning.timings)


def test_choice_is_cached_per_source_and_device():
    _, kernel = _kernel(CASES["reduction"][0], *CASES["reduction"][1])
    calls = []

    def measure(compiled):
        calls.append(compiled)
        return float(compiled.num_warps)

    first = autotune.choose(kernel, "GPU A", measure)
    n = len(calls)
    assert autotune.choose(kernel, "GPU A", measure) is first and len(calls) == n
    _, same = _kernel(
        CASES["reduction"][0], *CASES["reduction"][1]
    )  # traced again: same source, same choice
    assert autotune.choose(same, "GPU A", measure) is first and len(calls) == n
    assert autotune.cached(kernel, "GPU A") is first
    autotune.choose(kernel, "GPU B", measure)  # another device tunes again
    assert len(calls) == 2 * n
    _, other = _kernel(_softmax, torch.randn(50, 1000).bfloat16())  # other types: own entry
    assert autotune.cached(other, "GPU A") is None


def test_choice_persists_on_disk_for_later_processes(tmp_path):
    """A choice is written under the cache directory; after the in-memory cache is gone
    (a new process), the same kernel, even under another name, reads it instead of tuning.
    A file that holds no valid configuration is ignored and tuned again."""
    fn, args = CASES["reduction"]
    _, kernel = _kernel(fn, *args)
    calls = []

    def measure(compiled):
        calls.append(compiled)
        return float(compiled.num_warps)

    first = autotune.choose(kernel, "GPU A", measure)
    (stored,) = (tmp_path / "autotune").glob("*.json")
    n = len(calls)
    autotune.clear_cache()
    renamed = kernel.clone()
    renamed.properties["sym_name"] = StringAttr("another_name")
    again = autotune.choose(renamed, "GPU A", measure)
    assert len(calls) == n and again.config == first.config
    assert again.compiled.num_warps == first.compiled.num_warps
    for corrupt in ('{"config": {"block": -1}}', "not json", '{"config": {"block": "1e9"}}'):
        stored.write_text(corrupt)
        autotune.clear_cache()
        assert autotune.choose(kernel, "GPU A", measure).config == first.config
        assert len(calls) > n
        n = len(calls)


def test_no_candidate_compiles():
    _, kernel = _kernel(CASES["pointwise"][0], *CASES["pointwise"][1])

    def measure(compiled):
        raise RuntimeError("no")

    with pytest.raises(TesseraError, match="no configuration compiled"):
        autotune.choose(kernel, "fake GPU", measure)


def test_interpreter_runs_the_default_config(monkeypatch):
    def no_tuning(*args, **kwargs):
        raise AssertionError("the interpreter must not autotune")

    monkeypatch.setattr(autotune, "tune", no_tuning)
    fn, args = CASES["reduction"]
    lowered, kernel = _kernel(fn, *args)
    from xdsl.context import Context

    from tessera.passes.lower_schedule_to_tile import LowerScheduleToTilePass

    module = lowered.module_at("schedule").clone()
    LowerScheduleToTilePass().apply(Context(), module)
    runner = TritonKernels(module, autotune=True)
    mesh = dist.mesh({"d": 1})
    compiled, _, _ = runner.prepare(kernel, list(args), schedule_runner.KernelContext(mesh, 0))
    assert compiled.source == CompiledKernel.from_tile(autotune.lower(kernel)).source
    (out,) = launch_plan.run_virtual(module, lowered.name, mesh, [list(args)], runner)[0]
    torch.testing.assert_close(out, torch.softmax(args[0], dim=-1))
    assert autotune.cached(kernel, "cpu") is None


def test_autotune_switch(monkeypatch):
    monkeypatch.setenv("TESSERA_AUTOTUNE", "0")
    assert not autotune.enabled()
    monkeypatch.setenv("TESSERA_AUTOTUNE", "1")
    assert autotune.enabled()
