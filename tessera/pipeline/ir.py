"""Pipeline schedules as IR: :class:`Action` lists to ``schedule.pipeline`` and back.

``pipeline_op`` builds the op (one ``schedule.pipeline_rank`` per list, in rank order, one
``schedule.action`` per action); ``actions_of`` reads the lists back, exactly::

    actions_of(pipeline_op("1f1b", 2, 4, 1, lists)) == lists

The op's verifier (see :mod:`tessera.ir.schedule`) checks that the lists are a complete,
consistent schedule; neither function does.
"""

from __future__ import annotations

from collections.abc import Sequence

from tessera.ir.schedule import ActionOp, PipelineOp, PipelineRankOp
from tessera.pipeline.actions import Action


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
