"""FP8 dots: an fp8 matmul's generated Triton kernel converts its operand tiles (which hold
e4m3 values exactly) to ``tl.float8e4nv`` and ``tl.dot``s them into an f32 accumulator,
the scales applied in its epilogue (``graph.matmul``'s ``fp8`` property; on by default on
GPUs of compute capability 8.9 and later, forced here with ``TESSERA_FP8_DOTS=on``).

These run in Triton's interpreter on the CPU, which executes fp8 dots (Triton 3.9: the
tiles are cast to float8, multiplied exactly and summed in f32). Tolerances: fp8 products
are exact in f32 and both sides sum them in f32, so against torch's emulation
``(fp8(a/sa) @ fp8(b/sb)) · (sa·sb)`` results differ only in summation order (1e-6 of
the largest sum); against quantise–dequantise then multiply (the dequantised operands and
products each rounded once more in f32) by 1e-5."""

from __future__ import annotations

import pytest
import torch
from test_fp8 import E4M3, init, make_step, qdq, torch_grads

import tessera as ts
from tessera import op, optim
from tessera.dtypes import DType
from tessera.errors import ShapeError
from tessera.ir import graph as ir
from tessera.ir.abstract import AbstractTensor
from tessera.precision import fp8_dots


def emulate(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """torch: e4m3 values of both operands (current per-tensor scales), multiplied in f32
    and rescaled."""
    sa, sb = a.abs().max() / 448.0, b.abs().max() / 448.0
    qa, qb = (a / sa).to(torch.float8_e4m3fn), (b / sb).to(torch.float8_e4m3fn)
    return (qa.float() @ qb.float()) * (sa * sb)


def fp8_source(kernels: dict[str, str]) -> list[str]:
    return [name for name, source in kernels.items() if "tl.float8e4nv" in source]


def test_fp8_dots_are_off_in_the_interpreter_unless_forced(monkeypatch) -> None:
    """``auto``: only a GPU of compute capability 8.9 or later (not Triton's interpreter)."""
    monkeypatch.delenv("TESSERA_FP8_DOTS", raising=False)
    assert not fp8_dots()  # these tests run interpreted (or on a GPU with TRITON_INTERPRET=1)
    monkeypatch.setenv("TESSERA_FP8_DOTS", "on")
    assert fp8_dots()
    monkeypatch.setenv("TESSERA_FP8_DOTS", "off")
    assert not fp8_dots()


@pytest.mark.parametrize("dots", ["on", "off"])
def test_fp8_matmul_kernel_dots_in_fp8(monkeypatch, dots: str) -> None:
    """The matmul kernel (K looped with a masked tail, edge tiles masked) against torch's
    emulation; with fp8 dots its source casts both tiles to ``tl.float8e4nv`` before
    ``tl.dot`` (no IEEE f32 dot), without them it dots f32 tiles."""
    monkeypatch.setenv("TESSERA_FP8_DOTS", dots)
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(48, 80, generator=g) * 3, torch.randn(80, 40, generator=g) / 5
    fn = ts.jit(lambda x, y: op.fp8_matmul(x, y), kernels="triton")
    got = fn(a, b)
    want = emulate(a, b)
    largest = want.abs().max().item()
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6 * largest)
    torch.testing.assert_close(got, qdq(a, E4M3) @ qdq(b, E4M3), rtol=0, atol=1e-5 * largest)
    lowered = fn.lower(a, b)
    matmuls = [o for o in lowered.module_at("traced").walk() if isinstance(o, ir.MatmulOp)]
    assert [m.attrs().get("fp8") for m in matmuls] == (["e4m3"] if dots == "on" else [None])
    sources = lowered.triton_source()
    [matmul] = [s for s in sources.values() if "tl.dot(" in s]
    if dots == "on":
        assert matmul.count(".to(tl.float8e4nv)") == 2 and "ieee" not in matmul
    else:
        assert not fp8_source(sources) and 'input_precision="ieee"' in matmul


def test_fp8_training_step_with_fp8_dots_matches_torch(monkeypatch) -> None:
    """One SGD step (lr 1) with fp8 dots in the forward matmuls (the backward's stay f32
    dots of the e5m2 gradient and the e4m3 operands): the loss as torch's emulation's,
    the gradients as in ``test_fp8`` (a few e5m2 roundings flip with the f32 sums' last
    bits), and the loss bit-close to the same step with f32 dots."""
    params, x, y = init()
    want = torch_grads(params, x, y)
    losses = {}
    for dots in ("off", "on"):
        monkeypatch.setenv("TESSERA_FP8_DOTS", dots)
        step = make_step("fp8", "triton", optim.SGD(lr=1.0))
        state = step.init({k: v.clone() for k, v in params.items()})
        if dots == "on":
            sources = step.lower(state, x, y).triton_source()
            assert len(fp8_source(sources)) == 2  # the two forward matmuls
        losses[dots] = step(state, x, y)["loss"].item()
        for name, value in params.items():
            got, largest = value - state.params[name], want[name].abs().max()
            assert ((got - want[name]).abs() <= 1e-5 * largest).float().mean() >= 0.85
    assert losses["on"] == pytest.approx(losses["off"], rel=1e-6)


def test_an_fp8_matmul_needs_float_operands_and_a_format() -> None:
    f32, i32 = AbstractTensor((4, 4), DType.f32), AbstractTensor((4, 4), DType.i32)
    assert ir.MatmulOp.infer(f32, f32, fp8="e4m3")[0] == f32
    for operand, fmt in ((f32, "e3m4"), (i32, "e4m3")):
        with pytest.raises(ShapeError, match="fp8 matmul"):
            ir.MatmulOp.infer(operand, operand, fp8=fmt)
