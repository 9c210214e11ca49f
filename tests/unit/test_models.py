"""tessera.models against Hugging Face transformers: small models built from configs with
random weights (nothing downloaded), saved with ``save_pretrained``, loaded with
``models.load``; logits and gradients compared in float64.

transformers computes a few things in float32 even in a float64 model: RMSNorm's
statistics, the rotary tables (float32 frequencies, angles, cos and sin) and its loss
(``logits.float()``). Differences of ~1e-7 would hide nothing but make a 1e-9 comparison
impossible, so the exact tests (``exact_float64``) patch those two modules to compute in
the model's dtype (the rotary frequencies from ``op.rope_frequencies``, checked against
transformers' own here) and take the cross-entropy of transformers' logits in float64;
``test_stock_transformers_agrees_to_float32_rounding`` compares unpatched transformers.
"""

from __future__ import annotations

import importlib
import json

import pytest
import torch
import torch.nn.functional as F

import tessera as ts
from tessera import dist, graph, models, op, optim

transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

LLAMA31 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
           "high_freq_factor": 4.0, "original_max_position_embeddings": 16}  # fmt: skip
SMALL = {"vocab_size": 100, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2}  # fmt: skip
CONFIGS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", SMALL | {"rope_theta": 500000.0}),
    "llama31": ("LlamaConfig", "LlamaForCausalLM",
                SMALL | {"rope_scaling": LLAMA31, "tie_word_embeddings": True}),
    "mistral": ("MistralConfig", "MistralForCausalLM", SMALL | {"sliding_window": 3}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM",
              SMALL | {"use_sliding_window": True, "max_window_layers": 1, "sliding_window": 3}),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM",
                SMALL | {"num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": 5,
                         "experts_implementation": "eager"}),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel",
             {"vocab_size": 100, "n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 16}),
}  # fmt: skip
B, T = 2, 8


def hf_model(kind: str, seed: int = 0) -> torch.nn.Module:
    """A small float64 transformers model of ``kind`` with random weights (norms' and
    biases' too, so that they matter)."""
    config_class, model_class, options = CONFIGS[kind]
    config = getattr(transformers, config_class)(**options, attn_implementation="sdpa")
    torch.manual_seed(seed)
    model = getattr(transformers, model_class)(config).double().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name or "ln_" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model


def rms_norm_forward(self, x: torch.Tensor) -> torch.Tensor:
    return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))


def rotary_forward(self, x: torch.Tensor, position_ids: torch.Tensor):
    c = self.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    rope = c.rope_parameters
    inv_freq = torch.from_numpy(op.rope_frequencies(head_dim, rope["rope_theta"], rope))
    torch.testing.assert_close(inv_freq, self.inv_freq.double(), rtol=1e-6, atol=0)
    angles = position_ids[..., None].double() * inv_freq
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().to(x.dtype), angles.sin().to(x.dtype)


@pytest.fixture
def exact_float64(monkeypatch: pytest.MonkeyPatch) -> None:
    """transformers' RMSNorm and rotary tables in the model's dtype (see the module's
    docstring)."""
    for kind in ("llama", "mistral", "qwen2", "mixtral"):
        module = importlib.import_module(f"transformers.models.{kind}.modeling_{kind}")
        prefix = {"llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2", "mixtral": "Mixtral"}[
            kind
        ]
        monkeypatch.setattr(getattr(module, f"{prefix}RMSNorm"), "forward", rms_norm_forward)
        monkeypatch.setattr(getattr(module, f"{prefix}RotaryEmbedding"), "forward", rotary_forward)
    router = importlib.import_module("transformers.models.mixtral.modeling_mixtral")
    monkeypatch.setattr(router.MixtralTopKRouter, "forward", router_forward)


def router_forward(self, x: torch.Tensor):
    """Mixtral's router with its softmax in the model's dtype (transformers': float32)."""
    logits = F.linear(x.reshape(-1, self.hidden_dim), self.weight)
    top, experts = torch.topk(logits.softmax(-1), self.top_k, dim=-1)
    return logits, top / top.sum(-1, keepdim=True), experts


