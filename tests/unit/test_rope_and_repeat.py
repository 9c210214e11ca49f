"""``op.repeat`` / ``op.repeat_interleave``, ``op.tile``, ``op.cumsum`` and ``op.rope``.

repeat, tile and cumsum run under ``ts.jit`` with the generated Triton kernels
(interpreted on a CPU) and are compared with torch eager in float64: f32 results within
rtol 1e-5, atol 1e-5 (repeat and tile copy exactly; cumsum adds at most 8 terms of size
about 1); integer results are exact. Gradients come from ``ts.grad`` of
``sum(f(x) * c)`` for a random ``c`` and match ``torch.autograd`` in float64 within rtol
1e-4, atol 1e-5.

rope is checked against transformers' ``LlamaRotaryEmbedding`` + ``apply_rotary_pos_emb``
(rotate-half) and Meta's original Llama ``precompute_freqs_cis`` + ``apply_rotary_emb``
(interleaved, complex products), both rewritten here in torch, with and without Llama
3.1's frequency scaling (``_compute_llama3_parameters``, also checked against Meta's
per-frequency loop in numpy float64): in float64 (tables in float64, positions up to
20000 so that every frequency band is used) within 1e-12; in f32 against the exact
transformers computation (f32 tables, positions < 64) within atol 2e-6 (an f32 angle of
at most ~64 is off by half an ulp, 4e-6 relative, in either). Sharded runs on a 2 x 2
dp x tp mesh must give the unsharded values and gradients within the same tolerances.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from user_errors import raised_at_marked_line

import tessera as ts
from tessera import dist, op

RTOL, ATOL = 1e-5, 1e-5
GRAD_RTOL, GRAD_ATOL = 1e-4, 1e-5
F64_TOL = 1e-12
MESH = dist.mesh({"dp": 2, "tp": 2})
ROWS_DP = dist.ShardSpec(partition=(0,), mesh_axes=("dp",))
COLS_TP = dist.ShardSpec(partition=(1,), mesh_axes=("tp",))
BOTH = dist.ShardSpec(partition=(0, 1), mesh_axes=("dp", "tp"))
LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}
SCALINGS = {"none": None, "linear": {"rope_type": "linear", "factor": 4.0}, "llama3": LLAMA3}


def randn(*shape: int, seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def jit(fn: Callable[..., Any], **options: Any) -> Any:
    return ts.jit(fn, kernels="triton", **options)


def close(got: Any, expected: torch.Tensor, rtol: float = RTOL, atol: float = ATOL) -> None:
    got = got if isinstance(got, torch.Tensor) else torch.as_tensor(np.asarray(got))
    assert tuple(got.shape) == tuple(expected.shape), (tuple(got.shape), tuple(expected.shape))
    torch.testing.assert_close(got.double(), expected.double(), rtol=rtol, atol=atol)


def check_grad(
    ours: Callable[..., Any], theirs: Callable[..., torch.Tensor], x: torch.Tensor, **options: Any
) -> None:
    """``ts.grad`` of ``sum(ours(x) * c)`` against torch.autograd of ``theirs``."""
    c = randn(*theirs(x.double()).shape, seed=7, dtype=torch.float64)
    got = ts.grad(
        lambda x: op.sum(ours(x) * c.to(x.dtype.to_torch())), kernels="triton", **options
    )(x)
    leaf = x.double().requires_grad_()
    (expected,) = torch.autograd.grad((theirs(leaf) * c).sum(), [leaf])
    close(got, expected, GRAD_RTOL, GRAD_ATOL)


# --- repeat, repeat_interleave, tile -------------------------------------------------------------

REPEATS = [  # (x's shape, repeats, axis): torch.repeat_interleave(x, repeats, dim=axis)
    ((2, 3), 2, 0),
    ((2, 3), 3, 1),
    ((2, 3), 3, -1),
    ((2, 3, 4), 2, 1),
    ((2, 3), 2, None),  # flattened
    ((2, 3), 1, 1),
    ((2, 3), 0, 1),  # an empty result
    ((2, 3), [1, 0, 2], 1),  # one count per entry
    ((4,), [3], 0),  # one count for all
    ((2, 3), np.int64(2), 0),
]


@pytest.mark.parametrize(("shape", "repeats", "axis"), REPEATS)
def test_repeat_and_repeat_interleave_match_torch(
    shape: tuple[int, ...], repeats: Any, axis: int | None
) -> None:
    x = randn(*shape)
    counts = torch.as_tensor(repeats) if isinstance(repeats, list) else int(repeats)
    expected = torch.repeat_interleave(x.double(), counts, dim=axis)
    close(jit(lambda x: op.repeat(x, repeats, axis))(x), expected)
    close(jit(lambda x: op.repeat_interleave(x, repeats, dim=axis))(x), expected)
    assert np.array_equal(
        np.repeat(x.numpy(), repeats, axis), expected.float().numpy()
    )  # numpy's too
    if expected.numel():
        check_grad(
            lambda x: op.repeat(x, repeats, axis),
            lambda x: torch.repeat_interleave(x, counts, dim=axis),
            x,
        )


TILES = [  # (x's shape, reps)
    ((2, 3), (2, 1)),
    ((2, 3), (1, 3)),
    ((2, 3), (2, 3)),
    ((2, 3), 2),  # an int: the last dim
    ((2, 3), (2, 1, 2)),  # longer reps: x gets a leading dim
    ((2, 3, 4), (2,)),  # shorter reps: padded with 1s on the left
    ((3,), (0,)),  # an empty result
    ((2, 3), (1, 1)),
]


@pytest.mark.parametrize(("shape", "reps"), TILES)
def test_tile_matches_torch_and_numpy(shape: tuple[int, ...], reps: Any) -> None:
    x = randn(*shape)
    as_tuple = (reps,) if isinstance(reps, int) else reps
    expected = torch.tile(x.double(), as_tuple)
    close(jit(lambda x: op.tile(x, reps))(x), expected)
    assert np.array_equal(np.tile(x.numpy(), reps), expected.float().numpy())
    if expected.numel():
        check_grad(lambda x: op.tile(x, reps), lambda x: torch.tile(x, as_tuple), x)


def test_repeat_and_tile_of_integers_are_exact() -> None:
    x = torch.randint(-9, 9, (2, 3), dtype=torch.int32)
    got = jit(lambda x: (op.repeat(x, 2, 1), op.tile(x, (2, 2)), op.repeat(x, [2, 0], 0)))(x)
    expected = (
        x.repeat_interleave(2, 1),
        x.tile((2, 2)),
        x.repeat_interleave(torch.tensor([2, 0]), 0),
    )
    for g, e in zip(got, expected, strict=True):
        assert g.dtype == torch.int32 and torch.equal(g, e)


# --- cumsum -----------------------------------------------------------------------------------------

CUMSUMS = [
    ((8,), 0),
    ((3, 5), 1),
    ((3, 5), 0),
    ((3, 5), -1),
    ((2, 3, 4), 0),
    ((2, 3, 4), 1),
    ((2, 3, 4), 2),
    ((2, 3), None),
    ((3, 1), 1),
]


@pytest.mark.parametrize(("shape", "axis"), CUMSUMS)
def test_cumsum_matches_torch(shape: tuple[int, ...], axis: int | None) -> None:
    x = randn(*shape)

    def theirs(x: torch.Tensor) -> torch.Tensor:
        return torch.cumsum(x.reshape(-1) if axis is None else x, dim=0 if axis is None else axis)

    close(jit(lambda x: op.cumsum(x, axis))(x), theirs(x.double()))
    check_grad(lambda x: op.cumsum(x, axis), theirs, x)


def test_cumsum_dtypes_follow_numpy_and_torch() -> None:
    ints = torch.randint(-9, 9, (3, 6), dtype=torch.int32)
    bools = torch.rand(3, 6, generator=torch.Generator().manual_seed(1)) > 0.5
    s32, s_bool, s_f64, s_or, s_f32 = jit(
        lambda i, b: (
            op.cumsum(i, 1),
            op.cumsum(b, 1),
            op.cumsum(i, 0, dtype="float64"),
            op.cumsum(b, 1, dtype=bool),
            op.cumsum(b.astype("f32"), 1),
        )
    )(ints, bools)
    assert s32.dtype == torch.int64 and torch.equal(s32, ints.cumsum(1))  # int32 sums in int64
    assert s_bool.dtype == torch.int64 and torch.equal(s_bool, bools.cumsum(1))
    assert s_f64.dtype == torch.float64 and torch.equal(s_f64, ints.double().cumsum(0))
    assert s_or.dtype == torch.bool and torch.equal(
        s_or, torch.from_numpy(np.cumsum(bools.numpy(), 1, dtype=bool))
    )
    assert torch.equal(s_f32, bools.float().cumsum(1))


def test_cumsum_in_float64_is_exact_to_rounding() -> None:
    x = randn(4, 33, dtype=torch.float64)
    close(jit(lambda x: op.cumsum(x, 1))(x), x.cumsum(1), F64_TOL, F64_TOL)


# --- sharded on a dp x tp mesh ----------------------------------------------------------------------

SHARDED = {
    "repeat axis 1 (split on tp)": (lambda x: op.repeat(x, 2, 1), BOTH),
    "repeat axis 0 (split on dp)": (lambda x: op.repeat(x, 3, 0), ROWS_DP),
    "repeat per entry": (lambda x: op.repeat_interleave(x, [1, 2, 0, 1, 3, 1], dim=1), BOTH),
    "tile": (lambda x: op.tile(x, (2, 3)), BOTH),
    "tile rows": (lambda x: op.tile(x, (3, 1)), ROWS_DP),
    "cumsum axis 1 (split on tp)": (lambda x: op.cumsum(x, 1), BOTH),
    "cumsum axis 0 (split on dp)": (lambda x: op.cumsum(x, 0), ROWS_DP),
    "cumsum of a tp column split": (lambda x: op.cumsum(x, 0), COLS_TP),
}


@pytest.mark.parametrize("name", sorted(SHARDED))
def test_sharded_matches_unsharded_values_and_gradients(name: str) -> None:
    fn, spec = SHARDED[name]
    x = randn(4, 6)
    close(
        jit(fn, mesh=MESH, in_shardings=(spec,))(x),
        torch.as_tensor(np.asarray(jit(fn)(x))).double(),
    )
    c = randn(*np.asarray(jit(fn)(x)).shape, seed=3)

    def loss(x: Any) -> Any:
        return op.sum(fn(x) * c)

    expected = ts.grad(loss, kernels="triton")(x)
    got = ts.grad(loss, kernels="triton", mesh=MESH, in_shardings=(spec,))(x)
    close(got, torch.as_tensor(np.asarray(expected)).double())


# --- rope: the implementations it must match ----------------------------------------------------------


def hf_inv_freq(
    head_dim: int, theta: float, scaling: dict | None, dtype: torch.dtype
) -> torch.Tensor:
    """transformers' ``_compute_default_rope_parameters`` (then ``..._linear_scaling_...``
    or ``_compute_llama3_parameters``), in ``dtype`` (transformers: float32)."""
    inv_freq = 1.0 / (
        theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).to(dtype) / head_dim)
    )
    if scaling is None:
        return inv_freq
    if scaling["rope_type"] == "linear":
        return inv_freq / scaling["factor"]
    factor = scaling["factor"]
    low_freq_factor, high_freq_factor = scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_context_len = scaling["original_max_position_embeddings"]
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth_factor = (old_context_len / wavelen - low_freq_factor) / (
        high_freq_factor - low_freq_factor
    )
    smoothed_inv_freq = (
        1 - smooth_factor
    ) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
    is_medium_freq = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium_freq, smoothed_inv_freq, inv_freq_llama)


def hf_rope(
    x: torch.Tensor,
    position_ids: torch.Tensor,
    theta: float,
    scaling: dict | None,
    table_dtype: torch.dtype,
) -> torch.Tensor:
    """``LlamaRotaryEmbedding.forward`` then ``apply_rotary_pos_emb`` on ``x [B, H, T, D]``
    with ``position_ids [B, T]``."""
    inv_freq = hf_inv_freq(x.shape[-1], theta, scaling, table_dtype)
    inv_freq_expanded = inv_freq[None, :, None].expand(position_ids.shape[0], -1, 1)
    position_ids_expanded = position_ids[:, None, :].to(table_dtype)
    freqs = (inv_freq_expanded @ position_ids_expanded).transpose(1, 2)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().to(x.dtype).unsqueeze(1), emb.sin().to(x.dtype).unsqueeze(1)

    def rotate_half(x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
        return torch.cat((-x2, x1), dim=-1)

    return (x * cos) + (rotate_half(x) * sin)


def meta_rope(
    x: torch.Tensor, position_ids: torch.Tensor, theta: float, scaling: dict | None
) -> torch.Tensor:
    """Meta's Llama ``precompute_freqs_cis`` and ``apply_rotary_emb`` (complex products of
    the pairs ``(2j, 2j+1)``) on ``x [B, T, H, D]`` (float64), positions ``[B, T]``."""
    freqs = hf_inv_freq(x.shape[-1], theta, scaling, torch.float64)
    angles = position_ids.to(torch.float64)[..., None] * freqs  # [B, T, D/2]
    freqs_cis = torch.polar(torch.ones_like(angles), angles)[:, :, None, :]
    x_ = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(x_ * freqs_cis).flatten(3)


def meta_llama3_frequencies(head_dim: int, theta: float, scaling: dict) -> np.ndarray:
    """Meta's ``apply_scaling`` (llama-models), frequency by frequency, in float64."""
    freqs = 1.0 / theta ** (np.arange(0, head_dim, 2)[: head_dim // 2] / head_dim)
    low_wavelen = scaling["original_max_position_embeddings"] / scaling["low_freq_factor"]
    high_wavelen = scaling["original_max_position_embeddings"] / scaling["high_freq_factor"]
    result = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            result.append(freq)
        elif wavelen > low_wavelen:
            result.append(freq / scaling["factor"])
        else:
            smooth = (
                scaling["original_max_position_embeddings"] / wavelen - scaling["low_freq_factor"]
            ) / (scaling["high_freq_factor"] - scaling["low_freq_factor"])
            result.append((1 - smooth) * freq / scaling["factor"] + smooth * freq)
    return np.array(result)


# --- rope ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("head_dim", [8, 64, 128])
def test_llama3_frequencies_match_meta_and_transformers(head_dim: int) -> None:
    for theta in (10000.0, 500000.0):
        ours = op.rope_frequencies(head_dim, theta, LLAMA3)
        np.testing.assert_allclose(
            ours, meta_llama3_frequencies(head_dim, theta, LLAMA3), rtol=1e-14
        )
        np.testing.assert_allclose(
            ours, hf_inv_freq(head_dim, theta, LLAMA3, torch.float64).numpy(), rtol=1e-14
        )
    # all three bands are used at head_dim 128: kept, divided by 8, interpolated
    ratio = op.rope_frequencies(128, 500000.0) / op.rope_frequencies(128, 500000.0, LLAMA3)
    assert ratio[0] == 1 and ratio[-1] == 8 and ((ratio > 1) & (ratio < 8)).any()
    legacy = {k: v for k, v in LLAMA3.items() if k != "rope_type"} | {"type": "llama3"}
    assert np.array_equal(
        op.rope_frequencies(64, 1e4, legacy), op.rope_frequencies(64, 1e4, LLAMA3)
    )


@pytest.mark.parametrize("scaling", sorted(SCALINGS))
@pytest.mark.parametrize("interleaved", [False, True], ids=["rotate_half", "interleaved"])
def test_rope_float64_matches_transformers_and_meta(scaling: str, interleaved: bool) -> None:
    B, H, T, D = 2, 3, 5, 16
    x = randn(B, H, T, D, dtype=torch.float64)
    positions = torch.randint(0, 20000, (B, T), generator=torch.Generator().manual_seed(2))
    got = jit(lambda x, p: op.rope(x, p, 500000.0, SCALINGS[scaling], interleaved))(x, positions)
    if interleaved:  # Meta's layout is [B, T, H, D]
        expected = meta_rope(x.transpose(1, 2), positions, 500000.0, SCALINGS[scaling]).transpose(
            1, 2
        )
    else:
        expected = hf_rope(x, positions, 500000.0, SCALINGS[scaling], torch.float64)
    close(got, expected, F64_TOL, F64_TOL)


@pytest.mark.parametrize("scaling", ["none", "llama3"])
def test_rope_float32_matches_transformers_exactly_as_it_computes(scaling: str) -> None:
    """transformers computes its tables in f32 and casts them to x's dtype."""
    B, H, T, D = 2, 2, 48, 32
    x = randn(B, H, T, D)
    positions = torch.arange(T)[None].expand(B, T) + torch.tensor([[0], [15]])  # < 64
    got = jit(lambda x, p: op.rope(x, p, scaling=SCALINGS[scaling]))(x, positions)
    close(got, hf_rope(x, positions, 10000.0, SCALINGS[scaling], torch.float32), 0, 2e-6)


def test_rope_positions_of_any_form_and_meta_layout() -> None:
    """positions as a range, a list, numpy, a traced [T] or [1, T] tensor give one
    result; ``seq_axis=-3`` reads Meta's ``[B, T, H, D]``."""
    B, H, T, D = 2, 3, 6, 8
    x = randn(B, H, T, D, dtype=torch.float64)
    expected = hf_rope(x, torch.arange(T).expand(B, T), 10000.0, None, torch.float64)
    for positions in (range(T), list(range(T)), np.arange(T), torch.arange(T)):
        close(jit(lambda x, p=positions: op.rope(x, p))(x), expected, F64_TOL, F64_TOL)
    for positions in (torch.arange(T), torch.arange(T)[None]):
        close(jit(lambda x, p: op.rope(x, p))(x, positions), expected, F64_TOL, F64_TOL)
    meta = jit(lambda x: op.rope(x, range(T), seq_axis=-3, interleaved=True))(x.transpose(1, 2))
    expected = meta_rope(x.transpose(1, 2), torch.arange(T).expand(B, T), 10000.0, None)
    close(meta, expected, F64_TOL, F64_TOL)


def test_rope_bfloat16_casts_the_tables_as_transformers_does() -> None:
    x = randn(1, 2, 8, 16).to(torch.bfloat16)
    got = jit(lambda x: op.rope(x, range(8)))(x)
    assert got.dtype == torch.bfloat16
    expected = hf_rope(x, torch.arange(8)[None], 10000.0, None, torch.float32)
    close(got, expected, 1e-2, 1e-2)  # bf16: 8 bits of mantissa


@pytest.mark.parametrize("interleaved", [False, True], ids=["rotate_half", "interleaved"])
def test_rope_gradient_matches_torch(interleaved: bool) -> None:
    positions = torch.tensor([[3, 1, 4, 1], [5, 9, 2, 6]]) * 1000

    def theirs(x: torch.Tensor) -> torch.Tensor:
        if interleaved:
            return meta_rope(x.transpose(1, 2), positions, 1e4, LLAMA3).transpose(1, 2)
        return hf_rope(x, positions, 1e4, LLAMA3, torch.float64)

    check_grad(
        lambda x: op.rope(x, positions, scaling=LLAMA3, interleaved=interleaved),
        theirs,
        randn(2, 3, 4, 8, dtype=torch.float64),
    )


@pytest.mark.parametrize("interleaved", [False, True], ids=["rotate_half", "interleaved"])
def test_rope_sharded_dp_tp_matches_unsharded(interleaved: bool) -> None:
    """x [B, H, T, D] with B on dp and the heads on tp (Megatron), positions [B, T] on dp."""
    x = randn(4, 4, 6, 8)
    positions = torch.randint(0, 100, (4, 6), generator=torch.Generator().manual_seed(4))
    c = randn(4, 4, 6, 8, seed=5)

    def loss(x: Any, p: Any) -> Any:
        return op.sum(op.rope(x, p, scaling=LLAMA3, interleaved=interleaved) * c)

    shardings = (BOTH, ROWS_DP)
    close(
        jit(lambda x, p: op.rope(x, p, interleaved=interleaved), mesh=MESH, in_shardings=shardings)(
            x, positions
        ),
        torch.as_tensor(
            np.asarray(jit(lambda x, p: op.rope(x, p, interleaved=interleaved))(x, positions))
        ).double(),
    )
    expected = ts.grad(loss, kernels="triton")(x, positions)
    got = ts.grad(loss, kernels="triton", mesh=MESH, in_shardings=shardings)(x, positions)
    close(got, torch.as_tensor(np.asarray(expected)).double())


# --- errors -----------------------------------------------------------------------------------------


ERRORS = {
    "repeat axis": (lambda x: op.repeat(x, 2, axis=2), ts.ShapeError, "axis 2 is out of range"),  # <- repeat axis
    "repeat counts": (lambda x: op.repeat(x, [1, 2], axis=1), ts.ShapeError, "one repeat count per entry of the axis (3), found 2"),  # <- repeat counts
    "repeat negative": (lambda x: op.repeat_interleave(x, -1, dim=0), ts.ShapeError, "repeats must be >= 0"),  # <- repeat negative
    "repeat traced": (lambda x: op.repeat(x, op.sum(x), axis=0), ts.ShapeError, "repeats must be Python or numpy integers"),  # <- repeat traced
    "repeat float": (lambda x: op.repeat(x, 1.5, axis=0), ts.ShapeError, "must be an integer"),  # <- repeat float
    "tile negative": (lambda x: op.tile(x, (1, -2)), ts.ShapeError, "reps must be >= 0"),  # <- tile negative
    "cumsum axis": (lambda x: op.cumsum(x, axis=-3), ts.ShapeError, "axis -3 is out of range"),  # <- cumsum axis
    "rope odd head_dim": (lambda x: op.rope(x, range(2)), ts.ShapeError, "head_dim (the last dim of x) must be even, found 3"),  # <- rope odd head_dim
    "rope positions": (lambda x: op.rope(x[:, :2], range(5)), ts.ShapeError, "positions [seq] or [batch, seq] with seq = 2"),  # <- rope positions
    "rope seq_axis": (lambda x: op.rope(x[:, :2], range(2), seq_axis=-1), ts.ShapeError, "is the head_dim axis"),  # <- rope seq_axis
    "rope rank": (lambda x: op.rope(x[0], range(2)), ts.ShapeError, "rank >= 2"),  # <- rope rank
    "rope rope_type": (lambda x: op.rope(x[:, :2], range(2), scaling={"rope_type": "yarn", "factor": 4.0}), ts.ArgumentError, "unsupported rope_type 'yarn'"),  # <- rope rope_type
    "rope llama3 key": (lambda x: op.rope(x[:, :2], range(2), scaling={"rope_type": "llama3", "factor": 8.0}), ts.ArgumentError, "needs 'low_freq_factor'"),  # <- rope llama3 key
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(ERRORS))
def test_errors_name_the_problem_and_the_line(name: str) -> None:
    fn, error, words = ERRORS[name]
    raised_at_marked_line(fn, error, words, __file__, name)
