"""Transformer model descriptions for ``tessera plan``: presets with public configurations
and custom descriptions.

A :class:`ModelSpec` is a decoder-only transformer: ``layers`` blocks of attention
(``heads`` query heads, ``kv_heads`` key/value heads of ``head_dim``) and an MLP (SwiGLU
or GELU) or a mixture of experts (``experts`` routed experts of ``expert_ffn``, ``top_k``
per token, ``shared_experts`` always on), plus an embedding of ``vocab`` rows and an
output projection (tied or not). Counting conventions follow Megatron-LM (Narayanan et
al. 2021, §5.1): a matmul of ``m×k`` by ``k×n`` is ``2mkn`` FLOPs, the backward twice the
forward; attention adds ``4·T·d`` FLOPs per token and layer forward (``q kᵀ`` and ``p v``),
halved for a causal mask.

Presets (sources in :data:`SOURCES`): ``gpt3-175b``, ``llama3-8b``, ``llama3-70b``,
``llama3-405b``, ``mixtral-8x7b``, ``deepseek-v3``. A custom description is
``"layers=32,hidden=4096,heads=32,kv_heads=8,ffn=14336,vocab=128256"`` (any field of
:class:`ModelSpec`), a JSON file of the same fields, or a Hugging Face ``config.json``
(:mod:`tessera.plan.hf_config`); ``base=llama3-8b,layers=4``
overrides a preset. ``layer=module:function`` (or ``layer=path/to/file.py:function``)
replaces the layer Tessera compiles by a Tessera function of the signature of
:func:`tessera.plan.layer.transformer_layer` (``x, params, heads, kv_heads, mlp,
residual``) over the same weights (``wq wk wv wo w1 w2 w3 ln1 ln2``, laid out over tp by
name): a different block (parallel attention and MLP, another norm or activation) is
compiled, simulated and its saved activations counted; parameter counts and model FLOPs
(MFU) still come from the description's sizes.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.util
import json
import os
from collections.abc import Callable
from dataclasses import dataclass

from tessera.errors import TesseraError
from tessera.plan.hf_config import fields_from_hf, is_hf_config

MLP_KINDS = ("swiglu", "gelu")


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer's sizes."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int  # MLP width of a dense layer
    vocab: int
    seq: int = 4096  # default training sequence length
    head_dim: int = 0  # 0: hidden // heads
    mlp: str = "swiglu"
    experts: int = 0  # routed experts per MoE layer; 0: dense model
    top_k: int = 0
    expert_ffn: int = 0  # 0: ffn
    shared_experts: int = 0
    dense_layers: int = 0  # leading layers with a dense MLP in an MoE model
    # node-limited routing: a token's experts lie in at most this many of the expert
    # groups (nodes) of its expert-parallel group; 0: unlimited (DeepSeek's topk_group)
    route_groups: int = 0
    tied_embeddings: bool = False
    note: str = ""  # approximations the description makes
    layer: str = ""  # a Tessera layer function, "module:function" or "file.py:function"

    def __post_init__(self) -> None:
        for name in ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "seq"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise TesseraError(
                    f"model {self.name!r}: {name} must be an int >= 1, got {value!r}"
                )
        if self.mlp not in MLP_KINDS:
            raise TesseraError(
                f"model {self.name!r}: mlp must be one of {', '.join(MLP_KINDS)}, got {self.mlp!r}"
            )
        if self.head_dim == 0:
            if self.hidden % self.heads:
                raise TesseraError(
                    f"model {self.name!r}: hidden {self.hidden} is not a multiple of heads "
                    f"{self.heads}; give head_dim"
                )
            object.__setattr__(self, "head_dim", self.hidden // self.heads)
        if self.heads % self.kv_heads:
            raise TesseraError(
                f"model {self.name!r}: heads {self.heads} is not a multiple of kv_heads "
                f"{self.kv_heads}"
            )
        if self.experts:
            if not 1 <= self.top_k <= self.experts:
                raise TesseraError(
                    f"model {self.name!r}: top_k must be in [1, experts={self.experts}], "
                    f"got {self.top_k}"
                )
            if self.expert_ffn == 0:
                object.__setattr__(self, "expert_ffn", self.ffn)
        if self.route_groups < 0 or (self.route_groups and not self.experts):
            raise TesseraError(
                f"model {self.name!r}: route_groups limits an MoE model's routing; it must be "
                f">= 0 and needs experts, got {self.route_groups}"
            )
        if not 0 <= self.dense_layers <= self.layers:
            raise TesseraError(f"model {self.name!r}: dense_layers must be in [0, layers]")
        if self.layer:
            layer_function(self.layer)  # importable and callable, or a clear error

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @property
    def moe_layers(self) -> int:
        return self.layers - self.dense_layers if self.is_moe else 0

    # ---- parameter counts ----

    def attention_params(self) -> int:
        q = self.heads * self.head_dim
        kv = self.kv_heads * self.head_dim
        return self.hidden * (q + 2 * kv) + q * self.hidden

    def mlp_params(self, width: int) -> int:
        """One MLP (or one expert) of ``width``."""
        return (3 if self.mlp == "swiglu" else 2) * self.hidden * width

    def dense_layer_params(self) -> int:
        return self.attention_params() + self.mlp_params(self.ffn) + 2 * self.hidden

    def expert_params(self) -> int:
        """All routed experts of one MoE layer (the part expert parallelism splits)."""
        return self.experts * self.mlp_params(self.expert_ffn) if self.is_moe else 0

    def moe_layer_params(self) -> int:
        """One MoE layer: attention, router, shared and routed experts, norms."""
        shared = self.shared_experts * self.mlp_params(self.expert_ffn)
        router = self.hidden * self.experts
        return self.attention_params() + router + shared + self.expert_params() + 2 * self.hidden

    def embedding_params(self) -> int:
        return self.vocab * self.hidden * (1 if self.tied_embeddings else 2)

    def params(self) -> int:
        """Total parameters."""
        body = (
            self.dense_layers * self.dense_layer_params()
            + self.moe_layers * self.moe_layer_params()
        )
        if not self.is_moe:
            body = self.layers * self.dense_layer_params()
        return body + self.embedding_params() + self.hidden

    def active_layer_params(self) -> int:
        """Parameters one token's forward multiplies with, in an average layer."""
        if not self.is_moe:
            return self.dense_layer_params()
        active_moe = self.attention_params() + self.mlp_params(self.active_ffn()) + 2 * self.hidden
        dense = self.dense_layers * self.dense_layer_params()
        return (dense + self.moe_layers * active_moe) // self.layers

    def active_ffn(self) -> int:
        """The MLP width a token goes through: ``ffn``, or (top_k + shared) experts."""
        if not self.is_moe:
            return self.ffn
        return (self.top_k + self.shared_experts) * self.expert_ffn

    def active_params(self) -> int:
        return self.layers * self.active_layer_params() + self.embedding_params() + self.hidden

    # ---- FLOPs ----

    def flops_per_token(self, seq: int) -> float:
        """Model FLOPs of one token's forward and backward (no recomputation): 6 per
        active weight (the output projection included) plus causal attention,
        6·layers·heads·head_dim·seq."""
        weights = self.layers * self.active_layer_params() + self.vocab * self.hidden
        attention = 6.0 * self.layers * self.heads * self.head_dim * seq
        return 6.0 * weights + attention

    def describe(self) -> str:
        moe = (
            f", {self.experts} experts top-{self.top_k} (ffn {self.expert_ffn}"
            f"{f', {self.shared_experts} shared' if self.shared_experts else ''})"
            if self.is_moe
            else ""
        )
        return (
            f"{self.name}: {self.params() / 1e9:.1f}B params ({self.active_params() / 1e9:.1f}B "
            f"active), {self.layers} layers, hidden {self.hidden}, {self.heads} heads / "
            f"{self.kv_heads} KV, ffn {self.ffn} {self.mlp}{moe}, vocab {self.vocab}"
        )


