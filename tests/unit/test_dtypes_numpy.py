"""Dtypes as numpy says (README "Dtypes"): every elementwise binary op, every reduction and
a few unary ops over every dtype (pair) among bool, int32, int64, float16, bfloat16,
float32, float64, compared with numpy.

The result dtype must be numpy's, or the documented deviation (:func:`expected_dtype`):
an integer or bool meeting a float gives that float (torch's and JAX's rule; numpy widens
int32 or int64 with float16 or float32 to float64), true division, the mean and float
functions (exp, sqrt...) of integers or bools give float32 (torch's default float; numpy
gives float64), bool ** bool is rejected (numpy gives int8, which Tessera has no dtype
for). numpy has no bfloat16: there the result dtype is torch's, the values numpy's
computed in float32. What numpy rejects (bool subtraction, bool negation, integers to
negative constant integer powers) is a ShapeError naming the op and the user's line.

The values must equal numpy's within the tolerance of the result dtype (``TOLERANCE``,
float16's where numpy's result is float16 and ours wider): exact for bool and integers;
about two units in the last place of the result's float format otherwise, as kernels
compute f16 and bf16 in f32 and pow as exp(y log |x|), and numpy may compute a mixed pair
in float64. Operands are small and exact in every dtype (floats are halves in [-4, 4]),
broadcast (``[3, 37]`` with ``[37]``, a ``[3, 1]`` condition), 37 wide so that a Triton
kernel's block has masked lanes; divisors include 0 (inf and nan), integer exponents are
>= 0. All pairs run with the reference kernels (torch; about 10 s on a CPU), a subset
with the generated Triton kernels (in Triton's interpreter on a CPU). The tests after
the property tests reach what its small values do not: int32 sums past 2**32, integer
means past 2**24, integer overflow and negative exponents, the errors' messages, Python
scalars.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import tessera as ts
from tessera import op

DTYPES = ["bool", "int32", "int64", "float16", "bfloat16", "float32", "float64"]
FLOATS = {"float16", "bfloat16", "float32", "float64"}
PAIRS = [(a, b) for a in DTYPES for b in DTYPES]
# (rtol, atol) of a result dtype; None: exact
TOLERANCE = {
    "bool": None,
    "int32": None,
    "int64": None,
    "float64": (1e-12, 1e-12),
    "float32": (4e-6, 1e-6),
    "float16": (2e-3, 1e-3),
    "bfloat16": (1.6e-2, 1e-2),
}
SOURCE = Path(__file__).read_text().splitlines()

# name: (the traced expression, numpy's function); x and y are the operands, c a bool
# condition (where)
BINARY = {
    "add": (lambda x, y, c: x + y, lambda x, y, c: np.add(x, y)),
    "subtract": (lambda x, y, c: x - y, lambda x, y, c: np.subtract(x, y)),
    "multiply": (lambda x, y, c: x * y, lambda x, y, c: np.multiply(x, y)),
    "divide": (lambda x, y, c: x / y, lambda x, y, c: np.true_divide(x, y)),
    "power": (lambda x, y, c: x**y, lambda x, y, c: np.power(x, y)),
    "maximum": (lambda x, y, c: op.maximum(x, y), lambda x, y, c: np.maximum(x, y)),
    "minimum": (lambda x, y, c: op.minimum(x, y), lambda x, y, c: np.minimum(x, y)),
    "equal": (lambda x, y, c: x == y, lambda x, y, c: np.equal(x, y)),
    "not_equal": (lambda x, y, c: op.not_equal(x, y), lambda x, y, c: np.not_equal(x, y)),
    "less": (lambda x, y, c: x < y, lambda x, y, c: np.less(x, y)),
    "less_equal": (lambda x, y, c: x <= y, lambda x, y, c: np.less_equal(x, y)),
    "greater": (lambda x, y, c: x > y, lambda x, y, c: np.greater(x, y)),
    "greater_equal": (lambda x, y, c: op.greater_equal(x, y), lambda x, y, c: x >= y),
    "where": (lambda x, y, c: op.where(c, x, y), lambda x, y, c: np.where(c, x, y)),
}
# (op.sum-like function, numpy's, axis, keepdims)
REDUCTIONS = {
    f"{name} axis={axis} keepdims={keepdims}": (ours, theirs, axis, keepdims)
    for name, ours, theirs in [
        ("sum", op.sum, np.sum),
        ("mean", op.mean, np.mean),
        ("max", op.max, np.max),
        ("min", op.min, np.min),
    ]
    for axis, keepdims in [(None, False), (1, False), (0, True)]
}


def torch_dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


def numpy_dtype(name: str) -> np.dtype:
    """numpy's dtype of ``name``; bfloat16 values stand in float32."""
    return np.dtype("float32" if name == "bfloat16" else name)


