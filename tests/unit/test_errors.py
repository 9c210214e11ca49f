"""Bad programs raise TesseraError subclasses that name the user's line and the shapes.

The offending line of each case carries a ``# <- name`` marker; ``at(name)`` is that
line's ``file:line``, which the error message must contain.
"""

from __future__ import annotations

import traceback
from pathlib import Path

import numpy as np
import pytest

import tessera as ts
from tessera import op

SOURCE = Path(__file__).read_text().splitlines()


def at(marker: str) -> str:
    """``file:line`` of the line of this file ending in ``# <- marker``."""
    (line,) = [i for i, text in enumerate(SOURCE, 1) if text.endswith(f"# <- {marker}")]
    return f"{__file__}:{line}"


def raises(error: type[ts.TesseraError], fn, *args, marker: str, shapes: tuple[str, ...] = ()):
    """Calls ``fn``; checks the error type, the source line and the shapes in the message."""
    with pytest.raises(error) as info:
        fn(*args)
    message = str(info.value)
    assert at(marker) in message, message
    for shape in shapes:
        assert shape in message, message
    return info


def f32(*shape: int) -> np.ndarray:
    return np.zeros(shape, np.float32)


# --- shape errors found while tracing ------------------------------------------------------------


def test_matmul_contraction_mismatch():
    def f(x, w):
        return x @ w  # <- matmul

    raises(ts.ShapeError, ts.jit(f), f32(2, 3), f32(4, 5), marker="matmul",
           shapes=("tensor<2x3xf32>", "tensor<4x5xf32>", "k = 3", "k = 4"))  # fmt: skip


def test_matmul_of_a_scalar():
    def f(x, w):
        return op.matmul(x, w)  # <- matmul scalar

    raises(
        ts.ShapeError, ts.jit(f), f32(), f32(2, 2), marker="matmul scalar", shapes=("tensor<f32>",)
    )


def test_non_broadcastable_add():
    def f(x, y):
        return x + y  # <- add

    raises(ts.ShapeError, ts.jit(f), f32(2, 3), f32(4), marker="add", shapes=("[2, 3]", "[4]"))


def test_reshape_to_a_different_size():
    def f(x):
        return x.reshape(4, 4)  # <- reshape

    raises(
        ts.ShapeError, ts.jit(f), f32(2, 3), marker="reshape", shapes=("tensor<2x3xf32>", "[4, 4]")
    )


def test_reshape_with_minus_one_that_does_not_divide():
    def f(x):
        return op.reshape(x, (4, -1))  # <- reshape -1

    raises(ts.ShapeError, ts.jit(f), f32(2, 3), marker="reshape -1", shapes=("tensor<2x3xf32>",))


AXIS_ERRORS = {
    "sum": lambda x: op.sum(x, axis=2),  # <- sum
    "mean": lambda x: op.mean(x, axis=(0, -3)),  # <- mean
    "softmax": lambda x: op.softmax(x, axis=2),  # <- softmax
    "layer_norm": lambda x: op.layer_norm(x, axis=-3),  # <- layer_norm
    "transpose": lambda x: op.transpose(x, (0, 2)),  # <- transpose
    "swapaxes": lambda x: op.swapaxes(x, 0, 2),  # <- swapaxes
    "concat": lambda x: op.concat([x, x], axis=2),  # <- concat axis
    "concat one": lambda x: op.concat([x], axis=-3),  # <- concat one
    "split": lambda x: op.split(x, 1, axis=-3),  # <- split axis
    "chunk": lambda x: op.chunk(x, 2, axis=2),  # <- chunk
    "take": lambda x: op.take(x, np.array([0]), axis=2),  # <- take
}


@pytest.mark.parametrize("name", sorted(AXIS_ERRORS))
def test_axis_out_of_range(name):
    marker = {"concat": "concat axis", "split": "split axis"}.get(name, name)
    raises(ts.ShapeError, ts.jit(AXIS_ERRORS[name]), f32(2, 3), marker=marker,
           shapes=("tensor<2x3xf32>", "rank 2"))  # fmt: skip


@pytest.mark.parametrize("perm", [(0, 0), (0, 1, 2), (1,)])
def test_bad_transpose_permutation(perm):
    def f(x):
        return x.transpose(perm)  # <- perm

    raises(ts.ShapeError, ts.jit(f), f32(2, 3), marker="perm", shapes=("tensor<2x3xf32>",))


def test_concat_mismatch():
    def f(x, y):
        return op.concat([x, y], axis=1)  # <- concat

    raises(ts.ShapeError, ts.jit(f), f32(2, 3), f32(3, 3), marker="concat",
           shapes=("tensor<2x3xf32>", "tensor<3x3xf32>"))  # fmt: skip


def test_split_sections_that_do_not_divide_the_axis():
    def f(x):
        return op.split(x, 2, axis=1)  # <- split

    raises(
        ts.ShapeError,
        ts.jit(f),
        f32(2, 3),
        marker="split",
        shapes=("tensor<2x3xf32>", "2 sections"),
    )


