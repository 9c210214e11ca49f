"""Gradient clipping by global norm, inside a traced training step.

As ``torch.nn.utils.clip_grad_norm_``: the norm is that of all gradients together,
``‖g‖ = sqrt(Σ_i Σ g_i²)``, and every gradient is scaled by ``min(1, max_norm / (‖g‖ +
1e-6))``. Each gradient's squared sum is local to its rank's shard; the scalars are added
before any reduction, so the sharding passes reduce the total once (one all-reduce of a
scalar per group of mesh axes the gradients are split over), never gathering a gradient.
"""

from __future__ import annotations

from collections.abc import Sequence

from tessera import op
from tessera.frontend.tracer import Tensor

EPS = 1e-6  # as torch's clip_grad_norm_


def clip_by_global_norm(grads: Sequence[Tensor], max_norm: float) -> tuple[list[Tensor], Tensor]:
    """``grads`` scaled to a global norm of at most ``max_norm``, and their norm before."""
    norm = op.sqrt(squared_norm(grads))
    return clip_to_norm(grads, norm, max_norm), norm


def squared_norm(grads: Sequence[Tensor]) -> Tensor:
    """``Σ_i Σ g_i²``: the squared global norm of ``grads``."""
    total = None
    for g in grads:
        square = op.sum(g * g)
        total = square if total is None else total + square
    assert total is not None, "a training step has parameters"
    return total


def clip_to_norm(grads: Sequence[Tensor], norm: Tensor, max_norm: float) -> list[Tensor]:
    """``grads`` scaled by ``min(1, max_norm / (norm + 1e-6))``, where ``norm`` is their
    global norm (computed here, or summed over the stages of a pipeline)."""
    scale = op.minimum(max_norm / (norm + EPS), 1.0)
    return [g * op.astype(scale, g.aval.dtype) for g in grads]
