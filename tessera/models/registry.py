"""Which model class serves which Hugging Face ``model_type``."""

from __future__ import annotations

from typing import Any

from tessera.errors import ArgumentError
from tessera.models.base import CausalLM
from tessera.models.config import ModelConfig
from tessera.models.gpt2 import GPT2
from tessera.models.llama import Llama

MODELS: dict[str, type[CausalLM]] = {"llama": Llama, "mistral": Llama, "qwen2": Llama, "gpt2": GPT2}


def from_config(config: dict[str, Any] | ModelConfig) -> CausalLM:
    """The model of ``config`` (a parsed Hugging Face ``config.json`` or a
    :class:`ModelConfig`)."""
    if not isinstance(config, ModelConfig):
        config = ModelConfig.from_dict(config)
    if config.model_type not in MODELS:
        raise ArgumentError(
            f"unsupported model_type {config.model_type!r}; supported: {', '.join(sorted(MODELS))}"
        )
    return MODELS[config.model_type](config)
