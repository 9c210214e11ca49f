"""The composite ops of ``tessera.op`` (einsum, arange, tril / triu, logsumexp, one_hot,
var / std, stack, squeeze, expand_dims, take_along_axis, numpy's split) against torch.

Values run under ``ts.jit`` with the generated Triton kernels (interpreted on a CPU) and
are compared with torch eager in float64: f32 results within rtol 1e-5 and atol 1e-5 (a
few f32 roundings, sums of at most a few dozen terms of size about 1). Gradients come
from ``ts.grad`` (Triton kernels) of ``sum(f(x) * c)`` for a random ``c`` and are
compared with ``torch.autograd`` in float64 within rtol 1e-4, atol 1e-5 (the backward
program adds a few more roundings). Sharded runs (a 2 x 2 dp x tp mesh) must give the
unsharded result within the same tolerance. Integer and boolean results are exact.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from user_errors import raised_at_marked_line

import tessera as ts
from tessera import dist, op

RTOL, ATOL = 1e-5, 1e-5
GRAD_RTOL, GRAD_ATOL = 1e-4, 1e-5
MESH = dist.mesh({"dp": 2, "tp": 2})
ROWS_DP = dist.ShardSpec(partition=(0,), mesh_axes=("dp",))
COLS_TP = dist.ShardSpec(partition=(1,), mesh_axes=("tp",))


def randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def jit(fn: Callable[..., Any], **options: Any) -> Any:
    return ts.jit(fn, kernels="triton", **options)


def close(got: Any, expected: torch.Tensor, rtol: float = RTOL, atol: float = ATOL) -> None:
    got = torch.as_tensor(np.asarray(got)) if isinstance(got, np.ndarray) else got
    assert tuple(got.shape) == tuple(expected.shape), (tuple(got.shape), tuple(expected.shape))
    torch.testing.assert_close(got.double(), expected.double(), rtol=rtol, atol=atol)


def check_grad(
    ours: Callable[..., Any],
    theirs: Callable[..., torch.Tensor],
    inputs: Sequence[torch.Tensor],
    *,
    seed: int = 1,
) -> None:
    """``ts.grad`` of ``sum(ours(*inputs) * c)`` against torch.autograd of ``theirs``."""
    c = torch.randn(
        theirs(*[x.double() for x in inputs]).shape,
        generator=torch.Generator().manual_seed(seed),
        dtype=torch.float64,
    )
    argnums = tuple(range(len(inputs)))
    got = ts.grad(lambda *xs: op.sum(ours(*xs) * c.float()), argnums=argnums, kernels="triton")(
        *inputs
    )
    leaves = [x.double().requires_grad_() for x in inputs]
    expected = torch.autograd.grad((theirs(*leaves) * c).sum(), leaves)
    for g, e in zip(got, expected, strict=True):
        close(g, e, GRAD_RTOL, GRAD_ATOL)


# --- einsum -------------------------------------------------------------------------------------

EINSUM_CASES = [
    ("ij,jk->ik", [(3, 4), (4, 5)]),  # matmul
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),  # batched matmul
    ("bhqd,bhkd->bhqk", [(2, 3, 4, 5), (2, 3, 6, 5)]),  # attention scores
    ("bhqk,bhkd->bqhd", [(2, 3, 4, 6), (2, 3, 6, 5)]),  # attention output, heads moved
    ("ij,jk->ki", [(3, 4), (4, 5)]),  # transposed output
    ("ij->ji", [(3, 4)]),
    ("ij->j", [(3, 4)]),  # a reduction
    ("ijk->", [(2, 3, 4)]),
    ("i,j->ij", [(3,), (4,)]),  # outer product
    ("i,i->", [(5,), (5,)]),  # dot
    ("ij,ij->ij", [(3, 4), (3, 4)]),  # elementwise
    ("ij,ij->i", [(3, 4), (3, 4)]),  # rowwise dot
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]),  # three operands
    ("bi,bj,bk->bijk", [(2, 3), (2, 4), (2, 2)]),
    ("ab,bc,ca->", [(2, 3), (3, 4), (4, 2)]),
    ("ij,jk", [(3, 4), (4, 5)]),  # implicit output: ik
    ("ba,cb", [(3, 4), (5, 3)]),  # implicit output, sorted: ac
    ("bij,bjk", [(2, 3, 4), (2, 4, 5)]),  # implicit: b is summed (appears twice)
    ("ij,k->", [(2, 3), (4,)]),  # indices in one operand only, summed first
    ("ii->i", [(4, 4)]),  # diagonal
    ("ii", [(4, 4)]),  # trace
    ("iij->j", [(3, 3, 2)]),
    ("...ij,...jk->...ik", [(2, 3, 4, 5), (3, 5, 2)]),  # ellipsis, broadcast batch
    ("...ij,...jk", [(2, 1, 4, 5), (3, 5, 2)]),  # size-1 ellipsis dim broadcasts
    ("...i,...i->...", [(2, 3, 4), (4,)]),
    ("i...->...i", [(3, 2, 4)]),
    ("bn...,bn->b...", [(2, 3, 4, 5), (2, 3)]),
    (" ij , jk -> ik ", [(3, 4), (4, 5)]),  # spaces are ignored
    ("Ab,bC->AC", [(3, 4), (4, 2)]),  # upper-case indices
]


@pytest.mark.parametrize(("equation", "shapes"), EINSUM_CASES)
def test_einsum(equation: str, shapes: list[tuple[int, ...]]) -> None:
    xs = [randn(*shape, seed=i) for i, shape in enumerate(shapes)]
    got = jit(lambda *ts_: op.einsum(equation, *ts_))(*xs)
    close(got, torch.einsum(equation, *[x.double() for x in xs]))


@st.composite
def einsum_cases(draw: st.DrawFn) -> tuple[str, list[tuple[int, ...]]]:
    """Random equations: 1-3 operands of 0-3 indices from ``abcde`` (repeats included),
    an explicit output (a subset of the indices, in any order) or an implicit one."""
    sizes = {letter: draw(st.integers(1, 4)) for letter in "abcde"}
    terms = draw(st.lists(st.text("abcde", max_size=3), min_size=1, max_size=3))
    used = sorted(set("".join(terms)))
    equation = ",".join(terms)
    if draw(st.booleans()):
        output = draw(st.permutations(used))[: draw(st.integers(0, len(used)))]
        equation += "->" + "".join(output)
    return equation, [tuple(sizes[letter] for letter in term) for term in terms]


@settings(max_examples=40, deadline=None)
@given(case=einsum_cases(), seed=st.integers(0, 2**16))
def test_einsum_random_equations(case: tuple[str, list[tuple[int, ...]]], seed: int) -> None:
    equation, shapes = case
    xs = [randn(*shape, seed=seed + i) for i, shape in enumerate(shapes)]
    got = jit(lambda *a: op.einsum(equation, *a))(*xs)
    close(got, torch.einsum(equation, *[x.double() for x in xs]))


@pytest.mark.parametrize(
    ("equation", "shapes"),
    [
        ("bhqd,bhkd->bhqk", [(2, 2, 3, 4), (2, 2, 5, 4)]),
        ("ij,jk,kl->li", [(2, 3), (3, 4), (4, 2)]),
        ("i,j->ij", [(3,), (4,)]),
        ("ii->i", [(3, 3)]),
        ("...ij,...jk", [(2, 1, 3, 4), (3, 4, 2)]),
    ],
)
def test_einsum_gradient(equation: str, shapes: list[tuple[int, ...]]) -> None:
    xs = [randn(*shape, seed=i) for i, shape in enumerate(shapes)]
    check_grad(lambda *a: op.einsum(equation, *a), lambda *a: torch.einsum(equation, *a), xs)


def test_einsum_lowers_to_matmuls_and_layout_ops() -> None:
    a, b = randn(2, 3, 4, 5), randn(2, 3, 6, 5)
    text = jit(lambda a, b: op.einsum("bhqd,bhkd->bhqk", a, b)).lower(a, b).as_text("graph")
    assert text.count("graph.matmul") == 1 and "graph.transpose" in text
    text = jit(lambda a, b: op.einsum("ij,ij->ij", a, b)).lower(a[0, 0], a[0, 0]).as_text("graph")
    assert "graph.matmul" not in text and "graph.mul" in text  # nothing contracted


def test_einsum_of_integers_is_exact() -> None:
    a, b = torch.randint(-5, 5, (3, 4)), torch.randint(-5, 5, (4, 2))
    # the reference executor: Triton's tl.dot has no int64 operands (as for op.matmul)
    got = ts.jit(lambda a, b: op.einsum("ij,jk->ik", a, b), kernels="reference")(a, b)
    assert got.dtype == torch.int64 and torch.equal(got, a @ b)


SOURCE = Path(__file__).read_text().splitlines()


def caret_at(message: str, equation: str) -> int:
    """The column the caret under the equation points at (0 = its first character)."""
    lines = message.splitlines()
    row = next(i for i, line in enumerate(lines) if line == f"  {equation}")
    return lines[row + 1].index("^") - 2


EINSUM_ERRORS = [
    # equation, operand shapes, error, words in the message, caret position
    ("ij,jk->i$", [(2, 3), (3, 4)], ts.TraceError, "unexpected character '$'", 8),
    ("ij,j1->ik", [(2, 3), (3, 4)], ts.TraceError, "unexpected character '1'", 4),
    ("ij-jk", [(2, 3)], ts.TraceError, "unexpected character '-'", 2),
    ("ij,jk->ik->i", [(2, 3), (3, 4)], ts.TraceError, "unexpected '->'", 9),
    ("ij,jk->ik", [(2, 3)], ts.ShapeError, "2 input terms but 1 operands", 3),
    ("ij,jk->ik", [(2, 3), (3, 4), (4, 4)], ts.ShapeError, "2 input terms but 3 operands", 5),
    ("ij,jk->ik", [(2, 3), (4, 5)], ts.ShapeError, "index 'j' has size 4 in operand 1", 3),
    ("ii->i", [(2, 3)], ts.ShapeError, "index 'i' has size 3 in operand 0 but size 2", 1),
    ("ij,jk->il", [(2, 3), (3, 4)], ts.TraceError, "output index 'l' does not appear", 8),
    ("ij,jk->kik", [(2, 3), (3, 4)], ts.TraceError, "output index 'k' appears more than once", 9),
    (
        "ij,jk->ik",
        [(2, 3, 1), (3, 4)],
        ts.ShapeError,
        "term 0 names 2 dims but operand 0 has rank 3",
        0,
    ),
    ("...i...,i", [(2, 3), (3,)], ts.TraceError, "only one '...'", 4),
    (
        "...ij,...jk",
        [(2, 3, 4), (5, 4, 2)],
        ts.ShapeError,
        "'...' dims of the operands do not broadcast",
        0,
    ),
]


@pytest.mark.parametrize(("equation", "shapes", "error", "words", "caret"), EINSUM_ERRORS)
def test_einsum_errors_point_at_the_culprit(
    equation: str, shapes: list[tuple[int, ...]], error: type[Exception], words: str, caret: int
) -> None:
    def f(*xs):
        return op.einsum(equation, *xs)  # <- einsum

    with pytest.raises(error) as info:
        jit(f)(*[np.zeros(s, np.float32) for s in shapes])
    message = str(info.value)
    assert words in message, message
    assert caret_at(message, equation) == caret, message
    (line,) = [i for i, text in enumerate(SOURCE, 1) if text.endswith("# <- einsum")]
    assert f"{__file__}:{line}" in message, message


# --- constants, masks and one_hot -----------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "dtype", "expected"),
    [
        ((5,), None, torch.arange(5)),
        ((2, 9, 3), None, torch.arange(2, 9, 3)),
        ((5, 0, -2), None, torch.arange(5, 0, -2)),
        ((0.5, 2.0, 0.25), None, torch.arange(0.5, 2.0, 0.25, dtype=torch.float32)),
        ((4,), "f32", torch.arange(4, dtype=torch.float32)),
        ((3,), "i32", torch.arange(3, dtype=torch.int32)),
    ],
)
def test_arange(args: tuple[Any, ...], dtype: Any, expected: torch.Tensor) -> None:
    got = jit(lambda x: op.arange(*args, dtype=dtype) + x * 0)(
        torch.zeros((), dtype=expected.dtype)
    )
    assert got.dtype == expected.dtype and torch.equal(got, expected)


@pytest.mark.parametrize("k", [-2, -1, 0, 1, 3])
@pytest.mark.parametrize("shape", [(4, 4), (2, 3, 5), (5, 2)])
def test_tril_triu(shape: tuple[int, ...], k: int) -> None:
    x = randn(*shape)
    lower, upper = jit(lambda x: (op.tril(x, k), op.triu(x, k=k)))(x)
    assert torch.equal(lower, torch.tril(x, k)) and torch.equal(upper, torch.triu(x, k))


def test_tril_gradient_and_integers() -> None:
    check_grad(lambda x: op.tril(x, -1), lambda x: torch.tril(x, -1), [randn(3, 4)])
    ints = torch.randint(-9, 9, (3, 3))
    assert torch.equal(jit(op.triu)(ints), torch.triu(ints))


@pytest.mark.parametrize("shape", [(5,), (2, 3), (2, 1, 4)])
@pytest.mark.parametrize("dtype", ["f32", "i32", "i1"])
def test_one_hot(shape: tuple[int, ...], dtype: str) -> None:
    ids = torch.randint(-1, 6, shape, generator=torch.Generator().manual_seed(3))
    got = jit(lambda i: op.one_hot(i, 5, dtype=dtype))(ids)
    # out-of-range indices (here -1 and 5) give zero rows, as jax.nn.one_hot
    expected = torch.nn.functional.one_hot(ids.clamp(0, 5), 6)[..., :5] * (ids >= 0)[..., None]
    torch_dtype = {"f32": torch.float32, "i32": torch.int32, "i1": torch.bool}[dtype]
    assert got.dtype == torch_dtype and torch.equal(got, expected.to(torch_dtype))


def cross_entropy_via_one_hot(logits: Any, labels: Any) -> Any:
    picked = op.sum(op.log_softmax(logits, axis=-1) * op.one_hot(labels, logits.shape[-1]), axis=-1)
    return -op.mean(picked)


def test_one_hot_loss_and_its_gradient() -> None:
    logits, labels = randn(6, 5), torch.randint(0, 5, (6,))
    got = jit(cross_entropy_via_one_hot)(logits, labels)
    close(got, torch.nn.functional.cross_entropy(logits.double(), labels))
    grad = ts.grad(cross_entropy_via_one_hot, kernels="triton")(logits, labels)
    leaf = logits.double().requires_grad_()
    torch.nn.functional.cross_entropy(leaf, labels).backward()
    close(grad, leaf.grad, GRAD_RTOL, GRAD_ATOL)


# --- reductions -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("shape", "axis", "keepdims"),
    [((3, 5), -1, False), ((3, 5), 0, True), ((2, 3, 4), (0, 2), False), ((2, 3, 4), None, False),
     ((2, 3, 4), None, True), ((6,), 0, False)],
)  # fmt: skip
def test_logsumexp(shape: tuple[int, ...], axis: Any, keepdims: bool) -> None:
    x = randn(*shape) * 30  # large values: exp alone would overflow f32
    dims = tuple(range(len(shape))) if axis is None else axis
    got = jit(lambda x: op.logsumexp(x, axis=axis, keepdims=keepdims))(x)
    close(got, torch.logsumexp(x.double(), dim=dims, keepdim=keepdims), rtol=RTOL, atol=1e-4)
    check_grad(
        lambda x: op.logsumexp(x, axis=axis, keepdims=keepdims),
        lambda x: torch.logsumexp(x, dim=dims, keepdim=keepdims),
        [randn(*shape)],
    )


def test_logsumexp_of_infinities() -> None:
    x = torch.tensor([[-torch.inf, -torch.inf], [1.0, torch.inf], [-torch.inf, 2.0], [1e30, 1e30]])
    got = jit(lambda x: op.logsumexp(x, axis=1))(x)
    torch.testing.assert_close(got, torch.logsumexp(x, dim=1))


@pytest.mark.parametrize("name", ["var", "std"])
@pytest.mark.parametrize(
    ("shape", "axis", "ddof", "keepdims"),
    [((4, 5), None, 0, False), ((4, 5), 0, 1, False), ((4, 5), -1, 0, True),
     ((2, 3, 4), (0, 2), 1, False), ((2, 3, 4), 1, 2, True)],
)  # fmt: skip
def test_var_std(name: str, shape: tuple[int, ...], axis: Any, ddof: int, keepdims: bool) -> None:
    x = randn(*shape) * 2 + 3
    dims = tuple(range(len(shape))) if axis is None else axis

    def ours(x: Any) -> Any:
        return getattr(op, name)(x, axis=axis, ddof=ddof, keepdims=keepdims)

    def theirs(x: torch.Tensor) -> torch.Tensor:
        return getattr(torch, name)(x, dim=dims, correction=ddof, keepdim=keepdims)

    close(jit(ours)(x), theirs(x.double()))
    check_grad(ours, theirs, [x])


def test_var_of_integers_is_float_and_matches_numpy() -> None:
    x = np.arange(12, dtype=np.int64).reshape(3, 4) ** 2
    got = jit(lambda x: op.var(x, axis=1, ddof=1))(x)
    np.testing.assert_allclose(got, np.var(x, axis=1, ddof=1), rtol=1e-6)


# --- layout ---------------------------------------------------------------------------------


@pytest.mark.parametrize("axis", [0, 1, 2, -1, -3])
def test_stack(axis: int) -> None:
    xs = [randn(2, 3, seed=i) for i in range(3)]
    got = jit(lambda a, b, c: op.stack([a, b, c], axis=axis))(*xs)
    assert torch.equal(got, torch.stack(xs, dim=axis))
    check_grad(lambda *a: op.stack(a, axis=axis), lambda *a: torch.stack(a, dim=axis), xs)


@pytest.mark.parametrize(
    ("shape", "axis"), [((1, 3, 1, 2), None), ((1, 3, 1, 2), 0), ((1, 3, 1, 2), (-2, 0)),
                        ((1,), None), ((3,), None)]
)  # fmt: skip
def test_squeeze(shape: tuple[int, ...], axis: Any) -> None:
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    got = jit(lambda x: op.squeeze(x, axis))(x)
    np.testing.assert_array_equal(got, np.squeeze(x, axis))


@pytest.mark.parametrize(
    ("shape", "axis"), [((2, 3), 0), ((2, 3), -1), ((2, 3), 2), ((2, 3), (0, 3)), ((), 0),
                        ((4,), (-1, 0))]
)  # fmt: skip
def test_expand_dims(shape: tuple[int, ...], axis: Any) -> None:
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    got = jit(lambda x: op.expand_dims(x, axis))(x)
    np.testing.assert_array_equal(got, np.expand_dims(x, axis))


@pytest.mark.parametrize(
    ("x_shape", "index_shape", "axis"),
    [((4, 7), (4, 1), 1), ((4, 7), (4, 3), -1), ((5, 3), (2, 3), 0), ((2, 3, 4), (2, 5, 4), 1),
     ((2, 3, 4), (1, 3, 2), 2), ((2, 6), (2, 6), 1)],
)  # fmt: skip
def test_take_along_axis(x_shape: tuple[int, ...], index_shape: tuple[int, ...], axis: int) -> None:
    x = randn(*x_shape)
    size = x_shape[axis]
    ids = torch.randint(-size, size, index_shape, generator=torch.Generator().manual_seed(5))
    got = jit(lambda x, i: op.take_along_axis(x, i, axis))(x, ids)
    close(got, torch_take(x.double(), ids, axis))
    np.testing.assert_allclose(got, np.take_along_axis(x.numpy(), ids.numpy(), axis), rtol=1e-6)
    check_grad(lambda x: op.take_along_axis(x, ids, axis), lambda x: torch_take(x, ids, axis), [x])


def torch_take(x: torch.Tensor, ids: torch.Tensor, axis: int) -> torch.Tensor:
    """numpy's take_along_axis in torch (broadcast, negative indices): a gather."""
    axis %= x.ndim
    outside = [tuple(1 if d == axis else s for d, s in enumerate(t.shape)) for t in (x, ids)]
    shape = list(np.broadcast_shapes(*outside))
    x_shape, ids_shape = list(shape), list(shape)
    x_shape[axis], ids_shape[axis] = x.shape[axis], ids.shape[axis]
    return torch.gather(x.expand(x_shape), axis, (ids % x.shape[axis]).expand(ids_shape))


