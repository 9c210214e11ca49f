"""The dtype policy (README "Dtypes"): float64 is computed in float64 end to end, integer
matmuls are exact, bool matmuls are rejected at trace time, Python floats are weakly typed.

float64 results are compared with torch in float64 within rtol = atol = 1e-12 (an f32
computation is off by ~1e-7: ``test_the_tolerance_tells_f64_from_f32`` checks that the
tolerance would catch it), in every kernel class, with the generated Triton kernels (in
Triton's interpreter on a CPU) and the reference executor.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import tessera as ts
from tessera import dist, graph, op, optim

F64_TOLERANCE = {"rtol": 1e-12, "atol": 1e-12}
SOURCE = Path(__file__).read_text().splitlines()
rng = torch.Generator().manual_seed(0)


def at(marker: str) -> str:
    """``file:line`` of the line of this file ending in ``# <- marker``."""
    (line,) = [i for i, text in enumerate(SOURCE, 1) if text.endswith(f"# <- {marker}")]
    return f"{__file__}:{line}"


def f64(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=rng, dtype=torch.float64)


def attention(q, k, v):
    return op.softmax(q @ op.swapaxes(k, -1, -2) / 3) @ v


# name: (tessera function, torch function, arguments); the sizes cross block edges
CASES = {
    "pointwise": (lambda x, y: op.gelu(x) * 2.5 + op.exp(y) / (1 + op.abs(x)) ** 1.5,
                  lambda x, y: F.gelu(x) * 2.5 + torch.exp(y) / (1 + x.abs()) ** 1.5,
                  lambda: (f64(5, 37), f64(37))),
    "tanh gelu, sigmoid, erf, rsqrt": (
        lambda x: op.gelu(x, approximate="tanh") + op.sigmoid(x) + op.erf(x) + op.rsqrt(x * x + 1),
        lambda x: F.gelu(x, approximate="tanh") + torch.sigmoid(x) + torch.erf(x) + torch.rsqrt(x * x + 1),
        lambda: (f64(7, 9),)),
    "f64 scalar constant": (
        lambda x: op.power(op.full((), 0.9, "float64"), x) + op.constant(np.float64(1 / 3)),
        lambda x: torch.pow(torch.tensor(0.9, dtype=torch.float64), x) + 1 / 3,
        lambda: (f64(6),),
    ),
    "layout": (lambda x: op.concat([x.T, x.T[::2]], axis=0).reshape(-1, 5) * 3,
               lambda x: torch.cat([x.T, x.T[::2]]).reshape(-1, 5) * 3, lambda: (f64(5, 8),)),
    "row sum over 300": (lambda x: op.sum(x, axis=1), lambda x: x.sum(1), lambda: (f64(6, 300),)),
    "mean of all": (op.mean, torch.mean, lambda: (f64(40, 70),)),
    "softmax": (op.softmax, lambda x: x.softmax(-1), lambda: (f64(5, 70),)),
    "log_softmax": (op.log_softmax, lambda x: x.log_softmax(-1), lambda: (f64(5, 70),)),
    "layer_norm": (op.layer_norm, lambda x: F.layer_norm(x, (70,)), lambda: (f64(5, 70),)),
    "cross_entropy": (op.cross_entropy, F.cross_entropy,
                      lambda: (f64(6, 11), torch.randint(0, 11, (6,), generator=rng))),
    "matmul, k = 70": (lambda a, b: a @ b, lambda a, b: a @ b, lambda: (f64(37, 70), f64(70, 45))),
    "matmul with transposed operand and epilogue": (
        lambda a, b, c: op.tanh(a @ b.T + c), lambda a, b, c: torch.tanh(a @ b.T + c),
        lambda: (f64(37, 70), f64(45, 70), f64(45))),
    "batched matmul": (lambda a, b: a @ b, lambda a, b: a @ b,
                       lambda: (f64(3, 17, 20), f64(3, 20, 9))),
    "attention": (attention, lambda q, k, v: torch.softmax(q @ k.transpose(-1, -2) / 3, -1) @ v,
                  lambda: (f64(2, 40, 16), f64(2, 50, 16), f64(2, 50, 16))),
    "embedding": (op.embedding, F.embedding,
                  lambda: (torch.randint(0, 5, (7,), generator=rng), f64(5, 3))),
}  # fmt: skip