def hf_loss(model: torch.nn.Module, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of transformers' logits, in float64 (transformers'
    own loss shifts the labels and computes in float32)."""
    logits = model(tokens).logits
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def hf_grads(model: torch.nn.Module, tokens, targets) -> dict[str, torch.Tensor]:
    """The gradients of :func:`hf_loss`, by tessera.models' names (transformers keeps
    Mixtral's experts stacked in memory: ``experts.gate_up_proj [E, 2F, C]``,
    ``down_proj``; tessera.models as ``experts.w1.weight``, ``w3``, ``w2``)."""
    model.zero_grad()
    hf_loss(model, tokens, targets).backward()
    grads = {}
    for name, p in model.named_parameters():
        moe = name.split("mlp.")[0] + "block_sparse_moe."
        if name.endswith("mlp.gate.weight"):
            grads[f"{moe}gate.weight"] = p.grad
        elif name.endswith("experts.gate_up_proj"):
            gate, up = p.grad.chunk(2, dim=1)
            grads |= {f"{moe}experts.w1.weight": gate, f"{moe}experts.w3.weight": up}
        elif name.endswith("experts.down_proj"):
            grads[f"{moe}experts.w2.weight"] = p.grad
        else:
            grads[name] = p.grad
    return grads


def batch(seed: int = 1, rows: int = B) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 100, (rows, T + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach(), b.detach()
    return float((a - b).abs().max() / b.abs().max())


def assert_grads_match(grads: dict, expected: dict, params: dict, rtol: float) -> None:
    assert set(grads) == set(params)
    for name in params:
        # tied head: transformers' embedding parameter accumulates both uses; GPT-2's
        # c_attn is [C, 3, C] here, [C, 3C] in transformers
        assert relative_error(grads[name], expected[name].reshape(params[name].shape)) < rtol, name


@pytest.mark.parametrize("kind", list(CONFIGS))
def test_logits_and_gradients_match_transformers(kind, tmp_path, exact_float64) -> None:
    hf = hf_model(kind)
    hf.save_pretrained(tmp_path)
    model, params = models.load(tmp_path)
    assert set(params) == set(model.param_shapes())
    assert all(p.dtype == torch.float64 for p in params.values())
    tokens, targets = batch()
    logits = ts.jit(model.logits, kernels="reference")(params, tokens)
    expected = hf(tokens).logits
    assert logits.dtype == torch.float64
    assert relative_error(logits, expected) < 1e-9
    loss, grads = ts.value_and_grad(model.loss, kernels="reference")(params, tokens, targets)
    assert abs(float(loss) - hf_loss(hf, tokens, targets).item()) < 1e-9
    assert_grads_match(grads, hf_grads(hf, tokens, targets), params, 1e-9)


def test_stock_transformers_agrees_to_float32_rounding(tmp_path) -> None:
    """Unpatched transformers (float32 norms and rotary tables in a float64 model):
    Llama 3.1's scaled rotary embeddings and transformers' own shifted loss."""
    hf = hf_model("llama31")
    hf.save_pretrained(tmp_path)
    model, params = models.load(tmp_path)
    tokens, _ = batch()
    logits = ts.jit(model.logits, kernels="reference")(params, tokens)
    assert relative_error(logits, hf(tokens).logits) < 1e-6
    # transformers' labels are shifted inside: logits[:, t] predicts labels[:, t + 1]
    loss = ts.jit(model.loss, kernels="reference")(params, tokens[:, :-1], tokens[:, 1:])
    assert abs(float(loss) - hf(tokens, labels=tokens).loss.item()) < 1e-5


@pytest.mark.parametrize("kind", ["llama", "mixtral", "gpt2"])
def test_tensor_parallel_on_a_dp_tp_mesh(kind, tmp_path, exact_float64) -> None:
    hf = hf_model(kind)
    hf.save_pretrained(tmp_path)
    model, params = models.load(tmp_path)
    mesh = dist.mesh({"dp": 2, "tp": 2})
    specs = model.param_shardings(mesh)
    head = "transformer.wte.weight" if kind == "gpt2" else "lm_head.weight"
    assert specs[head].partition == (0,)
    rows = dist.ShardSpec(partition=(0,), mesh_axes=("dp",))
    tokens, targets = batch()
    shardings = (specs, rows, rows)
    loss, grads = ts.value_and_grad(
        model.loss, mesh=mesh, in_shardings=shardings, kernels="reference"
    )(params, tokens, targets)
    assert abs(float(loss) - hf_loss(hf, tokens, targets).item()) < 1e-9
    assert_grads_match(grads, hf_grads(hf, tokens, targets), params, 1e-9)
    jitted = ts.jit(model.logits, mesh=mesh, in_shardings=(specs, rows), kernels="reference")
    assert relative_error(jitted(params, tokens), hf(tokens).logits) < 1e-9
    # Megatron: each rank computes its heads and MLP columns, so the forward's only
    # collectives over tp are all_reduces (the embedding, attention and MLP outputs);
    # a q/k/v split that is not head-aligned would move activations or weights
    kinds = {c.kind for c in jitted.lower(params, tokens).collectives() if "tp" in c.mesh_axes}
    assert kinds == {"all_reduce"}


def local_shape(shape: tuple[int, ...], spec: dist.ShardSpec, mesh: dist.Mesh) -> tuple[int, ...]:
    """A rank's block of a tensor of ``shape`` laid out as ``spec``."""
    out = list(shape)
    for dim, axes in zip(spec.partition, spec.mesh_axes, strict=True):
        for axis in (axes,) if isinstance(axes, str) else axes:
            out[dim] //= mesh.axis_size(axis)
    return tuple(out)


