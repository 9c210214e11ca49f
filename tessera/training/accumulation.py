"""Gradient accumulation over microbatches, inside a traced training step (no pipeline).

The step's batch is cut into ``k`` microbatches; the user's function runs on each in
turn (forward, then backward), and the gradients and float metrics are averaged: for a
loss that is a mean over the rows, the full batch's. Only one microbatch's activations
are live at a time. On a mesh the rows are split over dp: microbatch ``j`` is the
``j``-th chunk of every rank's rows (a reshape to ``[dp, k, rows]`` and a slice of the
unsplit middle dim), so cutting moves no data, and the gradients' dp reduction happens
once, after the sum.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from tessera import op
from tessera.errors import TraceError
from tessera.frontend import pytree
from tessera.frontend.tracer import Tensor, user_location


def microbatch(x: Any, j: int, k: int, dp: int) -> Any:
    """Microbatch ``j`` of ``k`` of the batch leaf ``x`` (rows split over ``dp`` ranks)."""
    if not isinstance(x, Tensor) or not x.aval.shape:
        return x  # a scalar or a static value: every microbatch sees it whole
    rows, *rest = x.aval.shape
    if rows % (dp * k):
        raise TraceError(
            f"accumulate={k}: a batch argument of {rows} rows does not split into {k} "
            f"microbatches over {dp} data-parallel ranks, at {user_location()}"
        )
    size = rows // (dp * k)
    blocks = op.reshape(x, (dp, k, size, *rest))
    return op.reshape(blocks[:, j : j + 1], (dp * size, *rest))


def accumulate_microbatches(
    run: Callable[[Sequence[Any]], tuple[list[Tensor], Any]],
    batch: Sequence[Any],
    k: int,
    dp: int,
) -> tuple[list[Tensor], Any]:
    """The mean of ``run``'s gradients and float metrics over ``k`` microbatches."""
    total: list[Tensor] = []
    metric_sums: list[Any] = []
    metric_tree = None
    for j in range(k):
        leaves, tree = pytree.flatten(tuple(batch))
        micro = pytree.unflatten(tree, [microbatch(x, j, k, dp) for x in leaves])
        grads, metrics = run(micro)
        metric_leaves, metric_tree = pytree.flatten(metrics)
        total = grads if not total else [a + b for a, b in zip(total, grads, strict=True)]
        metric_sums = (
            metric_leaves
            if not metric_sums
            else [_add_float(a, b) for a, b in zip(metric_sums, metric_leaves, strict=True)]
        )
    assert metric_tree is not None
    metrics = pytree.unflatten(metric_tree, [_mean(m, k) for m in metric_sums])
    return [g / k for g in total], metrics


def _add_float(a: Any, b: Any) -> Any:
    return a + b if isinstance(a, Tensor) and a.aval.dtype.is_float else b


def _mean(a: Any, k: int) -> Any:
    return a / k if isinstance(a, Tensor) and a.aval.dtype.is_float else a
