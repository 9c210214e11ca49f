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
    total = None
    for g in grads:
        square = op.sum(g * g)
        total = square if total is None else total + square
    assert total is not None, "a training step has parameters"
    norm = op.sqrt(total)
    scale = op.minimum(max_norm / (norm + EPS), 1.0)
    return [g * scale for g in grads], norm
