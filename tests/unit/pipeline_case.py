"""The GPT training case the pipeline tests share (examples/train_gpt.py's model)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

import train_gpt

from tessera import dist, schedule

BATCH, SEQ, DIM, LAYERS, VOCAB, HEADS = 8, 8, 32, 2, 64, 2


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    stream = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=torch.Generator().manual_seed(1))
    return stream[:, :-1], stream[:, 1:]


def losses_and_params(
    pp: int,
    dp: int,
    tp: int,
    microbatches: int = 1,
    kind: str = "1f1b",
    virtual: int = 1,
    steps: int = 2,
) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Per-step losses and the parameters after ``steps`` AdamW steps of the GPT on a
    ``pp x dp x tp`` mesh (no pp axis when ``pp`` is 0: the unpipelined step)."""
    params = train_gpt.init_params(VOCAB, SEQ, DIM, LAYERS)
    args = argparse.Namespace(lr=3e-3, zero=0, heads=HEADS, layers=LAYERS)
    if pp:
        mesh = dist.Mesh(axes=["pp", "dp", "tp"], shape=(pp, dp, tp))
    else:
        mesh = dist.Mesh(axes=["dp", "tp"], shape=(dp, tp))
    step = train_gpt.make_step(mesh, params, args)
    state = step.init(params)
    tokens, targets = batch()
    losses = []
    with schedule.options(
        pipeline_microbatches=microbatches, pipeline_schedule=kind, pipeline_virtual=virtual
    ):
        for _ in range(steps):
            loss = step(state, tokens, targets)["loss"]
            losses.append(float(loss.full() if hasattr(loss, "full") else loss))
    return losses, dict(step.gather(state).params)
