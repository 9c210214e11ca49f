"""Autoregressive generation: a prefill of the prompt, then one token per decode step,
both through one traced step function over a static KV cache (:class:`KVCache`),
compiled once each (the position is a runtime i32 input). Sampling runs on the host over
the last logits: greedy at ``temperature=0``, else temperature, top-k and top-p
(nucleus), by inverse CDF from uniforms that ``ts.random`` draws from ``key``."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from tessera import dist
from tessera import random as ts_random
from tessera.errors import ArgumentError
from tessera.frontend.tracer import user_location
from tessera.jit_function import jit
from tessera.models.kv_cache import KVCache

if TYPE_CHECKING:
    from tessera.models.base import CausalLM, Params


@dataclass(frozen=True)
class Generation:
    """What :func:`generate` returns: ``tokens [B, prompt + new]`` (the prompt first)
    and the wall-clock seconds of the prefill and of the decode steps."""

    tokens: torch.Tensor
    prompt_length: int
    prefill_seconds: float
    decode_seconds: float

    @property
    def new_tokens(self) -> torch.Tensor:
        """The generated tokens ``[B, new]``."""
        return self.tokens[:, self.prompt_length :]

    @property
    def tokens_per_second(self) -> float:
        """Generated tokens (over the batch) per second, prefill included."""
        seconds = self.prefill_seconds + self.decode_seconds
        return self.new_tokens.numel() / seconds if seconds > 0 else 0.0


def _fail(message: str) -> ArgumentError:
    return ArgumentError(f"generate: {message}, at {user_location()}")


def _prompt(prompt: Any) -> torch.Tensor:
    """``prompt`` as int64 ``[B, P]`` (a 1-D prompt is one row)."""
    tokens = torch.as_tensor(prompt)
    if tokens.ndim == 1:
        tokens = tokens[None]
    if tokens.ndim != 2 or tokens.dtype.is_floating_point or tokens.dtype == torch.bool:
        raise _fail(f"prompt must be integer token ids [batch, length], found {tokens.dtype} "
                    f"{list(tokens.shape)}")  # fmt: skip
    if tokens.shape[1] == 0:
        raise _fail("prompt is empty (it needs at least one token)")
    return tokens.to(torch.int64)


def _check_sampling(
    max_new_tokens: Any, temperature: float, top_k: int | None, top_p: float | None
) -> None:
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise _fail(f"max_new_tokens must be an int >= 0, found {max_new_tokens!r}")
    if not (isinstance(temperature, (int, float)) and math.isfinite(temperature) and temperature >= 0):
        raise _fail(f"temperature must be a finite number >= 0 (0: greedy), found {temperature!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise _fail(f"top_k must be an int >= 1 or None, found {top_k!r}")
    if top_p is not None and not (isinstance(top_p, (int, float)) and 0 < top_p <= 1):
        raise _fail(f"top_p must be in (0, 1] or None, found {top_p!r}")


def sample(
    logits: torch.Tensor,
    temperature: float,
    top_k: int | None = None,
    top_p: float | None = None,
    uniform: torch.Tensor | None = None,
) -> torch.Tensor:
    """The next token of each row of ``logits [B, V]``: the argmax at ``temperature=0``;
    else drawn from ``softmax(logits / temperature)`` restricted to the ``top_k`` largest
    and to the smallest set of mass >= ``top_p`` (as transformers' warpers), by inverse
    CDF at ``uniform [B]`` (numbers in [0, 1))."""
    if temperature == 0:
        return logits.argmax(-1)
    scores = logits.double() / temperature
    if top_k is not None and top_k < scores.shape[-1]:
        kth = torch.topk(scores, top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, -math.inf)
    probs = torch.softmax(scores, dim=-1)
    if top_p is not None and top_p < 1:
        ordered, order = torch.sort(probs, dim=-1, descending=True, stable=True)
        before = torch.cumsum(ordered, dim=-1) - ordered  # mass of the more likely tokens
        drop = torch.zeros_like(probs, dtype=torch.bool).scatter(-1, order, before >= top_p)
        probs = probs.masked_fill(drop, 0.0)
    assert uniform is not None
    cdf = torch.cumsum(probs, dim=-1)
    target = uniform.double()[:, None] * cdf[:, -1:]
    chosen = torch.searchsorted(cdf, target, right=True).squeeze(-1)
    return chosen.clamp(max=probs.shape[-1] - 1)


def step_function(model: CausalLM) -> Callable[..., Any]:
    """``step(params, tokens [B, T], position, keys, values) -> (last logits [B, V],
    keys, values)``: the model on ``tokens`` at ``position`` (an i32 scalar) with the
    layers' caches ``[B, kv_heads, max_len, head_dim]`` (lists), updated."""

    def step(params: Params, tokens: Any, position: Any, keys: Any, values: Any) -> Any:
        cache = KVCache(list(keys), list(values), position)
        logits = model.logits(params, tokens, cache)
        return logits[:, tokens.shape[1] - 1], cache.keys, cache.values

    return step


def compiled_step(
    model: CausalLM, mesh: dist.Mesh | None, tp: str, kernels: str | None
) -> Callable[..., Any]:
    """The jitted :func:`step_function` of ``model`` (made once per mesh, axis and
    kernels; its programs are compiled once per prompt length, and once for decoding):
    with a ``mesh``, the parameters in ``model.param_shardings(mesh, tp)`` and the
    caches split over heads along ``tp``. The caches are donated (``donate_argnums``):
    a step's inputs are dead once it has run."""
    steps = model._generation_steps
    key = (mesh, tp, kernels)
    if key not in steps:
        if mesh is None:
            steps[key] = jit(step_function(model), kernels=kernels, donate_argnums=(3, 4))
        else:
            c = model.config
            heads = c.num_key_value_heads % mesh.axis_size(tp) == 0 if tp in mesh.axis_names else False
            split = dist.ShardSpec(partition=(1,), mesh_axes=(tp,)) if heads else None
            caches = [split] * c.num_hidden_layers
            steps[key] = jit(
                step_function(model), mesh=mesh, kernels=kernels, donate_argnums=(3, 4),
                in_shardings=(model.param_shardings(mesh, tp), None, None, caches, caches),
                out_shardings=(None, caches, caches),
            )  # fmt: skip
    return steps[key]


def generate(
    model: CausalLM,
    params: Params,
    prompt: Any,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    key: Any = None,
    *,
    max_len: int | None = None,
    mesh: dist.Mesh | None = None,
    tp: str = "tp",
    kernels: str | None = None,
    verbose: bool = False,
) -> Generation:
    """See :meth:`CausalLM.generate`."""
    tokens = _prompt(prompt)
    _check_sampling(max_new_tokens, temperature, top_k, top_p)
    batch, length = tokens.shape
    max_len = length + max_new_tokens if max_len is None else max_len
    if length + max_new_tokens > max_len:
        what = "the prompt" if length > max_len else "the prompt and max_new_tokens"
        raise _fail(f"{what} ({length} + {max_new_tokens} tokens) exceed max_len {max_len}")
    if max_new_tokens == 0:
        return Generation(tokens, length, 0.0, 0.0)
    uniforms = None
    if temperature > 0:
        key = ts_random.key(0) if key is None else key
        uniforms = ts_random.uniform(key, (max_new_tokens, batch))
    c = model.config
    dtype = next(p.dtype for p in params.values() if torch.as_tensor(p).is_floating_point())
    shape = (batch, c.num_key_value_heads, max_len, c.head_dim)
    keys = [torch.zeros(shape, dtype=dtype) for _ in range(c.num_hidden_layers)]
    values = [torch.zeros(shape, dtype=dtype) for _ in range(c.num_hidden_layers)]
    step = compiled_step(model, mesh, tp, kernels)
    out = [tokens]

    def advance(inputs: torch.Tensor, position: int, i: int) -> torch.Tensor:
        nonlocal keys, values
        at = torch.tensor(position, dtype=torch.int32)
        logits, keys, values = step(params, inputs, at, keys, values)
        chosen = sample(logits, temperature, top_k, top_p, None if uniforms is None else uniforms[i])
        out.append(chosen[:, None].to(torch.int64))
        return out[-1]

    start = time.perf_counter()
    last = advance(tokens, 0, 0)
    prefill = time.perf_counter() - start
    for i in range(1, max_new_tokens):
        last = advance(last, length + i - 1, i)
    result = Generation(torch.cat(out, dim=1), length, prefill, time.perf_counter() - start - prefill)
    if verbose:
        print(
            f"generate: {batch} x {max_new_tokens} tokens in {prefill + result.decode_seconds:.2f} s "
            f"({result.tokens_per_second:.1f} tokens/s; prefill of {length} tokens {prefill:.2f} s)"
        )
    return result
