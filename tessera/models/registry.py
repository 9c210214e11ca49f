"""Which model class serves which Hugging Face ``model_type``."""

from __future__ import annotations

from typing import Any

from tessera.errors import ArgumentError
from tessera.models.base import CausalLM
from tessera.models.config import ModelConfig
from tessera.models.gpt2 import GPT2
from tessera.models.llama import Llama
from tessera.models.mixtral import Mixtral

MODELS: dict[str, type[CausalLM]] = {
    "llama": Llama, "mistral": Llama, "qwen2": Llama, "mixtral": Mixtral, "gpt2": GPT2
}  # fmt: skip


def from_config(config: dict[str, Any] | ModelConfig) -> CausalLM:
    """The model of ``config`` (a parsed Hugging Face ``config.json`` or a
    :class:`ModelConfig`)."""
    kind = config.model_type if isinstance(config, ModelConfig) else config.get("model_type")
    if kind not in MODELS:
        raise ArgumentError(
            f"unsupported model_type {kind!r}; supported: {', '.join(sorted(MODELS))}"
        )
    if not isinstance(config, ModelConfig):
        config = ModelConfig.from_dict(config)
    return MODELS[kind](config)
