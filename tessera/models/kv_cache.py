"""The key/value cache of one traced generation step: each layer's keys and values
``[B, kv_heads, max_len, head_dim]`` (static size), written at a runtime position by
``op.dynamic_update_slice``, so that one compiled program serves every decode step."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tessera import op


@dataclass
class KVCache:
    """The caches of a step whose tokens start at ``position`` (a traced i32 scalar).
    The model calls :meth:`attend` once per layer, in order; ``keys`` and ``values``
    then hold the updated caches (the step's outputs)."""

    keys: list[Any]
    values: list[Any]
    position: Any
    layer: int = field(default=0)

    def positions(self, length: int) -> Any:
        """The positions ``[length]`` (i32) of the step's tokens."""
        return op.arange(length, dtype="i32") + self.position

    def attend(self, q: Any, k: Any, v: Any, window: int | None) -> Any:
        """Writes this layer's ``k`` and ``v`` ``[B, kv_heads, T, D]`` into its caches and
        attends ``q`` ``[B, heads, T, D]`` to them: causal at the step's positions (a
        sliding ``window`` too), with the cache slots past the step's last token hidden
        by a key padding mask."""
        i = self.layer
        self.layer += 1
        self.keys[i] = op.dynamic_update_slice(self.keys[i], k, self.position, axis=2)
        self.values[i] = op.dynamic_update_slice(self.values[i], v, self.position, axis=2)
        batch, length, steps = q.shape[0], self.keys[i].shape[2], q.shape[2]
        filled = op.arange(length, dtype="i32") < self.position + steps
        mask = op.broadcast_to(op.reshape(filled, (1, length)), (batch, length))
        return op.attention(
            q, self.keys[i], self.values[i], causal=True, q_offset=self.position,
            window=window, key_padding_mask=mask,
        )  # fmt: skip