def operand(name: str, shape: tuple[int, ...], rng: np.random.Generator, role: str) -> np.ndarray:
    """Values exact in every dtype: bools; integers in [-4, 4] (an exponent: [0, 3]);
    halves in [-4, 4] (an exponent: [-2, 3]); a divisor includes 0."""
    if name == "bool":
        return rng.random(shape) < 0.5
    low, high = (0, 3) if role == "exponent" else (-4, 4)
    if name in FLOATS:
        low, high = (-2, 3) if role == "exponent" else (low, high)
        values = rng.integers(2 * low, 2 * high + 1, shape) / 2
    else:
        values = rng.integers(low, high + 1, shape)
    return values.astype(numpy_dtype(name))


def arguments(a: str, b: str, exponent: bool, seed: int):
    """(torch arguments, numpy arguments): x [3, 37] of ``a``, y [37] of ``b``, c [3, 1]."""
    rng = np.random.default_rng(seed)
    x = operand(a, (3, 37), rng, "base")
    y = operand(b, (37,), rng, "exponent" if exponent else "operand")
    c = rng.random((3, 1)) < 0.5
    as_torch = [torch.from_numpy(v).to(torch_dtype(d)) for v, d in ((x, a), (y, b), (c, "bool"))]
    return as_torch, (x, y, c)


# torch result dtypes (torch rejects any bool subtraction: add promotes as sub does)
TORCH = {
    "add": torch.add, "subtract": torch.add, "multiply": torch.mul, "divide": torch.true_divide,
    "power": torch.pow, "maximum": torch.maximum, "minimum": torch.minimum, "equal": torch.eq,
    "not_equal": torch.ne, "less": torch.lt, "less_equal": torch.le, "greater": torch.gt,
    "greater_equal": torch.ge, "where": lambda x, y: torch.where(torch.ones_like(x, dtype=torch.bool), x, y),
}  # fmt: skip


def torch_result_dtype(name: str, a: str, b: str) -> str:
    """torch's result dtype of ``name`` (used where numpy has no answer: bfloat16)."""
    x, y = torch.ones(2, dtype=torch_dtype(a)), torch.ones(2, dtype=torch_dtype(b))
    return str(TORCH[name](x, y).dtype).removeprefix("torch.")


def expected_dtype(name: str, a: str, b: str, numpy: str | None) -> str | None:
    """The result dtype: numpy's (``numpy``; None where numpy raises), but for the
    deviations of README "Dtypes". None: a ShapeError."""
    if name == "power" and a == b == "bool":
        return None  # numpy: int8, which Tessera has no dtype for (torch rejects it)
    if "bfloat16" in (a, b):  # numpy has no bfloat16: torch's result dtype
        return None if numpy is None else torch_result_dtype(name, a, b)
    if numpy is None or numpy == "bool":
        return numpy
    floats = [d for d in (a, b) if d in FLOATS]
    if len(floats) == 1:  # an integer or bool meets a float: that float (torch, JAX)
        return floats[0]
    if name == "divide" and not floats:  # true division of integers: float32 (torch)
        return "float32"
    return numpy