PRESETS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        ModelSpec("gpt3-175b", 96, 12288, 96, 96, 49152, 50257, seq=2048, mlp="gelu",
                  tied_embeddings=True),
        ModelSpec("llama3-8b", 32, 4096, 32, 8, 14336, 128256, seq=8192),
        ModelSpec("llama3-70b", 80, 8192, 64, 8, 28672, 128256, seq=8192),
        ModelSpec("llama3-405b", 126, 16384, 128, 8, 53248, 128256, seq=8192),
        ModelSpec("mixtral-8x7b", 32, 4096, 32, 8, 14336, 32000, seq=4096, experts=8, top_k=2),
        ModelSpec(
            "deepseek-v3", 61, 7168, 128, 8, 18432, 129280, seq=4096, head_dim=128, experts=256,
            top_k=8, expert_ffn=2048, shared_experts=1, dense_layers=3, route_groups=4,
            note="multi-head latent attention modelled as grouped-query attention with 8 KV "
            "heads of 128 (close in FLOPs; 1.6% more parameters); the multi-token-prediction "
            "module is left out",
        ),
    )
}  # fmt: skip

SOURCES: dict[str, str] = {
    "gpt3-175b": "Brown et al. 2020, 'Language Models are Few-Shot Learners', Table 2.1",
    "llama3-8b": "Llama Team 2024, 'The Llama 3 Herd of Models', Table 3",
    "llama3-70b": "Llama Team 2024, 'The Llama 3 Herd of Models', Table 3",
    "llama3-405b": "Llama Team 2024, 'The Llama 3 Herd of Models', Table 3",
    "mixtral-8x7b": "Jiang et al. 2024, 'Mixtral of Experts', Table 1",
    "deepseek-v3": "DeepSeek-AI 2024, 'DeepSeek-V3 Technical Report', §4.2",
}

