"""Learning-rate schedules: the learning rate as a function of the optimizer step.

``t`` counts the updates already done (the first update uses ``t = 0``), as
``torch.optim.lr_scheduler.LambdaLR``'s epoch does when ``scheduler.step()`` follows each
``optimizer.step()``. With ``w`` warmup steps, ``T`` total steps, peak ``p`` and minimum
``m``:

* ``constant(p)``: ``p``;
* ``linear_warmup(p, w)``: ``p (t + 1) / w`` while ``t < w``, then ``p``;
* ``warmup_cosine(p, w, T, m)``: the warmup, then ``m + ½ (p − m)(1 + cos(π (t − w) / (T − w)))``
  until ``T``, then ``m``;
* ``warmup_linear_decay(p, w, T, m)``: the warmup, then ``m + (p − m)(1 − (t − w) / (T − w))``
  until ``T``, then ``m``.

A schedule is called with a Python number (the value, a float: for checks and plots) or
with the traced step count (a 0-d float tensor: the value as graph ops). An optimizer
given ``lr=<schedule>`` evaluates it inside the compiled step from the step count in its
state, so every step runs the same program.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from tessera import op
from tessera.errors import ArgumentError
from tessera.frontend.tracer import Tensor

KINDS = ("constant", "linear_warmup", "warmup_cosine", "warmup_linear_decay")


@dataclass(frozen=True)
class Schedule:
    """A learning-rate schedule (build one with the functions of this module)."""

    kind: str
    peak_lr: float
    warmup_steps: int = 0
    total_steps: int | None = None  # None: no decay (constant, linear_warmup)
    min_lr: float = 0.0

    def __call__(self, step: Any) -> Any:
        """The learning rate for update ``step`` (0 for the first): a float for a
        Python number, a 0-d tensor of the step's dtype for a traced tensor."""
        if isinstance(step, Tensor):
            return self._traced(step)
        if isinstance(step, bool) or not isinstance(step, (int, float)) or not step >= 0:
            raise ArgumentError(
                f"optim.schedules.{self.kind}: the step must be a number >= 0 (updates "
                f"already done) or the traced step count, found {step!r}"
            )
        return self._value(float(step))

    def _value(self, t: float) -> float:
        peak, low, w = self.peak_lr, self.min_lr, self.warmup_steps
        if t < w:
            return peak * (t + 1) / w
        if self.total_steps is None:
            return peak
        if t >= self.total_steps:
            return low
        progress = (t - w) / (self.total_steps - w)
        if self.kind == "warmup_cosine":
            return low + 0.5 * (peak - low) * (1 + math.cos(math.pi * progress))
        return low + (peak - low) * (1 - progress)

    def _traced(self, t: Tensor) -> Tensor:
        if t.ndim != 0 or not t.dtype.is_float:
            raise ArgumentError(
                f"optim.schedules.{self.kind}: the traced step count must be a 0-d float "
                f"tensor, found {t.dtype} of shape {list(t.shape)}"
            )
        peak, low, w, total = self.peak_lr, self.min_lr, self.warmup_steps, self.total_steps
        if total is None:
            after = op.full((), peak, t.dtype)
        elif total == w:  # no decay phase
            after = op.full((), low, t.dtype)
        else:
            progress = op.minimum((t - float(w)) / float(total - w), 1.0)  # 1 from T on
            if self.kind == "warmup_cosine":
                after = (op.cos(progress * math.pi) + 1.0) * (0.5 * (peak - low)) + low
            else:
                after = (1.0 - progress) * (peak - low) + low
        if w == 0:
            return after
        warm = (t + 1.0) * peak / float(w)
        return op.where(op.less(t, float(w)), warm, after)


def _number(name: str, key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ArgumentError(
            f"optim.schedules.{name}: {key} must be a finite number, found {value!r}"
        )
    if value < 0:
        raise ArgumentError(f"optim.schedules.{name}: {key} must be >= 0, found {value!r}")
    return float(value)


def _count(name: str, key: str, value: Any, least: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ArgumentError(
            f"optim.schedules.{name}: {key} must be an int >= {least} (optimizer steps), "
            f"found {value!r}"
        )
    return value


def constant(lr: float) -> Schedule:
    """``lr`` at every step."""
    return Schedule("constant", _number("constant", "lr", lr))


def linear_warmup(peak_lr: float, warmup_steps: int) -> Schedule:
    """``peak_lr (t + 1) / warmup_steps`` for ``t < warmup_steps``, then ``peak_lr``."""
    name = "linear_warmup"
    return Schedule(
        name, _number(name, "peak_lr", peak_lr), _count(name, "warmup_steps", warmup_steps)
    )


def _decaying(
    name: str, peak_lr: float, warmup_steps: int, total_steps: int, min_lr: float
) -> Schedule:
    peak, low = _number(name, "peak_lr", peak_lr), _number(name, "min_lr", min_lr)
    warmup = _count(name, "warmup_steps", warmup_steps)
    total = _count(name, "total_steps", total_steps, least=1)
    if warmup > total:
        raise ArgumentError(
            f"optim.schedules.{name}: warmup_steps={warmup} is more than total_steps={total}; "
            f"the warmup is part of the total"
        )
    if low > peak:
        raise ArgumentError(
            f"optim.schedules.{name}: min_lr={min_lr!r} is above peak_lr={peak_lr!r}"
        )
    return Schedule(name, peak, warmup, total, low)


def warmup_cosine(
    peak_lr: float, warmup_steps: int, total_steps: int, min_lr: float = 0.0
) -> Schedule:
    """Linear warmup to ``peak_lr``, then a half cosine from ``peak_lr`` down to
    ``min_lr`` at ``total_steps`` (and ``min_lr`` after)."""
    return _decaying("warmup_cosine", peak_lr, warmup_steps, total_steps, min_lr)


def warmup_linear_decay(
    peak_lr: float, warmup_steps: int, total_steps: int, min_lr: float = 0.0
) -> Schedule:
    """Linear warmup to ``peak_lr``, then a straight line down to ``min_lr`` at
    ``total_steps`` (and ``min_lr`` after)."""
    return _decaying("warmup_linear_decay", peak_lr, warmup_steps, total_steps, min_lr)


__all__ = ["Schedule", "constant", "linear_warmup", "warmup_cosine", "warmup_linear_decay"]