def test_take_along_axis_flattened() -> None:
    x, ids = randn(3, 4), torch.tensor([0, 11, -1, 5])
    got = jit(lambda x, i: op.take_along_axis(x, i, None))(x, ids)
    close(got, torch.from_numpy(np.take_along_axis(x.numpy().ravel(), ids.numpy(), None)))


@pytest.mark.parametrize(
    ("shape", "arg", "axis"),
    [((6, 2), 3, 0), ((6, 2), 1, 0), ((2, 8), 4, -1), ((7, 3), [2, 5], 0), ((7, 3), [0, 9], 0),
     ((7, 3), [-2], 0), ((7, 3), [5, 2], 0), ((2, 5), [], 1), ((2, 5), [1, 1, 4], 1)],
)  # fmt: skip
def test_split_has_numpy_semantics(shape: tuple[int, ...], arg: Any, axis: int) -> None:
    x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    got = jit(lambda x: op.split(x, arg, axis=axis))(x)
    expected = np.split(x, arg, axis=axis)
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_array_equal(g, e)


def test_split_gradient() -> None:
    x = randn(7, 3)
    check_grad(
        lambda x: op.concat(op.split(x, [2, 5], axis=0)[::-1], axis=0),
        lambda x: torch.cat(torch.tensor_split(x, [2, 5], dim=0)[::-1], dim=0),
        [x],
    )


