"""Llama 2, 3 and 3.1 (RMSNorm, rotary embeddings with Hugging Face's ``rope_scaling``,
grouped-query attention, SwiGLU); Mistral is Llama with a sliding window, Qwen2 Llama with
q, k and v biases. Parameters are named as in transformers' ``LlamaForCausalLM``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tessera import op
from tessera.models.base import CausalLM, Params, activation, heads, linear, merge_heads
from tessera.models.kv_cache import KVCache


@dataclass(frozen=True)
class Llama(CausalLM):
    """``LlamaForCausalLM`` (and ``MistralForCausalLM``, ``Qwen2ForCausalLM``)."""

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        c = self.config
        C, V = c.hidden_size, c.vocab_size
        q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
        shapes = {"model.embed_tokens.weight": (V, C)}
        for i in range(c.num_hidden_layers):
            layer = f"model.layers.{i}."
            attn = {"q_proj": (q, C), "k_proj": (kv, C), "v_proj": (kv, C), "o_proj": (C, q)}
            for name, shape in attn.items():
                shapes[f"{layer}self_attn.{name}.weight"] = shape
                if c.attention_bias and (name != "o_proj" or c.model_type != "qwen2"):
                    shapes[f"{layer}self_attn.{name}.bias"] = shape[:1]
            shapes |= {
                f"{layer}input_layernorm.weight": (C,),
                f"{layer}post_attention_layernorm.weight": (C,),
            }
            shapes |= self.mlp_shapes(f"{layer}mlp.")
        shapes["model.norm.weight"] = (C,)
        if not c.tie_word_embeddings:
            shapes["lm_head.weight"] = (V, C)
        return shapes

    def mlp_shapes(self, prefix: str) -> dict[str, tuple[int, ...]]:
        """The feed-forward block's parameters (Mixtral's replace them)."""
        C, F = self.config.hidden_size, self.config.intermediate_size
        shapes = {}
        for name, shape in {"gate_proj": (F, C), "up_proj": (F, C), "down_proj": (C, F)}.items():
            shapes[f"{prefix}{name}.weight"] = shape
            if self.config.mlp_bias:
                shapes[f"{prefix}{name}.bias"] = shape[:1]
        return shapes

    def tp_dims(self) -> dict[str, int]:
        dims = {}
        for name in self.param_shapes():
            module, kind = name.rsplit(".", 2)[-2:]
            if module in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"):
                dims[name] = 0  # output features ([out, in] weights, [out] biases)
            elif module in ("o_proj", "down_proj") and kind == "weight":
                dims[name] = 1  # input features
            elif module in ("embed_tokens", "lm_head"):
                dims[name] = 0  # vocabulary
        return dims

    def logits(self, params: Params, tokens: Any, cache: KVCache | None = None) -> Any:
        c = self.config
        x = op.take(params["model.embed_tokens.weight"], tokens, axis=0)
        for i in range(c.num_hidden_layers):
            x = self.layer(params, f"model.layers.{i}.", x, c.sliding_windows[i], cache)
        x = op.rms_norm(x, eps=c.norm_eps, weight=params["model.norm.weight"])
        head = "model.embed_tokens.weight" if c.tie_word_embeddings else "lm_head.weight"
        with op.fp8_matmuls(False):  # the output head stays bf16 in an fp8 step
            return x @ op.transpose(params[head])

    def layer(
        self, params: Params, prefix: str, x: Any, window: int | None, cache: KVCache | None = None
    ) -> Any:
        """One decoder layer of ``x [B, T, C]``."""
        c = self.config
        h = op.rms_norm(x, eps=c.norm_eps, weight=params[f"{prefix}input_layernorm.weight"])
        x = x + self.attention(params, f"{prefix}self_attn.", h, window, cache)
        h = op.rms_norm(
            x, eps=c.norm_eps, weight=params[f"{prefix}post_attention_layernorm.weight"]
        )
        return x + self.mlp(params, f"{prefix}mlp.", h)

    def attention(
        self, params: Params, prefix: str, h: Any, window: int | None, cache: KVCache | None = None
    ) -> Any:
        """Causal grouped-query self-attention with rotary embeddings (``window``: a
        sliding window, Mistral's; ``cache``: attend to the cached keys and values)."""
        c = self.config
        bias = c.attention_bias
        q = heads(linear(h, params, f"{prefix}q_proj", bias), c.num_attention_heads, c.head_dim)
        k = heads(linear(h, params, f"{prefix}k_proj", bias), c.num_key_value_heads, c.head_dim)
        v = heads(linear(h, params, f"{prefix}v_proj", bias), c.num_key_value_heads, c.head_dim)
        positions = range(h.shape[1]) if cache is None else cache.positions(h.shape[1])
        q, k = (op.rope(t, positions, c.rope_theta, c.rope_scaling) for t in (q, k))
        if cache is None:
            out = op.attention(q, k, v, causal=True, window=window)  # k, v shared by head groups
        else:
            out = cache.attend(q, k, v, window)
        return linear(merge_heads(out), params, f"{prefix}o_proj", bias and c.model_type != "qwen2")

    def mlp(self, params: Params, prefix: str, h: Any) -> Any:
        """SwiGLU: ``down(act(gate(h)) * up(h))``."""
        bias, act = self.config.mlp_bias, activation(self.config.hidden_act)
        gate = act(linear(h, params, f"{prefix}gate_proj", bias))
        return linear(
            gate * linear(h, params, f"{prefix}up_proj", bias), params, f"{prefix}down_proj", bias
        )
