"""The training options the example scripts share, for Tessera and for their torch loops.

``add_arguments`` adds ``--precision``, ``--clip``, ``--zero``, ``--remat``,
``--accumulate``, ``--deterministic``, ``--lr-schedule``/``--warmup``/``--min-lr`` and
the pipeline's ``--pp``/``--microbatches``/``--schedule``/``--virtual``;
``step_options`` turns them into ``graph.training_step`` keywords; ``TorchUpdate`` does
the same update in the torch loop (``clip_grad_norm_``, ``LambdaLR`` with the closed
form of the schedule, GradScaler's skip of fp16 steps whose gradients overflow, decided
by an fp16 copy of the model). ``add_checkpoint_arguments`` adds the checkpoint policy's
``--save``/``--resume``/``--checkpoint-every``/``--keep-last`` and ``--log-every``.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import Any

import torch

from tessera import optim

SCHEDULES = ("constant", "linear_warmup", "warmup_cosine", "warmup_linear_decay")


def add_arguments(parser: argparse.ArgumentParser, remat_default: str = "everything") -> None:
    parser.add_argument(
        "--precision", default="f32", choices=("f32", "bf16", "fp16", "fp8"),
        help="compute dtype (f32 master weights; fp16 with dynamic loss scaling; fp8: matmuls "
        "with per-tensor scaled e4m3 operands and e5m2 gradients, emulated, the rest bf16)",
    )  # fmt: skip
    parser.add_argument(
        "--clip", type=float, default=None, help="clip gradients to this global norm"
    )
    parser.add_argument(
        "--zero", type=int, default=0, choices=(0, 1, 2, 3), help="ZeRO stage over dp"
    )
    parser.add_argument(
        "--remat", default=remat_default, choices=("everything", "matmuls", "nothing"),
        help="what the backward keeps of each block (the rest is recomputed)",
    )  # fmt: skip
    parser.add_argument(
        "--accumulate", type=int, default=None,
        help="gradient-accumulation rounds per step (with --pp: rounds of --microbatches)",
    )  # fmt: skip
    parser.add_argument(
        "--deterministic", action="store_true", help="sums over ranks in a fixed order"
    )
    parser.add_argument(
        "--lr-schedule",
        default="constant",
        choices=SCHEDULES,
        help="the lr over --steps, peaking at --lr",
    )
    parser.add_argument("--warmup", type=int, default=0, help="warmup steps of --lr-schedule")
    parser.add_argument("--min-lr", type=float, default=0.0, help="the lr at the end of the decay")
    parser.add_argument("--pp", type=int, default=1, help="pipeline stages (ranks along pp)")
    parser.add_argument(
        "--microbatches", type=int, default=4, help="microbatches per step (with --pp)"
    )
    parser.add_argument(
        "--schedule", default="1f1b", choices=("gpipe", "1f1b", "interleaved", "zb-h1")
    )
    parser.add_argument(
        "--virtual", type=int, default=1, help="model chunks per pipeline rank (interleaved)"
    )


def add_checkpoint_arguments(parser: argparse.ArgumentParser, log_every: int) -> None:
    """``--save DIR`` (checkpoints ``DIR/step_<k>``; a run resumes from the newest complete
    one there; SIGTERM or SIGUSR1 saves at the next step boundary and stops), ``--resume``,
    ``--checkpoint-every``, ``--keep-last``, ``--async-save``, ``--log-every``."""
    add = parser.add_argument
    add("--save", default=None, help="checkpoint into DIR/step_<k> at the end (and every "
        "--checkpoint-every steps); resume from the newest complete one there")  # fmt: skip
    add("--resume", default=None, help="start from this checkpoint (or the newest under it)")
    add(
        "--checkpoint-every", type=int, default=0, help="with --save: every K steps (0: at the end)"
    )
    add("--keep-last", type=int, default=3, help="with --save: keep the newest N checkpoints")
    add("--async-save", action="store_true", help="with --save: write checkpoints in the "
        "background (the state is copied, the steps go on)")  # fmt: skip
    add("--log-every", type=int, default=log_every, help="a loss line every N steps (0: none)")


def check(args: argparse.Namespace, error: Callable[[str], None]) -> None:
    """Argument errors the parser cannot see."""
    if args.accumulate is not None and args.accumulate < 1:
        error(f"--accumulate must be at least 1, found {args.accumulate}")
    if args.lr_schedule not in ("constant", "linear_warmup") and args.warmup > args.steps:
        error(f"--warmup {args.warmup} is longer than --steps {args.steps}")


def learning_rate(args: argparse.Namespace) -> float | optim.schedules.Schedule:
    """``--lr`` as a number, or the ``--lr-schedule`` peaking at it (over ``--steps``)."""
    kind = getattr(args, "lr_schedule", "constant")
    warmup, floor = getattr(args, "warmup", 0), getattr(args, "min_lr", 0.0)
    if kind == "constant":
        return args.lr
    if kind == "linear_warmup":
        return optim.schedules.linear_warmup(args.lr, warmup)
    return getattr(optim.schedules, kind)(args.lr, warmup, args.steps, floor)


def lr_factor(args: argparse.Namespace, t: int) -> float:
    """The schedule's lr at update ``t`` over ``--lr``, written out for ``LambdaLR``."""
    kind, warmup = getattr(args, "lr_schedule", "constant"), getattr(args, "warmup", 0)
    floor = getattr(args, "min_lr", 0.0) / args.lr
    if kind == "constant":
        return 1.0
    if t < warmup:
        return (t + 1) / warmup
    if kind == "linear_warmup":
        return 1.0
    if t >= args.steps:
        return floor
    done = (t - warmup) / (args.steps - warmup)
    if kind == "warmup_cosine":
        return floor + 0.5 * (1 - floor) * (1 + math.cos(math.pi * done))
    return floor + (1 - floor) * (1 - done)


