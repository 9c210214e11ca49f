"""``graph.random_bits``: Philox-4x32-10 random bits, an elementwise op.

Each element is a pure function of its key words and counter (``tessera.random`` gives
each element its index in the global array as its counter), so the op is sharded
elementwise like any other: a rank computes the bits of its slice from its slice of
the counter. The reference runs Philox in numpy ``uint32``/``uint64`` arithmetic; the
tile code is ``tile.philox``, which Triton runs as ``tl.philox`` (the algorithm of
``tl.randint`` and ``tl.rand``): both give the same bits. Integer bits carry no gradient.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch
from xdsl.dialects.builtin import i32
from xdsl.ir import SSAValue

from tessera.ir import graph
from tessera.ir.grad_builder import GradBuilder
from tessera.ir.sharding_rules import elementwise
from tessera.opdefs.registry import NOT_LINEAR, Cotangents, Fusion, Pointwise, bound, register

if TYPE_CHECKING:
    from tessera.ir.tile_builder import TileBuilder

ROUNDS = 10
KEY_A, KEY_B = np.uint32(0x9E3779B9), np.uint32(0xBB67AE85)  # the key's increments per round
ROUND_A, ROUND_B = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)  # the multipliers


def philox(
    key0: np.ndarray, key1: np.ndarray, counter0: np.ndarray, counter1: np.ndarray
) -> np.ndarray:
    """The first word of Philox-4x32-10 of the counter ``(counter0, counter1, 0, 0)``
    under the key ``(key0, key1)``: uint32 arrays (broadcast) to uint32, as
    ``triton.language.random.philox_impl`` computes it."""
    k0, k1, c0, c1 = (np.asarray(a, dtype=np.uint32) for a in (key0, key1, counter0, counter1))
    k0, k1, c0, c1 = np.broadcast_arrays(k0, k1, c0, c1)
    c2 = np.zeros_like(c0)
    c3 = np.zeros_like(c0)
    with np.errstate(over="ignore"):
        for _ in range(ROUNDS):
            product_a = ROUND_A * c0.astype(np.uint64)
            product_b = ROUND_B * c2.astype(np.uint64)
            c0, c1, c2, c3 = (
                (product_b >> np.uint64(32)).astype(np.uint32) ^ c1 ^ k0,
                product_b.astype(np.uint32),
                (product_a >> np.uint64(32)).astype(np.uint32) ^ c3 ^ k1,
                product_a.astype(np.uint32),
            )
            k0, k1 = k0 + KEY_A, k1 + KEY_B
    return c0


@bound
def _random_bits_reference(op: graph.RandomBitsOp) -> Callable[..., torch.Tensor]:
    """Philox in numpy on the operands' bit patterns; the result as int32."""
    stream = np.uint32(op.attrs()["stream"])

    def run(key0: torch.Tensor, key1: torch.Tensor, counter: torch.Tensor) -> torch.Tensor:
        words = [
            (t.to(torch.int64).numpy() & 0xFFFFFFFF).astype(np.uint32)
            for t in (key0, key1, counter)
        ]
        bits = philox(*words, stream)
        return torch.from_numpy(np.ascontiguousarray(bits).view(np.int32))

    return run


def _random_bits_tile(
    b: TileBuilder, op: graph.RandomBitsOp, operands: Sequence[SSAValue]
) -> SSAValue:
    key0, key1, counter = operands
    return b.philox(key0, key1, counter, b.constant(_signed(op.attrs()["stream"]), i32))


def _signed(word: int) -> int:
    """A uint32 word as the int32 of the same bits."""
    return word - (1 << 32) if word >= 1 << 31 else word


def _no_gradient(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
    """Integer operands and result: no gradient."""
    return [None, None, None]


register(
    graph.RandomBitsOp,
    sharding=elementwise,
    partial=NOT_LINEAR,
    vjp=_no_gradient,
    reference=_random_bits_reference,
    tile=Pointwise(_random_bits_tile),
    fusion=Fusion.ELEMENTWISE,
)
