"""GPT-2: learned positions, LayerNorm, GELU (tanh), fused q/k/v, a head tied to the
embedding. Parameters are named and laid out as in transformers' ``GPT2LMHeadModel``
(its ``Conv1D`` weights are ``[in, out]``) but for the fused ``c_attn``: weight
``[C, 3, C]`` and bias ``[3, C]`` (q, k, v; the checkpoint's ``[C, 3C]``, ``[3C]``
reshaped by load and save), so that tensor parallelism splits each of q, k and v by heads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tessera import op
from tessera.errors import ArgumentError
from tessera.models.base import CausalLM, Params, activation, heads, merge_heads
from tessera.models.kv_cache import KVCache


def conv1d(x: Any, params: Params, name: str) -> Any:
    """transformers' ``Conv1D``: ``x @ weight + bias``, weight ``[in, out]``."""
    return x @ params[f"{name}.weight"] + params[f"{name}.bias"]


@dataclass(frozen=True)
class GPT2(CausalLM):
    """``GPT2LMHeadModel``."""

    def __post_init__(self) -> None:
        raw = self.config.raw
        for option in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"):
            if raw.get(option):
                raise ArgumentError(f"GPT-2: {option}=True is not supported")

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        c = self.config
        C, F = c.hidden_size, c.intermediate_size
        shapes = {
            "transformer.wte.weight": (c.vocab_size, C),
            "transformer.wpe.weight": (c.max_position_embeddings, C),
        }
        for i in range(c.num_hidden_layers):
            layer = f"transformer.h.{i}."
            modules = {"ln_1": (C,), "attn.c_attn": (C, 3, C), "attn.c_proj": (C, C), "ln_2": (C,),
                       "mlp.c_fc": (C, F), "mlp.c_proj": (F, C)}  # fmt: skip
            for name, shape in modules.items():
                shapes[f"{layer}{name}.weight"] = shape
                shapes[f"{layer}{name}.bias"] = shape[1:] if name == "attn.c_attn" else shape[-1:]
        shapes |= {"transformer.ln_f.weight": (C,), "transformer.ln_f.bias": (C,)}
        if not c.tie_word_embeddings:
            shapes["lm_head.weight"] = (c.vocab_size, C)
        return shapes

    def from_checkpoint(self, tensors: dict[str, Any]) -> dict[str, Any]:
        C, out = self.config.hidden_size, dict(tensors)
        for name, shape in self.param_shapes().items():
            if name.endswith(".c_attn.weight") and name in out and out[name].dim() == 2:
                out[name] = out[name].reshape(shape)  # [C, 3C] -> [C, 3, C]
            elif name.endswith(".c_attn.bias") and name in out and out[name].shape == (3 * C,):
                out[name] = out[name].reshape(shape)  # [3C] -> [3, C]
        return out

    def to_checkpoint(self, params: Params) -> dict[str, Any]:
        C = self.config.hidden_size
        flat = {"weight": (C, 3 * C), "bias": (3 * C,)}
        return {
            k: v.reshape(flat[k.rsplit(".", 1)[1]]) if ".c_attn." in k else v
            for k, v in params.items()
        }

    def tp_dims(self) -> dict[str, int]:
        dims = {}
        for name in self.param_shapes():
            if name.endswith(("c_attn.weight", "c_attn.bias")):
                dims[name] = 2 if name.endswith("weight") else 1  # q, k and v by heads
            elif name.endswith(("c_fc.weight", "c_fc.bias")):
                dims[name] = 0 if name.endswith("bias") else 1  # output features
            elif name.endswith("c_proj.weight"):
                dims[name] = 0  # input features ([in, out] weights)
            elif name in ("transformer.wte.weight", "lm_head.weight"):
                dims[name] = 0  # vocabulary
        return dims

    def logits(self, params: Params, tokens: Any, cache: KVCache | None = None) -> Any:
        c = self.config
        T = tokens.shape[1]
        x = op.take(params["transformer.wte.weight"], tokens, axis=0)
        if cache is None:
            x = x + params["transformer.wpe.weight"][:T]
        else:
            x = x + op.take(params["transformer.wpe.weight"], cache.positions(T), axis=0)
        for i in range(c.num_hidden_layers):
            x = self.layer(params, f"transformer.h.{i}.", x, cache)
        x = self.norm(params, "transformer.ln_f", x)
        head = "transformer.wte.weight" if c.tie_word_embeddings else "lm_head.weight"
        with op.fp8_matmuls(False):  # the output head stays bf16 in an fp8 step
            return x @ op.transpose(params[head])

    def norm(self, params: Params, name: str, x: Any) -> Any:
        weight, bias = params[f"{name}.weight"], params[f"{name}.bias"]
        return op.layer_norm(x, eps=self.config.norm_eps, weight=weight, bias=bias)

    def layer(self, params: Params, prefix: str, x: Any, cache: KVCache | None = None) -> Any:
        """One pre-LN block of ``x [B, T, C]`` (``cache``: attend to the cached keys and
        values)."""
        c = self.config
        C, H = c.hidden_size, c.num_attention_heads
        D = C // H
        h = self.norm(params, f"{prefix}ln_1", x)
        weights = op.split(params[f"{prefix}attn.c_attn.weight"], 3, axis=1)  # [C, 1, C] each
        biases = op.split(params[f"{prefix}attn.c_attn.bias"], 3, axis=0)  # [1, C] each
        q, k, v = (
            heads(h @ op.reshape(w, (C, C)) + op.reshape(b, (C,)), H, D)
            for w, b in zip(weights, biases, strict=True)
        )
        if cache is None:
            attended = merge_heads(op.attention(q, k, v, causal=True))
        else:
            attended = merge_heads(cache.attend(q, k, v, None))
        x = x + conv1d(attended, params, f"{prefix}attn.c_proj")
        h = activation(c.hidden_act)(
            conv1d(self.norm(params, f"{prefix}ln_2", x), params, f"{prefix}mlp.c_fc")
        )
        return x + conv1d(h, params, f"{prefix}mlp.c_proj")
