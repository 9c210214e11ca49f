"""``graph.checkpoint``: mark a block of traced code for activation checkpointing.

Each call of a checkpointed function tags the ops it traces with ``graph.checkpoint =
<id>`` (:mod:`tessera.transforms.remat`); the backward pass then keeps only what the training
step's remat policy saves of the block and recomputes the rest, as
``torch.utils.checkpoint`` and ``jax.checkpoint`` do::

    @graph.checkpoint
    def block(p, x):
        return x + op.matmul(op.gelu(op.matmul(x, p["w1"])), p["w2"])
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from xdsl.dialects.builtin import IntegerAttr, i64

from tessera.errors import TraceError
from tessera.frontend.tracer import current_trace, is_tracing, user_location
from tessera.transforms.remat import CHECKPOINT, REGENERATE


def checkpoint(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` whose every call traced is one checkpointed block (ops in a nested
    checkpointed call belong to the outermost block)."""
    if not callable(fn):
        raise TraceError(
            f"graph.checkpoint expects a function, found {type(fn).__name__} at {user_location()}"
        )

    @functools.wraps(fn)
    def block(*args: Any, **kwargs: Any) -> Any:
        if not is_tracing():
            return fn(*args, **kwargs)
        return _tagged(CHECKPOINT, fn, *args, **kwargs)

    return block


def regenerate(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, traced as a block that every backward pass recomputes
    instead of keeping its values (``graph.regenerate``): for cheap values that are big
    to keep, like a dropout mask computed from a key."""
    if not is_tracing():
        return fn(*args, **kwargs)
    return _tagged(REGENERATE, fn, *args, **kwargs)


def _tagged(attribute: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, its traced ops tagged ``attribute = <a new block id>``."""
    trace = current_trace()
    before = trace.block.last_op
    result = fn(*args, **kwargs)
    tag = IntegerAttr(trace.checkpoints, i64)
    trace.checkpoints += 1
    op = before.next_op if before is not None else trace.block.first_op
    while op is not None:
        op.attributes[attribute] = tag
        op = op.next_op
    return result