_FIELDS = {f.name: f for f in dataclasses.fields(ModelSpec)}


@functools.cache
def layer_function(path: str) -> Callable[..., object]:
    """The function ``"module:function"`` or ``"file.py:function"`` names."""
    where, _, name = path.rpartition(":")
    if not where or not name:
        raise TesseraError(f"layer {path!r}: expected 'module:function' or 'file.py:function'")
    try:
        if where.endswith(".py"):
            spec = importlib.util.spec_from_file_location(f"_tessera_plan_layer_{name}", where)
            if spec is None or spec.loader is None:
                raise ImportError(f"cannot load {where}")
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        else:
            module = importlib.import_module(where)
    except (ImportError, OSError) as error:
        raise TesseraError(f"layer {path!r}: cannot import {where!r}: {error}") from None
    function = getattr(module, name, None)
    if not callable(function):
        raise TesseraError(f"layer {path!r}: {where!r} has no function {name!r}")
    return function


def load_model(text: str) -> ModelSpec:
    """A preset name, a JSON file (our fields or a Hugging Face ``config.json``), or
    ``key=value,...`` (``base=<preset>`` to start from one)."""
    text = text.strip()
    if text in PRESETS:
        return PRESETS[text]
    if text.endswith(".json") or os.path.isfile(text):
        try:
            with open(text) as handle:
                data = json.load(handle)
        except (OSError, json.JSONDecodeError) as error:
            raise TesseraError(f"cannot read model file {text!r}: {error}") from None
        if not isinstance(data, dict):
            raise TesseraError(f"model file {text!r} must hold a JSON object")
        if is_hf_config(data):
            return model_from_fields(fields_from_hf(data, text), default_name=text)
        return model_from_fields({str(k): v for k, v in data.items()}, default_name=text)
    if "=" not in text:
        raise TesseraError(
            f"unknown model {text!r}; presets: {', '.join(PRESETS)}; or a description "
            "'layers=..,hidden=..,heads=..,kv_heads=..,ffn=..,vocab=..' or a JSON file"
        )
    fields: dict[str, object] = {}
    for item in text.split(","):
        key, _, value = item.partition("=")
        fields[key.strip()] = value.strip()
    return model_from_fields(fields, default_name="custom")


def model_from_fields(fields: dict[str, object], default_name: str = "custom") -> ModelSpec:
    """A model from field values (strings are converted), over ``base`` when given."""
    fields = dict(fields)
    base = fields.pop("base", None)
    values: dict[str, object] = {}
    if base is not None:
        if base not in PRESETS:
            raise TesseraError(f"unknown base model {base!r}; presets: {', '.join(PRESETS)}")
        values = dataclasses.asdict(PRESETS[str(base)])
        values["name"] = f"{base}*"
    values.setdefault("name", default_name)
    for key, value in fields.items():
        if key not in _FIELDS:
            raise TesseraError(f"unknown model field {key!r}; valid: {', '.join(_FIELDS)}")
        values[key] = _convert(key, value)
    missing = [
        f.name
        for f in _FIELDS.values()
        if f.default is dataclasses.MISSING and f.name not in values
    ]
    if missing:
        raise TesseraError(f"model description is missing {', '.join(missing)}")
    return ModelSpec(**values)  # type: ignore[arg-type]


def _convert(key: str, value: object) -> object:
    kind = _FIELDS[key].type
    if not isinstance(value, str):
        return value
    if kind == "int":
        try:
            return int(value)
        except ValueError:
            raise TesseraError(f"model field {key} must be an integer, got {value!r}") from None
    if kind == "bool":
        return value.lower() in ("1", "true", "yes")
    return value
