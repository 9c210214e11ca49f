"""Elementwise ops, casts, constants and dtype promotion, against torch eager.

Tolerances are those of ``opcheck`` (f32 rtol 1e-5 / atol 1e-6 against float64;
f16 / bf16 1e-2; integers and booleans exact).
"""

from __future__ import annotations

import operator

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from opcheck import (
    DTYPES,
    FLOATS,
    INTS,
    TORCH_DTYPES,
    as_input,
    broadcast_shapes,
    check,
    exact,
    random,
    seeds,
    shapes,
)

import tessera as ts
from tessera import op

# --- unary ----------------------------------------------------------------------------

# name -> (float64 reference, input values)
FLOAT_UNARY = {
    "negative": (torch.neg, "normal"),
    "abs": (torch.abs, "normal"),
    "relu": (torch.relu, "normal"),
    "exp": (torch.exp, "normal"),
    "log": (torch.log, "positive"),
    "tanh": (torch.tanh, "normal"),
    "sqrt": (torch.sqrt, "positive"),
    "rsqrt": (torch.rsqrt, "positive"),
    "sigmoid": (torch.sigmoid, "normal"),
    "silu": (F.silu, "normal"),
    "erf": (torch.erf, "normal"),
    "cos": (torch.cos, "normal"),
    "sin": (torch.sin, "normal"),
}


@ts.jit
def unary(x, name):
    return getattr(op, name)(x)


@pytest.mark.parametrize("name", sorted(FLOAT_UNARY))
@settings(max_examples=20)
@given(shape=shapes(), dtype=st.sampled_from(FLOATS), seed=seeds, as_numpy=st.booleans())
def test_float_unary(name, shape, dtype, seed, as_numpy):
    reference, kind = FLOAT_UNARY[name]
    x = random(seed, shape, dtype, kind)
    arg = as_input(x, as_numpy)
    check(unary(arg, name=name), reference(x.double()), dtype, args=[arg])


@pytest.mark.parametrize("approximate", ["none", "tanh", True, False])
@settings(max_examples=10)
@given(shape=shapes(), dtype=st.sampled_from(FLOATS), seed=seeds)
def test_gelu(approximate, shape, dtype, seed):
    arg = as_input(random(seed, shape, dtype), True)
    result = ts.jit(lambda x: op.gelu(x, approximate=approximate))(arg)
    mode = {True: "tanh", False: "none"}.get(approximate, approximate)
    check(result, F.gelu(torch.as_tensor(arg).double(), approximate=mode), dtype, args=[arg])


@pytest.mark.parametrize("name", ["negative", "abs", "relu"])
@settings(max_examples=8)
@given(shape=shapes(), dtype=st.sampled_from(INTS), seed=seeds)
def test_integer_unary_is_exact(name, shape, dtype, seed):
    reference, _ = FLOAT_UNARY[name]
    x = random(seed, shape, dtype)
    check(unary(x.numpy(), name=name), reference(x), dtype, args=[x.numpy()])


@pytest.mark.parametrize("name", ["exp", "tanh", "sqrt", "sigmoid"])
def test_float_unary_of_integers_computes_in_f32(name):
    x = torch.arange(1, 7, dtype=torch.int32).reshape(2, 3)
    reference, _ = FLOAT_UNARY[name]
    check(unary(x, name=name), reference(x.double()), "f32", args=[x])


@settings(max_examples=10)
@given(shape=shapes(), dtype=st.sampled_from(FLOATS), seed=seeds)
def test_unary_operators(shape, dtype, seed):
    x = random(seed, shape, dtype)
    neg, absolute, plus = ts.jit(lambda x: (-x, abs(x), +x))(x)
    check(neg, -x.double(), dtype, args=[x])
    check(absolute, x.double().abs(), dtype, args=[x])
    check(plus, x.double(), dtype, args=[x])


# --- binary ---------------------------------------------------------------------------

