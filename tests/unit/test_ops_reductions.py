"""sum / mean / max / min over axes, against torch eager in float64.

Axes are None, an int, a tuple (possibly empty) or negative; ``keepdims`` both ways.
Tolerances are those of ``opcheck``; f32 sums use ``ACCUMULATE_ATOL``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from opcheck import ACCUMULATE_ATOL, FLOATS, INTS, as_input, check, random, seeds, shapes

import tessera as ts
from tessera import op

REFERENCES = {"sum": torch.sum, "mean": torch.mean, "max": torch.amax, "min": torch.amin}


@st.composite
def shapes_and_axes(draw: st.DrawFn) -> tuple[tuple[int, ...], int | tuple[int, ...] | None]:
    """A shape and an axis argument for it: None, an int or a tuple, possibly negative."""
    shape = draw(shapes())
    rank = len(shape)
    kind = draw(st.sampled_from(["none", "int", "tuple"] if rank else ["none", "tuple"]))
    if kind == "none":
        return shape, None
    if kind == "int":
        return shape, draw(st.integers(-rank, rank - 1))
    axes = draw(st.lists(st.integers(0, rank - 1), unique=True, max_size=rank)) if rank else []
    return shape, tuple(draw(st.sampled_from([a, a - rank])) for a in axes)


def expected_reduction(name: str, x: torch.Tensor, axis, keepdims: bool) -> torch.Tensor:
    """numpy's meaning of ``axis``, computed by torch (where ``dim=()`` means all axes)."""
    if axis is None:
        axes = tuple(range(x.ndim))
    else:
        axes = tuple(a % x.ndim for a in ((axis,) if isinstance(axis, int) else axis))
    if not axes:
        return x
    return REFERENCES[name](x, dim=axes, keepdim=keepdims)


@ts.jit
def reduce(x, name, axis, keepdims, as_method):
    if as_method:
        return getattr(x, name)(axis=axis, keepdims=keepdims)
    return getattr(op, name)(x, axis=axis, keepdims=keepdims)


@pytest.mark.parametrize("name", sorted(REFERENCES))
@settings(max_examples=25)
@given(
    case=shapes_and_axes(),
    keepdims=st.booleans(),
    dtype=st.sampled_from(FLOATS),
    seed=seeds,
    as_numpy=st.booleans(),
    as_method=st.booleans(),
)
def test_float_reductions(name, case, keepdims, dtype, seed, as_numpy, as_method):
    shape, axis = case
    x = random(seed, shape, dtype)
    arg = as_input(x, as_numpy)
    result = reduce(arg, name=name, axis=axis, keepdims=keepdims, as_method=as_method)
    expected = expected_reduction(name, x.double(), axis, keepdims)
    atol = ACCUMULATE_ATOL if dtype == "f32" else None
    check(result, expected, dtype, args=[arg], atol=atol)


@pytest.mark.parametrize("name", ["sum", "max", "min"])
@settings(max_examples=15)
@given(case=shapes_and_axes(), keepdims=st.booleans(), dtype=st.sampled_from(INTS), seed=seeds)
def test_integer_reductions_are_exact(name, case, keepdims, dtype, seed):
    # max and min keep the dtype; a sum of int32 is int64, as in numpy (64-bit Linux) and torch
    shape, axis = case
    x = random(seed, shape, dtype)
    result = reduce(x.numpy(), name=name, axis=axis, keepdims=keepdims, as_method=False)
    expected = expected_reduction(name, x.long() if name == "sum" else x, axis, keepdims)
    check(result, expected, "i64" if name == "sum" else dtype, args=[x.numpy()])


@settings(max_examples=10)
@given(case=shapes_and_axes(), keepdims=st.booleans(), dtype=st.sampled_from(INTS), seed=seeds)
def test_mean_of_integers_is_f32(case, keepdims, dtype, seed):
    shape, axis = case
    x = random(seed, shape, dtype)
    result = reduce(x.numpy(), name="mean", axis=axis, keepdims=keepdims, as_method=False)
    check(result, expected_reduction("mean", x.double(), axis, keepdims), "f32", args=[x.numpy()])


@settings(max_examples=10)
@given(case=shapes_and_axes(), keepdims=st.booleans(), seed=seeds)
def test_sum_of_booleans_counts_in_i64(case, keepdims, seed):
    shape, axis = case
    x = random(seed, shape, "i1")
    result = reduce(x.numpy(), name="sum", axis=axis, keepdims=keepdims, as_method=False)
    check(result, expected_reduction("sum", x.long(), axis, keepdims), "i64", args=[x.numpy()])


@pytest.mark.parametrize("name", ["max", "min"])
def test_max_min_of_booleans_are_any_and_all(name):
    x = np.array([[True, False], [False, False]])
    result = reduce(x, name=name, axis=1, keepdims=False, as_method=False)
    np.testing.assert_array_equal(result, [True, False] if name == "max" else [False, False])
    assert result.dtype == np.bool_


def test_reduction_of_zero_dimensional_tensor_is_identity():
    x = np.array(2.5, dtype=np.float32)
    for name in REFERENCES:
        result = reduce(x, name=name, axis=None, keepdims=False, as_method=False)
        assert result.shape == () and result == 2.5


def test_reductions_over_empty_axes_change_nothing():
    x = random(0, (2, 3), "f32")
    result = ts.jit(lambda x: (op.sum(x, axis=()), op.max(x, axis=(), keepdims=True)))(x)
    for r in result:
        assert torch.equal(r, x)
