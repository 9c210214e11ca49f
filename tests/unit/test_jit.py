"""``ts.jit``: caching by signature, static arguments, pytrees, kwargs and ``lower``."""

from __future__ import annotations

import functools
from collections import namedtuple

import numpy as np
import pytest
import torch
from xdsl.context import Context
from xdsl.dialects.builtin import Builtin
from xdsl.dialects.func import Func
from xdsl.parser import Parser

import tessera as ts
from tessera import op
from tessera.ir.graph import Graph


def f32(*shape: int) -> np.ndarray:
    return np.arange(np.prod(shape), dtype=np.float32).reshape(shape)


# --- caching by signature -------------------------------------------------------------------


def test_same_shapes_and_dtypes_do_not_retrace():
    calls = []

    @ts.jit
    def f(x, y):
        calls.append(1)  # runs only while tracing
        return x @ y

    x, y = f32(2, 3), f32(3, 4)
    first = f(x, y)
    second = f(x + 1, y * 2)
    assert f.trace_count == 1 and len(calls) == 1
    np.testing.assert_allclose(first, x @ y)
    np.testing.assert_allclose(second, (x + 1) @ (y * 2))


def test_numpy_and_torch_arguments_share_a_trace():
    f = ts.jit(lambda x: x * 2)
    f(f32(2, 3))
    f(torch.zeros(2, 3))
    f(np.zeros((2, 3), np.float32))
    assert f.trace_count == 1
    f(np.zeros((2, 3)))  # float64 is computed in float64: a signature of its own
    assert f.trace_count == 2


@pytest.mark.parametrize(
    "other",
    [
        f32(3, 2),
        f32(2, 3, 1),
        np.zeros((2, 3), np.float16),
        torch.zeros(2, 3, dtype=torch.bfloat16),
    ],
    ids=["shape", "rank", "f16", "bf16"],
)
def test_a_new_shape_or_dtype_retraces(other):
    f = ts.jit(lambda x: x + 1)
    f(f32(2, 3))
    result = f(other)
    assert f.trace_count == 2
    assert result.shape == other.shape and result.dtype == other.dtype
    f(other)
    assert f.trace_count == 2


def test_python_scalars_are_static_and_compared_by_type():
    f = ts.jit(lambda x, scale: x * scale)
    x = np.array([1, 2], dtype=np.int32)
    assert f(x, 2).dtype == np.int32
    f(x, 2)
    assert f.trace_count == 1
    f(x, 3)
    assert f.trace_count == 2
    # 2 == 2.0 in Python, but x * 2.0 is a float computation.
    halfway = f(x, 2.0)
    assert f.trace_count == 3
    assert halfway.dtype == np.float32
    np.testing.assert_array_equal(f(x, True), x)
    assert f.trace_count == 4


def test_lower_is_cached_and_counts_traces():
    f = ts.jit(lambda x: x.sum())
    x = f32(4)
    lowered = f.lower(x)
    assert f.lower(x) is lowered
    assert f.trace_count == 1
    assert float(lowered(x)) == 6.0
    f(x)
    assert f.trace_count == 1


def test_lowered_rejects_arguments_of_another_signature():
    lowered = ts.jit(lambda x: x + 1).lower(f32(2, 3))
    with pytest.raises(ts.ExecutionError, match=r"tensor<2x3xf32>.*found tensor<3x2xf32>"):
        lowered(f32(3, 2))


# --- static_argnums ----------------------------------------------------------------------------


def test_static_argnums_specialises_on_the_value():
    @ts.jit(static_argnums=1)
    def f(x, shape):
        return x.reshape(shape)

    x = f32(2, 6)
    assert f(x, (3, 4)).shape == (3, 4)
    assert f(x, (3, 4)).shape == (3, 4)
    assert f.trace_count == 1
    assert f(x, (12,)).shape == (12,)
    assert f.trace_count == 2


def test_static_argnums_allows_python_control_flow():
    @ts.jit(static_argnums=(1, 2))
    def f(x, activation, repeat):
        for _ in range(repeat):
            x = op.relu(x) if activation == "relu" else op.tanh(x)
        return x

    x = np.array([-1.0, 2.0], dtype=np.float32)
    np.testing.assert_allclose(f(x, "relu", 2), [0.0, 2.0])
    np.testing.assert_allclose(f(x, "tanh", 1), np.tanh(x), rtol=1e-6)
    assert f.trace_count == 2


def test_negative_static_argnums_count_from_the_end():
    f = ts.jit(lambda x, axis: op.softmax(x, axis=axis), static_argnums=-1)
    x = f32(2, 3)
    expected = torch.softmax(torch.from_numpy(x).double(), 0).numpy()
    np.testing.assert_allclose(f(x, 0), expected, rtol=1e-5)
    f(x, 0)
    assert f.trace_count == 1


def test_unhashable_static_argument_raises():
    f = ts.jit(lambda x, opts: x, static_argnums=1)
    with pytest.raises(ts.TraceError, match="hashable"):
        f(f32(2), {"a": 1})


# --- pytrees and kwargs --------------------------------------------------------------------------

Pair = namedtuple("Pair", ["left", "right"])


