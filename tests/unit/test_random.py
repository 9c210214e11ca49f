"""``ts.random`` and ``op.dropout``: Philox bits against Triton's ``tl.randint``, keys
(determinism, split, fold_in), the statistics of uniform, normal and bernoulli, the same
numbers on one device and on dp x tp and dp x tp x cp meshes, dropout's value and
gradient against torch with the same mask, and the regenerated (not saved) mask."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import tessera as ts
from tessera import dist, op
from tessera.ir import graph
from tessera.opdefs.random import philox
from tessera.transforms.remat import REMAT

SOURCE = Path(__file__).read_text().splitlines()


def jit(fn: Callable[..., Any], **options: Any) -> Any:
    return ts.jit(fn, kernels=options.pop("kernels", "triton"), **options)


def array(x: Any) -> np.ndarray:
    return np.asarray(x.numpy() if isinstance(x, torch.Tensor) else x)


def randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


# --- Philox bits ----------------------------------------------------------------------


def test_key_words_are_the_seeds_low_and_high_halves() -> None:
    assert ts.random.key(5).tolist() == [5, 0]
    assert ts.random.key((3 << 32) + 7).tolist() == [7, 3]
    assert ts.random.key(0xFFFFFFFF).tolist() == [-1, 0]  # uint32 bits as int32


@pytest.mark.parametrize("seed", [0, 12345, (1 << 40) + 99, (1 << 63) - 5])
def test_reference_bits_equal_triton_randint(seed: int) -> None:
    """numpy Philox against ``tl.randint(seed, offsets)`` run by Triton itself."""
    import triton
    import triton.language as tl

    @triton.jit
    def randint(out, seed, n: tl.constexpr):
        offsets = tl.arange(0, n)
        tl.store(out + offsets, tl.randint(seed, offsets))

    out = torch.empty(128, dtype=torch.int32)
    randint[(1,)](out, seed, 128)
    words = np.uint32(seed & 0xFFFFFFFF), np.uint32(seed >> 32)
    expected = philox(*words, np.arange(128, dtype=np.uint32), np.uint32(0)).view(np.int32)
    np.testing.assert_array_equal(out.numpy(), expected)


@pytest.mark.parametrize("shape", [(5,), (40, 36), (3, 7, 50)])
def test_triton_kernels_and_reference_give_identical_bits(shape: tuple[int, ...]) -> None:
    key = ts.random.key((1 << 33) + 11)

    def sample(k: Any) -> Any:
        return ts.random.bits(k, shape), ts.random.uniform(k, shape)

    bits, uniform = jit(sample)(key)
    ref_bits, ref_uniform = jit(sample, kernels="reference")(key)
    expected = philox(np.uint32(11), np.uint32(2), np.arange(np.prod(shape), dtype=np.uint32), 0)
    np.testing.assert_array_equal(array(bits), expected.view(np.int32).reshape(shape))
    np.testing.assert_array_equal(array(ref_bits), array(bits))
    np.testing.assert_array_equal(array(ref_uniform).view(np.int32), array(uniform).view(np.int32))
    tile = jit(sample).lower(key).triton_source()
    assert any("tl.philox" in source for source in tile.values())


# --- keys -------------------------------------------------------------------------------


def test_same_key_same_numbers_split_and_fold_in_differ() -> None:
    key = ts.random.key(42)
    first = jit(lambda k: ts.random.uniform(k, (64,)))(key)
    again = jit(lambda k: ts.random.uniform(k, (64,)))(ts.random.key(42))
    np.testing.assert_array_equal(array(first), array(again))

    def derived(k: Any) -> Any:
        a, b, c = ts.random.split(k, 3)
        return [
            ts.random.uniform(x, (64,))
            for x in (k, a, b, c, ts.random.fold_in(k, 0), ts.random.fold_in(k, 1))
        ]

    samples = [array(s) for s in jit(derived)(key)]
    for i in range(len(samples)):
        for j in range(i):
            assert not np.allclose(samples[i], samples[j]), (i, j)
    np.testing.assert_array_equal(samples[0], array(first))


def test_keys_pass_in_and_out_of_jit_and_eager_calls_match_traced_ones() -> None:
    key = ts.random.key(3)
    a, b = ts.random.split(key)
    assert a.dtype == torch.int32 and tuple(a.shape) == (2,)
    traced = jit(lambda k: ts.random.split(k))(key)
    np.testing.assert_array_equal(array(traced[1]), array(b))
    folded = ts.random.fold_in(key, 7)
    traced = jit(lambda k, step: ts.random.fold_in(k, step))(
        key, torch.tensor(7, dtype=torch.int32)
    )
    np.testing.assert_array_equal(array(traced), array(folded))
    np.testing.assert_allclose(  # transcendentals: to rounding
        array(ts.random.normal(b, (8,))),
        array(jit(lambda k: ts.random.normal(k, (8,)))(b)),
        rtol=1e-6,
    )


# --- statistics ---------------------------------------------------------------------------


N = 100_000


def test_uniform_mean_and_variance_within_5_sigma() -> None:
    u = array(ts.random.uniform(ts.random.key(1), (N,))).astype(np.float64)
    assert u.min() >= 0 and u.max() < 1
    assert abs(u.mean() - 0.5) < 5 * np.sqrt(1 / 12 / N)
    # var of (u - 1/2)^2 is 1/80 - 1/144
    assert abs(u.var() - 1 / 12) < 5 * np.sqrt((1 / 80 - 1 / 144) / N)
    scaled = array(ts.random.uniform(ts.random.key(1), (N,), minval=-2.0, maxval=3.0))
    np.testing.assert_allclose(scaled, -2 + 5 * u, rtol=1e-6, atol=1e-6)


def test_normal_moments() -> None:
    z = array(ts.random.normal(ts.random.key(2), (N,))).astype(np.float64)
    assert abs(z.mean()) < 5 / np.sqrt(N)
    assert abs(z.var() - 1) < 5 * np.sqrt(2 / N)
    assert abs((z**3).mean()) < 5 * np.sqrt(15 / N)
    assert abs((z**4).mean() - 3) < 5 * np.sqrt(96 / N)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_bernoulli_rate(p: float) -> None:
    b = array(ts.random.bernoulli(ts.random.key(4), p, (N,)))
    assert b.dtype == np.bool_
    assert abs(b.mean() - p) < 5 * np.sqrt(p * (1 - p) / N)


# --- the same numbers whatever the mesh ---------------------------------------------------

SHAPE = (8, 12, 16)  # 1536 elements: the index constants are not folded into one


def spec(*dims: tuple[int, str | tuple[str, ...]]) -> dist.ShardSpec:
    return dist.ShardSpec(partition=tuple(d for d, _ in dims), mesh_axes=tuple(a for _, a in dims))


MESHES = {
    "dp x tp, rows and columns": ({"dp": 2, "tp": 2}, spec((0, "dp"), (1, "tp"))),
    "dp x tp, last dim on tp": ({"dp": 2, "tp": 2}, spec((2, "tp"))),
    "dp x tp, one dim on both": ({"dp": 2, "tp": 2}, spec((1, ("dp", "tp")))),
    "dp x tp x cp, every dim": ({"dp": 2, "tp": 2, "cp": 2}, spec((0, "dp"), (1, "cp"), (2, "tp"))),
    "dp x tp x cp, other dims": ({"dp": 2, "tp": 2, "cp": 2}, spec((2, "dp"), (0, ("tp", "cp")))),
}


def noisy(x: Any, k: Any) -> Any:
    k1, k2 = ts.random.split(k)
    noise = ts.random.normal(k1, x.shape) + ts.random.uniform(k2, x.shape)
    return x + noise + op.dropout(x, 0.5, ts.random.fold_in(k, 3))


@pytest.mark.parametrize("name", sorted(MESHES))
def test_same_key_same_numbers_on_one_device_and_on_meshes(name: str) -> None:
    axes, layout = MESHES[name]
    x, key = randn(*SHAPE), ts.random.key(2024)
    expected = array(jit(noisy)(x, key))
    sharded = jit(noisy, mesh=dist.mesh(axes), in_shardings=(layout, None), out_shardings=layout)
    np.testing.assert_allclose(array(sharded(x, key)), expected, rtol=1e-6, atol=1e-6)
    partitioned = sharded.lower(x, key).module_at("partitioned")
    local = [
        o.result.type.get_shape() for o in partitioned.walk() if isinstance(o, graph.RandomBitsOp)
    ]
    assert local and all(np.prod(s) < np.prod(SHAPE) for s in local), local  # computed per shard


# --- dropout ------------------------------------------------------------------------------


def mask_of(key: torch.Tensor, rate: float, shape: tuple[int, ...]) -> torch.Tensor:
    return torch.as_tensor(array(ts.random.bernoulli(key, 1 - rate, shape)))


@pytest.mark.parametrize("kernels", ["triton", "reference"])
def test_dropout_value_and_gradient_against_torch_with_the_same_mask(kernels: str) -> None:
    rate, key = 0.3, ts.random.key(9)
    x, c = randn(16, 48), randn(16, 48, seed=1)
    mask = mask_of(key, rate, (16, 48))
    assert 0.6 < mask.float().mean() < 0.8
    y = jit(lambda x, k: op.dropout(x, rate, k), kernels=kernels)(x, key)
    leaf = x.double().requires_grad_()
    theirs = leaf * mask / (1 - rate)
    torch.testing.assert_close(
        torch.as_tensor(array(y)).double(), theirs.detach(), rtol=1e-6, atol=1e-6
    )
    (expected,) = torch.autograd.grad((theirs * c.double()).sum(), [leaf])
    got = ts.grad(lambda x, k: op.sum(op.dropout(x, rate, k) * c), kernels=kernels)(x, key)
    torch.testing.assert_close(torch.as_tensor(array(got)).double(), expected, rtol=1e-6, atol=1e-6)


def test_dropout_rate_zero_and_deterministic_are_the_identity() -> None:
    x, key = randn(4, 8), ts.random.key(0)
    np.testing.assert_array_equal(array(jit(lambda x, k: op.dropout(x, 0.0, k))(x, key)), array(x))
    same = jit(lambda x, k: op.dropout(x, 0.5, k, deterministic=True))(x, key)
    np.testing.assert_array_equal(array(same), array(x))


def _derived_from_random_bits(ops: list[Any]) -> set[Any]:
    derived: set[Any] = set()
    for o in ops:
        if isinstance(o, graph.RandomBitsOp) or any(v in derived for v in o.operands):
            derived.update(o.results)
    return derived


def test_dropout_backward_regenerates_the_mask_instead_of_saving_it() -> None:
    x, key, c = randn(16, 96), ts.random.key(5), randn(16, 96, seed=2)

    def loss(x: Any, k: Any) -> Any:
        return op.sum(op.dropout(op.tanh(x), 0.25, k) * c)

    module = ts.value_and_grad(loss, kernels="reference").lower(x, key).module_at("graph")
    (function,) = [f for f in module.ops if f.body.blocks]
    ops = list(function.body.block.ops)
    backward = [o for o in ops if REMAT in o.attributes]
    forward = [o for o in ops if o not in backward]
    assert sum(isinstance(o, graph.RandomBitsOp) for o in backward) == 1
    assert sum(isinstance(o, graph.RandomBitsOp) for o in forward) == 1
    start = ops.index(backward[0])
    saved = _derived_from_random_bits(forward) - set(ops[-1].operands)  # but the results
    for o in ops[start:]:
        read = [v for v in o.operands if v in saved]
        assert not read, f"{o.name} in the backward reads a forward value made from random bits"


# --- errors at the user's line --------------------------------------------------------------

ERRORS = {
    "dropout rate 1": (lambda x, k: op.dropout(x, 1.0, k), "rate must be a number in [0, 1), found 1.0"),  # <- dropout rate 1
    "dropout rate negative": (lambda x, k: op.dropout(x, -0.1, k), "rate must be a number in [0, 1)"),  # <- dropout rate negative
    "dropout float key": (lambda x, k: op.dropout(x, 0.1, x), "expected a key (an int32[2]"),  # <- dropout float key
    "uniform int key": (lambda x, k: ts.random.uniform(7, (2,)), "found 7"),  # <- uniform int key
    "split num": (lambda x, k: ts.random.split(k, 0), "num must be a positive int"),  # <- split num
    "fold_in data": (lambda x, k: ts.random.fold_in(k, -1), "expected an int in [0, 2^31)"),  # <- fold_in data
    "bernoulli p": (lambda x, k: ts.random.bernoulli(k, 1.5, (2,)), "p must be in [0, 1]"),  # <- bernoulli p
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(ERRORS))
def test_errors_name_the_problem_and_the_line(name: str) -> None:
    fn, words = ERRORS[name]
    with pytest.raises(ts.ShapeError) as info:
        jit(fn)(np.zeros((2, 3), np.float32), ts.random.key(0))
    message = str(info.value)
    assert words in message, message
    (line,) = [i for i, text in enumerate(SOURCE, 1) if text.endswith(f"# <- {name}")]
    assert f"{__file__}:{line}" in message, message


def test_eager_call_with_a_non_key_names_the_line() -> None:
    with pytest.raises(ts.ShapeError, match="expected a key") as info:
        ts.random.uniform(torch.zeros(2), (3,))  # <- eager
    (line,) = [i for i, text in enumerate(SOURCE, 1) if text.endswith("# <- eager")]
    assert f"{__file__}:{line}" in str(info.value)