def numpy_result(fn, *args) -> np.ndarray | None:
    """numpy's result, None where numpy raises (TypeError: bool subtraction)."""
    try:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return np.asarray(fn(*args))
    except (TypeError, ValueError):
        return None


def assert_matches(ours: torch.Tensor, theirs: np.ndarray, dtype: str, what: str) -> None:
    assert str(ours.dtype).removeprefix("torch.") == dtype, what
    actual = ours.to(torch.float64).numpy() if dtype in FLOATS else ours.numpy()
    assert actual.shape == theirs.shape, what
    tolerance = TOLERANCE[dtype]
    if tolerance is not None and theirs.dtype == np.float16:  # numpy rounded to float16
        tolerance = max(tolerance, TOLERANCE["float16"])
    if tolerance is None:
        np.testing.assert_array_equal(actual, theirs, err_msg=what)
    else:
        rtol, atol = tolerance
        np.testing.assert_allclose(
            actual, theirs.astype(np.float64), rtol=rtol, atol=atol, equal_nan=True, err_msg=what
        )


def check_pair(a: str, b: str, kernels: str, names=tuple(BINARY), seed: int = 0) -> None:
    """Every op of ``names`` on (a, b): one program for the ops numpy accepts, a ShapeError
    for each it rejects."""
    accepted = {}
    for name in names:
        fn, theirs = BINARY[name]
        torch_args, numpy_args = arguments(a, b, name == "power", seed)
        expected = numpy_result(theirs, *numpy_args)
        dtype = expected_dtype(name, a, b, None if expected is None else expected.dtype.name)
        if dtype is None:
            check_rejected(fn, torch_args, name)
        else:
            accepted[name] = (fn, torch_args, expected, dtype)
    for name, (fn, args, expected, dtype) in accepted.items():
        result = ts.jit(fn, kernels=kernels)(*args)
        assert_matches(result, expected, dtype, f"{name}({a}, {b}) with {kernels} kernels")


def check_rejected(fn, args, name: str) -> None:
    with pytest.raises(ts.ShapeError) as info:
        ts.jit(fn)(*args)
    message = str(info.value)
    graph_name = {"subtract": "graph.sub", "power": "graph.pow"}[name]
    assert message.startswith(graph_name) and "not supported" in message, message
    assert f"{__file__}:" in message, message  # the user's line: the lambda in BINARY


@pytest.mark.parametrize(("a", "b"), PAIRS, ids=[f"{a}-{b}" for a, b in PAIRS])
def test_binary_ops_follow_numpy(a, b):
    check_pair(a, b, "reference")


TRITON_PAIRS = [
    ("bool", "bool"),
    ("int32", "int32"),
    ("int64", "int32"),
    ("int32", "float16"),
    ("bfloat16", "float16"),
    ("float64", "int64"),
]


@pytest.mark.parametrize(("a", "b"), TRITON_PAIRS, ids=[f"{a}-{b}" for a, b in TRITON_PAIRS])
def test_binary_ops_follow_numpy_in_triton_kernels(a, b):
    check_pair(
        a, b, "triton", names=("add", "multiply", "divide", "power", "maximum", "less", "where")
    )


def expected_reduction_dtype(name: str, dtype: str, numpy: str) -> str:
    if dtype == "bfloat16":
        return "bfloat16"  # torch's: every reduction of bf16 is bf16
    if name.startswith("mean") and dtype not in FLOATS:
        return "float32"  # the mean of integers or bools: float32 (torch's default float)
    return numpy


def check_reductions(dtype: str, kernels: str, names=tuple(REDUCTIONS)) -> None:
    rng = np.random.default_rng(1)
    x = operand(dtype, (3, 37), rng, "operand")
    fns = [REDUCTIONS[n] for n in names]
    program = ts.jit(
        lambda t: tuple(f(t, axis=ax, keepdims=k) for f, _, ax, k in fns), kernels=kernels
    )
    results = program(torch.from_numpy(x).to(torch_dtype(dtype)))
    for name, (_, theirs, axis, keepdims), result in zip(names, fns, results, strict=True):
        expected = np.asarray(theirs(x, axis=axis, keepdims=keepdims))
        what = f"{name} of {dtype} with {kernels} kernels"
        assert_matches(
            result, expected, expected_reduction_dtype(name, dtype, expected.dtype.name), what
        )


