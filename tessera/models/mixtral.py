"""Mixtral: Mistral with a top-2 mixture of SwiGLU experts in place of the MLP (routing
dropless, so every token reaches its two experts as in transformers). Parameters are named
as in Mixtral's checkpoints (``block_sparse_moe.gate``) but for the experts, which are
stacked for expert parallelism: ``block_sparse_moe.experts.w1.weight [E, F, C]`` (gate),
``w3`` (up) and ``w2 [E, C, F]`` (down), the checkpoint's ``experts.{e}.w1.weight`` ...
stacked by load and unstacked by save."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from tessera import op
from tessera.models.base import Params, activation, linear
from tessera.models.llama import Llama

_EXPERT_WEIGHTS = ("w1", "w2", "w3")


@dataclass(frozen=True)
class Mixtral(Llama):
    """``MixtralForCausalLM``."""

    def mlp_shapes(self, prefix: str) -> dict[str, tuple[int, ...]]:
        c = self.config
        E, C, F = c.num_local_experts, c.hidden_size, c.intermediate_size
        moe = prefix.removesuffix("mlp.") + "block_sparse_moe."
        return {
            f"{moe}gate.weight": (E, C),
            f"{moe}experts.w1.weight": (E, F, C),
            f"{moe}experts.w2.weight": (E, C, F),
            f"{moe}experts.w3.weight": (E, F, C),
        }

    def tp_dims(self) -> dict[str, int]:
        dims = super().tp_dims()
        for name in self.ep_dims():  # each expert's SwiGLU split as Megatron's MLP
            dims[name] = 2 if name.endswith("w2.weight") else 1
        return dims

    def ep_dims(self) -> dict[str, int]:
        return {name: 0 for name in self.param_shapes() if ".experts." in name}

    def from_checkpoint(self, tensors: dict[str, Any]) -> dict[str, Any]:
        out = dict(tensors)
        for name in self.ep_dims():  # experts.{e}.w1.weight ... -> experts.w1.weight
            prefix, w = name.removesuffix(".weight").rsplit(".", 1)
            names = [f"{prefix}.{e}.{w}.weight" for e in range(self.config.num_local_experts)]
            if all(n in out for n in names) and len({out[n].shape for n in names}) == 1:
                out[name] = torch.stack([out.pop(n) for n in names])
        return out

    def to_checkpoint(self, params: Params) -> dict[str, Any]:
        out = dict(params)
        for name in self.ep_dims():
            prefix, w = name.removesuffix(".weight").rsplit(".", 1)
            out |= {f"{prefix}.{e}.{w}.weight": t for e, t in enumerate(out.pop(name).unbind(0))}
        return out

    def mlp(self, params: Params, prefix: str, h: Any) -> Any:
        """Top-``num_experts_per_tok`` experts of each token of ``h [B, T, C]`` (each
        batch row a routing group), their outputs weighted by the renormalised softmax
        of the router's logits. Split over ``ep``, the dispatched tokens go to their
        experts' ranks by all-to-all (GShard)."""
        c = self.config
        E, K, T = c.num_local_experts, c.num_experts_per_tok, h.shape[1]
        moe, act = prefix.removesuffix("mlp.") + "block_sparse_moe.", activation(c.hidden_act)
        with op.fp8_matmuls(False):  # the gate stays bf16 in an fp8 step
            logits = linear(h, params, f"{moe}gate")
        weights, experts, _ = op.router(logits, k=K)
        routing = op.route(experts, E, capacity=op.expert_capacity(T, E, K, None))
        w1, w2, w3 = (
            op.transpose(params[f"{moe}experts.{w}.weight"], (0, 2, 1)) for w in _EXPERT_WEIGHTS
        )  # [E, in, out]

        def ffn(xe: Any) -> Any:  # [G, E, capacity, C]
            return (act(xe @ w1) * (xe @ w3)) @ w2

        return op.moe_block(h, routing, weights, experts=ffn)
