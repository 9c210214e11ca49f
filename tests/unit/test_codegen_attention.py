"""Flash attention: the softmax(score(q kᵀ)) v pattern becomes one kernel (``codegen.attention``)
whose Triton source (run in Triton's interpreter on a CPU) agrees with torch's
scaled_dot_product_attention computed in float64."""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from xdsl.dialects.builtin import BFloat16Type

import tessera as ts
from tessera import op
from tessera.codegen.attention import find_attention, match_attention
from tessera.codegen.kernels import kernel_class
from tessera.ir import graph, schedule, tile

ROOT = Path(__file__).resolve().parents[2]
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 1e-2}


def attention(q, k, v):
    scores = q @ op.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    return op.softmax(scores, axis=-1) @ v


def causal_attention(q, k, v):
    scores = q @ op.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    mask = np.tril(np.ones((q.shape[-2], k.shape[-2]), dtype=bool))
    return op.softmax(op.where(mask, scores, -1e9), axis=-1) @ v


def masked_attention(q, k, v, mask):  # a boolean mask input (True: attend)
    scores = q @ op.swapaxes(k, -1, -2) * (1 / math.sqrt(q.shape[-1]))
    return op.softmax(op.where(mask, scores, float("-inf")), axis=-1) @ v


def biased_attention(q, k, v, bias):  # an additive bias input
    scores = q @ op.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    return op.softmax(scores + bias, axis=-1) @ v


def attention_kt(q, kt, v):  # kᵀ given as an input: no transpose in the pattern
    return op.softmax(q @ kt * 0.25, axis=-1) @ v


def softmax_used_twice(q, k, v):
    p = op.softmax(q @ op.swapaxes(k, -1, -2), axis=-1)
    return p @ v, p


def _triton(fn: Callable) -> Callable:
    """``fn`` compiled to generated Triton kernels (the interpreter on a CPU)."""
    return ts.jit(fn, kernels="triton")


def _kernels(fn: Callable, *args: torch.Tensor) -> dict[str, str]:
    module = ts.jit(fn).lower(*args).module_at("schedule")
    return {
        k.kernel_name: kernel_class(k) for k in module.walk() if isinstance(k, schedule.KernelOp)
    }


def _inputs(
    batch: tuple[int, ...], tq: int, tk: int, d: int, dtype: torch.dtype, dv: int | None = None
) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(tq * 1000 + tk * 10 + d)
    shapes = ((*batch, tq, d), (*batch, tk, d), (*batch, tk, dv or d))
    return tuple(torch.randn(s, generator=g).to(dtype) for s in shapes)


def _check(out: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype = torch.float32) -> None:
    assert out.dtype == dtype
    tolerance = TOLERANCE[dtype]
    torch.testing.assert_close(out.double(), expected, rtol=tolerance, atol=tolerance)


def _sdpa(q, k, v, **kwargs) -> torch.Tensor:
    return F.scaled_dot_product_attention(q.double(), k.double(), v.double(), **kwargs)


# --- numerics against torch --------------------------------------------------------------------


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize(
    ("batch", "t", "d"), [((), 1, 16), ((2,), 7, 24), ((2, 2), 33, 16), ((1, 2), 50, 64)]
)
def test_f32(causal: bool, batch: tuple[int, ...], t: int, d: int) -> None:
    q, k, v = _inputs(batch, t, t, d, torch.float32)
    fn = causal_attention if causal else attention
    assert list(_kernels(fn, q, k, v).values()) == ["attention"]
    _check(_triton(fn)(q, k, v), _sdpa(q, k, v, is_causal=causal))


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize(("batch", "t", "d"), [((2,), 33, 64), ((3,), 20, 24)])
def test_bf16(causal: bool, batch: tuple[int, ...], t: int, d: int) -> None:
    q, k, v = _inputs(batch, t, t, d, torch.bfloat16)
    fn = causal_attention if causal else attention
    assert list(_kernels(fn, q, k, v).values()) == ["attention"]
    module = ts.jit(fn).lower(q, k, v).module_at("tile")
    dots = [o for o in module.walk() if isinstance(o, tile.DotOp)]
    # two per key loop; causal: one loop below the diagonal (no mask), one on it
    assert len(dots) == (4 if causal else 2)
    assert all(tile.element_type(o.a.type) == BFloat16Type() for o in dots)  # tensor cores
    _check(_triton(fn)(q, k, v), _sdpa(q, k, v, is_causal=causal), torch.bfloat16)