@pytest.mark.parametrize("dtype", DTYPES)
def test_reductions_follow_numpy(dtype):
    check_reductions(dtype, "reference")


@pytest.mark.parametrize("dtype", ["bool", "int32", "bfloat16", "float64"])
def test_reductions_follow_numpy_in_triton_kernels(dtype):
    check_reductions(dtype, "triton")


UNARY = {
    "negative": (lambda x: -x, np.negative),
    "abs": (abs, np.abs),
    "exp": (op.exp, np.exp),
    "sqrt": (op.sqrt, np.sqrt),
    "tanh": (op.tanh, np.tanh),
}


@pytest.mark.parametrize("kernels", ["reference", "triton"])
def test_unary_ops_follow_numpy(kernels):
    """Unary ops keep the dtype; a float function (exp, sqrt, tanh) of integers or bools is
    float32 (numpy: float64, float16 for bools); negating bools is a ShapeError."""
    rng = np.random.default_rng(3)
    for dtype in DTYPES if kernels == "reference" else ["bool", "int32", "bfloat16"]:
        x = operand(dtype, (3, 37), rng, "operand")
        if dtype in FLOATS:
            x = np.abs(x)  # sqrt: no nan
        arg = torch.from_numpy(x).to(torch_dtype(dtype))
        for name, (ours, theirs) in UNARY.items():
            expected = numpy_result(theirs, x)
            if expected is None:
                with pytest.raises(ts.ShapeError, match="negating a bool tensor"):
                    ts.jit(ours)(arg)
                continue
            numpy = "bfloat16" if dtype == "bfloat16" else expected.dtype.name
            want = "float32" if numpy.startswith("float") and dtype not in FLOATS else numpy
            result = ts.jit(ours, kernels=kernels)(arg)
            assert_matches(result, expected, want, f"{name}({dtype}) with {kernels} kernels")


# --- what the property test's small values do not reach -----------------------------------


@pytest.mark.parametrize("kernels", ["triton", "reference"])
def test_int32_sums_accumulate_in_int64(kernels):
    """A sum of int32 reaching 2**32 (which wrapped to 0 in int32) and a count of bools are
    int64, as in numpy; the kernel converts each element to int64 before it adds."""
    x = np.full((3, 37), 2**30, dtype=np.int32)
    mask = np.ones((3, 37), dtype=bool)
    f = ts.jit(
        lambda x, m: (op.sum(x), op.sum(x, axis=1), x.sum(axis=0, keepdims=True), op.sum(m)),
        kernels=kernels,
    )
    total, rows, cols, count = f(x, mask)
    for ours, theirs in zip(
        (total, rows, cols, count),
        (x.sum(), x.sum(axis=1), x.sum(axis=0, keepdims=True), mask.sum()),
        strict=True,
    ):
        assert ours.dtype == theirs.dtype == np.int64
        np.testing.assert_array_equal(ours, theirs)
    lowered = f.lower(x, mask)
    graph = lowered.as_text("graph")
    assert "graph.cast %x : tensor<3x37xi32> -> tensor<3x37xi64>" in graph
    assert "graph.sum" in graph and "xi32> -> tensor<i" not in graph  # no i32 sum
    if kernels == "triton":
        assert ".to(tl.int64)" in "".join(lowered.triton_source().values())