# --- error messages -------------------------------------------------------------------------------


ERRORS = {
    "squeeze": (lambda x: op.squeeze(x, 1), ts.ShapeError, "its size is 3, not 1"),  # <- squeeze
    "expand_dims": (lambda x: op.expand_dims(x, 4), ts.ShapeError, "axis 4 is out of range"),  # <- expand_dims
    "stack": (lambda x: op.stack([x, x.T]), ts.ShapeError, "tensors of one shape"),  # <- stack
    "split": (lambda x: op.split(x, 4, axis=1), ts.ShapeError, "4 sections do not divide"),  # <- split
    "tril": (lambda x: op.tril(x[0]), ts.ShapeError, "rank >= 2"),  # <- tril
    "one_hot": (lambda x: op.one_hot(x, 3), ts.ShapeError, "integer indices"),  # <- one_hot
    "take_along_axis": (lambda x: op.take_along_axis(x, np.zeros((2,), np.int64), 1), ts.ShapeError, "rank of x"),  # <- take_along_axis
    "logsumexp": (lambda x: op.logsumexp(x, axis=2), ts.ShapeError, "axis"),  # <- logsumexp
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(ERRORS))
def test_errors_name_the_problem_and_the_line(name: str) -> None:
    fn, error, words = ERRORS[name]
    message = raised_at_marked_line(fn, error, words, __file__, name)
    assert re.search(r"tensor<(2x)?3xf32>", message), message  # the operand


