"""matmul, softmax, log_softmax, layer_norm, rms_norm and cross_entropy vs torch eager.

References are torch functions called directly in float64. Tolerances are those of
``opcheck``; f32 contractions use ``ACCUMULATE_ATOL``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from opcheck import (
    ACCUMULATE_ATOL,
    FLOATS,
    INTS,
    as_input,
    broadcast_shapes,
    check,
    random,
    seeds,
    shapes,
)

import tessera as ts
from tessera import op

sides = st.integers(1, 6)

# --- matmul -------------------------------------------------------------------------------


@st.composite
def matmul_shapes(draw: st.DrawFn) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Operand shapes for numpy matmul: 1-d vectors, matrices, broadcast batch dims."""
    batch_a, batch_b = draw(broadcast_shapes(2, max_rank=2))
    m, k, n = draw(sides), draw(sides), draw(sides)
    lhs = (k,) if draw(st.integers(0, 4)) == 0 else (*batch_a, m, k)
    rhs = (k,) if draw(st.integers(0, 4)) == 0 else (*batch_b, k, n)
    return lhs, rhs


@ts.jit
def matmul(a, b, use_operator):
    return a @ b if use_operator else op.matmul(a, b)


@settings(max_examples=60)
@given(
    shapes=matmul_shapes(),
    dtype=st.sampled_from(FLOATS),
    seed=seeds,
    as_numpy=st.booleans(),
    use_operator=st.booleans(),
)
def test_matmul(shapes, dtype, seed, as_numpy, use_operator):
    a = random(seed, shapes[0], dtype)
    b = random(seed, shapes[1], dtype, salt=1)
    args = [as_input(a, as_numpy), as_input(b, as_numpy)]
    expected = torch.matmul(a.double(), b.double())
    atol = ACCUMULATE_ATOL if dtype == "f32" else None
    check(matmul(*args, use_operator=use_operator), expected, dtype, args=args, atol=atol)


@pytest.mark.parametrize(
    ("lhs", "rhs", "result"),
    [
        ((3,), (3,), ()),
        ((3,), (3, 4), (4,)),
        ((2, 3), (3,), (2,)),
        ((5, 2, 3), (3,), (5, 2)),
        ((3,), (5, 3, 4), (5, 4)),
        ((2, 1, 2, 3), (4, 3, 5), (2, 4, 2, 5)),
    ],
)
def test_matmul_result_shapes_follow_numpy(lhs, rhs, result):
    a, b = np.ones(lhs, np.float32), np.ones(rhs, np.float32)
    assert matmul(a, b, use_operator=True).shape == np.matmul(a, b).shape == result


@settings(max_examples=10)
@given(shapes=matmul_shapes(), dtype=st.sampled_from(INTS), seed=seeds)
def test_integer_matmul_is_exact(shapes, dtype, seed):
    a, b = random(seed, shapes[0], dtype), random(seed, shapes[1], dtype, salt=1)
    check(matmul(a, b, use_operator=True), torch.matmul(a, b), dtype, args=[a, b])


def test_matmul_of_mixed_dtypes_promotes():
    a, b = np.ones((2, 3), np.float16), np.ones((3, 2), np.float32)
    result = matmul(a, b, use_operator=True)
    assert result.dtype == np.float32
    np.testing.assert_array_equal(result, np.full((2, 2), 3.0))


# --- softmax ---------------------------------------------------------------------------------


@st.composite
def shapes_and_axis(draw: st.DrawFn, min_rank: int = 1) -> tuple[tuple[int, ...], int]:
    shape = draw(shapes(min_rank=min_rank))
    return shape, draw(st.integers(-len(shape), len(shape) - 1))


@pytest.mark.parametrize(
    ("name", "reference"), [("softmax", torch.softmax), ("log_softmax", torch.log_softmax)]
)
@settings(max_examples=25)
@given(case=shapes_and_axis(), dtype=st.sampled_from(FLOATS), seed=seeds, as_numpy=st.booleans())
def test_softmax(name, reference, case, dtype, seed, as_numpy):
    shape, axis = case
    x = random(seed, shape, dtype) * 3
    arg = as_input(x, as_numpy)
    result = ts.jit(lambda x: getattr(op, name)(x, axis=axis))(arg)
    check(result, reference(x.double(), dim=axis), dtype, args=[arg])


def test_softmax_defaults_to_the_last_axis():
    x = random(0, (2, 3, 4), "f32")
    check(ts.jit(op.softmax)(x), torch.softmax(x.double(), -1), "f32", args=[x])


# --- normalizations ----------------------------------------------------------------------------


