"""``ts.random``: counter-based random numbers, as in JAX.

A *key* is an ``int32[2]`` array (a Philox key's two 32-bit words): made by :func:`key`,
passed into and out of ``@ts.jit`` functions like any array, never updated in place. A
key gives the same numbers every time; :func:`split` and :func:`fold_in` derive new keys.
The numbers are Philox-4x32-10 (``graph.random_bits``; Triton's ``tl.randint``): element
``i`` of ``uniform(k, shape)`` depends only on ``k`` and ``i``, its row-major index in the
whole array, so a sharded array's numbers are the same whatever the mesh.

Inside traced code the functions bind graph ops (:mod:`tessera.op.random`); called on
arrays they compile and run (one small program per call)::

    k = ts.random.key(0)
    k1, k2 = ts.random.split(k)
    x = ts.random.normal(k1, (4, 8))
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from tessera.errors import ShapeError
from tessera.frontend.tracer import Tensor, is_tracing, user_location
from tessera.jit_function import jit
from tessera.op import random as traced
from tessera.op.random import Key, key

__all__ = ["Key", "bernoulli", "bits", "fold_in", "key", "normal", "split", "uniform"]


def split(key: Key, num: int = 2) -> tuple[Key, ...]:
    """``num`` new keys, independent of ``key`` and of one another."""
    return tuple(_run(lambda k: traced.split(k, num), key))


def fold_in(key: Key, data: int | Tensor) -> Key:
    """A new key from ``key`` and an integer ``data`` in ``[0, 2^31)`` (a step number, a
    layer index; in traced code a traced integer scalar too)."""
    return _run(lambda k: traced.fold_in(k, data), key)


def bits(key: Key, shape: Sequence[int]) -> Any:
    """Random ``int32`` bit patterns (uniform over all 2^32) of ``shape``."""
    return _run(lambda k: traced.bits(k, shape), key)


def uniform(
    key: Key,
    shape: Sequence[int] = (),
    dtype: Any = "f32",
    minval: float | Tensor = 0.0,
    maxval: float | Tensor = 1.0,
) -> Any:
    """Uniform numbers in ``[minval, maxval)`` (31 random bits each, drawn in f32)."""
    return _run(lambda k: traced.uniform(k, shape, dtype, minval, maxval), key)


def normal(key: Key, shape: Sequence[int] = (), dtype: Any = "f32") -> Any:
    """Standard normal numbers (Box-Muller on two uniforms, in f32)."""
    return _run(lambda k: traced.normal(k, shape, dtype), key)


def bernoulli(key: Key, p: float | Tensor = 0.5, shape: Sequence[int] | None = None) -> Any:
    """Booleans, true with probability ``p`` (a number in [0, 1] or a tensor that
    broadcasts to ``shape``; ``shape`` defaults to ``p``'s)."""
    return _run(lambda k: traced.bernoulli(k, p, shape), key)


def _run(fn: Callable[[Any], Any], key: Any) -> Any:
    """``fn(key)`` in traced code; outside it, ``fn`` compiled and run on the key array."""
    if is_tracing():
        return fn(key)
    if not isinstance(key, torch.Tensor) or key.shape != (2,) or key.dtype != torch.int32:
        found = (
            f"a {key.dtype} tensor of shape {list(key.shape)}"
            if isinstance(key, torch.Tensor)
            else repr(key)
        )
        raise ShapeError(
            f"expected a key (an int32[2] from ts.random.key, split or fold_in), found {found} "
            f"at {user_location()}"
        )
    return jit(fn)(key)