# --- sharded on a dp x tp mesh ----------------------------------------------------------------------


def attention_scores(q: Any, k: Any) -> Any:
    return op.einsum("bhqd,bhkd->bhqk", q, k) * 0.5


def statistics(x: Any) -> Any:
    return (
        op.logsumexp(x, axis=-1),
        op.var(x, axis=0, ddof=1),
        op.std(x, axis=1, keepdims=True),
        op.stack([x, x * 2], axis=1),
    )


@pytest.mark.parametrize(
    ("fn", "inputs", "shardings"),
    [
        (attention_scores, (randn(4, 2, 3, 5), randn(4, 2, 6, 5, seed=1)), (ROWS_DP, COLS_TP)),
        (lambda a, b: op.einsum("ij,jk->ik", a, b), (randn(4, 6), randn(6, 8, seed=1)), (ROWS_DP, COLS_TP)),
        (lambda a, b: op.einsum("ij,jk->ik", a, b), (randn(4, 6), randn(6, 8, seed=1)), (COLS_TP, ROWS_DP)),
        (statistics, (randn(4, 6),), (ROWS_DP,)),
        (statistics, (randn(4, 6),), (dist.ShardSpec(partition=(0, 1), mesh_axes=("dp", "tp")),)),
        (cross_entropy_via_one_hot, (randn(8, 6), torch.randint(0, 6, (8,))), (ROWS_DP, ROWS_DP)),
        (cross_entropy_via_one_hot, (randn(8, 6), torch.randint(0, 6, (8,))), (COLS_TP, None)),
        (lambda x, i: op.take_along_axis(x, i, 1), (randn(4, 6), torch.randint(0, 6, (4, 2))), (ROWS_DP, ROWS_DP)),
    ],
)  # fmt: skip
def test_sharded_matches_unsharded(
    fn: Callable[..., Any], inputs: Sequence[Any], shardings: Any
) -> None:
    expected = jit(fn)(*inputs)
    got = jit(fn, mesh=MESH, in_shardings=shardings)(*inputs)
    for g, e in zip(*(r if isinstance(r, tuple) else (r,) for r in (got, expected)), strict=True):
        close(g, e)


def test_sharded_one_hot_loss_gradient() -> None:
    logits, labels = randn(8, 6), torch.randint(0, 6, (8,))
    expected = ts.grad(cross_entropy_via_one_hot, kernels="triton")(logits, labels)
    got = ts.grad(
        cross_entropy_via_one_hot, mesh=MESH, in_shardings=(ROWS_DP, ROWS_DP), kernels="triton"
    )(logits, labels)
    close(got, expected)
