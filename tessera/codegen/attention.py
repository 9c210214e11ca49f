"""Flash attention for kernels holding softmax(Q Kᵀ) V (to be filled in)."""

from __future__ import annotations

from collections.abc import Sequence

from xdsl.ir import Operation

from tessera.ir import schedule


def find_attention(ops: Sequence[Operation]) -> list[list[Operation]]:
    """Groups of graph ops forming softmax(q kᵀ) v, to become one kernel each."""
    return []


def match_attention(kernel: schedule.KernelOp) -> None:
    return None