@pytest.mark.parametrize("kernels", ["triton", "reference"])
@pytest.mark.parametrize("name", list(CASES))
def test_float64_is_computed_in_float64(name, kernels):
    fn, reference, make_args = CASES[name]
    args = make_args()
    result = ts.jit(fn, kernels=kernels)(*args)
    assert result.dtype == torch.float64
    torch.testing.assert_close(result, reference(*args), **F64_TOLERANCE)


def test_the_tolerance_tells_f64_from_f32():
    """The same matmul computed in f32 misses the f64 tolerance by orders of magnitude."""
    a, b = f64(37, 70), f64(70, 45)
    in_f32 = ts.jit(lambda x, y: x @ y, kernels="triton")(a.float(), b.float())
    with pytest.raises(AssertionError):
        torch.testing.assert_close(in_f32.double(), a @ b, **F64_TOLERANCE)


def test_float64_program_is_float64_in_every_stage():
    lowered = ts.jit(lambda a, b: op.softmax(a @ b)).lower(f64(4, 8), f64(8, 16))
    for stage in ("graph", "partitioned", "tile"):
        text = lowered.as_text(stage)
        assert "f64" in text and "f32" not in text, stage
    assert "tl.float64" in "".join(lowered.triton_source().values())


def test_float64_gradient():
    def loss(w, x):
        return op.sum(op.tanh(x @ w) ** 2)

    w, x = f64(7, 3), f64(5, 7)
    grad = ts.jit(ts.grad(loss), kernels="triton")(w, x)
    w_ref = w.clone().requires_grad_()
    (torch.tanh(x @ w_ref) ** 2).sum().backward()
    assert grad.dtype == torch.float64
    torch.testing.assert_close(grad, w_ref.grad, **F64_TOLERANCE)


def test_float64_on_a_mesh():
    mesh = dist.Mesh(axes=["dp", "tp"], shape=(2, 2))
    rows = dist.ShardSpec(partition=(0,), mesh_axes=("dp",))
    cols = dist.ShardSpec(partition=(1,), mesh_axes=("tp",))
    f = ts.jit(lambda x, w: op.softmax(x @ w), mesh=mesh, in_shardings=(rows, cols),
               kernels="triton")  # fmt: skip
    x, w = f64(8, 6), f64(6, 10)
    torch.testing.assert_close(f(x, w), torch.softmax(x @ w, -1), **F64_TOLERANCE)


OPTIMIZERS = {
    "SGD": (optim.SGD(lr=0.1, momentum=0.9), lambda w: torch.optim.SGD([w], lr=0.1, momentum=0.9)),
    "AdamW": (optim.AdamW(lr=0.01), lambda w: torch.optim.AdamW([w], lr=0.01)),
}


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_float64_training_step_matches_torch(name):
    optimizer, torch_optimizer = OPTIMIZERS[name]
    w0 = f64(6, 4)
    x, y = f64(8, 6), f64(8, 4)

    @graph.training_step(optimizer=optimizer, kernels="triton")
    def step(params, x, y):
        loss = op.mean((op.tanh(x @ params["w"]) - y) ** 2)
        return graph.backward(loss), {"loss": loss}

    state = step.init({"w": w0.clone()})
    losses = [step(state, x, y)["loss"] for _ in range(2)]
    w = w0.clone().requires_grad_()
    reference = torch_optimizer(w)
    for loss in losses:
        reference.zero_grad()
        expected = ((torch.tanh(x @ w) - y) ** 2).mean()
        expected.backward()
        reference.step()
        assert loss.dtype == torch.float64
        torch.testing.assert_close(loss, expected.detach(), **F64_TOLERANCE)
    torch.testing.assert_close(state.params["w"], w.detach(), **F64_TOLERANCE)


