"""Causal language models checked against Hugging Face ``transformers``: GPT-2, Llama
(2, 3, 3.1), Mistral, Mixtral and Qwen2, each a Tessera function of ``(params, tokens)`` with
``params`` keyed by the Hugging Face state-dict names (GPT-2's ``c_attn`` ``[C, 3, C]``,
Mixtral's experts stacked ``[E, ...]``: ``load`` and ``save`` convert)::

    model, params = models.load("path/to/checkpoint")   # config.json + safetensors
    logits = ts.jit(model.logits)(params, tokens)
    specs = model.param_shardings(mesh)                  # Megatron tensor parallelism
    specs = model.param_shardings(mesh, ep="ep")         # Mixtral: experts over ep too
    models.save("out", model, params)                    # transformers loads it
    out = model.generate(params, prompt, max_new_tokens=16, temperature=0)  # KV-cached
"""

from tessera.models.base import CausalLM, Params
from tessera.models.config import ModelConfig
from tessera.models.files import load, read_tensors, save
from tessera.models.generate import Generation, sample
from tessera.models.gpt2 import GPT2
from tessera.models.kv_cache import KVCache
from tessera.models.llama import Llama
from tessera.models.mixtral import Mixtral
from tessera.models.registry import MODELS, from_config

__all__ = [
    "GPT2",
    "MODELS",
    "CausalLM",
    "Generation",
    "KVCache",
    "Llama",
    "Mixtral",
    "ModelConfig",
    "Params",
    "from_config",
    "load",
    "read_tensors",
    "sample",
    "save",
]
