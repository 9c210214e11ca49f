"""The configuration of a causal language model, read from a Hugging Face ``config.json``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tessera.errors import ArgumentError

_REQUIRED = object()


def _first(raw: dict[str, Any], *keys: str, default: Any = _REQUIRED) -> Any:
    """The value of the first of ``keys`` that ``raw`` holds (not None), else ``default``
    (an error naming ``keys`` when none is given)."""
    value = next((raw[k] for k in keys if raw.get(k) is not None), default)
    if value is _REQUIRED:
        raise ArgumentError(f"config.json has no {' or '.join(map(repr, keys))}")
    return value


def _rope(raw: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """``rope_theta`` and the ``rope_scaling`` dict, from transformers 4's keys
    (``rope_theta``, ``rope_scaling``) or 5's (``rope_parameters``)."""
    parameters = raw.get("rope_parameters") or {}
    theta = float(_first(raw, "rope_theta", default=parameters.get("rope_theta", 10000.0)))
    scaling = raw.get("rope_scaling") or parameters or None
    if scaling is not None and scaling.get("rope_type", scaling.get("type")) == "default":
        scaling = None
    return theta, scaling


@dataclass(frozen=True)
class ModelConfig:
    """What the models need from a Hugging Face ``config.json`` (GPT-2's names ``n_embd``,
    ``n_layer``, ``n_head``, ``n_inner``, ``layer_norm_epsilon``, ``n_positions`` are read
    too); ``raw`` is the whole dict, written back unchanged by ``models.save``."""

    model_type: str
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    head_dim: int
    norm_eps: float
    hidden_act: str
    max_position_embeddings: int
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    sliding_windows: tuple[int | None, ...] = ()
    num_local_experts: int = 0
    num_experts_per_tok: int = 0
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ModelConfig:
        """The config of ``raw`` (a parsed ``config.json``)."""
        if "model_type" not in raw:
            raise ArgumentError(f"config.json has no 'model_type'; its keys: {sorted(raw)}")
        kind = raw["model_type"]
        hidden = int(_first(raw, "hidden_size", "n_embd"))
        layers = int(_first(raw, "num_hidden_layers", "n_layer"))
        heads = int(_first(raw, "num_attention_heads", "n_head"))
        theta, scaling = _rope(raw)
        return cls(
            model_type=kind,
            vocab_size=int(_first(raw, "vocab_size")),
            hidden_size=hidden,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=int(_first(raw, "num_key_value_heads", default=heads)),
            intermediate_size=int(_first(raw, "intermediate_size", "n_inner", default=4 * hidden)),
            head_dim=int(_first(raw, "head_dim", default=hidden // heads)),
            norm_eps=float(_first(raw, "rms_norm_eps", "layer_norm_epsilon", default=1e-6)),
            hidden_act=str(_first(raw, "hidden_act", "activation_function", default="silu")),
            max_position_embeddings=int(
                _first(raw, "max_position_embeddings", "n_positions", default=2048)
            ),
            rope_theta=theta,
            rope_scaling=scaling,
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", kind == "gpt2")),
            attention_bias=bool(raw.get("attention_bias", kind == "qwen2")),
            mlp_bias=bool(raw.get("mlp_bias", False)),
            sliding_windows=_sliding_windows(raw, kind, layers),
            num_local_experts=int(raw.get("num_local_experts", 0)),
            num_experts_per_tok=int(raw.get("num_experts_per_tok", 0)),
            raw=dict(raw),
        )


def _sliding_windows(raw: dict[str, Any], kind: str, layers: int) -> tuple[int | None, ...]:
    """Each layer's sliding window (None: full causal attention): transformers'
    ``layer_types`` where given, else ``sliding_window`` on every layer (Mistral,
    Mixtral; Qwen2 only with ``use_sliding_window`` from ``max_window_layers`` on)."""
    window = raw.get("sliding_window")
    if window is None:
        return (None,) * layers
    if raw.get("layer_types"):
        return tuple(window if t == "sliding_attention" else None for t in raw["layer_types"])
    if kind == "qwen2":
        start = raw.get("max_window_layers", layers) if raw.get("use_sliding_window") else layers
        return tuple(window if i >= start else None for i in range(layers))
    return (int(window),) * layers
