"""``model.generate`` and its KV-cache write, ``op.dynamic_update_slice``: greedy
decoding against transformers' ``generate`` (small random float64 models, as in
test_models.py), the cached decode logits against a full recompute, tensor parallelism,
sampling's determinism, the op's reference and Triton kernel against numpy, errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_models import exact_float64, hf_model  # noqa: F401  (a fixture)
from user_errors import raised_at_line

import tessera as ts
from tessera import dist, models, op
from tessera.models.generate import compiled_step, sample

pytest.importorskip("transformers")
NEW = 5


def loaded(kind: str, tmp_path) -> tuple[torch.nn.Module, models.CausalLM, dict]:
    hf = hf_model(kind)
    hf.save_pretrained(tmp_path)
    model, params = models.load(tmp_path)
    return hf, model, params


def prompt(batch: int = 2, length: int = 5, seed: int = 3) -> torch.Tensor:
    return torch.randint(0, 100, (batch, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("kind", ["llama", "qwen2", "mixtral", "gpt2"])
def test_greedy_matches_transformers(kind, tmp_path, exact_float64) -> None:  # noqa: F811
    """Token for token (llama: grouped-query attention; qwen2 and mixtral: a sliding
    window shorter than the sequence on some layers); no end-of-sequence stop."""
    hf, model, params = loaded(kind, tmp_path)
    tokens = prompt()
    out = model.generate(params, tokens, NEW, temperature=0)
    expected = hf.generate(
        tokens, max_new_tokens=NEW, do_sample=False, eos_token_id=None, pad_token_id=0
    )
    assert torch.equal(out.tokens, expected)
    assert out.new_tokens.shape == (2, NEW) and out.tokens_per_second > 0


def test_cached_decode_logits_equal_a_full_recompute(tmp_path, exact_float64) -> None:  # noqa: F811
    """Each step's logits (prefill, then one token at a time into the cache) against
    transformers' eager float64 logits of the whole sequence: relative error < 1e-9."""
    hf, model, params = loaded("llama", tmp_path)
    tokens = prompt(length=4)
    sequence = torch.cat([tokens, prompt(length=3, seed=4)], dim=1)  # 4 + 3 tokens
    expected = hf(sequence).logits
    shape = (2, model.config.num_key_value_heads, sequence.shape[1], model.config.head_dim)
    keys = [torch.zeros(shape, dtype=torch.float64) for _ in range(2)]
    values = [torch.zeros(shape, dtype=torch.float64) for _ in range(2)]
    step = compiled_step(model, None, "tp", None)
    logits, keys, values = step(params, tokens, torch.tensor(0, dtype=torch.int32), keys, values)
    got = [logits]
    for t in range(4, sequence.shape[1]):
        at = torch.tensor(t, dtype=torch.int32)
        logits, keys, values = step(params, sequence[:, t : t + 1], at, keys, values)
        got.append(logits)
    want = expected[:, 3:]
    error = (torch.stack(got, 1) - want).abs().max() / want.abs().max()
    assert error < 1e-9


def test_tensor_parallel_gives_the_same_tokens_and_keeps_the_cache_split(tmp_path) -> None:
    _, model, params = loaded("llama", tmp_path)
    tokens = prompt()
    one = model.generate(params, tokens, 3, temperature=0)
    mesh = dist.mesh({"tp": 2})
    assert torch.equal(model.generate(params, tokens, 3, temperature=0, mesh=mesh).tokens, one.tokens)
    shape = (2, 2, 8, model.config.head_dim)  # kv heads 2: one per rank
    caches = [torch.zeros(shape, dtype=torch.float64)] * 2
    lowered = compiled_step(model, mesh, "tp", None).lower(
        params, tokens[:, :1], torch.tensor(5, dtype=torch.int32), caches, caches
    )
    assert "graph.dynamic_update_slice" in lowered.as_text("partitioned")
    gathered = [c for c in lowered.collectives() if c.kind == "all_gather" and len(c.shape) == 4]
    assert not gathered, gathered  # no cache (nor k, v) is gathered over the heads


def test_sampling_is_deterministic_given_the_key(tmp_path) -> None:
    _, model, params = loaded("gpt2", tmp_path)
    tokens = prompt()
    options = {"top_k": 30, "top_p": 0.95, "temperature": 1.5}
    a = model.generate(params, tokens, NEW, key=ts.random.key(1), **options)
    b = model.generate(params, tokens, NEW, key=ts.random.key(1), **options)
    c = model.generate(params, tokens, NEW, key=ts.random.key(2), **options)
    assert torch.equal(a.tokens, b.tokens) and not torch.equal(a.tokens, c.tokens)
    greedy = model.generate(params, tokens, NEW, temperature=0).tokens
    assert torch.equal(model.generate(params, tokens, NEW, top_k=1).tokens, greedy)


