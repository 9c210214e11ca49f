"""Optimizers as graph ops: SGD (with momentum) and AdamW on pytrees of parameters.

They are plain functions of traced tensors, so a whole training step — forward,
``graph.backward`` and the update — compiles into one program (the updates become fused
elementwise kernels). State lives in pytrees of arrays that the step takes and returns;
``*_state(params)`` builds the initial state from the (torch) parameters::

    state = optim.adamw_state(params)
    params, state = step(params, state, batch)   # step calls optim.adamw inside

The update rules are torch.optim's (``SGD`` with ``dampening=0``; ``AdamW`` with decoupled
weight decay and bias correction).

:class:`SGD` and :class:`AdamW` bundle a rule with its hyper-parameters for
``graph.training_step(optimizer=...)``, which also needs to know how the state is laid
out (:meth:`state_layout`) to shard it for ZeRO.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from tessera import op
from tessera.errors import ArgumentError
from tessera.frontend import pytree


def _map(fn: Any, *trees: Any) -> Any:
    leaves = [pytree.flatten(t)[0] for t in trees]
    tree = pytree.flatten(trees[0])[1]
    return pytree.unflatten(tree, [fn(*xs) for xs in zip(*leaves, strict=True)])


def _zeros(params: Any) -> Any:
    return _map(lambda p: torch.zeros_like(torch.as_tensor(p)), params)


def sgd_state(params: Any) -> dict[str, Any]:
    """The momentum buffers of :func:`sgd` (zeros like the parameters)."""
    return {"momentum": _zeros(params)}


def sgd(
    params: Any,
    grads: Any,
    state: dict[str, Any] | None = None,
    lr: float = 1e-2,
    momentum: float = 0.0,
    weight_decay: float = 0.0,
) -> tuple[Any, dict[str, Any] | None]:
    """One SGD step: ``g += wd p; b = momentum b + g; p -= lr b`` (torch's first step
    sets ``b = g``, which zero-initialised buffers give too)."""
    if weight_decay:
        grads = _map(lambda g, p: g + p * weight_decay, grads, params)
    if momentum and state is None:
        raise ValueError("sgd with momentum needs its state: optim.sgd_state(params)")
    if momentum:
        buffers = _map(lambda b, g: b * momentum + g, state["momentum"], grads)  # type: ignore[index]
        return _map(lambda p, b: p - b * lr, params, buffers), {"momentum": buffers}
    return _map(lambda p, g: p - g * lr, params, grads), state


def adamw_state(params: Any) -> dict[str, Any]:
    """AdamW's state: the step count (a scalar: f64 when a parameter is f64, else f32)
    and the two moment estimates."""
    leaves = [torch.as_tensor(p) for p in pytree.flatten(params)[0]]
    wide = any(p.dtype == torch.float64 for p in leaves)
    step = torch.zeros((), dtype=torch.float64 if wide else torch.float32)
    return {"step": step, "m": _zeros(params), "v": _zeros(params)}


def adamw(
    params: Any,
    grads: Any,
    state: dict[str, Any],
    lr: float = 1e-3,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    weight_decay: float = 1e-2,
) -> tuple[Any, dict[str, Any]]:
    """One AdamW step (torch.optim.AdamW's update)."""
    beta1, beta2 = betas
    step = state["step"] + 1.0
    correction1 = 1.0 - op.power(op.full((), beta1, step.dtype), step)
    correction2 = 1.0 - op.power(op.full((), beta2, step.dtype), step)
    m = _map(lambda m, g: m * beta1 + g * (1.0 - beta1), state["m"], grads)
    v = _map(lambda v, g: v * beta2 + g * g * (1.0 - beta2), state["v"], grads)

    def update(p: Any, m: Any, v: Any) -> Any:
        decayed = p * (1.0 - lr * weight_decay)
        return decayed - (m / correction1) * lr / (op.sqrt(v / correction2) + eps)

    return _map(update, params, m, v), {"step": step, "m": m, "v": v}


def _check_hyperparameters(name: str, **values: float) -> None:
    """torch.optim's checks: every value a finite number >= 0 (betas below 1)."""
    for key, value in values.items():
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise ArgumentError(f"optim.{name}: {key} must be a number, found {value!r}")
        if not 0 <= value < (1 if key.startswith("beta") else math.inf):
            bound = "in [0, 1)" if key.startswith("beta") else "a finite number >= 0"
            raise ArgumentError(f"optim.{name}: {key} must be {bound}, found {value!r}")


@dataclass(frozen=True)
class SGD:
    """SGD with optional momentum and weight decay (torch.optim.SGD, ``dampening=0``)."""

    lr: float = 1e-2
    momentum: float = 0.0
    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        _check_hyperparameters(
            "SGD", lr=self.lr, momentum=self.momentum, weight_decay=self.weight_decay
        )

    def init(self, params: Any) -> dict[str, Any]:
        return sgd_state(params) if self.momentum else {}

    def update(self, params: Any, grads: Any, state: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        new_params, new_state = sgd(
            params, grads, state or None, self.lr, self.momentum, self.weight_decay
        )
        return new_params, new_state or {}

    def state_layout(self, like_params: Any, scalar: Any) -> dict[str, Any]:
        """The state's pytree with ``like_params`` for buffers shaped like the parameters
        and ``scalar`` for scalars."""
        return {"momentum": like_params} if self.momentum else {}


@dataclass(frozen=True)
class AdamW:
    """AdamW (torch.optim.AdamW): decoupled weight decay, bias-corrected moments."""

    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 1e-2

    def __post_init__(self) -> None:
        if not isinstance(self.betas, (tuple, list)) or len(self.betas) != 2:
            raise ArgumentError(f"optim.AdamW: betas must be a pair, found {self.betas!r}")
        _check_hyperparameters(
            "AdamW", lr=self.lr, beta1=self.betas[0], beta2=self.betas[1], eps=self.eps,
            weight_decay=self.weight_decay,
        )  # fmt: skip

    def init(self, params: Any) -> dict[str, Any]:
        return adamw_state(params)

    def update(self, params: Any, grads: Any, state: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        return adamw(params, grads, state, self.lr, self.betas, self.eps, self.weight_decay)

    def state_layout(self, like_params: Any, scalar: Any) -> dict[str, Any]:
        """The state's pytree with ``like_params`` for the moments and ``scalar`` for the
        step count."""
        return {"step": scalar, "m": like_params, "v": like_params}
