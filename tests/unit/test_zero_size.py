"""Tensors with a dimension of size 0, in every kernel class, against torch eager.

Each case runs the generated Triton kernels (in Triton's interpreter on a CPU) and the
reference executor. Results must have torch's shapes and values: a sum over an empty
axis is 0, a mean nan, a matmul with k = 0 gives zeros; where torch raises (the maximum
over an empty axis), Tessera raises a ShapeError at the user's line. A kernel whose
outputs are all empty launches nothing (before: an unmasked load from an empty tensor's
null pointer crashed the interpreter with a segmentation fault, and kernels with an
empty grid failed the tile verifier).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import tessera as ts
from tessera import dist, op

SOURCE = Path(__file__).read_text().splitlines()
rng = torch.Generator().manual_seed(0)


def randn(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=rng)


def labels(n: int, classes: int = 5) -> torch.Tensor:
    return torch.randint(0, classes, (n,), generator=rng)


def attention(q, k, v):
    return op.softmax(q @ op.swapaxes(k, -1, -2) / 2) @ v


def torch_attention(q, k, v):
    return torch.softmax(q @ k.transpose(-1, -2) / 2, -1) @ v


# name: (tessera function, torch function, arguments)
CASES = {
    # pointwise
    "add rows=0": (lambda a, b: a + b, lambda a, b: a + b, lambda: (randn(0, 4), randn(0, 4))),
    "exp cols=0": (op.exp, torch.exp, lambda: (randn(3, 0),)),
    "broadcast of empty": (lambda a, b: a * b, lambda a, b: a * b, lambda: (randn(0, 1), randn(4))),
    # layout
    "transpose": (lambda x: x.T * 2, lambda x: x.T * 2, lambda: (randn(0, 4),)),
    "reshape": (
        lambda x: x.reshape(4, 0, 2) + 1,
        lambda x: x.reshape(4, 0, 2) + 1,
        lambda: (randn(0, 8),),
    ),
    "empty slice of a full tensor": (
        lambda x: x[:, 2:2] + 1,
        lambda x: x[:, 2:2] + 1,
        lambda: (randn(3, 4),),
    ),
    "concat with an empty piece": (
        lambda a, b: op.concat([a, b, a], axis=0) * 2,
        lambda a, b: torch.cat([a, b, a]) * 2,
        lambda: (randn(0, 4), randn(3, 4)),
    ),
    # row reductions and norms
    "sum rows=0": (lambda x: op.sum(x, axis=1), lambda x: x.sum(1), lambda: (randn(0, 4),)),
    "sum over an empty axis": (
        lambda x: op.sum(x, axis=1),
        lambda x: x.sum(1),
        lambda: (randn(4, 0),),
    ),
    "mean over an empty axis": (
        lambda x: op.mean(x, axis=1),
        lambda x: x.mean(1),
        lambda: (randn(4, 0),),
    ),
    "max rows=0": (lambda x: op.max(x, axis=1), lambda x: x.amax(1), lambda: (randn(0, 4),)),
    "softmax rows=0": (op.softmax, lambda x: x.softmax(-1), lambda: (randn(0, 4),)),
    "softmax width=0": (op.softmax, lambda x: x.softmax(-1), lambda: (randn(4, 0),)),
    "layer_norm rows=0": (op.layer_norm, lambda x: F.layer_norm(x, (4,)), lambda: (randn(0, 4),)),
    "logsumexp over an empty axis": (
        lambda x: op.logsumexp(x, axis=1),
        lambda x: torch.logsumexp(x, 1),
        lambda: (randn(4, 0),),
    ),
    "cross_entropy rows=0 (mean: nan)": (
        op.cross_entropy,
        F.cross_entropy,
        lambda: (randn(0, 5), labels(0)),
    ),
    "cross_entropy rows=0 (sum: 0)": (
        lambda x, y: op.cross_entropy(x, y, reduction="sum"),
        lambda x, y: F.cross_entropy(x, y, reduction="sum"),
        lambda: (randn(0, 5), labels(0)),
    ),
    # full reductions
    "sum of all, empty": (op.sum, torch.sum, lambda: (randn(0, 4),)),
    "mean of all, empty": (op.mean, torch.mean, lambda: (randn(0, 4),)),
    # matmul
    "matmul m=0": (lambda a, b: a @ b, lambda a, b: a @ b, lambda: (randn(0, 4), randn(4, 3))),
    "matmul n=0": (lambda a, b: a @ b, lambda a, b: a @ b, lambda: (randn(2, 4), randn(4, 0))),
    "matmul k=0 (zeros)": (
        lambda a, b: a @ b,
        lambda a, b: a @ b,
        lambda: (randn(2, 0), randn(0, 3)),
    ),
    "matmul k=0 with epilogue": (
        lambda a, b: op.tanh(a @ b) + 1,
        lambda a, b: torch.tanh(a @ b) + 1,
        lambda: (randn(2, 0), randn(0, 3)),
    ),
    "batched matmul batch=0": (
        lambda a, b: a @ b,
        lambda a, b: a @ b,
        lambda: (randn(0, 2, 4), randn(4, 3)),
    ),
    # attention
    "attention queries=0": (
        attention,
        torch_attention,
        lambda: (randn(0, 8), randn(16, 8), randn(16, 8)),
    ),
    "attention keys=0 (zeros)": (
        attention,
        torch_attention,
        lambda: (randn(4, 8), randn(0, 8), randn(0, 8)),
    ),
    "attention batch=0": (
        attention,
        torch_attention,
        lambda: (randn(0, 4, 8), randn(0, 16, 8), randn(0, 16, 8)),
    ),
    # gather
    "embedding ids=0": (op.embedding, F.embedding, lambda: (labels(0), randn(5, 3))),
    "take ids=0": (op.take, lambda t, i: t[i], lambda: (randn(5, 3), labels(0))),
}


def _close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.shape == expected.shape and actual.dtype == expected.dtype
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-6, equal_nan=True)


@pytest.mark.parametrize("kernels", ["triton", "reference"])
@pytest.mark.parametrize("name", list(CASES))
def test_zero_size_tensors_match_torch(name, kernels):
    fn, reference, make_args = CASES[name]
    args = make_args()
    _close(ts.jit(fn, kernels=kernels)(*args), reference(*args))


mesh = dist.Mesh(axes=["dp"], shape=(2,))
batch = dist.ShardSpec(partition=(0,), mesh_axes=("dp",))
columns = dist.ShardSpec(partition=(1,), mesh_axes=("dp",))

# an empty dim split over dp: every rank holds an empty piece
SHARDED = {
    "pointwise": (lambda a: a * 2, lambda a: a * 2, (batch,), lambda: (randn(0, 4),)),
    "matmul": (
        lambda a, w: a @ w,
        lambda a, w: a @ w,
        (batch, None),
        lambda: (randn(0, 4), randn(4, 3)),
    ),
    "matmul, empty columns": (
        lambda a, w: a @ w,
        lambda a, w: a @ w,
        (None, columns),
        lambda: (randn(2, 4), randn(4, 0)),
    ),
    "sum of all": (op.sum, torch.sum, (batch,), lambda: (randn(0, 4),)),
    "mean over the empty axis": (
        lambda a: op.mean(a, axis=0),
        lambda a: a.mean(0),
        (batch,),
        lambda: (randn(0, 4),),
    ),
    "softmax over the split empty axis": (
        lambda a: op.softmax(a, axis=1),
        lambda a: a.softmax(1),
        (columns,),
        lambda: (randn(4, 0),),
    ),
    "layer_norm over the split empty axis": (
        lambda a: op.layer_norm(a, axis=1),
        lambda a: F.layer_norm(a, (0,)),
        (columns,),
        lambda: (randn(4, 0),),
    ),
    "cross_entropy": (
        op.cross_entropy,
        F.cross_entropy,
        (batch, batch),
        lambda: (randn(0, 5), labels(0)),
    ),
}


@pytest.mark.parametrize("name", list(SHARDED))
def test_zero_size_tensors_on_a_mesh_match_torch(name):
    fn, reference, shardings, make_args = SHARDED[name]
    args = make_args()
    f = ts.jit(fn, mesh=mesh, in_shardings=shardings, kernels="triton")
    _close(f(*args), reference(*args))


GRADIENTS = {  # d/dx of sum(f(x)) for an empty x, against torch.autograd
    "softmax": (lambda x: op.sum(op.softmax(x) * x), lambda x: (x.softmax(-1) * x).sum(), (0, 4)),
    "layer_norm": (
        lambda x: op.sum(op.layer_norm(x) * x),
        lambda x: (F.layer_norm(x, (4,)) * x).sum(),
        (0, 4),
    ),
    "matmul k=0": (
        lambda x: op.sum(op.tanh(x @ op.ones((0, 3)))),
        lambda x: torch.tanh(x @ torch.ones(0, 3)).sum(),
        (2, 0),
    ),
    "cross_entropy": (
        lambda x: op.cross_entropy(x, labels(0), reduction="sum"),
        lambda x: F.cross_entropy(x, torch.zeros(0, dtype=torch.int64), reduction="sum"),
        (0, 5),
    ),
}


@pytest.mark.parametrize("name", list(GRADIENTS))
def test_gradients_of_empty_tensors_match_torch(name):
    fn, reference, shape = GRADIENTS[name]
    x = randn(*shape).requires_grad_()
    reference(x).backward()
    _close(ts.jit(ts.grad(fn), kernels="triton")(x.detach()), x.grad)


def test_gradient_through_an_empty_weight_is_zero():
    def loss(w, x):
        return op.sum(op.tanh(x @ w))

    w, x = randn(4, 3), randn(0, 4)
    grad = ts.jit(ts.grad(loss), kernels="triton")(w, x)
    _close(grad, torch.zeros(4, 3))


def test_maximum_over_an_empty_axis_is_a_shape_error_at_the_users_line():
    def f(x):
        return op.max(x, axis=1)  # <- empty max

    (line,) = [i for i, text in enumerate(SOURCE, 1) if text.endswith("# <- empty max")]
    with pytest.raises(ts.ShapeError, match="over an empty axis") as info:
        ts.jit(f)(randn(4, 0))
    assert f"{__file__}:{line}" in str(info.value)
    with pytest.raises(IndexError):  # torch agrees that it is an error
        randn(4, 0).amax(1)