def test_sample_restricts_to_top_k_and_top_p() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]] * 4000, dtype=torch.float64))
    u = torch.rand(4000, generator=torch.Generator().manual_seed(0))
    counts = lambda **kw: torch.bincount(sample(logits, 1.0, uniform=u, **kw), minlength=4)  # noqa: E731
    assert counts(top_k=2)[2:].sum() == 0 and counts(top_k=2)[1] > 1000
    assert counts(top_p=0.7)[2:].sum() == 0  # 0.5 + 0.3 >= 0.7: the first two
    assert counts(top_p=0.5)[1:].sum() == 0
    assert counts()[3] > 100
    assert torch.equal(sample(logits[:2], 0.0), torch.zeros(2, dtype=torch.int64))


@pytest.mark.parametrize("kernels", ["reference", "triton"])
def test_dynamic_update_slice_against_numpy(kernels) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 8, 4)).astype(np.float32)
    update = rng.standard_normal((2, 3, 3, 4)).astype(np.float32)
    f = ts.jit(lambda x, u, s: op.dynamic_update_slice(x, u, s, axis=2), kernels=kernels)
    for start in (0, 2, 5, 7, -1):  # 7 and -1 clamp into [0, 5]
        want = x.copy()
        begin = min(max(start, 0), 5)
        want[:, :, begin : begin + 3] = update
        got = f(x, update, np.int32(start))
        np.testing.assert_array_equal(np.asarray(got), want)
    one = f(x, update[:, :, :1], np.int32(4))  # a decode step's single position
    want = x.copy()
    want[:, :, 4:5] = update[:, :, :1]
    np.testing.assert_array_equal(np.asarray(one), want)


def test_dynamic_update_slice_gradients() -> None:
    x, u = torch.randn(3, 6, dtype=torch.float64), torch.randn(3, 2, dtype=torch.float64)
    w = torch.randn(3, 6, dtype=torch.float64)
    loss = lambda x, u, s: (op.dynamic_update_slice(x, u, s, axis=1) * w).sum()  # noqa: E731
    dx, du = ts.grad(loss, argnums=(0, 1))(x, u, torch.tensor(3, dtype=torch.int32))
    mask = torch.ones(3, 6, dtype=torch.float64)
    mask[:, 3:5] = 0
    torch.testing.assert_close(dx, w * mask)
    torch.testing.assert_close(du, w[:, 3:5])


def test_errors_name_the_problem_at_the_users_line(tmp_path) -> None:
    _, model, params = loaded("gpt2", tmp_path)
    tokens = prompt(1, 6)
    raised_at_line(
        lambda: model.generate(params, tokens, 2, max_len=4),  # <- long
        ts.ArgumentError, "the prompt (6 + 2 tokens) exceed max_len 4", __file__, "long",
    )  # fmt: skip
    raised_at_line(
        lambda: model.generate(params, tokens, -1),  # <- negative
        ts.ArgumentError, "max_new_tokens must be an int >= 0, found -1", __file__, "negative",
    )  # fmt: skip
    raised_at_line(
        lambda: model.generate(params, tokens, 2, top_p=1.5),  # <- top_p
        ts.ArgumentError, "top_p must be in (0, 1] or None, found 1.5", __file__, "top_p",
    )  # fmt: skip


def test_donated_cache_is_updated_in_place() -> None:
    """With the cache donated, the write's result takes the cache's own buffer: the
    program's peak is one cache (plus the update and the start), not two."""
    cache = torch.zeros(2, 4, 64, 16)
    update, start = torch.ones(2, 4, 1, 16), torch.tensor(3, dtype=torch.int32)

    def write(c, u, s):
        return op.dynamic_update_slice(c, u, s, 2)

    copied = ts.jit(write).lower(cache, update, start).memory().peak_bytes
    in_place = ts.jit(write, donate_argnums=0).lower(cache, update, start).memory().peak_bytes
    cache_bytes = cache.numel() * 4
    assert copied >= 2 * cache_bytes
    assert cache_bytes <= in_place < cache_bytes + 4096  # the update (512 B) and the start