EP_MESHES = {"dp2_ep2": ({"dp": 2, "ep": 2}, None), "tp2_ep2": ({"tp": 2, "ep": 2}, "tp")}


@pytest.mark.parametrize("layout", list(EP_MESHES))
def test_mixtral_expert_parallel(layout, tmp_path, exact_float64) -> None:
    """Experts split over ep (and tp inside them), rows over dp x ep: logits, loss and
    gradients equal transformers' to 1e-9 (float64), and the experts' outputs return to
    their tokens' ranks by all-to-all over ep."""
    hf = hf_model("mixtral")
    hf.save_pretrained(tmp_path)
    model, params = models.load(tmp_path)
    axes, tp = EP_MESHES[layout]
    mesh = dist.mesh(axes)
    specs = model.param_shardings(mesh, tp=tp, ep="ep")
    w1, w2 = (specs[f"model.layers.0.block_sparse_moe.experts.{w}.weight"] for w in ("w1", "w2"))
    assert (w1.partition, w1.mesh_axes) == (((0, 1), ("ep", "tp")) if tp else ((0,), ("ep",)))
    assert (w2.partition, w2.mesh_axes) == (((0, 2), ("ep", "tp")) if tp else ((0,), ("ep",)))
    rows = dist.ShardSpec(partition=(0,), mesh_axes=(tuple(a for a in axes if a != "tp"),))
    tokens, targets = batch(rows=4)
    loss, grads = ts.value_and_grad(
        model.loss, mesh=mesh, in_shardings=(specs, rows, rows), kernels="reference"
    )(params, tokens, targets)
    assert abs(float(loss) - hf_loss(hf, tokens, targets).item()) < 1e-9
    assert_grads_match(grads, hf_grads(hf, tokens, targets), params, 1e-9)
    jitted = ts.jit(model.logits, mesh=mesh, in_shardings=(specs, rows), kernels="reference")
    assert relative_error(jitted(params, tokens), hf(tokens).logits) < 1e-9
    collectives = jitted.lower(params, tokens).collectives()
    # one all-to-all over ep per MoE layer; the experts' weights are never moved
    assert sum(c.kind == "all_to_all" and c.mesh_axes == ("ep",) for c in collectives) == 2
    local = {
        local_shape(shape, specs[name], mesh)
        for name, shape in model.param_shapes().items()
        if ".experts." in name
    }
    assert not [c for c in collectives if c.shape in local]


def test_sharded_checkpoints_round_trip(tmp_path, exact_float64) -> None:
    """transformers' shards with an index -> models.load; models.save in shards ->
    models.load and transformers."""
    hf = hf_model("qwen2")
    hf.save_pretrained(tmp_path / "hf", max_shard_size="20KB")
    assert (tmp_path / "hf" / "model.safetensors.index.json").exists()
    model, params = models.load(tmp_path / "hf")
    models.save(tmp_path / "ours", model, params, max_shard_bytes=20_000)
    index = json.loads((tmp_path / "ours" / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    _, again = models.load(tmp_path / "ours")
    assert all(torch.equal(again[k], v) for k, v in params.items())
    loaded = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path / "ours", attn_implementation="sdpa", dtype=torch.float64
    )
    tokens, _ = batch()
    torch.testing.assert_close(loaded(tokens).logits, hf(tokens).logits, rtol=0, atol=0)


@pytest.mark.parametrize("kind", ["llama31", "gpt2", "mixtral"])
def test_transformers_loads_what_models_save_writes(kind, tmp_path, exact_float64) -> None:
    hf = hf_model(kind)
    hf.save_pretrained(tmp_path / "hf")
    model, params = models.load(tmp_path / "hf")
    params = {k: v + 0.01 for k, v in params.items()}  # other weights than transformers'
    models.save(tmp_path / "ours", model, params)  # Mixtral's experts unstacked
    eager = {"experts_implementation": "eager"} if kind == "mixtral" else {}  # float64
    loaded = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path / "ours", attn_implementation="sdpa", **eager
    )
    assert next(loaded.parameters()).dtype == torch.float64
    tokens, _ = batch()
    logits = ts.jit(model.logits, kernels="reference")(params, tokens)
    assert relative_error(logits, loaded(tokens).logits) < 1e-9


def test_triton_kernels_in_float32(tmp_path) -> None:
    """The generated kernels (Triton's interpreter on a CPU) against stock transformers."""
    hf = hf_model("mistral").float()
    hf.save_pretrained(tmp_path)
    model, params = models.load(tmp_path)
    tokens, _ = batch()
    logits = ts.jit(model.logits, kernels="triton")(params, tokens[:1])
    assert relative_error(logits, hf(tokens[:1]).logits) < 1e-4