# name -> (operator or None, float64 reference, lhs values, rhs values)
BINARY = {
    "add": (operator.add, torch.add, "normal", "normal"),
    "subtract": (operator.sub, torch.sub, "normal", "normal"),
    "multiply": (operator.mul, torch.mul, "normal", "normal"),
    "divide": (operator.truediv, torch.div, "normal", "nonzero"),
    "power": (operator.pow, torch.pow, "positive", "normal"),
    "maximum": (None, torch.maximum, "normal", "normal"),
    "minimum": (None, torch.minimum, "normal", "normal"),
}


@ts.jit
def binary(a, b, name, use_operator):
    if use_operator:
        return BINARY[name][0](a, b)
    return getattr(op, name)(a, b)


@pytest.mark.parametrize("name", sorted(BINARY))
@settings(max_examples=25)
@given(
    shapes=broadcast_shapes(2),
    dtype=st.sampled_from(FLOATS),
    seed=seeds,
    as_numpy=st.booleans(),
    use_operator=st.booleans(),
)
def test_float_binary(name, shapes, dtype, seed, as_numpy, use_operator):
    operator_fn, reference, lhs_kind, rhs_kind = BINARY[name]
    a = random(seed, shapes[0], dtype, lhs_kind)
    b = random(seed, shapes[1], dtype, rhs_kind, salt=1)
    args = [as_input(a, as_numpy), as_input(b, as_numpy)]
    result = binary(*args, name=name, use_operator=use_operator and operator_fn is not None)
    check(result, reference(a.double(), b.double()), dtype, args=args)


@pytest.mark.parametrize("name", ["add", "subtract", "multiply", "maximum", "minimum"])
@settings(max_examples=10)
@given(shapes=broadcast_shapes(2), dtype=st.sampled_from(INTS), seed=seeds)
def test_integer_binary_is_exact(name, shapes, dtype, seed):
    _, reference, _, _ = BINARY[name]
    a, b = random(seed, shapes[0], dtype), random(seed, shapes[1], dtype, salt=1)
    args = [a.numpy(), b.numpy()]
    result = binary(*args, name=name, use_operator=name in ("add", "subtract", "multiply"))
    check(result, reference(a, b), dtype, args=args)


@settings(max_examples=10)
@given(shapes=broadcast_shapes(2), dtype=st.sampled_from(INTS), seed=seeds)
def test_integer_true_division_gives_f32(shapes, dtype, seed):
    a = random(seed, shapes[0], dtype)
    b = random(seed, shapes[1], dtype, "positive", salt=1)
    args = [a.numpy(), b.numpy()]
    result = binary(*args, name="divide", use_operator=True)
    check(result, a.double() / b.double(), "f32", args=args)


def test_binary_aliases_are_the_numpy_functions():
    assert (op.sub, op.mul, op.div, op.pow) == (op.subtract, op.multiply, op.divide, op.power)
    assert (op.neg, op.cast, op.select) == (op.negative, op.astype, op.where)


# --- comparisons and select --------------------------------------------------------------

COMPARISONS = {
    "equal": operator.eq,
    "not_equal": operator.ne,
    "less": operator.lt,
    "less_equal": operator.le,
    "greater": operator.gt,
    "greater_equal": operator.ge,
}


@ts.jit
def compare(a, b, name, use_operator):
    return COMPARISONS[name](a, b) if use_operator else getattr(op, name)(a, b)


@pytest.mark.parametrize("name", sorted(COMPARISONS))
@settings(max_examples=15)
@given(
    shapes=broadcast_shapes(2),
    dtype=st.sampled_from(DTYPES[:-1]),
    seed=seeds,
    use_operator=st.booleans(),
)
def test_comparisons(name, shapes, dtype, seed, use_operator):
    # Small integer values (in every dtype) make ties common, so eq / le / ge matter.
    a = random(seed, shapes[0], dtype, "small_ints")
    b = random(seed, shapes[1], dtype, "small_ints", salt=1)
    args = [as_input(a, True), as_input(b, True)]
    result = compare(*args, name=name, use_operator=use_operator)
    check(result, COMPARISONS[name](exact(a), exact(b)), "i1", args=args)