def test_broadcast_to_a_smaller_shape():
    def f(x):
        return op.broadcast_to(x, (3,))  # <- broadcast_to

    raises(
        ts.ShapeError,
        ts.jit(f),
        f32(2, 3),
        marker="broadcast_to",
        shapes=("tensor<2x3xf32>", "[3]"),
    )


def test_cross_entropy_label_shape():
    def f(logits, labels):
        return op.cross_entropy(logits, labels)  # <- labels shape

    raises(ts.ShapeError, ts.jit(f), f32(2, 5), np.zeros(3, np.int64), marker="labels shape",
           shapes=("tensor<2x5xf32>", "tensor<3xi64>", "[2]"))  # fmt: skip


def test_cross_entropy_label_dtype():
    def f(logits, labels):
        return op.cross_entropy(logits, labels)  # <- labels dtype

    raises(ts.ShapeError, ts.jit(f), f32(2, 5), f32(2), marker="labels dtype",
           shapes=("integer labels", "tensor<2xf32>"))  # fmt: skip


def test_index_out_of_bounds():
    def f(x):
        return x[:, 3]  # <- index

    raises(ts.ShapeError, ts.jit(f), f32(2, 3), marker="index", shapes=("tensor<2x3xf32>",))


def test_error_names_the_user_line_not_a_helper_inside_tessera():
    def helper(x):
        return op.exp(x) @ x  # <- helper

    def f(x):
        return helper(x) + 1

    raises(ts.ShapeError, ts.jit(f), f32(2, 3), marker="helper")


def test_shape_error_is_short():
    # The error is raised from the op, not chained to the rule's internal exception.
    info = raises(ts.ShapeError, ts.jit(lambda x: x @ x), f32(2, 3), marker="short")  # <- short
    assert info.value.__cause__ is None and info.value.__suppress_context__


# --- Python that cannot be traced -------------------------------------------------------------------


def test_python_if_on_a_tensor():
    def f(x):
        if x.sum() > 0:  # <- if
            return x
        return -x

    raises(ts.TraceError, ts.jit(f), f32(2), marker="if", shapes=("tensor<i1>",))


@pytest.mark.parametrize("convert", [float, int, range, np.asarray])
def test_converting_a_tensor_to_a_python_value(convert):
    def f(x):
        return convert(x)  # <- convert

    raises(ts.TraceError, ts.jit(f), f32(), marker="convert", shapes=("tensor<f32>",))


def test_returning_a_non_tensor():
    def f(x):  # <- def
        return x + 1, 3

    info = raises(ts.TraceError, ts.jit(f), f32(2), marker="def")
    assert "found int: 3" in str(info.value)


def test_using_a_tensor_from_another_trace():
    leaked = []

    def first(x):
        leaked.append(x)
        return x

    def second(y):
        return y + leaked[0]  # <- leak

    ts.jit(first)(f32(2))
    raises(ts.TraceError, ts.jit(second), f32(2), marker="leak")


def test_calling_op_outside_jit():
    with pytest.raises(ts.TraceError, match=r"inside a @ts.jit function") as add:
        op.add(np.ones(2), 1)  # <- outside add
    with pytest.raises(ts.TraceError, match=r"inside a @ts.jit function") as exp:
        op.exp(np.ones(2))  # <- outside exp
    with pytest.raises(ts.TraceError, match=r"inside a @ts.jit function") as zeros:
        op.zeros((2,))  # <- outside zeros
    assert at("outside add") in str(add.value)
    assert at("outside exp") in str(exp.value)
    assert at("outside zeros") in str(zeros.value)


# --- errors found while running ----------------------------------------------------------------------


def test_gather_with_out_of_range_indices_at_run_time():
    def f(table, ids):
        return op.take(table, ids)  # <- gather

    info = raises(ts.ExecutionError, ts.jit(f), f32(3, 4), np.array([0, 5]), marker="gather",
                  shapes=("[3, 4]", "[-3, 3)", "5"))  # fmt: skip
    error = info.value
    assert error.__cause__ is None and error.__suppress_context__
    # The traceback runs from the call through ts.jit to the executor, not through the
    # interpreter's internals.
    assert len(traceback.extract_tb(info.tb)) <= 6


def test_cross_entropy_with_out_of_range_label_at_run_time():
    def f(logits, labels):
        return op.cross_entropy(logits, labels)  # <- label value

    raises(ts.ExecutionError, ts.jit(f), f32(2, 5), np.array([1, 7]), marker="label value",
           shapes=("[0, 5)", "[2, 5]", "7"))  # fmt: skip


def test_errors_are_tessera_errors():
    for error in (ts.ShapeError, ts.TraceError, ts.ExecutionError, ts.IRError):
        assert issubclass(error, ts.TesseraError)