def test_param_shardings_are_megatron() -> None:
    model = models.from_config(json.loads(json.dumps(hf_model("qwen2").config.to_dict())))
    specs = model.param_shardings(dist.mesh({"tp": 2}))
    split = {k: s.partition[0] for k, s in specs.items() if s is not None}
    layer = "model.layers.0."
    assert (
        split[f"{layer}self_attn.q_proj.weight"] == 0
        and split[f"{layer}self_attn.k_proj.bias"] == 0
    )
    assert (
        split[f"{layer}self_attn.o_proj.weight"] == 1 and split[f"{layer}mlp.down_proj.weight"] == 1
    )
    assert split["model.embed_tokens.weight"] == 0 and split["lm_head.weight"] == 0
    assert specs[f"{layer}input_layernorm.weight"] is None and specs["model.norm.weight"] is None
    with pytest.raises(ts.ArgumentError, match="mesh axis 'mp'"):
        model.param_shardings(dist.mesh({"tp": 2}), tp="mp")
    with pytest.raises(ts.ArgumentError, match="has no experts"):
        model.param_shardings(dist.mesh({"tp": 2, "ep": 2}), ep="ep")


def test_param_shardings_of_experts_and_fused_qkv() -> None:
    """Mixtral's stacked experts split by expert over ep; GPT-2's c_attn [C, 3, C] by
    heads of each of q, k and v."""
    mixtral = models.from_config(json.loads(json.dumps(hf_model("mixtral").config.to_dict())))
    moe = "model.layers.1.block_sparse_moe."
    assert mixtral.param_shapes()[f"{moe}experts.w2.weight"] == (4, 32, 64)
    specs = mixtral.param_shardings(dist.mesh({"ep": 4}), tp=None, ep="ep")
    assert specs[f"{moe}experts.w3.weight"] == dist.ShardSpec(partition=(0,), mesh_axes=("ep",))
    assert specs[f"{moe}gate.weight"] is None and specs["lm_head.weight"] is None
    with pytest.raises(
        ts.ArgumentError, match=r"does not split 8 ways on dim 0 \(mesh axis 'ep'\)"
    ):
        mixtral.param_shardings(dist.mesh({"ep": 8}), tp=None, ep="ep")
    with pytest.raises(ts.ArgumentError, match=r"mesh axis 'tp'.*tp=None"):
        mixtral.param_shardings(dist.mesh({"ep": 2}), ep="ep")
    gpt2 = models.from_config(json.loads(json.dumps(hf_model("gpt2").config.to_dict())))
    specs = gpt2.param_shardings(dist.mesh({"tp": 2}))
    attn = "transformer.h.0.attn.c_attn."
    assert gpt2.param_shapes()[f"{attn}weight"] == (32, 3, 32)
    assert specs[f"{attn}weight"].partition == (2,) and specs[f"{attn}bias"].partition == (1,)


def test_an_unsupported_model_type_is_named_with_the_supported_ones(tmp_path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert", "vocab_size": 10}))
    with pytest.raises(
        ts.ArgumentError, match=r"'bert'; supported: gpt2, llama, mistral, mixtral, qwen2"
    ):
        models.load(tmp_path)


def test_a_checkpoint_that_does_not_match_its_config_is_refused(tmp_path) -> None:
    hf = hf_model("llama")
    hf.save_pretrained(tmp_path)
    model, params = models.load(tmp_path)
    models.save(tmp_path / "wrong", model, params | {"model.norm.weight": torch.ones(3)})
    with pytest.raises(ts.ArgumentError, match=r"model.norm.weight': \(\[3\], \[32\]\)"):
        models.load(tmp_path / "wrong")
    del params["model.norm.weight"]
    with pytest.raises(ts.ArgumentError, match=r"params lack \['model.norm.weight'\]"):
        models.save(tmp_path / "wrong", model, params)


def test_param_shardings_drive_a_training_step() -> None:
    model = models.from_config(json.loads(json.dumps(hf_model("mistral").config.to_dict())))
    params = {n: 0.2 * torch.randn(s, generator=torch.Generator().manual_seed(0))
              for n, s in model.param_shapes().items()}  # fmt: skip
    mesh = dist.mesh({"dp": 2, "tp": 2})
    rows = dist.ShardSpec(partition=(0,), mesh_axes=("dp",))

    def step(p, tokens, targets):
        loss = model.loss(p, tokens, targets)
        return graph.backward(loss), {"loss": loss}

    train = graph.training_step(
        step, optimizer=optim.AdamW(lr=1e-2), mesh=mesh, kernels="reference",
        param_shardings=model.param_shardings(mesh), batch_shardings=(rows, rows),
    )  # fmt: skip
    state = train.init(params)
    tokens, targets = batch()
    losses = [float(train(state, tokens, targets)["loss"]) for _ in range(3)]
    assert losses[2] < losses[0]