def test_comparison_with_python_scalar():
    x = np.array([-1.0, 0.0, 2.0], dtype=np.float32)
    low, high = ts.jit(lambda x: (x < 0, x >= 1))(x)
    np.testing.assert_array_equal(low, [True, False, False])
    np.testing.assert_array_equal(high, [False, False, True])


@settings(max_examples=20)
@given(
    shapes=broadcast_shapes(3),
    dtype=st.sampled_from(DTYPES),
    seed=seeds,
    use_select=st.booleans(),
)
def test_where(shapes, dtype, seed, use_select):
    cond = random(seed, shapes[0], "i1")
    x = random(seed, shapes[1], dtype, salt=1)
    y = random(seed, shapes[2], dtype, salt=2)
    where = op.select if use_select else op.where
    args = [as_input(cond, True), as_input(x, True), as_input(y, True)]
    result = ts.jit(lambda c, x, y: where(c, x, y))(*args)
    check(result, torch.where(cond, exact(x), exact(y)), dtype, args=args)


def test_where_with_non_boolean_condition_tests_nonzero():
    cond = np.array([0.0, 2.0, -1.0], dtype=np.float32)
    x = np.array([1, 2, 3], dtype=np.int32)
    result = ts.jit(lambda c, x: op.where(c, x, -x))(cond, x)
    np.testing.assert_array_equal(result, [-1, 2, 3])
    assert result.dtype == np.int32


def test_where_with_python_scalar_branches():
    x = np.array([[-1.5, 0.0], [2.0, -3.0]], dtype=np.float32)
    relu, mask = ts.jit(lambda x: (op.where(x > 0, x, 0.0), op.where(x > 0, 1.0, 0.0)))(x)
    np.testing.assert_array_equal(relu, np.maximum(x, 0))
    np.testing.assert_array_equal(mask, (x > 0).astype(np.float32))
    assert relu.dtype == mask.dtype == np.float32


# --- casts ------------------------------------------------------------------------------


@ts.jit
def cast(x, dtype, form):
    if form == "method":
        return x.astype(dtype)
    return getattr(op, form)(x, dtype)


@pytest.mark.parametrize("target", DTYPES)
@pytest.mark.parametrize("source", DTYPES)
@settings(max_examples=4)
@given(shape=shapes(), seed=seeds, form=st.sampled_from(["astype", "cast", "method"]))
def test_cast(source, target, shape, seed, form):
    # Floats are multiples of 1/4 below 32 in magnitude: exact in f32, f16 and bf16,
    # so the expected result is known exactly (floats to ints truncate towards zero).
    if source in FLOATS:
        values = torch.round(random(seed, shape, "f32").double() * 32) / 4
        x = values.to(TORCH_DTYPES[source])
    else:
        x = random(seed, shape, source)
        values = x.double()
    if target in FLOATS:
        expected = values
    elif target == "i1":
        expected = values != 0
    else:
        expected = torch.trunc(values).long()
    arg = as_input(x, True)
    check(cast(arg, dtype=target, form=form), expected, target, args=[arg])


def test_cast_accepts_numpy_torch_and_alias_dtype_names():
    x = np.array([1.5, -2.5], dtype=np.float32)
    results = ts.jit(
        lambda x: (
            x.astype(np.int32),
            x.astype(torch.float16),
            x.astype("bfloat16"),
            x.astype(ts.DType.i64),
        )
    )(x)
    assert [r.dtype for r in results] == [np.int32, np.float16, torch.bfloat16, np.int64]
    np.testing.assert_array_equal(results[0], [1, -2])


def test_cast_to_the_same_dtype_records_no_op():
    text = ts.jit(lambda x: x.astype("f32") + 1).lower(np.zeros(2, np.float32)).as_text("graph")
    assert "graph.cast" not in text


