"""Pipeline schedules as per-rank action lists, and those lists as the Schedule IR's
``schedule.pipeline`` op (:func:`pipeline_op`) and back (:func:`actions_of`).

:func:`pipeline_schedule` builds, for each pipeline rank, the ordered list of
:class:`~tessera.ir.pipeline_actions.Action` a runtime executes literally:

- ``gpipe`` (Huang et al. 2019, "GPipe"): every forward, then every backward;
- ``1f1b`` (Narayanan et al. 2021, PipeDream-Flush; Megatron-LM's default): rank ``r`` runs
  ``min(p - r - 1, m)`` warm-up forwards, then one forward / one backward, then the
  remaining backwards, so at most ``p - r`` microbatches are in flight;
- ``interleaved`` (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training
  on GPU Clusters Using Megatron-LM", §2.2): ``v`` model chunks per rank, stage ``s`` on
  rank ``s % p``, microbatches taken in groups of ``p`` per chunk exactly as Megatron's
  ``forward_backward_pipelining_with_interleaving`` (warm-up ``2(p - r - 1) + (v - 1)p``);
- ``zb-h1`` (Qi et al. 2023, "Zero Bubble Pipeline Parallelism", §3.1): the backward split
  into ``backward_input`` (B) and ``backward_weight`` (W); 1F1B's order with B in place of
  the backward (at most ``p - r`` forwards awaiting their B) and rank ``r``'s W passes
  ``r`` microbatches late, so they fill the cool-down bubble.

Transfers: a forward of stage ``s > 0`` is right after ``recv_activation`` from ``s - 1``
and a forward of ``s < S - 1`` right before ``send_activation`` to ``s + 1``; a backward (or
``backward_input``) of ``s < S - 1`` is right after ``recv_grad`` from ``s + 1`` and one of
``s > 0`` right before ``send_grad`` to ``s - 1``.
"""

from __future__ import annotations

from collections.abc import Sequence

from tessera.errors import TesseraError
from tessera.ir.pipeline_actions import (
    BACKWARD,
    BACKWARD_INPUT,
    BACKWARD_WEIGHT,
    FORWARD,
    RECV_ACTIVATION,
    RECV_GRAD,
    SCHEDULE_KINDS,
    SEND_ACTIVATION,
    SEND_GRAD,
    Action,
    Step,
)
from tessera.ir.schedule import ActionOp, PipelineOp, PipelineRankOp

Compute = tuple[str, int, int]  # (kind, microbatch, stage)


def stage_count(ranks: int, virtual: int = 1) -> int:
    """The number of model stages: ``ranks * virtual``."""
    return ranks * virtual


def pipeline_schedule(
    kind: str, ranks: int, microbatches: int, virtual: int = 1
) -> list[list[Action]]:
    """One action list per pipeline rank (index = rank) for schedule ``kind``.

    ``virtual`` (model chunks per rank) is for ``interleaved`` only; with ``virtual = 1``
    it is exactly ``1f1b`` (Megatron's interleaved warm-up would run p − r − 1 more
    forwards). Raises :class:`TesseraError` for an unknown kind or bad sizes."""
    return [
        [Action(*step) for step in steps]
        for steps in schedule_steps(kind, ranks, microbatches, virtual)
    ]


def schedule_steps(kind: str, ranks: int, microbatches: int, virtual: int = 1) -> list[list[Step]]:
    """:func:`pipeline_schedule`'s lists as plain ``(kind, microbatch, stage, peer)``
    tuples (what the planner simulates: no :class:`Action` built per step)."""
    validate(kind, ranks, microbatches, virtual)
    p, m = ranks, microbatches
    if kind == "gpipe":
        orders = [_gpipe(r, m) for r in range(p)]
    elif kind == "1f1b" or (kind == "interleaved" and virtual == 1):
        orders = [_one_f_one_b(p, r, m) for r in range(p)]
    elif kind == "interleaved":
        orders = [_interleaved(p, r, m, virtual) for r in range(p)]
    else:
        orders = [_zb_h1(p, r, m) for r in range(p)]
    stages = stage_count(p, virtual)
    return [_with_transfers(order, stages) for order in orders]