@pytest.mark.parametrize(("tq", "tk", "d", "dv"), [(7, 50, 16, 24), (40, 3, 24, 16)])
def test_queries_and_keys_differ(tq: int, tk: int, d: int, dv: int) -> None:
    q, k, v = _inputs((2,), tq, tk, d, torch.float32, dv)
    _check(_triton(attention)(q, k, v), _sdpa(q, k, v))


def test_causal_with_fewer_queries_than_keys() -> None:
    # np.tril(ones((Tq, Tk))): query i sees keys j <= i, as torch's is_causal
    q, k, v = _inputs((2,), 20, 45, 16, torch.float32)
    _check(_triton(causal_attention)(q, k, v), _sdpa(q, k, v, is_causal=True))


def test_boolean_mask_input_with_fully_masked_rows() -> None:
    q, k, v = _inputs((2,), 19, 37, 16, torch.float32)
    mask = torch.rand(19, 37, generator=torch.Generator().manual_seed(3)) > 0.4
    mask[4] = False  # no visible key: 0, as torch (the reference's softmax gives NaN)
    mask[5, 33:] = False  # only keys of the first block are visible
    mask[6, :32] = False  # only keys of the last block: the first block's max is -inf
    mask[6, 35] = True
    assert list(_kernels(masked_attention, q, k, v, mask).values()) == ["attention"]
    out = _triton(masked_attention)(q, k, v, mask)
    assert not out.isnan().any()
    _check(out, _sdpa(q, k, v, attn_mask=mask))


def test_additive_bias_broadcast_over_batch() -> None:
    q, k, v = _inputs((2, 2), 17, 21, 16, torch.float32)
    bias = torch.randn(2, 1, 17, 21, generator=torch.Generator().manual_seed(4))
    assert list(_kernels(biased_attention, q, k, v, bias).values()) == ["attention"]
    _check(_triton(biased_attention)(q, k, v, bias), _sdpa(q, k, v, attn_mask=bias.double()))


def test_additive_causal_mask_constant() -> None:
    def fn(q, k, v):
        t = q.shape[-2]
        mask = np.where(np.tril(np.ones((t, t), dtype=bool)), 0.0, -np.inf).astype(np.float32)
        return op.softmax(q @ op.swapaxes(k, -1, -2) * 0.25 + mask, axis=-1) @ v

    q, k, v = _inputs((2,), 40, 40, 16, torch.float32)
    kernel = _schedule_kernel(fn, q, k, v)
    found = match_attention(kernel)
    assert found is not None and found.causal_mask is not None
    assert found.causal_mask.additive and found.causal_mask.skip
    _check(_triton(fn)(q, k, v), _sdpa(q, k, v, is_causal=True, scale=0.25))


def test_pre_transposed_k_and_broadcast_batch() -> None:
    g = torch.Generator().manual_seed(5)
    q = torch.randn(2, 3, 9, 16, generator=g)
    kt = torch.randn(3, 16, 21, generator=g)  # broadcast over q's first batch dim
    v = torch.randn(1, 3, 21, 16, generator=g)
    kernel = _schedule_kernel(attention_kt, q, kt, v)
    found = match_attention(kernel)
    assert found is not None and found.k_transposed and not found.causal
    expected = torch.softmax(q.double() @ kt.double() * 0.25, dim=-1) @ v.double()
    _check(_triton(attention_kt)(q, kt, v), expected)


# --- the pattern ---------------------------------------------------------------------------------


def _schedule_kernel(fn: Callable, *args: torch.Tensor) -> schedule.KernelOp:
    module = ts.jit(fn).lower(*args).module_at("schedule")
    kernels = [k for k in module.walk() if isinstance(k, schedule.KernelOp)]
    attention_kernels = [k for k in kernels if kernel_class(k) == "attention"]
    assert len(attention_kernels) == 1, [k.kernel_name for k in kernels]
    return attention_kernels[0]


def test_match_describes_the_pattern() -> None:
    q, k, v = _inputs((2,), 8, 8, 16, torch.float32)
    kernel = _schedule_kernel(causal_attention, q, k, v)
    assert kernel.kernel_name.endswith("_attention")
    found = match_attention(kernel)
    assert found is not None
    assert not found.k_transposed
    assert [type(o) for o in found.score_ops] == [graph.DivOp, graph.SelectOp]
    assert found.causal and found.causal_mask is not None and found.causal_mask.skip
    assert [found.q.name_hint, found.k.name_hint, found.v.name_hint] == ["q", "k", "v"]
    assert found.output is kernel.body.block.last_op.operands[0]
    # not causal: no mask
    found = match_attention(_schedule_kernel(attention, q, k, v))
    assert found is not None and not found.causal


