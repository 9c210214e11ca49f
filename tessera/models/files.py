"""Loading and saving models as Hugging Face checkpoints: ``config.json`` and
safetensors, one file or shards with a ``model.safetensors.index.json``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from tessera.errors import ArgumentError
from tessera.models.base import CausalLM, Params
from tessera.models.registry import from_config

SINGLE, INDEX = "model.safetensors", "model.safetensors.index.json"
# buffers some checkpoints store that are no parameters
_IGNORED = (".rotary_emb.inv_freq", ".attn.bias", ".attn.masked_bias")


def _safetensors() -> Any:
    try:
        import safetensors.torch
    except ImportError as error:  # pragma: no cover - a dev dependency
        raise ImportError("tessera.models needs safetensors: pip install safetensors") from error
    return safetensors.torch


def read_tensors(directory: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of the safetensors checkpoint in ``directory`` (never pickle)."""
    directory, st = Path(directory), _safetensors()
    if (directory / INDEX).exists():
        weight_map = json.loads((directory / INDEX).read_text())["weight_map"]
        tensors: dict[str, torch.Tensor] = {}
        for shard in sorted(set(weight_map.values())):
            tensors |= st.load_file(directory / shard)
        return tensors
    if (directory / SINGLE).exists():
        return st.load_file(directory / SINGLE)
    raise FileNotFoundError(f"{directory} has neither {SINGLE} nor {INDEX}")


def load(directory: str | Path) -> tuple[CausalLM, Params]:
    """The model of ``directory/config.json`` and its parameters (torch tensors keyed
    by their Hugging Face state-dict names, in the layout of ``model.param_shapes()``:
    :meth:`~tessera.models.CausalLM.from_checkpoint`) from its safetensors."""
    directory = Path(directory)
    model = from_config(json.loads((directory / "config.json").read_text()))
    tensors = read_tensors(directory)
    shapes = model.param_shapes()
    if model.config.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)  # a copy of the embedding
    tensors = model.from_checkpoint(tensors)
    unexpected = sorted(k for k in tensors if k not in shapes and not k.endswith(_IGNORED))
    missing = sorted(k for k in shapes if k not in tensors)
    if missing or unexpected:
        raise ArgumentError(
            f"{directory}: the checkpoint does not match its {model.config.model_type} config: "
            f"missing {missing}, unexpected {unexpected}"
        )
    wrong = {
        k: (list(tensors[k].shape), list(s))
        for k, s in shapes.items()
        if tuple(tensors[k].shape) != s
    }
    if wrong:
        raise ArgumentError(f"{directory}: parameters of wrong shapes (found, expected): {wrong}")
    return model, {k: tensors[k] for k in shapes}


def save(
    directory: str | Path, model: CausalLM, params: Params, max_shard_bytes: int | None = None
) -> None:
    """Writes ``config.json`` and ``params`` as safetensors into ``directory`` (shards of
    at most ``max_shard_bytes`` with an index when given), as ``save_pretrained`` does:
    ``transformers.AutoModelForCausalLM.from_pretrained(directory)`` loads them."""
    directory, st = Path(directory), _safetensors()
    directory.mkdir(parents=True, exist_ok=True)
    missing = sorted(set(model.param_shapes()) - set(params))
    if missing:
        raise ArgumentError(f"save: params lack {missing}")
    checkpoint = model.to_checkpoint({k: torch.as_tensor(params[k]) for k in model.param_shapes()})
    tensors = {k: t.detach().cpu().contiguous() for k, t in checkpoint.items()}
    config = dict(model.config.raw)
    dtype = next(iter(tensors.values())).dtype
    config["dtype"] = config["torch_dtype"] = str(dtype).removeprefix("torch.")
    (directory / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    if max_shard_bytes is None:
        st.save_file(tensors, directory / SINGLE, metadata={"format": "pt"})
        return
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += nbytes
    weight_map = {}
    for i, shard in enumerate(shards):
        file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        st.save_file(shard, directory / file, metadata={"format": "pt"})
        weight_map |= dict.fromkeys(shard, file)
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / INDEX).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
