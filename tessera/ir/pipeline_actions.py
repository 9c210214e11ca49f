"""What one pipeline rank does, in order: the actions of a pipeline schedule (the
vocabulary of the Schedule IR's ``schedule.pipeline`` op).

A schedule over ``ranks`` pipeline ranks runs ``stages = ranks * virtual`` model stages;
stage ``s`` lives on rank ``s % ranks`` (Megatron's interleaved placement: with
``virtual = 1`` stage ``s`` is rank ``s``). Each rank's list holds computations
(``forward``, ``backward`` — both backward halves at once — or the split
``backward_input`` / ``backward_weight`` of zero-bubble schedules) and the point-to-point
transfers around them: ``send_*`` right after the computation that makes the value,
``recv_*`` right before the one that needs it. Sends do not block; a receive waits for
its send. Activations flow from stage ``s`` to ``s + 1``, gradients from ``s + 1`` to ``s``.
"""

from __future__ import annotations

from dataclasses import dataclass

FORWARD = "forward"
BACKWARD = "backward"
BACKWARD_INPUT = "backward_input"
BACKWARD_WEIGHT = "backward_weight"
SEND_ACTIVATION = "send_activation"
RECV_ACTIVATION = "recv_activation"
SEND_GRAD = "send_grad"
RECV_GRAD = "recv_grad"

# the pipeline schedules tessera.transforms.pipeline_schedules builds (schedule.pipeline's kinds)
SCHEDULE_KINDS = ("gpipe", "1f1b", "interleaved", "zb-h1")

COMPUTE_KINDS = (FORWARD, BACKWARD, BACKWARD_INPUT, BACKWARD_WEIGHT)
TRANSFER_KINDS = (SEND_ACTIVATION, RECV_ACTIVATION, SEND_GRAD, RECV_GRAD)
ACTION_KINDS = COMPUTE_KINDS + TRANSFER_KINDS

# an action's fields (kind, microbatch, stage, peer) as a plain tuple: what the planner's
# many simulations read, without building (and checking) an Action object per step
Step = tuple[str, int, int, int | None]


@dataclass(frozen=True)
class Action:
    """One step of a rank's list.

    ``stage`` is the (virtual) stage the action belongs to: the stage that computes, sends
    or receives. ``peer`` is, for transfers, the stage at the other end (``stage + 1`` for
    activations sent and gradients received, ``stage - 1`` for the others); ``None`` for
    computations."""

    kind: str
    microbatch: int
    stage: int
    peer: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in ACTION_KINDS:
            raise ValueError(f"unknown pipeline action {self.kind!r}; known: {ACTION_KINDS}")
        if (self.peer is None) != (self.kind in COMPUTE_KINDS):
            raise ValueError(f"{self.kind}: a transfer names its peer stage, a computation none")

    def __str__(self) -> str:
        peer = f"->{self.peer}" if self.peer is not None else ""
        return f"{self.kind}(mb={self.microbatch}, stage={self.stage}{peer})"


def rank_of(stage: int, ranks: int) -> int:
    """The pipeline rank that runs ``stage``."""
    return stage % ranks
