"""Training: the whole-step program behind ``graph.training_step`` and what it is made of.

- :mod:`~tessera.training.step`: :class:`TrainingStep` (forward, backward and optimizer
  update compiled as one program; ZeRO stages), the step being traced;
- :mod:`~tessera.training.state`: :class:`TrainState`, per-rank shards under processes;
- :mod:`~tessera.training.checkpoint`: sharded, atomic checkpoints of a step's state;
- :mod:`~tessera.training.checkpoint_policy`: :class:`CheckpointManager` (save every K
  steps to ``root/step_<k>``, keep the newest N) and :func:`latest` (the newest complete);
- :mod:`~tessera.training.preemption`: SIGTERM / SIGUSR1 turned into a save at the next
  step boundary, agreed by every rank;
- :mod:`~tessera.training.fault_injection`: ``TESSERA_FAULT_INJECT``, faults on cue for
  tests (off unless set);
- :mod:`~tessera.training.grad_clip`: clipping by the global norm;
- :mod:`~tessera.training.accumulation`: gradient accumulation over microbatches;
- :mod:`~tessera.training.mixed_precision`: bf16 / fp16 compute, loss scaling (the policy,
  :class:`~tessera.precision.Precision`, is defined below the compile driver).

The optimizers are :mod:`tessera.optim`.
"""

from tessera.training.checkpoint_policy import CheckpointManager, latest
from tessera.training.state import TrainState
from tessera.training.step import (
    ZERO_STAGES,
    StepTrace,
    TrainingStep,
    global_metrics,
    leaf_paths,
    metric_dtype,
    traced_step,
    tracing_step,
    widened_metrics,
    zero_sharding,
)

__all__ = [
    "ZERO_STAGES",
    "CheckpointManager",
    "StepTrace",
    "TrainState",
    "TrainingStep",
    "global_metrics",
    "latest",
    "leaf_paths",
    "metric_dtype",
    "traced_step",
    "tracing_step",
    "widened_metrics",
    "zero_sharding",
]
