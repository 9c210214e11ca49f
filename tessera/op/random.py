"""Counter-based random numbers in traced code (``ts.random`` calls these, or compiles them).

A *key* is an ``int32[2]`` tensor (the two 32-bit words of a Philox key): made by
:func:`key`, passed into and out of ``@ts.jit`` functions like any array, never updated
in place. A key gives the same numbers every time; :func:`split` and :func:`fold_in` derive
new keys. Numbers are Philox-4x32-10 (``graph.random_bits``; Triton's ``tl.randint``):
element ``i`` of ``uniform(k, shape)`` depends only on ``k`` and ``i``, its row-major index
in the whole array, so a sharded array's numbers are the same whatever the mesh.

Each function binds graph ops (:func:`key` alone also runs outside traced code)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from tessera.dtypes import DType, as_dtype
from tessera.errors import ShapeError
from tessera.frontend.tracer import Tensor, current_trace, is_tracing, user_location
from tessera.ir import graph

Key = Tensor | torch.Tensor  # int32[2]: a Philox key's two words

SAMPLE, SPLIT, FOLD = 0, 1, 2  # Philox streams (counter word 1): numbers, split, fold_in
_UNIT = 2.0**-31  # an int in [0, 2^31) times this is in [0, 1)
_BELOW_ONE = 1.0 - 2.0**-24  # the largest f32 below 1


def key(seed: int | Tensor) -> Key:
    """A key from an integer seed: its low and high 32-bit words (Triton's ``seed``).
    A traced integer scalar gives the key ``[seed, 0]``."""
    from tessera import op

    if isinstance(seed, Tensor):
        if seed.shape != () or seed.dtype not in (DType.i32, DType.i64):
            raise ShapeError(
                f"key: expected an integer scalar seed, found {seed.aval} at {user_location()}"
            )
        return op.concat([op.reshape(op.astype(seed, "i32"), (1,)), op.zeros((1,), "i32")])
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise ShapeError(f"key: expected an integer seed, found {seed!r} at {user_location()}")
    words = np.array([int(seed) & 0xFFFFFFFF, (int(seed) >> 32) & 0xFFFFFFFF], np.uint32)
    if is_tracing():
        return op.constant(words.view(np.int32))
    return torch.from_numpy(words.view(np.int32).copy())


def split(key: Key, num: int = 2) -> tuple[Key, ...]:
    """``num`` new keys, independent of ``key`` and of one another."""
    if isinstance(num, bool) or not isinstance(num, int) or num < 1:
        raise ShapeError(f"split: num must be a positive int, found {num!r} at {user_location()}")
    from tessera import op

    bits = _bits(check_key(key, "split"), op.constant(np.arange(2 * num, dtype=np.int32)), SPLIT)
    return tuple(op.slice(bits, [2 * i], [2 * i + 2]) for i in range(num))


def fold_in(key: Key, data: int | Tensor) -> Key:
    """A new key from ``key`` and an integer ``data`` in ``[0, 2^31)`` (a step number, a
    layer index; a traced integer scalar too): different data give different keys."""
    from tessera import op

    checked = check_key(key, "fold_in")
    if isinstance(data, Tensor):
        if data.shape != () or data.dtype not in (DType.i32, DType.i64):
            raise ShapeError(
                f"fold_in: expected an integer scalar, found {data.aval} at {user_location()}"
            )
        counter = op.add(
            op.multiply(op.astype(data, "i32"), 2), op.constant(np.arange(2, dtype=np.int32))
        )
    elif isinstance(data, (int, np.integer)) and not isinstance(data, bool) and 0 <= data < 1 << 31:
        counter = op.constant(
            np.array([2 * int(data), 2 * int(data) + 1], np.uint32).view(np.int32)
        )
    else:
        raise ShapeError(
            f"fold_in: expected an int in [0, 2^31), found {data!r} at {user_location()}"
        )
    return _bits(checked, counter, FOLD)


def bits(key: Key, shape: Sequence[int]) -> Tensor:
    """Random ``int32`` bit patterns (uniform over all 2^32) of ``shape``."""
    return _bits(check_key(key, "bits"), _global_index(_shape(shape, "bits")), SAMPLE)


def uniform(
    key: Key,
    shape: Sequence[int] = (),
    dtype: Any = "f32",
    minval: float | Tensor = 0.0,
    maxval: float | Tensor = 1.0,
) -> Tensor:
    """Uniform numbers in ``[minval, maxval)``, from 31 random bits each (drawn in f32,
    then converted to ``dtype``)."""
    from tessera import op

    target = as_dtype(dtype)
    if not target.is_float:
        raise ShapeError(f"uniform: expected a float dtype, found {dtype!r} at {user_location()}")
    words = _bits(check_key(key, "uniform"), _global_index(_shape(shape, "uniform")), SAMPLE)
    positive = op.where(op.less(words, 0), op.subtract(op.negative(words), 1), words)
    unit = op.minimum(op.multiply(op.astype(positive, "f32"), _UNIT), _BELOW_ONE)
    unit = op.astype(unit, target)
    if (
        isinstance(minval, (int, float))
        and isinstance(maxval, (int, float))
        and (minval, maxval) == (0, 1)
    ):
        return unit
    return op.add(minval, op.multiply(unit, op.subtract(maxval, minval)))


def normal(key: Key, shape: Sequence[int] = (), dtype: Any = "f32") -> Tensor:
    """Standard normal numbers (Box-Muller on two uniforms, in f32)."""
    from tessera import op

    radius_key, angle_key = split(check_key(key, "normal"))
    u1, u2 = uniform(radius_key, shape), uniform(angle_key, shape)
    radius = op.sqrt(op.multiply(op.log(op.subtract(1.0, u1)), -2.0))
    return op.astype(op.multiply(radius, op.cos(op.multiply(u2, 2 * math.pi))), dtype)


def bernoulli(key: Key, p: float | Tensor = 0.5, shape: Sequence[int] | None = None) -> Tensor:
    """Booleans, true with probability ``p`` (a number in [0, 1] or a tensor that
    broadcasts to ``shape``; ``shape`` defaults to ``p``'s)."""
    if isinstance(p, (int, float)) and not 0 <= p <= 1:
        raise ShapeError(f"bernoulli: p must be in [0, 1], found {p!r} at {user_location()}")
    from tessera import op

    if shape is None:
        shape = p.shape if isinstance(p, Tensor) else ()
    return op.less(uniform(check_key(key, "bernoulli"), shape), p)


# --- helpers ------------------------------------------------------------------------------


def check_key(key: Any, what: str) -> Tensor:
    """``key`` if it is a key (an int32[2] tensor); a ShapeError at the user's line if not."""
    if not isinstance(key, Tensor) or key.shape != (2,) or key.dtype != DType.i32:
        found = key.aval if isinstance(key, Tensor) else repr(key)
        raise ShapeError(
            f"{what}: expected a key (an int32[2] from ts.random.key, split or fold_in), "
            f"found {found} at {user_location()}"
        )
    return key


def _bits(key: Tensor, counter: Tensor, stream: int) -> Tensor:
    """``graph.random_bits`` of the key's two words and ``counter``."""
    from tessera import op

    words = [op.reshape(op.slice(key, [i], [i + 1]), ()) for i in range(2)]
    (result,) = current_trace().bind(graph.RandomBitsOp, [*words, counter], stream=stream)
    return result


def _global_index(shape: tuple[int, ...]) -> Tensor:
    """Each element's row-major index in an array of ``shape``, as int32 (wrapping past
    2^31): a sum of one ``iota * stride`` per dim, so that a rank's slice of it is its
    elements' global indices whatever the sharding (a split iota starts at its rank's
    first index)."""
    from tessera import op

    strides = [math.prod(shape[d + 1 :]) for d in range(len(shape))]
    index: Tensor | None = None
    for d, (size, stride) in enumerate(zip(shape, strides, strict=True)):
        if size == 1:
            continue
        piece = op.iota([size if e == d else 1 for e in range(len(shape))], d, "i32")
        if stride != 1:  # int32 products wrap as the uint32 counter does
            piece = op.multiply(piece, int(np.int64(stride).astype(np.uint32).view(np.int32)))
        index = piece if index is None else op.add(index, piece)
    if index is None:
        return op.zeros(shape, "i32")
    return index if index.shape == shape else op.broadcast_to(index, shape)


def _shape(shape: Any, what: str) -> tuple[int, ...]:
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, bool):
        shape = (int(shape),)
    if not isinstance(shape, Sequence) or not all(
        isinstance(s, (int, np.integer)) and not isinstance(s, bool) and s >= 0 for s in shape
    ):
        raise ShapeError(
            f"{what}: expected a shape (non-negative ints), found {shape!r} at {user_location()}"
        )
    return tuple(int(s) for s in shape)


__all__ = ["Key", "bernoulli", "bits", "fold_in", "key", "normal", "split", "uniform"]
