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

from dataclasses import dataclass
from typing import Any

import torch

from tessera import op
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
    """AdamW's state: the step count (an f32 scalar) and the two moment estimates."""
    return {"step": torch.zeros(()), "m": _zeros(params), "v": _zeros(params)}


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
    correction1 = 1.0 - op.power(op.full((), beta1), step)
    correction2 = 1.0 - op.power(op.full((), beta2), step)
    m = _map(lambda m, g: m * beta1 + g * (1.0 - beta1), state["m"], grads)
    v = _map(lambda v, g: v * beta2 + g * g * (1.0 - beta2), state["v"], grads)

    def update(p: Any, m: Any, v: Any) -> Any:
        decayed = p * (1.0 - lr * weight_decay)
        return decayed - (m / correction1) * lr / (op.sqrt(v / correction2) + eps)

    return _map(update, params, m, v), {"step": step, "m": m, "v": v}


@dataclass(frozen=True)
class SGD:
    """SGD with optional momentum and weight decay (torch.optim.SGD, ``dampening=0``)."""

    lr: float = 1e-2
    momentum: float = 0.0
    weight_decay: float = 0.0

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

    def init(self, params: Any) -> dict[str, Any]:
        return adamw_state(params)

    def update(self, params: Any, grads: Any, state: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        return adamw(params, grads, state, self.lr, self.betas, self.eps, self.weight_decay)

    def state_layout(self, like_params: Any, scalar: Any) -> dict[str, Any]:
        """The state's pytree with ``like_params`` for the moments and ``scalar`` for the
        step count."""
        return {"step": scalar, "m": like_params, "v": like_params}
