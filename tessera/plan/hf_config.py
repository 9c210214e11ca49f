"""A :class:`~tessera.plan.models.ModelSpec` from a Hugging Face ``config.json``.

``tessera plan ... --model path/to/config.json`` takes the file a model repository
ships (``transformers``' ``PretrainedConfig.to_json_file``): Llama, Mistral, Qwen2,
Mixtral, Qwen2-MoE, DeepSeek-V2/V3 and GPT-2 style configurations are read by their field
names (``num_hidden_layers``, ``hidden_size``, ``num_attention_heads``,
``num_key_value_heads``, ``intermediate_size``, ``vocab_size``; GPT-2's ``n_layer``,
``n_embd``, ``n_head``, ``n_inner``; the MoE fields ``num_local_experts`` /
``n_routed_experts``, ``num_experts_per_tok``, ``moe_intermediate_size``,
``n_shared_experts``, ``first_k_dense_replace``). Nothing is imported or executed from
the file: it is JSON, read as data.
"""

from __future__ import annotations

import os
from typing import Any

from tessera.errors import TesseraError

# model_type -> MLP kind (GELU MLPs of width ffn; the rest gated SwiGLU)
_GELU_TYPES = ("gpt2", "gpt_neox", "gptj", "gpt_bigcode", "opt", "falcon")


def is_hf_config(data: dict[str, Any]) -> bool:
    """Whether a JSON object looks like a Hugging Face model configuration."""
    return "model_type" in data or "architectures" in data or "num_hidden_layers" in data


def _first(data: dict[str, Any], *keys: str, default: Any = None) -> Any:
    for key in keys:
        value = data.get(key)
        if value is not None:
            return value
    return default


def _directory_name(path: str) -> str:
    """``Meta-Llama-3-8B`` for ``.../Meta-Llama-3-8B/config.json``."""
    parent = os.path.basename(os.path.dirname(os.path.abspath(path)))
    return parent if os.path.basename(path) == "config.json" else ""


def fields_from_hf(data: dict[str, Any], name: str) -> dict[str, object]:
    """ModelSpec fields of a Hugging Face configuration ``data`` (from file ``name``)."""
    model_type = str(data.get("model_type", ""))
    layers = _first(data, "num_hidden_layers", "n_layer", "num_layers")
    hidden = _first(data, "hidden_size", "n_embd", "d_model")
    heads = _first(data, "num_attention_heads", "n_head")
    vocab = _first(data, "vocab_size")
    missing = [
        key
        for key, value in (
            ("num_hidden_layers", layers), ("hidden_size", hidden),
            ("num_attention_heads", heads), ("vocab_size", vocab),
        )
        if value is None
    ]  # fmt: skip
    if missing:
        raise TesseraError(
            f"model file {name!r} (Hugging Face model_type {model_type or '?'}): missing "
            f"{', '.join(missing)}"
        )
    mlp = "gelu" if model_type in _GELU_TYPES else "swiglu"
    ffn = _first(data, "intermediate_size", "n_inner", "ffn_dim", default=4 * hidden)
    fields: dict[str, object] = {
        "name": str(data.get("_name_or_path") or _directory_name(name) or model_type or name),
        "layers": layers,
        "hidden": hidden,
        "heads": heads,
        "kv_heads": _first(data, "num_key_value_heads", "multi_query_group_num", default=heads),
        "ffn": ffn,
        "vocab": vocab,
        # the default training sequence: the context length, at most 8192 (--seq sets it)
        "seq": min(int(_first(data, "max_position_embeddings", "n_positions", default=4096)), 8192),
        "mlp": mlp,
        "tied_embeddings": bool(data.get("tie_word_embeddings", model_type == "gpt2")),
    }  # fmt: skip
    head_dim = data.get("head_dim")
    if head_dim and head_dim * heads != hidden:
        fields["head_dim"] = head_dim
    experts = _first(data, "num_local_experts", "n_routed_experts", "num_experts", default=0)
    if experts:
        fields["experts"] = experts
        fields["top_k"] = _first(data, "num_experts_per_tok", "moe_top_k", default=2)
        expert_ffn = _first(data, "moe_intermediate_size")
        if expert_ffn:
            fields["expert_ffn"] = expert_ffn
        shared = _first(data, "n_shared_experts", default=0)
        if not shared and data.get("shared_expert_intermediate_size") and expert_ffn:
            shared = max(1, int(data["shared_expert_intermediate_size"]) // int(expert_ffn))
        fields["shared_experts"] = shared
        fields["dense_layers"] = _first(data, "first_k_dense_replace", default=0)
        fields["route_groups"] = _first(data, "topk_group", default=0)  # node-limited routing
    if data.get("kv_lora_rank") or data.get("q_lora_rank"):
        fields["note"] = "multi-head latent attention priced as grouped-query attention"
    return fields