def step_options(args: argparse.Namespace) -> dict[str, Any]:
    """The ``graph.training_step`` keywords of the options (the optimizer's lr aside)."""
    return {
        "zero": getattr(args, "zero", 0),
        "remat": getattr(args, "remat", "everything"),
        "precision": getattr(args, "precision", "f32"),
        "numerics": "deterministic" if getattr(args, "deterministic", False) else None,
        "accumulate": getattr(args, "accumulate", None) or 1,
        "clip_grad_norm": getattr(args, "clip", None),
    }


class TorchUpdate:
    """The torch loop's update with the same options: ``update(params, loss_in_fp16)``
    after ``backward``, where ``loss_in_fp16(half_params)`` is the loss of an fp16 copy
    (used for fp16 only: GradScaler's overflow check, the scale seeding the backward in
    fp16; a step that overflows is skipped and the scale halved)."""

    def __init__(self, params: dict[str, torch.Tensor], args: argparse.Namespace):
        self.params, self.args = params, args
        self.optimizer = torch.optim.AdamW(params.values(), lr=args.lr, weight_decay=0.0)
        self.schedule = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda t: lr_factor(args, t)
        )
        self.scale, self.good = 2.0**16, 0

    def zero_grad(self) -> None:
        self.optimizer.zero_grad()

    def update(self, loss_in_fp16: Callable[[dict[str, torch.Tensor]], torch.Tensor]) -> None:
        if getattr(self.args, "precision", "f32") == "fp16" and not self._finite(loss_in_fp16):
            return
        if getattr(self.args, "clip", None) is not None:
            torch.nn.utils.clip_grad_norm_(list(self.params.values()), self.args.clip)
        self.optimizer.step()
        self.schedule.step()

    def _finite(self, loss_in_fp16: Callable[[dict[str, torch.Tensor]], torch.Tensor]) -> bool:
        half = {k: v.detach().float().half().requires_grad_() for k, v in self.params.items()}
        loss_in_fp16(half).backward(torch.tensor(self.scale).half())
        if all(bool(torch.isfinite(v.grad.float() / self.scale).all()) for v in half.values()):  # type: ignore[union-attr]
            self.good += 1
            if self.good == 2000:  # growth_interval
                self.scale, self.good = self.scale * 2, 0
            return True
        self.scale, self.good = self.scale / 2, 0
        return False