@pytest.mark.parametrize("kernels", ["triton", "reference"])
def test_integer_mean_is_float32_rounded_once(kernels):
    """The mean of integers is computed in float64 (numpy's algorithm) and rounded once to
    float32: exact sums beyond float32's 2**24, where an f32 accumulation would drift."""
    x = np.array([[2**30 + 1, 3, 2**30 - 7, 5] * 9 + [1]] * 2, dtype=np.int64)
    result = ts.jit(lambda x: (op.mean(x), op.mean(x, axis=1)), kernels=kernels)(x)
    for ours, theirs in zip(result, (x.mean(), x.mean(axis=1)), strict=True):
        assert ours.dtype == np.float32
        np.testing.assert_array_equal(ours, theirs.astype(np.float32))


@pytest.mark.parametrize("kernels", ["triton", "reference"])
@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_integer_powers(dtype, kernels):
    """int ** int is an int, wrapping on overflow as numpy does; a negative exponent known
    only at run time gives torch's result (numpy raises): 1 for 1, +-1 for -1, else 0."""
    base = np.array([3, -2, 2, 1, -1, 0, 5, -1, 7, 3], dtype=dtype)
    exponent = np.array([2, 3, -1, -5, -3, -1, -2, -4, 40, 0], dtype=dtype)
    result = ts.jit(lambda x, y: x**y, kernels=kernels)(base, exponent)
    assert result.dtype == np.dtype(dtype)
    torch_result = torch.pow(torch.from_numpy(base), torch.from_numpy(exponent)).numpy()
    np.testing.assert_array_equal(result, torch_result)
    nonnegative = exponent >= 0
    with np.errstate(over="ignore"):
        expected = np.power(base[nonnegative], exponent[nonnegative])
    np.testing.assert_array_equal(result[nonnegative], expected)


@pytest.mark.parametrize(
    "exponent", [-1, np.array([2, -3], dtype=np.int32), [1, -2]], ids=["int", "array", "list"]
)
def test_negative_constant_integer_exponent_is_an_error(exponent):
    def f(x):
        return x**exponent  # <- negative power

    with pytest.raises(ValueError, match="negative integer powers"):
        np.arange(1, 3, dtype=np.int32) ** exponent  # numpy raises too
    with pytest.raises(ts.ShapeError, match="integers to negative integer powers") as info:
        ts.jit(f)(np.arange(1, 3, dtype=np.int32))
    assert at("negative power") in str(info.value)
    assert ts.jit(f)(np.arange(1, 3, dtype=np.float32)).dtype == np.float32  # floats: fine


def at(marker: str) -> str:
    """``file:line`` of the line of this file ending in ``# <- marker``."""
    (line,) = [i for i, text in enumerate(SOURCE, 1) if text.endswith(f"# <- {marker}")]
    return f"{__file__}:{line}"


def test_bool_errors_name_the_op_and_the_line():
    def subtract(a, b):
        return a - b  # <- bool subtraction

    def negate(a):
        return -a  # <- bool negation

    def power(a, b):
        return a**b  # <- bool power

    t = np.array([True, False])
    for fn, args, op_name, marker in [
        (subtract, (t, t), "graph.sub", "bool subtraction"),
        (lambda a: subtract(a, True), (t,), "graph.sub", "bool subtraction"),
        (negate, (t,), "graph.neg", "bool negation"),
        (power, (t, t), "graph.pow", "bool power"),
    ]:
        with pytest.raises(ts.ShapeError) as info:
            ts.jit(fn)(*args)
        message = str(info.value)
        assert message.startswith(f"{op_name}: ") and "not supported" in message, message
        assert at(marker) in message, message
    with pytest.raises(TypeError):
        t - t  # numpy rejects it too
    with pytest.raises(TypeError):
        -t  # noqa: B018


# (scalar, the dtype numpy gives, the deviation (None: numpy's)) for each tensor dtype
SCALARS = [True, 3, 2.5]
SCALAR_OPS = {
    "add": lambda x, s: x + s,
    "radd": lambda x, s: s + x,
    "multiply": lambda x, s: x * s,
    "divide": lambda x, s: x / s,
    "power": lambda x, s: x**s,
    "maximum": lambda x, s: np.maximum(x, s) if isinstance(x, np.ndarray) else op.maximum(x, s),
    "less": lambda x, s: x < s,
}


