"""Mixtral: Mistral with a top-2 mixture of SwiGLU experts in place of the MLP (routing
dropless, so every token reaches its two experts as in transformers). Parameters are named
as in Mixtral's checkpoints (``block_sparse_moe.gate``, ``block_sparse_moe.experts.{e}.w1``
(gate), ``w3`` (up), ``w2`` (down))."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tessera import op
from tessera.models.base import Params, activation, linear
from tessera.models.llama import Llama


@dataclass(frozen=True)
class Mixtral(Llama):
    """``MixtralForCausalLM``."""

    def mlp_shapes(self, prefix: str) -> dict[str, tuple[int, ...]]:
        c = self.config
        C, F = c.hidden_size, c.intermediate_size
        moe = prefix.removesuffix("mlp.") + "block_sparse_moe."
        shapes = {f"{moe}gate.weight": (c.num_local_experts, C)}
        for e in range(c.num_local_experts):
            expert = f"{moe}experts.{e}."
            shapes |= {f"{expert}w1.weight": (F, C), f"{expert}w2.weight": (C, F)}
            shapes[f"{expert}w3.weight"] = (F, C)
        return shapes

    def tp_dims(self) -> dict[str, int]:
        dims = super().tp_dims()
        for name in self.param_shapes():  # each expert's SwiGLU split as Megatron's MLP
            if ".experts." in name:
                dims[name] = 1 if name.endswith("w2.weight") else 0
        return dims

    def mlp(self, params: Params, prefix: str, h: Any) -> Any:
        """Top-``num_experts_per_tok`` experts of each token of ``h [B, T, C]`` (each
        batch row a routing group), their outputs weighted by the renormalised softmax
        of the router's logits."""
        c = self.config
        E, K, T = c.num_local_experts, c.num_experts_per_tok, h.shape[1]
        moe, act = prefix.removesuffix("mlp.") + "block_sparse_moe.", activation(c.hidden_act)
        weights, experts, _ = op.router(linear(h, params, f"{moe}gate"), k=K)
        routing = op.route(experts, E, capacity=op.expert_capacity(T, E, K, None))

        def stacked(w: str) -> Any:  # [E, in, out]
            return op.stack(
                [op.transpose(params[f"{moe}experts.{e}.{w}.weight"]) for e in range(E)]
            )

        def ffn(xe: Any) -> Any:  # [G, E, capacity, C]
            return (act(xe @ stacked("w1")) * (xe @ stacked("w3"))) @ stacked("w2")

        return op.moe_block(h, routing, weights, experts=ffn)
