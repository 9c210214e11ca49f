"""Activation checkpointing (rematerialisation): which forward values a backward pass
recomputes instead of keeping.

``graph.checkpoint(block)`` tags the forward ops traced by each call of ``block`` with
``graph.checkpoint = <id>`` (one id per call). When differentiating, a
:class:`RematPolicy` decides, per checkpointed block, which of its values are *saved*
(kept alive from the forward to the backward) and which are *recomputed*: the backward
re-emits those ops, tagged ``graph.remat = <id>``, just before the block's VJPs. A tag
keeps ``cse`` from merging a recomputation into the forward op it copies, and
``lower-graph-to-schedule`` from fusing it into a forward kernel.

A block's inputs and its outputs (values used after it) are always saved: the forward
keeps them for the following blocks anyway.

``graph.regenerate = <id>`` tags a block that is recomputed whatever the policy (saving
nothing but its inputs and outputs): ``op.dropout``'s, whose mask the backward
regenerates from the key instead of keeping it.

``graph.regather = <id>`` tags a ``dist.shard`` whose result the backward does not keep:
it shards the operand again, just before the backward first reads the result (tagged
``graph.remat = <id>``; the ids keep ``cse`` from merging one microbatch's gathers with
another's, and the forward op keeps its tag for that). ZeRO-3 tags the gathers of its parameters, so each whole parameter
lives for its layer's forward and, gathered again, its layer's backward, not the whole
step (ZeRO's stage 3; FSDP's ``reshard_after_forward``).
"""

from __future__ import annotations

from dataclasses import dataclass

from tessera.errors import TesseraError

CHECKPOINT = "graph.checkpoint"  # on forward ops: the checkpointed block they belong to
REMAT = "graph.remat"  # on recomputed ops: the block they recompute
REGENERATE = "graph.regenerate"  # on forward ops: a block always recomputed (its id)
REGATHER = "graph.regather"  # on a forward dist.shard: the backward shards again (its id)

SAVE_POLICIES = ("nothing", "matmuls", "everything")


@dataclass(frozen=True)
class RematPolicy:
    """What a backward pass keeps of a checkpointed block.

    ``save``: ``"nothing"`` (recompute every value but the block's inputs and outputs),
    ``"matmuls"`` (keep matmul and attention results too: recompute only the cheap
    elementwise and reduction ops) or ``"everything"`` (no recomputation: checkpointing
    off). ``every``: checkpoint only every ``every``-th block (the 1st, the
    ``every+1``-th, ...); the others are saved whole."""

    save: str = "nothing"
    every: int = 1

    def __post_init__(self) -> None:
        if self.save not in SAVE_POLICIES:
            raise TesseraError(f"remat: save must be one of {SAVE_POLICIES}, found {self.save!r}")
        if not isinstance(self.every, int) or self.every < 1:
            raise TesseraError(f"remat: every must be a positive int, found {self.every!r}")

    @staticmethod
    def of(value: RematPolicy | str | bool | None) -> RematPolicy:
        """A policy from a policy, a ``save`` name, True (``"nothing"``), or False / None
        (``"everything"``)."""
        if isinstance(value, RematPolicy):
            return value
        if value is True:
            return RematPolicy()
        if value is False or value is None:
            return RematPolicy("everything")
        if isinstance(value, str):
            return RematPolicy(value)
        raise TesseraError(
            f"remat must be a graph.Remat, one of {SAVE_POLICIES} or a bool, found {value!r}"
        )

    @property
    def active(self) -> bool:
        return self.save != "everything"
