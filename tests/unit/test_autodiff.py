"""Reverse-mode gradients (``autodiff`` pass, ``ts.grad``, ``ts.value_and_grad``) against
``torch.autograd`` in float64, on random inputs. Programs run in f32: tolerance 1e-4
relative to the largest reference gradient."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import tessera as ts
from tessera import op

RTOL = 1e-4


def close(got: torch.Tensor, want: torch.Tensor) -> None:
    scale = max(want.abs().max().item(), 1.0)
    assert got.shape == want.shape
    assert (got.double() - want).abs().max().item() <= RTOL * scale


def torch_grads(fn, *args):
    leaves = [a.double().detach().requires_grad_() for a in args]
    fn(*leaves).backward()
    return [leaf.grad for leaf in leaves]


def randn(*shape: int, seed: int = 0, positive: bool = False) -> torch.Tensor:
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed))
    return x.abs() + 0.5 if positive else x


UNARY = {
    "neg": (op.negative, torch.neg, False),
    "abs": (op.abs, torch.abs, False),
    "relu": (op.relu, torch.relu, False),
    "exp": (op.exp, torch.exp, False),
    "log": (op.log, torch.log, True),
    "tanh": (op.tanh, torch.tanh, False),
    "sqrt": (op.sqrt, torch.sqrt, True),
    "rsqrt": (op.rsqrt, torch.rsqrt, True),
    "sigmoid": (op.sigmoid, torch.sigmoid, False),
    "silu": (op.silu, F.silu, False),
    "erf": (op.erf, torch.erf, False),
    "cos": (op.cos, torch.cos, False),
    "sin": (op.sin, torch.sin, False),
    "gelu": (op.gelu, F.gelu, False),
    "gelu_tanh": (
        lambda x: op.gelu(x, approximate="tanh"),
        lambda x: F.gelu(x, approximate="tanh"),
        False,
    ),
}


@pytest.mark.parametrize("name", list(UNARY))
def test_unary(name: str) -> None:
    ours, theirs, positive = UNARY[name]
    x, weights = randn(5, 7, seed=1, positive=positive), randn(5, 7, seed=2)
    (got,) = [ts.grad(lambda x, c: op.sum(ours(x) * c), kernels="reference")(x, weights)]
    (want, _) = torch_grads(lambda x, c: (theirs(x) * c).sum(), x, weights)
    close(got, want)


BINARY = {
    "add": (lambda a, b: a + b, lambda a, b: a + b),
    "sub": (lambda a, b: a - b, lambda a, b: a - b),
    "mul": (lambda a, b: a * b, lambda a, b: a * b),
    "div": (lambda a, b: a / b, lambda a, b: a / b),
    "pow": (op.power, torch.pow),
    "maximum": (op.maximum, torch.maximum),
    "minimum": (op.minimum, torch.minimum),
    "where": (lambda a, b: op.where(a > b, a * 2, b), lambda a, b: torch.where(a > b, a * 2, b)),
}


@pytest.mark.parametrize("name", list(BINARY))
@pytest.mark.parametrize(
    "shapes", [((4, 6), (4, 6)), ((3, 4, 6), (6,)), ((4, 1), (1, 6))], ids=["same", "bias", "outer"]
)
def test_binary_with_broadcasting(name: str, shapes) -> None:
    ours, theirs = BINARY[name]
    positive = name == "pow"
    a, b = (
        randn(*shapes[0], seed=3, positive=positive),
        randn(*shapes[1], seed=4, positive=name in ("div", "pow")),
    )
    ga, gb = ts.grad(lambda a, b: op.sum(op.tanh(ours(a, b))), argnums=(0, 1), kernels="reference")(
        a, b
    )
    wa, wb = torch_grads(lambda a, b: torch.tanh(theirs(a, b)).sum(), a, b)
    close(ga, wa)
    close(gb, wb)


def test_batched_matmul_with_broadcast_batch() -> None:
    a, b = randn(2, 3, 4, 5, seed=5), randn(5, 6, seed=6)
    ga, gb = ts.grad(lambda a, b: op.sum(op.tanh(a @ b)), argnums=(0, 1), kernels="reference")(a, b)
    wa, wb = torch_grads(lambda a, b: torch.tanh(a @ b).sum(), a, b)
    close(ga, wa)
    close(gb, wb)


def mlp_loss(params, x, labels):
    h = op.gelu(x @ params["w1"] + params["b1"])
    return op.cross_entropy(op.layer_norm(h) @ params["w2"], labels)


def torch_mlp_loss(w1, b1, w2, x, labels):
    h = F.gelu(x @ w1 + b1)
    return F.cross_entropy(F.layer_norm(h, (h.shape[-1],)) @ w2, labels)


@pytest.mark.parametrize("kernels", ["reference", "triton"])
def test_value_and_grad_of_a_pytree_of_parameters(kernels: str) -> None:
    params = {
        "w1": randn(8, 16, seed=7) / 3,
        "b1": randn(16, seed=8),
        "w2": randn(16, 5, seed=9) / 4,
    }
    x, labels = (
        randn(6, 8, seed=10),
        torch.randint(0, 5, (6,), generator=torch.Generator().manual_seed(0)),
    )
    loss, grads = ts.value_and_grad(mlp_loss, kernels=kernels)(params, x, labels)
    w1, b1, w2 = (params[k].double().requires_grad_() for k in ("w1", "b1", "w2"))
    want = torch_mlp_loss(w1, b1, w2, x.double(), labels)
    want.backward()
    assert set(grads) == {"w1", "b1", "w2"}
    assert abs(loss.item() - want.item()) <= 1e-5 * max(1.0, abs(want.item()))
    for name, leaf in (("w1", w1), ("b1", b1), ("w2", w2)):
        close(grads[name], leaf.grad)


def test_gradient_by_finite_differences() -> None:
    """An independent check: central differences in float64 of the torch function."""
    x = randn(3, 4, seed=11)
    fn = lambda x: op.sum(op.softmax(op.sin(x), axis=-1) ** 2)  # noqa: E731
    (got,) = [ts.grad(fn, kernels="reference")(x)]
    ref = lambda t: (torch.softmax(torch.sin(t), dim=-1) ** 2).sum()  # noqa: E731
    eps, x64 = 1e-6, x.double()
    numeric = torch.zeros_like(x64)
    for i in range(x64.numel()):
        step = torch.zeros_like(x64).view(-1)
        step[i] = eps
        numeric.view(-1)[i] = (ref(x64 + step.view_as(x64)) - ref(x64 - step.view_as(x64))) / (
            2 * eps
        )
    close(got, numeric)


def test_argnums_and_errors() -> None:
    x, w = randn(2, 3, seed=12), randn(3, 3, seed=13)
    gw = ts.grad(lambda x, w: op.sum(x @ w), argnums=1, kernels="reference")(x, w)
    close(gw, torch_grads(lambda x, w: (x @ w).sum(), x, w)[1])
    with pytest.raises(ts.TesseraError, match="must return one scalar"):
        ts.grad(lambda x: (op.sum(x), op.sum(x)))(x)
    with pytest.raises(ts.TesseraError, match="float scalar"):
        ts.grad(lambda x: x * 2)(x)
    with pytest.raises(ts.TesseraError, match="out of range"):
        ts.grad(lambda x: op.sum(x), argnums=3)(x)
    assert math.isfinite(ts.value_and_grad(lambda x: op.sum(x * x))(x)[0].item())