# --- constants and Python scalars ------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@settings(max_examples=4)
@given(shape=shapes(max_rank=3), value=st.integers(-3, 3))
def test_full_zeros_ones(dtype, shape, value):
    full, zeros, ones = ts.jit(
        lambda: (op.full(shape, value, dtype), op.zeros(shape, dtype), op.ones(shape, dtype))
    )()
    torch_dtype = TORCH_DTYPES[dtype]
    check(full, exact(torch.full(shape, value, dtype=torch_dtype)), dtype)
    check(zeros, exact(torch.zeros(shape, dtype=torch_dtype)), dtype)
    check(ones, exact(torch.ones(shape, dtype=torch_dtype)), dtype)


@pytest.mark.parametrize(
    ("fill", "dtype"), [(2.5, torch.float32), (3, torch.int64), (True, torch.bool)]
)
def test_full_infers_dtype_from_fill_value_like_torch(fill, dtype):
    result = ts.jit(lambda: op.full((2, 3), fill))()
    expected = torch.full((2, 3), fill)
    assert expected.dtype == dtype
    assert result.dtype == dtype
    assert torch.equal(result, expected)


@settings(max_examples=10)
@given(shape=shapes(), dtype=st.sampled_from(DTYPES), seed=seeds)
def test_constant_from_array_keeps_values_and_dtype(shape, dtype, seed):
    value = random(seed, shape, dtype)
    captured = as_input(value, True)  # bf16 stays a torch tensor
    result = ts.jit(lambda: op.constant(captured))()
    check(result, exact(value), dtype)


def test_constant_with_dtype_and_python_scalar():
    half, count = ts.jit(lambda: (op.constant(0.5, "f16"), op.constant(7)))()
    assert half.dtype == torch.float16 and half.shape == () and float(half) == 0.5
    assert count.dtype == torch.int64 and int(count) == 7


def test_captured_numpy_array_is_a_constant():
    bias = np.arange(4, dtype=np.float32)
    x = np.ones((3, 4), dtype=np.float32)
    np.testing.assert_array_equal(ts.jit(lambda x: x + bias)(x), x + bias)


# name -> (function of a tensor and a Python scalar, the same in torch)
SCALAR_FORMS = {
    "x * 2": lambda x: x * 2,
    "2 - x": lambda x: 2 - x,
    "x + 1.5": lambda x: x + 1.5,
    "0.5 * x": lambda x: 0.5 * x,
    "x / 2": lambda x: x / 2,
    "3 / x": lambda x: 3 / x,
}


@pytest.mark.parametrize("form", sorted(SCALAR_FORMS))
@settings(max_examples=6)
@given(shape=shapes(), dtype=st.sampled_from((*FLOATS, *INTS)), seed=seeds)
def test_python_scalars_are_weakly_typed(form, shape, dtype, seed):
    # torch also treats Python scalars as weak: its result dtype is the oracle.
    fn = SCALAR_FORMS[form]
    x = random(seed, shape, dtype, "nonzero" if "/ x" in form else "normal")
    expected_dtype = fn(x).dtype
    expected = fn(exact(x))
    dtype_name = next(k for k, v in TORCH_DTYPES.items() if v == expected_dtype)
    check(ts.jit(fn)(x), exact(expected), dtype_name, args=[x])


def test_scalar_maximum_keeps_dtype():
    x = torch.tensor([-1.0, 2.0], dtype=torch.bfloat16)
    result = ts.jit(lambda x: op.maximum(x, 0))(x)
    assert result.dtype == torch.bfloat16
    assert result.tolist() == [0.0, 2.0]


@pytest.mark.parametrize("b", DTYPES)
@pytest.mark.parametrize("a", DTYPES)
def test_promotion_follows_torch(a, b):
    x = random(0, (2, 3), a, "small_ints")
    y = random(1, (3,), b, "small_ints")
    total, quotient = ts.jit(lambda x, y: (x + y, x / y))(x, y)
    assert total.dtype == torch.promote_types(x.dtype, y.dtype)
    assert quotient.dtype == torch.div(x, y).dtype  # int / int -> f32
    assert torch.equal(total, x + y)