def test_numpy_float64_in_float64_out():
    x = np.random.default_rng(0).standard_normal((3, 4))
    result = ts.jit(lambda x: op.exp(x) * 2, kernels="triton")(x)
    assert isinstance(result, np.ndarray) and result.dtype == np.float64
    np.testing.assert_allclose(result, np.exp(x) * 2, rtol=1e-12, atol=1e-12)


def test_float32_with_float64_promotes_to_float64_as_in_torch():
    a, b = torch.randn(3, generator=rng), f64(3)
    result = ts.jit(lambda a, b: a * b)(a, b)
    assert result.dtype == (a * b).dtype == torch.float64
    torch.testing.assert_close(result, a * b, **F64_TOLERANCE)


@pytest.mark.parametrize(
    ("fn", "dtype"),
    [
        (lambda x: x * 2.5, torch.float32),  # a Python float keeps the tensor's dtype
        (lambda x: x + op.full((3,), 1.5), torch.float32),  # a float constant is f32
        (lambda x: x + op.constant([1.0, 2.0, 3.0]), torch.float32),  # a list too
        (lambda x: x + np.arange(3.0), torch.float64),  # a float64 numpy array keeps its dtype
        (lambda x: x / 2, torch.float32),
    ],
)
def test_constants_are_weakly_typed(fn, dtype):
    assert ts.jit(fn)(torch.ones(3)).dtype == dtype


@pytest.mark.parametrize("kernels", ["triton", "reference"])
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_integer_matmul_is_exact(dtype, kernels):
    """tl.dot has no int32 / int64 form: the kernel multiplies and sums exactly (wrapping
    on overflow, as torch does); batched, with an epilogue, and through einsum."""
    big = torch.randint(-(2**20), 2**20, (37, 70), generator=rng, dtype=dtype)
    other = torch.randint(-(2**20), 2**20, (70, 45), generator=rng, dtype=dtype)
    small = torch.randint(-9, 9, (3, 17, 20), generator=rng, dtype=dtype)
    f = ts.jit(
        lambda a, b, c: (
            a @ b * 3 - 1,
            c @ op.swapaxes(c, -1, -2),
            op.einsum("bij,bkj->bik", c, c),
        ),
        kernels=kernels,
    )
    product, batched, einsum = f(big, other, small)
    assert product.dtype == dtype
    assert torch.equal(product, big @ other * 3 - 1)
    assert torch.equal(batched, small @ small.transpose(-1, -2))
    assert torch.equal(einsum, small @ small.transpose(-1, -2))


def test_bool_matmul_is_rejected_at_trace_time():
    def f(a, b):
        return a @ b  # <- bool matmul

    ones = torch.ones(2, 2, dtype=torch.bool)
    with pytest.raises(ts.ShapeError, match="bool matmuls are not supported") as info:
        ts.jit(f)(ones, ones)
    message = str(info.value)
    assert "op.astype(x, 'int32')" in message and at("bool matmul") in message
    with pytest.raises(RuntimeError):  # torch rejects it too
        ones @ ones


def test_bool_einsum_is_rejected_at_trace_time():
    def f(a, b):
        return op.einsum("ij,jk->ik", a, b)  # <- bool einsum

    ones = torch.ones(2, 2, dtype=torch.bool)
    with pytest.raises(ts.ShapeError, match="cast the operands") as info:
        ts.jit(f)(ones, ones)
    assert at("bool einsum") in str(info.value)


@pytest.mark.parametrize("dtype", [torch.complex64, torch.uint8, torch.int16, torch.float8_e4m3fn])
def test_unsupported_argument_dtypes_are_rejected_naming_the_supported_ones(dtype):
    with pytest.raises(ts.ExecutionError, match="float64, float32, float16, bfloat16") as info:
        ts.jit(lambda x: x)(torch.zeros(2, dtype=dtype))
    assert str(dtype) in str(info.value) and "argument 'x'" in str(info.value)
