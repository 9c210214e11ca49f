"""Layout ops: reshape, transpose, broadcast_to, concat, split / chunk, slicing, gather.

These ops move values without arithmetic, so results must equal torch's (or numpy's)
exactly, in every dtype.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from opcheck import DTYPES, FLOATS, as_input, check, exact, random, seeds, shapes

import tessera as ts
from tessera import op

dtypes = st.sampled_from(DTYPES)

# --- reshape -------------------------------------------------------------------------------


def prime_factors(n: int) -> list[int]:
    factors, p = [], 2
    while n > 1:
        while n % p == 0:
            factors.append(p)
            n //= p
        p += 1
    return factors


@st.composite
def reshapes(draw: st.DrawFn) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """A shape and a target shape of the same size, perhaps with one -1 and extra 1s."""
    shape = draw(shapes())
    factors = draw(st.permutations(prime_factors(math.prod(shape))))
    target: list[int] = []
    for factor in factors:
        if target and draw(st.booleans()):
            target[-1] *= factor
        else:
            target.append(factor)
    for _ in range(draw(st.integers(0, 2))):
        target.insert(draw(st.integers(0, len(target))), 1)
    if target and draw(st.booleans()):
        target[draw(st.integers(0, len(target) - 1))] = -1
    return shape, tuple(target)


@ts.jit
def reshape(x, shape, form):
    if form == "op":
        return op.reshape(x, shape)
    if form == "method":
        return x.reshape(shape)
    return x.reshape(*shape)


@settings(max_examples=40)
@given(case=reshapes(), dtype=dtypes, seed=seeds, form=st.sampled_from(["op", "method", "varargs"]))
def test_reshape(case, dtype, seed, form):
    shape, target = case
    x = random(seed, shape, dtype)
    arg = as_input(x, True)
    check(reshape(arg, shape=target, form=form), exact(x.reshape(target)), dtype, args=[arg])


def test_reshape_to_minus_one_flattens():
    x = np.arange(24, dtype=np.int32).reshape(2, 3, 4)
    np.testing.assert_array_equal(ts.jit(lambda x: op.reshape(x, -1))(x), x.reshape(-1))


def test_reshape_to_same_shape_records_no_op():
    text = (
        ts.jit(lambda x: x.reshape(2, -1) + 1).lower(np.zeros((2, 3), np.float32)).as_text("graph")
    )
    assert "graph.reshape" not in text


# --- transpose -------------------------------------------------------------------------------


@st.composite
def permutations(draw: st.DrawFn) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """A shape and a permutation of its axes, some written as negative axes."""
    shape = draw(shapes())
    rank = len(shape)
    perm = draw(st.permutations(range(rank)))
    return shape, tuple(draw(st.sampled_from([p, p - rank])) for p in perm)


@ts.jit
def transpose(x, perm, form):
    if form == "op":
        return op.transpose(x, perm)
    if form == "permute_dims":
        return op.permute_dims(x, perm)
    if form == "method":
        return x.transpose(perm)
    return x.transpose(*perm)


@settings(max_examples=40)
@given(
    case=permutations(),
    dtype=dtypes,
    seed=seeds,
    form=st.sampled_from(["op", "permute_dims", "method", "varargs"]),
)
def test_transpose(case, dtype, seed, form):
    shape, perm = case
    x = random(seed, shape, dtype)
    arg = as_input(x, True)
    expected = x.permute(tuple(p % len(shape) for p in perm))
    check(transpose(arg, perm=perm, form=form), exact(expected), dtype, args=[arg])


@settings(max_examples=20)
@given(shape=shapes(), dtype=dtypes, seed=seeds)
def test_default_transpose_reverses_axes_like_numpy(shape, dtype, seed):
    x = random(seed, shape, dtype)
    arg = as_input(x, True)
    results = ts.jit(lambda x: (x.T, op.transpose(x), x.transpose()))(arg)
    expected = exact(x.permute(tuple(reversed(range(len(shape))))))
    for result in results:
        check(result, expected, dtype, args=[arg])


@settings(max_examples=15)
@given(shape=shapes(min_rank=1), data=st.data(), seed=seeds)
def test_swapaxes(shape, data, seed):
    rank = len(shape)
    a, b = data.draw(st.integers(-rank, rank - 1)), data.draw(st.integers(-rank, rank - 1))
    x = random(seed, shape, "f32")
    check(ts.jit(lambda x: op.swapaxes(x, a, b))(x), exact(x.swapaxes(a, b)), "f32", args=[x])


# --- broadcast_to ------------------------------------------------------------------------------


@st.composite
def broadcasts(draw: st.DrawFn) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """A target shape and an operand shape that broadcasts to it (a suffix, some dims 1)."""
    target = draw(shapes())
    suffix = target[len(target) - draw(st.integers(0, len(target))) :]
    return tuple(1 if draw(st.booleans()) else s for s in suffix), target


@settings(max_examples=30)
@given(case=broadcasts(), dtype=dtypes, seed=seeds)
def test_broadcast_to(case, dtype, seed):
    shape, target = case
    x = random(seed, shape, dtype)
    arg = as_input(x, True)
    result = ts.jit(lambda x: op.broadcast_to(x, target))(arg)
    check(result, exact(torch.broadcast_to(x, target)), dtype, args=[arg])


# --- concat and split ------------------------------------------------------------------------


@st.composite
def concat_cases(draw: st.DrawFn) -> tuple[list[tuple[int, ...]], int]:
    """Shapes agreeing on every dimension but ``axis`` (given possibly negative)."""
    shape = draw(shapes(min_rank=1))
    axis = draw(st.integers(-len(shape), len(shape) - 1))
    sizes = draw(st.lists(st.integers(1, 6), min_size=1, max_size=4))
    pieces = []
    for size in sizes:
        piece = list(shape)
        piece[axis] = size
        pieces.append(tuple(piece))
    return pieces, axis


@settings(max_examples=40)
@given(
    case=concat_cases(),
    dtype=dtypes,
    seed=seeds,
    name=st.sampled_from(["concat", "cat", "concatenate"]),
)
def test_concat(case, dtype, seed, name):
    shapes_, axis = case
    xs = [random(seed, s, dtype, salt=i) for i, s in enumerate(shapes_)]
    args = [as_input(x, True) for x in xs]
    result = ts.jit(lambda xs: getattr(op, name)(xs, axis=axis))(args)
    check(result, exact(torch.cat(xs, dim=axis)), dtype, args=args)


def test_concat_promotes_dtypes():
    a, b = np.ones((1, 2), np.float16), np.zeros((2, 2), np.float32)
    result = ts.jit(lambda a, b: op.concat([a, b]))(a, b)
    assert result.dtype == np.float32
    np.testing.assert_array_equal(result, np.concatenate([a, b]).astype(np.float32))


@st.composite
def split_cases(draw: st.DrawFn) -> tuple[tuple[int, ...], int, int | list[int]]:
    """A shape, an axis and numpy split arguments: an int dividing the dim (equal
    sections) or split points (sorted, or in any order, past the end and negative)."""
    shape = draw(shapes(min_rank=1))
    axis = draw(st.integers(-len(shape), len(shape) - 1))
    length = shape[axis]
    if draw(st.booleans()):
        return (
            shape,
            axis,
            draw(st.sampled_from([n for n in range(1, length + 1) if length % n == 0])),
        )
    points = draw(st.lists(st.integers(-length, length + 2), max_size=3))
    return shape, axis, sorted(points) if draw(st.booleans()) else points


@settings(max_examples=40)
@given(case=split_cases(), dtype=dtypes, seed=seeds)
def test_split(case, dtype, seed):
    shape, axis, sizes = case
    x = random(seed, shape, dtype)
    arg = as_input(x, True)
    results = ts.jit(lambda x: op.split(x, sizes, axis=axis))(arg)
    expected = torch.tensor_split(x, sizes, dim=axis)  # numpy's split (sections divide)
    assert isinstance(results, list) and len(results) == len(expected)
    for result, piece in zip(results, expected, strict=True):
        check(result, exact(piece), dtype, args=[arg])


@settings(max_examples=30)
@given(shape=shapes(min_rank=1), chunks=st.integers(1, 7), data=st.data(), seed=seeds)
def test_chunk(shape, chunks, data, seed):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    x = random(seed, shape, "f32")
    results = ts.jit(lambda x: op.chunk(x, chunks, axis=axis))(x)
    expected = torch.chunk(x, chunks, dim=axis)
    assert len(results) == len(expected)
    for result, piece in zip(results, expected, strict=True):
        check(result, exact(piece), "f32", args=[x])


# --- slicing -------------------------------------------------------------------------------------


@st.composite
def indices(draw: st.DrawFn) -> tuple[tuple[int, ...], tuple]:
    """A shape and a basic index for it: ints, slices with steps, None and Ellipsis."""
    shape = draw(shapes())
    bounds = st.one_of(st.none(), st.integers(-8, 8))

    def item(size: int) -> int | slice:
        if draw(st.booleans()):
            return draw(st.integers(-size, size - 1))
        return slice(draw(bounds), draw(bounds), draw(st.sampled_from([None, 1, 2, 3])))

    rank, ellipsis = len(shape), draw(st.booleans())
    lead = draw(st.integers(0, rank))
    trail = draw(st.integers(0, rank - lead)) if ellipsis else 0
    items: list = [item(size) for size in shape[:lead]]
    items += [Ellipsis] if ellipsis else []
    items += [item(size) for size in shape[rank - trail :]]
    for _ in range(draw(st.integers(0, 2))):
        items.insert(draw(st.integers(0, len(items))), None)
    if len(items) == 1 and draw(st.booleans()):
        return shape, items[0]  # x[i] rather than x[(i,)]
    return shape, tuple(items)


@settings(max_examples=80)
@given(case=indices(), dtype=dtypes, seed=seeds)
def test_getitem(case, dtype, seed):
    shape, index = case
    x = random(seed, shape, dtype)
    arg = as_input(x, True)
    result = ts.jit(lambda x: x[index])(arg)
    check(result, exact(x[index]), dtype, args=[arg])


def test_slice_op_with_explicit_bounds():
    x = np.arange(30, dtype=np.float32).reshape(5, 6)
    result = ts.jit(lambda x: op.slice(x, (1, 0), (5, 6), (2, 3)))(x)
    np.testing.assert_array_equal(result, x[1:5:2, 0:6:3])


# --- gather ------------------------------------------------------------------------------------


@st.composite
def gather_cases(draw: st.DrawFn) -> tuple[tuple[int, ...], int, np.ndarray]:
    """A shape, an axis and integer indices (negative ones too) into that axis."""
    shape = draw(shapes(min_rank=1))
    axis = draw(st.integers(-len(shape), len(shape) - 1))
    size = shape[axis]
    index_shape = draw(shapes(max_rank=2))
    flat = draw(
        st.lists(
            st.integers(-size, size - 1),
            min_size=math.prod(index_shape),
            max_size=math.prod(index_shape),
        )
    )
    dtype = draw(st.sampled_from([np.int32, np.int64]))
    return shape, axis, np.array(flat, dtype=dtype).reshape(index_shape)


@settings(max_examples=40)
@given(
    case=gather_cases(),
    dtype=dtypes,
    seed=seeds,
    name=st.sampled_from(["take", "gather"]),
    traced_indices=st.booleans(),
)
def test_take(case, dtype, seed, name, traced_indices):
    shape, axis, idx = case
    x = random(seed, shape, dtype)
    arg = as_input(x, True)
    if traced_indices:
        result = ts.jit(lambda x, i: getattr(op, name)(x, i, axis=axis))(arg, idx)
    else:
        result = ts.jit(lambda x: getattr(op, name)(x, idx, axis=axis))(arg)
    expected = torch.from_numpy(np.asarray(np.take(exact(x).numpy(), idx, axis=axis)))
    check(result, expected, dtype, args=[arg])


@settings(max_examples=20)
@given(
    vocab=st.integers(1, 6),
    dim=st.integers(1, 6),
    ids_shape=shapes(max_rank=3),
    dtype=st.sampled_from(FLOATS),
    seed=seeds,
)
def test_embedding(vocab, dim, ids_shape, dtype, seed):
    table = random(seed, (vocab, dim), dtype)
    ids = torch.randint(0, vocab, ids_shape, generator=torch.Generator().manual_seed(seed))
    args = [as_input(ids, True), as_input(table, True)]
    result = ts.jit(op.embedding)(*args)
    check(result, exact(F.embedding(ids, table)), dtype, args=args)


def test_indexing_with_a_tensor_takes_rows():
    table = np.arange(12, dtype=np.float32).reshape(4, 3)
    ids = np.array([[3, 0], [1, 1]])
    np.testing.assert_array_equal(ts.jit(lambda t, i: t[i])(table, ids), table[ids])


@pytest.mark.parametrize("index", [True, [0, 1], 1.5])
def test_unsupported_indices_raise(index):
    with pytest.raises(ts.TraceError, match="unsupported index"):
        ts.jit(lambda x: x[index])(np.zeros((3, 2), np.float32))
