"""The zig-zag order of a sequence: causal context parallelism's load balance.

With the sequence split over ``n`` ranks, causal attention gives the rank holding the
last tokens the most work. Cutting the sequence into ``2n`` chunks and giving rank ``r``
chunks ``r`` and ``2n - 1 - r`` balances it (Megatron-LM's context parallelism, Striped
and zig-zag ring attention). A data loader that *stores* the sequence in that order —
chunk ``s`` of the stored sequence is chunk :func:`true_chunk` ``(s)`` of the real one —
lets the plain contiguous split hand every rank its balanced pair, so no collective ever
reorders tokens. ``graph.attention``'s ``zigzag = n`` says q, k and v arrive so stored;
the causal mask then compares true positions (:func:`zigzag_order`).

Every op but attention is indifferent to the order of tokens (a loss that averages them,
a norm, an MLP); learned or rotary position embeddings read the true positions, which
``zigzag_order(T, n)`` gives in stored order.
"""

from __future__ import annotations

import numpy as np

from tessera.errors import ShapeError


def true_chunk(stored: int, ranks: int) -> int:
    """The true chunk (of ``2 · ranks``) held by stored chunk ``stored``: stored chunks
    ``2r`` and ``2r + 1`` are true chunks ``r`` and ``2 · ranks - 1 - r``."""
    half, odd = divmod(stored, 2)
    return 2 * ranks - 1 - half if odd else half


def check_zigzag(length: int, ranks: int, what: str = "sequence") -> None:
    """Raises ShapeError unless a ``length`` sequence splits into ``2 · ranks`` chunks."""
    if isinstance(ranks, bool) or not isinstance(ranks, (int, np.integer)) or ranks < 1:
        raise ShapeError(f"zigzag must be a positive number of ranks, found {ranks!r}")
    if length % (2 * ranks):
        raise ShapeError(
            f"a zig-zag order over {ranks} ranks cuts the {what} into {2 * ranks} chunks, "
            f"but its length {length} is not divisible by {2 * ranks}"
        )


def zigzag_order(length: int, ranks: int) -> np.ndarray:
    """The true positions of a ``length`` sequence stored in zig-zag order over ``ranks``:
    ``x[..., zigzag_order(T, n), :]`` stores ``x``, ``np.argsort`` of it restores it."""
    check_zigzag(length, ranks)
    chunk = length // (2 * ranks)
    starts = [true_chunk(s, ranks) * chunk for s in range(2 * ranks)]
    return np.concatenate([np.arange(s, s + chunk) for s in starts]).astype(np.int64)


__all__ = ["check_zigzag", "true_chunk", "zigzag_order"]
