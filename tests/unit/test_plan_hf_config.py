"""`tessera plan --model config.json` reads Hugging Face configurations: the sizes and
parameter counts equal those of the transformers model built from the same config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import transformers

from tessera.errors import TesseraError
from tessera.plan.models import load_model

SMALL = dict(vocab_size=1000, max_position_embeddings=512)


def _saved(tmp_path: Path, config: transformers.PretrainedConfig, name: str) -> str:
    folder = tmp_path / name
    folder.mkdir()
    config.to_json_file(str(folder / "config.json"))
    return str(folder / "config.json")


def _hf_params(config: transformers.PretrainedConfig) -> int:
    """Parameters of the transformers model built from ``config``, tied ones once,
    without what the planner leaves out: biases and GPT-2's learned positions."""
    model = transformers.AutoModelForCausalLM.from_config(config)
    return sum(
        p.numel()
        for name, p in model.named_parameters()  # tied parameters are listed once
        if not name.endswith("bias") and ".wpe." not in name
    )


CONFIGS = {
    "llama-gqa": transformers.LlamaConfig(
        hidden_size=128, intermediate_size=344, num_hidden_layers=3, num_attention_heads=8,
        num_key_value_heads=2, **SMALL,
    ),
    "qwen2": transformers.Qwen2Config(
        hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, tie_word_embeddings=True, **SMALL,
    ),
    "mixtral": transformers.MixtralConfig(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=1, num_local_experts=4, num_experts_per_tok=2, **SMALL,
    ),
    "gpt2": transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, n_positions=256, vocab_size=1000),
}  # fmt: skip


@pytest.mark.parametrize("kind", list(CONFIGS))
def test_hf_config_sizes_and_parameter_count(tmp_path: Path, kind: str) -> None:
    config = CONFIGS[kind]
    model = load_model(_saved(tmp_path, config, f"my-{kind}"))
    assert model.name == f"my-{kind}"  # the repository folder names the model
    assert model.layers == config.num_hidden_layers
    assert model.hidden == config.hidden_size
    assert model.heads == config.num_attention_heads
    assert model.kv_heads == getattr(config, "num_key_value_heads", config.num_attention_heads)
    assert model.vocab == config.vocab_size
    assert model.mlp == ("gelu" if kind == "gpt2" else "swiglu")
    if kind == "mixtral":
        assert (model.experts, model.top_k) == (4, 2)
    assert model.params() == _hf_params(config)


def test_hf_config_errors_name_the_file(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    with pytest.raises(TesseraError, match=r"config\.json.*missing num_hidden_layers"):
        load_model(str(path))
    path.write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 60,
                                "num_attention_heads": 7, "vocab_size": 10}))  # fmt: skip
    with pytest.raises(TesseraError, match="not a multiple of heads"):
        load_model(str(path))


def test_deepseek_config_gives_experts_and_node_limited_routing(tmp_path: Path) -> None:
    """A DeepSeek-V3 configuration: routed and shared experts, the leading dense layers and
    group-limited routing (``topk_group`` of ``n_group``: a token reaches at most that many
    expert groups, the nodes of the expert-parallel group), which prices the all-to-all."""
    config = transformers.DeepseekV3Config(
        hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8, num_experts_per_tok=2,
        n_group=4, topk_group=2, first_k_dense_replace=1, **SMALL,
    )  # fmt: skip
    model = load_model(_saved(tmp_path, config, "tiny-v3"))
    assert (model.experts, model.top_k, model.expert_ffn) == (8, 2, 32)
    assert (model.shared_experts, model.dense_layers, model.route_groups) == (1, 1, 2)