def test_pytree_inputs_and_outputs():
    @ts.jit
    def f(params, batch, extra):
        w, b = params["w"], params["b"]
        (x,), y = batch
        h = x @ w + b
        return {"h": h, "pair": Pair(h.sum(), [y * 2, None]), "none": None}, (extra.left,)

    params = {"w": f32(3, 2), "b": f32(2)}
    batch = ([f32(4, 3)], f32(4))
    extra = Pair(f32(1), None)
    out, (left,) = f(params, batch, extra)
    h = batch[0][0] @ params["w"] + params["b"]
    assert list(out) == ["h", "pair", "none"] and out["none"] is None
    np.testing.assert_allclose(out["h"], h)
    assert isinstance(out["pair"], Pair) and isinstance(out["pair"].right, list)
    np.testing.assert_allclose(out["pair"].left, h.sum())
    np.testing.assert_allclose(out["pair"].right[0], batch[1] * 2)
    assert out["pair"].right[1] is None
    np.testing.assert_array_equal(left, extra.left)


def test_a_new_pytree_structure_retraces():
    f = ts.jit(lambda xs: sum(xs[1:], xs[0]))
    f([f32(2), f32(2)])
    f([f32(2), f32(2)])
    assert f.trace_count == 1
    np.testing.assert_allclose(f((f32(2), f32(2), f32(2))), 3 * f32(2))
    assert f.trace_count == 2


def test_keyword_arguments():
    @ts.jit
    def f(x, *, bias, scale=2.0):
        return x * scale + bias

    x, b = f32(2, 2), np.ones(2, np.float32)
    np.testing.assert_allclose(f(x, bias=b), x * 2 + b)
    np.testing.assert_allclose(f(x, bias=b, scale=3.0), x * 3 + b)
    np.testing.assert_allclose(f(bias=b, x=x), x * 2 + b)
    assert f.trace_count == 3  # a new static value; x passed by keyword is a new structure


def test_single_tensor_output_is_not_wrapped():
    result = ts.jit(lambda x: x + 1)(f32(2))
    assert isinstance(result, np.ndarray)


# --- lowering and text --------------------------------------------------------------------------


def parse(text: str):
    context = Context()
    for dialect in (Builtin, Func, Graph):
        context.load_dialect(dialect)
    module = Parser(context, text).parse_module()
    module.verify()
    return module


def test_graph_text_parses_and_names_the_ops():
    @ts.jit
    def mlp(x, w1, w2):
        return op.gelu(x @ w1, approximate="tanh") @ w2 + 1.0

    text = mlp.lower(f32(4, 8), f32(8, 16), f32(16, 8)).as_text("graph")
    for name in ("func.func @mlp", "graph.matmul", "graph.gelu", "graph.add", "graph.constant"):
        assert name in text
    assert "tensor<4x16xf32>" in text
    assert str(parse(text)) == text


def test_graph_text_of_every_op_family_round_trips():
    @ts.jit
    def f(x, ids, labels):
        h = op.layer_norm(x, weight=op.ones((6,)))
        parts = op.split(op.softmax(h, axis=0), [2], axis=1)
        pooled = op.concat([parts[1], parts[0]], axis=1)[:, ::2].T.reshape(-1)
        picked = op.take(x, ids, axis=1)
        masked = op.where(x > 0, x, op.zeros((1, 6)))
        loss = op.cross_entropy(x, labels, reduction="sum")
        return pooled.max(), picked.astype("bf16"), masked.mean(axis=(0, 1), keepdims=True), loss

    text = f.lower(f32(3, 6), np.array([0, 5]), np.array([1, 2, 3])).as_text("graph")
    assert str(parse(text)) == text


def test_unknown_stage_raises():
    lowered = ts.jit(lambda x: x * 2).lower(f32(2))
    with pytest.raises(ts.TesseraError, match="unknown or not yet available stage 'graf'"):
        lowered.as_text("graf")


# --- the decorator ----------------------------------------------------------------------------------


def test_jit_keeps_the_function_name_and_doc():
    @ts.jit
    def scale(x):
        """Doubles x."""
        return x * 2

    assert scale.__name__ == "scale" and scale.__doc__ == "Doubles x."
    assert isinstance(scale, ts.JitFunction)


@pytest.mark.parametrize("bad", [3, "f", int])
def test_jit_of_a_non_function_raises(bad):
    with pytest.raises(ts.TesseraError, match="expects a function"):
        ts.jit(bad)


def test_function_without_array_arguments():
    result = ts.jit(lambda: op.ones((2,)) * 3)()
    assert isinstance(result, torch.Tensor) and result.tolist() == [3.0, 3.0]


def test_jit_of_a_partial_and_of_a_bound_method():
    def scaled(x, scale):
        return x * scale

    class Layer:
        def __init__(self):
            self.w = np.eye(2, dtype=np.float32)

        def __call__(self, x):
            return x @ self.w

    double = ts.jit(functools.partial(scaled, scale=2.0))
    np.testing.assert_array_equal(double(f32(2)), [0.0, 2.0])
    assert "func.func @main" in double.lower(f32(2)).as_text("graph")
    np.testing.assert_array_equal(ts.jit(Layer().__call__)(f32(1, 2)), f32(1, 2))
    with pytest.raises(ts.TraceError, match="must return tensors"):
        ts.jit(functools.partial(lambda x, s: (x, s), s=3))(f32(2))


def test_jit_of_a_callable_object_keeps_its_own_settings() -> None:
    """ts.jit copies a function's name, not its attributes: an object with a ``mesh``
    attribute must not turn the compiled function into a sharded one."""

    class Model:
        mesh = "not a mesh"
        __name__ = "model"

        def __call__(self, x):
            return x * 2

    compiled = ts.jit(Model())
    assert compiled.mesh is None and compiled.__name__ == "model"
    x = np.arange(4, dtype=np.float32)
    np.testing.assert_array_equal(compiled(x), x * 2)