@st.composite
def normalized_shapes(draw: st.DrawFn) -> tuple[tuple[int, ...], int]:
    """A shape and how many trailing dimensions to normalize over."""
    shape = draw(shapes(min_rank=1))
    return shape, draw(st.integers(1, len(shape)))


def double(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.double()


def trailing_axes(count: int) -> int | tuple[int, ...]:
    return -1 if count == 1 else tuple(range(-count, 0))


@settings(max_examples=40)
@given(
    case=normalized_shapes(),
    affine=st.sampled_from(["none", "weight", "both"]),
    dtype=st.sampled_from(FLOATS),
    seed=seeds,
    eps=st.sampled_from([1e-5, 1e-3]),
)
def test_layer_norm(case, affine, dtype, seed, eps):
    shape, count = case
    normalized = shape[len(shape) - count :]
    x = random(seed, shape, dtype) * 2 + 1
    weight = random(seed, normalized, dtype, salt=1) if affine != "none" else None
    bias = random(seed, normalized, dtype, salt=2) if affine == "both" else None
    fn = ts.jit(
        lambda x, w, b: op.layer_norm(x, axis=trailing_axes(count), eps=eps, weight=w, bias=b)
    )
    expected = F.layer_norm(x.double(), normalized, double(weight), double(bias), eps=eps)
    check(fn(x, weight, bias), expected, dtype, args=[x])


@settings(max_examples=15)
@given(shape=shapes(min_rank=2), seed=seeds)
def test_layer_norm_over_a_leading_axis(shape, seed):
    x = random(seed, shape, "f32")
    mean = x.double().mean(dim=0, keepdim=True)
    var = x.double().var(dim=0, keepdim=True, unbiased=False)
    expected = (x.double() - mean) / torch.sqrt(var + 1e-5)
    # Over a short leading axis (size 2) normalising is ill-conditioned: |x - mean| can be
    # tiny next to sqrt(var + eps), and f32 differs from float64 by up to ~2e-5 relative.
    result = ts.jit(lambda x: op.layer_norm(x, axis=0))(x)
    check(result, expected, "f32", args=[x], rtol=5e-5, atol=2e-5)


@settings(max_examples=30)
@given(
    case=normalized_shapes(),
    with_weight=st.booleans(),
    dtype=st.sampled_from(FLOATS),
    seed=seeds,
)
def test_rms_norm(case, with_weight, dtype, seed):
    shape, count = case
    normalized = shape[len(shape) - count :]
    x = random(seed, shape, dtype)
    weight = random(seed, normalized, dtype, salt=1) if with_weight else None
    fn = ts.jit(lambda x, w: op.rms_norm(x, axis=trailing_axes(count), eps=1e-6, weight=w))
    expected = F.rms_norm(x.double(), normalized, double(weight), eps=1e-6)
    check(fn(x, weight), expected, dtype, args=[x])


# --- cross-entropy -----------------------------------------------------------------------------


@settings(max_examples=40)
@given(
    batch=shapes(max_rank=2),
    classes=sides,
    reduction=st.sampled_from(["mean", "sum", "none"]),
    dtype=st.sampled_from(FLOATS),
    label_dtype=st.sampled_from(INTS),
    seed=seeds,
    as_numpy=st.booleans(),
)
def test_cross_entropy(batch, classes, reduction, dtype, label_dtype, seed, as_numpy):
    # Logits [C], [B, C] and [B, T, C]; the class axis is last, as in Tessera's op.
    logits = random(seed, (*batch, classes), dtype) * 2
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, classes, batch, generator=generator).to(
        torch.int32 if label_dtype == "i32" else torch.int64
    )
    args = [as_input(logits, as_numpy), as_input(labels, as_numpy)]
    result = ts.jit(lambda x, y: op.cross_entropy(x, y, reduction=reduction))(*args)
    picked = torch.log_softmax(logits.double(), -1).gather(-1, labels.long()[..., None])[..., 0]
    losses = -picked
    expected = {"none": losses, "sum": losses.sum(), "mean": losses.mean()}[reduction]
    check(result, expected, dtype, args=args)


def test_cross_entropy_matches_torch_on_batched_logits():
    logits = random(3, (2, 5, 7), "f32")
    labels = torch.randint(0, 7, (2, 5), generator=torch.Generator().manual_seed(3))
    result = ts.jit(op.cross_entropy)(logits, labels)
    expected = F.cross_entropy(logits.double().transpose(1, 2), labels)  # torch: classes on dim 1
    check(result, expected, "f32", args=[logits])