def test_causal_tile_kernel_stops_at_the_diagonal() -> None:
    q, k, v = _inputs((2,), 40, 40, 16, torch.float32)
    module = ts.jit(causal_attention).lower(q, k, v).module_at("tile")
    (kernel,) = [k for k in module.walk() if isinstance(k, tile.KernelOp)]
    names = [o.name for o in kernel.walk()]
    assert names.count("tile.dot") == 4  # a loop below the diagonal, one on it
    assert names.count("scf.for") == 2 and "arith.minsi" in names  # upper bound min(Tk, (pid+1)*BM)
    loads = [o for o in kernel.walk() if isinstance(o, tile.LoadOp)]
    assert len(loads) == 5  # q, then k and v in each loop: the mask constant is not loaded
    assert all(str(load.ptr.name_hint).startswith("in") for load in loads)
    assert kernel.grid_size == (2, 2, 1)  # cdiv(40, 32) query blocks, batch 2


def test_mask_that_is_not_tril_is_loaded() -> None:
    def fn(q, k, v):
        mask = np.triu(np.ones((q.shape[-2], k.shape[-2]), dtype=bool))
        return op.softmax(op.where(mask, q @ op.swapaxes(k, -1, -2), -1e9), axis=-1) @ v

    q, k, v = _inputs((2,), 12, 12, 16, torch.float32)
    found = match_attention(_schedule_kernel(fn, q, k, v))
    assert found is not None and not found.causal
    mask = torch.from_numpy(np.triu(np.ones((12, 12), dtype=bool)))
    _check(_triton(fn)(q, k, v), _sdpa(q, k, v, attn_mask=mask, scale=1.0))


def test_softmax_with_two_uses_is_not_attention() -> None:
    q, k, v = _inputs((2,), 8, 8, 16, torch.float32)
    kinds = _kernels(softmax_used_twice, q, k, v)
    assert "attention" not in kinds.values()
    out, p = _triton(softmax_used_twice)(q, k, v)
    ref_out, ref_p = ts.jit(softmax_used_twice, kernels="reference")(q, k, v)
    torch.testing.assert_close(out, ref_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(p, ref_p, rtol=1e-5, atol=1e-5)


def test_scores_with_two_uses_or_wrong_axis_are_not_attention() -> None:
    def scores_returned(q, k, v):
        s = q @ op.swapaxes(k, -1, -2)
        return op.softmax(s, axis=-1) @ v, s

    def softmax_over_queries(q, k, v):
        return op.softmax(q @ op.swapaxes(k, -1, -2), axis=-2) @ v

    q, k, v = _inputs((2,), 8, 8, 16, torch.float32)
    for fn in (scores_returned, softmax_over_queries):
        module = ts.jit(fn).lower(q, k, v).module_at("partitioned")
        function = next(iter(module.ops))
        assert find_attention(list(function.body.block.ops)) == []
        assert "attention" not in _kernels(fn, q, k, v).values()


def test_find_attention_returns_the_ops_in_program_order() -> None:
    q, k, v = _inputs((2,), 8, 8, 16, torch.float32)
    module = ts.jit(causal_attention).lower(q, k, v).module_at("partitioned")
    ops = list(next(iter(module.ops)).body.block.ops)
    (group,) = find_attention(ops)
    assert [o.name for o in group] == [
        "graph.transpose", "graph.matmul", "graph.div", "graph.select", "graph.softmax",
        "graph.matmul",
    ]  # fmt: skip
    assert sorted(group, key=ops.index) == group


# --- the GPT block example -------------------------------------------------------------------------


def _gpt_example():
    spec = importlib.util.spec_from_file_location(
        "example_gpt_block", ROOT / "examples/gpt_block.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gpt_block_uses_flash_attention() -> None:
    gpt = _gpt_example()
    params = gpt.init_params(32)
    x = torch.randn((2, 8, 32), generator=torch.Generator().manual_seed(1))
    lowered = gpt.gpt_block.lower(x, params, 2)
    kernels = [k for k in lowered.module_at("schedule").walk() if isinstance(k, schedule.KernelOp)]
    assert [kernel_class(k) for k in kernels].count("attention") == 1
    assert not any(kernel_class(k) == "reduction" and "softmax" in k.kernel_name for k in kernels)
    out = _triton(gpt.gpt_block.fn)(x, params, 2)
    reference = ts.jit(gpt.gpt_block.fn, kernels="reference")(x, params, 2)
    torch.testing.assert_close(out, reference, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out, gpt.torch_gpt_block(x, params, 2), rtol=1e-4, atol=1e-4)
