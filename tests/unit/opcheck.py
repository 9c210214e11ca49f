"""Helpers for the ``test_ops_*`` files: random inputs and comparison with torch eager.

Every op test draws shapes with hypothesis and input values from a seeded torch
generator, runs a ``@ts.jit`` function, and compares the result with torch called
directly, in float64. Tolerances (relative, absolute) against that float64 reference:

- f32: rtol 1e-5, atol 1e-6 — a few f32 roundings;
- f32 sums and contractions: atol 1e-5 — one rounding per term, at most 6**4 terms of
  size about 1 (the f32 error grows with the number of terms, not with the result);
- f16 / bf16: rtol 1e-2, atol 1e-2 — a rounding of the output (2**-8 for bf16) after
  math done in at least the input's precision;
- integer and boolean results: exact.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

FLOATS = ("f32", "f16", "bf16")
INTS = ("i32", "i64")
DTYPES = (*FLOATS, *INTS, "i1")
TORCH_DTYPES = {
    "f32": torch.float32,
    "f16": torch.float16,
    "bf16": torch.bfloat16,
    "i32": torch.int32,
    "i64": torch.int64,
    "i1": torch.bool,
}
TOLERANCE = {"f32": (1e-5, 1e-6), "f16": (1e-2, 1e-2), "bf16": (1e-2, 1e-2)}
ACCUMULATE_ATOL = 1e-5

seeds = st.integers(0, 2**32 - 1)


def shapes(min_rank: int = 0, max_rank: int = 4) -> st.SearchStrategy[tuple[int, ...]]:
    """Shapes with 1 to 6 elements per dimension (singleton dims included)."""
    return hnp.array_shapes(min_dims=min_rank, max_dims=max_rank, min_side=1, max_side=6)


def broadcast_shapes(
    num: int = 2, max_rank: int = 4
) -> st.SearchStrategy[tuple[tuple[int, ...], ...]]:
    """``num`` shapes that broadcast together (ranks 0..max_rank, sides 1..6)."""
    strategy = hnp.mutually_broadcastable_shapes(
        num_shapes=num, min_dims=0, max_dims=max_rank, min_side=1, max_side=6
    )
    return strategy.map(lambda b: b.input_shapes)


def random(
    seed: int, shape: tuple[int, ...], dtype: str, kind: str = "normal", salt: int = 0
) -> torch.Tensor:
    """A CPU tensor of ``dtype``; ``kind`` picks the values:

    ``normal`` N(0, 1); ``positive`` uniform in [0.5, 2]; ``nonzero`` +-[0.5, 2];
    ``small_ints`` integers in [-3, 3] (ties for comparisons, exact in every dtype).
    Integer dtypes get integers in [-9, 9] (``positive``: [1, 9]); i1 gets coin flips.
    """
    generator = torch.Generator().manual_seed(seed * 7919 + salt)
    target = TORCH_DTYPES[dtype]
    if dtype == "i1":
        return torch.rand(shape, generator=generator) < 0.5
    if dtype in INTS or kind == "small_ints":
        low = 1 if kind == "positive" else (-3 if kind == "small_ints" else -9)
        high = 4 if kind == "small_ints" else 10
        return torch.randint(low, high, shape, generator=generator).to(target)
    values = torch.randn(shape, generator=generator, dtype=torch.float64)
    if kind in ("positive", "nonzero"):
        magnitude = 0.5 + 1.5 * torch.rand(shape, generator=generator, dtype=torch.float64)
        values = magnitude if kind == "positive" else torch.where(values < 0, -magnitude, magnitude)
    return values.to(target)


def as_input(tensor: torch.Tensor, as_numpy: bool) -> Any:
    """The tensor as a numpy array when ``as_numpy`` (numpy has no bf16: torch then)."""
    if as_numpy and tensor.dtype != torch.bfloat16:
        return tensor.numpy()
    return tensor


def exact(tensor: torch.Tensor) -> torch.Tensor:
    """The values of ``tensor`` in float64 (integers and booleans unchanged)."""
    return tensor.double() if tensor.is_floating_point() else tensor


def check(
    result: Any,
    expected: torch.Tensor,
    dtype: str,
    *,
    args: Sequence[Any] = (),
    rtol: float | None = None,
    atol: float | None = None,
) -> None:
    """Asserts ``result`` has the container type, dtype, shape and values expected.

    ``expected`` holds exact values (float64 for float results); ``dtype`` is the dtype
    the result must have; ``args`` are the arrays the jitted function was called with:
    numpy arrays among them mean a numpy result (but numpy has no bf16).
    """
    want_numpy = any(isinstance(a, np.ndarray) for a in args) and dtype != "bf16"
    assert isinstance(result, np.ndarray if want_numpy else torch.Tensor), type(result)
    got = torch.from_numpy(np.asarray(result)) if want_numpy else result
    assert got.dtype == TORCH_DTYPES[dtype], f"dtype {got.dtype}, expected {dtype}"
    assert tuple(got.shape) == tuple(expected.shape), (
        f"shape {tuple(got.shape)}, expected {tuple(expected.shape)}"
    )
    if dtype in FLOATS:
        default_rtol, default_atol = TOLERANCE[dtype]
        torch.testing.assert_close(
            got.double(),
            expected.double(),
            rtol=default_rtol if rtol is None else rtol,
            atol=default_atol if atol is None else atol,
            equal_nan=True,
        )
    else:
        assert torch.equal(got, expected.to(got.dtype)), f"{got} != {expected}"