@pytest.mark.parametrize("dtype", [d for d in DTYPES if d != "bfloat16"])
def test_python_scalars_are_weak_as_in_numpy(dtype):
    """A Python scalar takes the tensor's dtype when it fits its kind (numpy 2's NEP 50):
    ``int32 + 3`` is int32, ``bool + 3`` int64, ``float16 * 2.5`` float16. Deviations: a
    Python float with an integer or bool tensor is float32 (numpy: float64), and so is
    true division of integers or bools."""
    rng = np.random.default_rng(2)
    x = operand(dtype, (37,), rng, "exponent")  # >= 0: integer powers of it are fine
    cases = []
    for name, fn in SCALAR_OPS.items():
        for scalar in SCALARS:
            expected = numpy_result(fn, x, scalar)
            if expected is None or expected.dtype == np.int8:  # bool ** True: a ShapeError
                continue
            numpy = expected.dtype.name
            deviation = numpy.startswith("float") and dtype not in FLOATS
            cases.append((name, scalar, expected, "float32" if deviation else numpy))
    program = ts.jit(lambda t: tuple(SCALAR_OPS[n](t, s) for n, s, _, _ in cases))
    for (name, scalar, expected, want), ours in zip(cases, program(x), strict=True):
        ours = torch.from_numpy(ours) if isinstance(ours, np.ndarray) else ours
        assert_matches(ours, expected, want, f"{name}({dtype}, {scalar!r})")


@pytest.mark.parametrize("fn", [lambda x: x // 2, lambda x: 7 % x, lambda x: divmod(x, x)])
def test_floor_division_and_remainder_are_trace_errors(fn):
    """Tessera has no floor division or remainder op yet: a TraceError, not Python's TypeError."""
    with pytest.raises(ts.TraceError, match="not supported yet") as info:
        ts.jit(fn)(np.arange(3, dtype=np.int32))
    assert f"{__file__}:" in str(info.value)


@pytest.mark.parametrize("kernels", ["triton", "reference"])
def test_sums_inside_composites_keep_the_dtype_as_numpy(kernels):
    """einsum and take_along_axis of int32 stay int32 and of bools bool, as in numpy (their
    sums are op.sum(..., dtype=x.dtype)); op.sum's dtype is numpy's (bool: the or)."""
    x = np.arange(12, dtype=np.int32).reshape(3, 4) - 5
    ids = np.array([[0, 3], [1, 1], [2, 0]])
    cases = [
        (lambda x, i: op.einsum("ij->i", x), lambda x, i: np.einsum("ij->i", x), x),
        (lambda x, i: op.einsum("ii->i", x[:, :3]), lambda x, i: np.einsum("ii->i", x[:, :3]), x),
        (lambda x, i: op.einsum("ij->j", x), lambda x, i: np.einsum("ij->j", x), x > 0),
        (lambda x, i: op.take_along_axis(x, i, 1), lambda x, i: np.take_along_axis(x, i, 1), x),
        (lambda x, i: op.take_along_axis(x, i, 1), lambda x, i: np.take_along_axis(x, i, 1), x > 0),
        (lambda x, i: op.sum(x, 1, dtype=bool), lambda x, i: np.sum(x, 1, dtype=bool), x * 0.25),
        (lambda x, i: op.sum(x, dtype="int32"), lambda x, i: np.sum(x, dtype=np.int32), x),
        (
            lambda x, i: op.sum(x, 0, dtype=np.float64),
            lambda x, i: np.sum(x, 0, dtype=np.float64),
            x,
        ),
    ]
    for ours, theirs, arg in cases:
        result, expected = ts.jit(ours, kernels=kernels)(arg, ids), theirs(arg, ids)
        assert result.dtype == expected.dtype
        np.testing.assert_array_equal(result, expected)