def validate(kind: str, ranks: int, microbatches: int, virtual: int = 1) -> None:
    """Raises :class:`TesseraError` naming the bad argument and what is allowed."""
    if kind not in SCHEDULE_KINDS:
        raise TesseraError(
            f"unknown pipeline schedule {kind!r}; known: {', '.join(SCHEDULE_KINDS)}"
        )
    for name, value in (("ranks", ranks), ("microbatches", microbatches), ("virtual", virtual)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise TesseraError(
                f"pipeline schedule {kind!r}: {name} must be an integer >= 1, got {value!r}"
            )
    if virtual != 1 and kind != "interleaved":
        raise TesseraError(
            f"pipeline schedule {kind!r}: virtual must be 1 (got {virtual}); only "
            f"'interleaved' runs several model chunks per rank"
        )
    if kind == "interleaved" and microbatches % ranks != 0:
        raise TesseraError(
            f"pipeline schedule 'interleaved': microbatches ({microbatches}) must be a multiple "
            f"of ranks ({ranks}); Megatron's interleaving takes microbatches in groups of ranks"
        )


def _gpipe(rank: int, m: int) -> list[Compute]:
    return [(FORWARD, i, rank) for i in range(m)] + [(BACKWARD, i, rank) for i in range(m)]


def _one_f_one_b(p: int, rank: int, m: int) -> list[Compute]:
    warmup = min(p - rank - 1, m)
    order: list[Compute] = [(FORWARD, i, rank) for i in range(warmup)]
    for i in range(m - warmup):
        order += [(FORWARD, warmup + i, rank), (BACKWARD, i, rank)]
    order += [(BACKWARD, i, rank) for i in range(m - warmup, m)]
    return order


def _interleaved(p: int, rank: int, m: int, v: int) -> list[Compute]:
    """Megatron-LM's interleaved 1F1B: the k-th forward (backward) of a rank runs chunk
    ``(k mod pv) // p`` (its mirror ``v - 1 - ...``) on microbatch ``(k // pv) p + k mod p``."""
    total = m * v
    warmup = min((p - rank - 1) * 2 + (v - 1) * p, total)

    def step(kind: str, k: int) -> Compute:
        chunk = (k % (p * v)) // p
        if kind == BACKWARD:
            chunk = v - 1 - chunk
        return (kind, (k // (p * v)) * p + k % p, chunk * p + rank)

    order = [step(FORWARD, k) for k in range(warmup)]
    for i in range(total - warmup):
        order += [step(FORWARD, warmup + i), step(BACKWARD, i)]
    order += [step(BACKWARD, k) for k in range(total - warmup, total)]
    return order


def _zb_h1(p: int, rank: int, m: int) -> list[Compute]:
    """ZB-H1: 1F1B's order with B for its backward, and rank ``r``'s W passes ``r``
    microbatches late, each right after a B and before the next F; the last ``r`` W
    passes close the list. With F = B = W this fills the cool-down exactly (found by
    simulating delays; see :mod:`tessera.pipeline.theory`)."""
    warmup = min(p - rank, m)
    order: list[Compute] = [(FORWARD, i, rank) for i in range(warmup)]
    weights = 0
    for i in range(m):
        order.append((BACKWARD_INPUT, i, rank))
        if i >= rank:
            order.append((BACKWARD_WEIGHT, i - rank, rank))
            weights += 1
        if warmup + i < m:
            order.append((FORWARD, warmup + i, rank))
    order += [(BACKWARD_WEIGHT, i, rank) for i in range(weights, m)]
    return order


def _with_transfers(order: list[Compute], stages: int) -> list[Step]:
    steps: list[Step] = []
    append = steps.append
    last = stages - 1
    for kind, mb, stage in order:
        if kind == FORWARD:
            if stage > 0:
                append((RECV_ACTIVATION, mb, stage, stage - 1))
            append((kind, mb, stage, None))
            if stage < last:
                append((SEND_ACTIVATION, mb, stage, stage + 1))
        elif kind in (BACKWARD, BACKWARD_INPUT):
            if stage < last:
                append((RECV_GRAD, mb, stage, stage + 1))
            append((kind, mb, stage, None))
            if stage > 0:
                append((SEND_GRAD, mb, stage, stage - 1))
        else:
            append((kind, mb, stage, None))
    return steps


# --- schedules as IR: action lists to schedule.pipeline and back -------------------------


def action_op(action: Action) -> ActionOp:
    """``schedule.action`` of one action."""
    return ActionOp.get(action.kind, action.microbatch, action.stage, action.peer)


def action_of(op: ActionOp) -> Action:
    """The action of one ``schedule.action`` (``ValueError`` for an unknown kind)."""
    return Action(op.kind_name, op.microbatch_index, op.stage_index, op.peer_stage)


def pipeline_op(
    kind: str,
    ranks: int,
    microbatches: int,
    virtual: int,
    actions: Sequence[Sequence[Action]],
) -> PipelineOp:
    """``schedule.pipeline`` of a schedule: ``actions[r]`` is what rank ``r`` runs."""
    rank_ops = [
        PipelineRankOp.get(rank, [action_op(a) for a in rank_actions])
        for rank, rank_actions in enumerate(actions)
    ]
    return PipelineOp.get(kind, ranks, microbatches, virtual, rank_ops)


def actions_of(op: PipelineOp) -> list[list[Action]]:
    """The schedule a ``schedule.pipeline`` holds: one list of actions per rank."""
    return [[action_of(a) for a in rank_op.actions] for rank_op in op.rank_ops]