def test_f16_plus_f32_is_f32_and_records_a_cast():
    f = ts.jit(lambda a, b: a + b)
    a, b = np.ones(3, np.float16), np.ones(3, np.float32)
    assert f(a, b).dtype == np.float32
    assert "graph.cast" in f.lower(a, b).as_text("graph")


# --- inputs and outputs --------------------------------------------------------------------


def test_numpy_inputs_give_numpy_and_torch_inputs_give_torch():
    f = ts.jit(lambda x: (x + 1, {"y": x * 2}))
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    out, extra = f(x)
    assert isinstance(out, np.ndarray) and isinstance(extra["y"], np.ndarray)
    out, extra = f(torch.from_numpy(x))
    assert isinstance(out, torch.Tensor) and isinstance(extra["y"], torch.Tensor)


def test_float64_inputs_are_computed_in_float64():
    # The dtype policy (README "Dtypes"; tests/unit/test_dtype_policy.py): never narrower.
    f = ts.jit(lambda x: x * 3)
    assert f(np.array([1.0, 2.0])).dtype == np.float64
    assert f(torch.tensor([1.0, 2.0], dtype=torch.float64)).dtype == torch.float64


def test_zero_dimensional_inputs_keep_their_shape():
    f = ts.jit(lambda x: x * 2)
    result = f(np.array(3.0, dtype=np.float32))
    assert result.shape == () and result == 6.0
    assert f(torch.tensor(1.5)).shape == ()


def test_numpy_scalars_are_zero_dimensional_arrays():
    result = ts.jit(lambda x: x * 2)(np.float32(3.0))
    assert isinstance(result, np.ndarray) and result.shape == () and result.dtype == np.float32


@pytest.mark.parametrize("make", [np.ones, torch.ones])
def test_outputs_do_not_alias_inputs(make):
    # Graph values are immutable: writing to a result must not change the argument.
    x = make((2, 3))
    same, flat, swapped = ts.jit(lambda x: (x, x.reshape(-1), x.T))(x)
    same[0, 0] = 5
    flat[1] = 7
    swapped[0, 1] = 9
    assert (x == 1).all()


def test_boolean_tensor_with_python_scalars_promotes_like_torch():
    mask = torch.tensor([True, False])
    counted, scaled = ts.jit(lambda m: (m * 2, m * 2.5))(mask)
    assert counted.dtype == (mask * 2).dtype == torch.int64
    assert scaled.dtype == (mask * 2.5).dtype == torch.float32
    assert counted.tolist() == [2, 0] and scaled.tolist() == [2.5, 0.0]


def test_ops_on_python_scalars_alone_make_default_typed_constants():
    e, three, half = ts.jit(lambda: (op.exp(1.0), op.add(1, 2), op.where(True, 0.5, 1)))()
    assert e.dtype == torch.float32 and abs(float(e) - np.e) < 1e-6
    assert three.dtype == torch.int64 and int(three) == 3
    assert half.dtype == torch.float32 and float(half) == 0.5


def test_where_promotes_its_branches():
    cond = np.array([True, False])
    x, y = np.ones(2, np.float16), np.zeros(2, np.float32)
    result = ts.jit(op.where)(cond, x, y)
    assert result.dtype == np.float32
    np.testing.assert_array_equal(result, [1.0, 0.0])


@pytest.mark.parametrize("make", [np.arange, torch.arange], ids=["numpy", "torch"])
def test_captured_arrays_on_the_left_of_operators(make):
    c = make(3).astype(np.float32) if make is np.arange else make(3, dtype=torch.float32)
    x = np.ones(3, np.float32)
    total, dot, greater = ts.jit(lambda x: (c + x, c @ x, c > x))(x)
    np.testing.assert_array_equal(total, [1.0, 2.0, 3.0])
    assert dot.shape == () and float(dot) == 3.0
    np.testing.assert_array_equal(greater, [False, False, True])
