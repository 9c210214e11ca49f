"""``op.dropout``: zeroes entries at random and scales the rest, as ``torch.nn.Dropout``.

The mask is ``ts.random.bernoulli(key, 1 - rate, x.shape)``, a function of the key
alone, so the backward regenerates it instead of keeping it: the ops are traced as a
``graph.regenerate`` block, which every backward pass recomputes
(:mod:`tessera.transforms.remat`).
"""

from __future__ import annotations

from typing import Any

from tessera.errors import ShapeError
from tessera.frontend.checkpoint import regenerate
from tessera.frontend.tracer import Tensor, user_location
from tessera.op import random
from tessera.op.primitives import Operand, _tensors, multiply, where


def dropout(x: Operand, rate: float, key: Any, deterministic: bool = False) -> Tensor:
    """``x * mask / (1 - rate)``, the mask true with probability ``1 - rate`` (drawn from
    ``key``); ``x`` itself when ``deterministic`` (evaluation) or ``rate == 0``."""
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 <= rate < 1:
        raise ShapeError(
            f"dropout: rate must be a number in [0, 1), found {rate!r} at {user_location()}"
        )
    (tensor,) = _tensors(x)
    if not tensor.dtype.is_float:
        raise ShapeError(
            f"dropout: expected a float tensor, found {tensor.aval} at {user_location()}"
        )
    if deterministic or rate == 0:
        if key is not None:
            random.check_key(key, "dropout")
        return tensor

    def masked(tensor: Tensor, key: Any) -> Tensor:
        keep = random.bernoulli(random.check_key(key, "dropout"), 1 - rate, tensor.shape)
        return where(keep, multiply(tensor, 1 / (1 - rate)), 0.0)

    return regenerate(masked, tensor, key)


__all__ = ["dropout"]
