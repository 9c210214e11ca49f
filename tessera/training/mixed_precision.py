"""Mixed precision for ``graph.training_step``: compute in bf16, fp16 or fp8, keep the master
parameters and the optimizer state in f32, reduce gradients in f32 or in the compute
dtype, and scale an fp16 loss dynamically.

The step's program casts the f32 parameters (and float batch arguments) to the compute
dtype before the user's function, so the forward and backward run in it; the gradients
are cast to f32 before their reduction over dp (``reduce="f32"``) or after it
(``reduce="compute"``), and the optimizer updates the f32 parameters.

FP8 (``precision="fp8"``): bf16 as above, and every ``op.matmul`` (``@``, ``einsum``; not
``cumsum``'s, nor attention's, which stay bf16) is :func:`tessera.op.fp8_matmul`: its
operands quantised per tensor to e4m3 and its incoming gradient to e5m2, each with its
current scale ``amax / max`` (the whole tensor's over a mesh; a pipelined step's per
data-parallel rank and microbatch, as gradient accumulation's per microbatch), the
operands' e4m3 values multiplied with f32 accumulation and rescaled. The quantisation is
quantise–dequantise (``graph.fp8_quantize``: torch's float8 casts on the reference
kernels, f32 arithmetic in Triton kernels); the forward matmuls' Triton kernels dot in fp8
where :func:`tessera.precision.fp8_dots` says so (compute capability 8.9 and later).
Delayed scaling (``Precision(fp8_scaling="delayed")``): each fp8 tensor's scale comes from
its amax history (:class:`tessera.op.Fp8History`; the gradients' amaxes reach it as the
gradients of probes, ``graph.fp8_grad_delayed``), kept in the optimizer state by
:class:`Fp8Delayed` and updated by the step (:func:`updated_history`).

Dynamic loss scaling (fp16's default, as ``torch.amp.GradScaler``): ``graph.backward``
seeds the loss's cotangent with the scale, so the backward computes the gradients of
``scale · loss``; the step divides them by the scale; if any is inf or NaN the update is
skipped (parameters and optimizer state keep their values) and the scale is multiplied by
``backoff_factor``, else after ``growth_interval`` finite steps in a row it is multiplied
by ``growth_factor``. The scale and the count of finite steps live in the optimizer state
(``opt_state["loss_scale"]``), so they are saved and sharded with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from xdsl.dialects.builtin import UnitAttr

from tessera import op
from tessera.analysis.reduction_points import REDUCE_WIDENED
from tessera.errors import TesseraError
from tessera.frontend import pytree
from tessera.frontend.tracer import Tensor
from tessera.ir.sharding import Sharding
from tessera.precision import Precision  # defined there, below the compile driver


def widened(grad: Tensor, dtype: Any) -> Tensor:
    """``grad`` cast to ``dtype`` (f32), tagged so that its partial sums are reduced
    after the cast, in f32 (``tessera.analysis.reduction_points``)."""
    wide = op.astype(grad, dtype)
    if wide is not grad:
        wide.value.owner.attributes[REDUCE_WIDENED] = UnitAttr()  # type: ignore[union-attr]
    return wide


def to_compute(tree: Any, precision: Precision) -> Any:
    """``tree`` with its f32 tensors cast to the compute dtype."""
    if not precision.mixed:
        return tree
    leaves, structure = pytree.flatten(tree)
    return pytree.unflatten(
        structure,
        [
            op.astype(x, precision.dtype)
            if isinstance(x, Tensor) and x.aval.dtype.name == "f32"
            else x
            for x in leaves
        ],
    )


@dataclass(frozen=True)
class LossScaled:
    """An optimizer whose update is skipped on non-finite gradients, with the loss scale
    in its state: ``{"optimizer": <inner state>, "loss_scale": {"scale", "good_steps"}}``."""

    inner: Any
    precision: Precision

    def init(self, params: Any) -> dict[str, Any]:
        scale = self.precision.loss_scale
        start = self.precision.init_scale if scale == "dynamic" else float(scale)  # type: ignore[arg-type]
        return {
            "optimizer": self.inner.init(params),
            "loss_scale": {"scale": torch.tensor(start), "good_steps": torch.tensor(0.0)},
        }

    def state_layout(self, like_params: Any, scalar: Any) -> dict[str, Any]:
        return {
            "optimizer": self.inner.state_layout(like_params, scalar),
            "loss_scale": {"scale": scalar, "good_steps": scalar},
        }

    def update(
        self, params: Any, grads: Any, state: dict[str, Any], finite: Tensor | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """The inner update where every (unscaled) gradient is finite, else the old
        state; the next loss scale. ``finite`` (a bool scalar) says whether the gradients
        are finite when they are not all here (a pipeline rank updates its stages'
        parameters only; the check spans every stage)."""
        if finite is None:
            finite = all_finite(pytree.flatten(grads)[0])
        new_params, new_state = self.inner.update(params, grads, state["optimizer"])
        keep = lambda new, old: op.where(finite, new, old)  # noqa: E731
        new_params = _map(keep, new_params, params)
        new_state = _map(keep, new_state, state["optimizer"])
        scale, good = state["loss_scale"]["scale"], state["loss_scale"]["good_steps"]
        if self.precision.loss_scale == "dynamic":
            p = self.precision
            grown = op.where(good + 1.0 >= p.growth_interval, scale * p.growth_factor, scale)
            scale = op.where(finite, grown, scale * p.backoff_factor)
            good = op.where(
                finite,
                op.where(good + 1.0 >= p.growth_interval, good * 0.0, good + 1.0),
                good * 0.0,
            )
        return new_params, {
            "optimizer": new_state,
            "loss_scale": {"scale": scale, "good_steps": good},
        }


def nonfinite_probe(grads: Any) -> Tensor:
    """A scalar that is NaN when any gradient holds an inf or NaN, else 0 (inf · 0 and
    NaN · 0 are NaN)."""
    total = None
    for g in grads:
        term = op.sum(g * 0.0)
        total = term if total is None else total + term
    assert total is not None, "a training step has parameters"
    return total


def all_finite(grads: Any) -> Tensor:
    """A bool scalar: whether every gradient is finite."""
    probe = nonfinite_probe(grads)
    return op.equal(probe, probe)


def _map(fn: Any, *trees: Any) -> Any:
    leaves = [pytree.flatten(t)[0] for t in trees]
    return pytree.unflatten(
        pytree.flatten(trees[0])[1], [fn(*xs) for xs in zip(*leaves, strict=True)]
    )


@dataclass(frozen=True)
class Fp8Delayed:
    """An optimizer whose state also holds the amax histories of delayed fp8 scaling:
    ``{"optimizer": <inner state>, "fp8": {"amax_history": [tensors, amax_history]}}``, one
    row per fp8 tensor of the step (most recent amax first). The rows are counted when
    the step first traces (:meth:`tessera.training.TrainingStep.lower`): ``init`` makes none."""

    inner: Any
    precision: Precision

    def init(self, params: Any) -> dict[str, Any]:
        history = torch.zeros(0, self.precision.amax_history)
        return {"optimizer": self.inner.init(params), "fp8": {"amax_history": history}}

    def state_layout(self, like_params: Any, scalar: Any) -> dict[str, Any]:
        return {
            "optimizer": self.inner.state_layout(like_params, scalar),
            "fp8": {"amax_history": Sharding(((), ()))},  # replicated
        }

    def update(self, params: Any, grads: Any, state: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        """The inner update; the histories as they were (the step writes the new ones)."""
        new_params, new_state = self.inner.update(params, grads, state["optimizer"])
        return new_params, {"optimizer": new_state, "fp8": state["fp8"]}


def updated_history(history: Tensor, amaxes: list[Tensor | None]) -> Tensor:
    """``history`` with this step's amaxes first and its oldest column dropped."""
    if len(amaxes) != history.aval.shape[0] or any(a is None for a in amaxes):
        raise TesseraError(
            f"fp8 delayed scaling: the step quantised {len(amaxes)} fp8 tensors (with every "
            f"gradient's through graph.backward) for an amax history of "
            f"{history.aval.shape[0]} rows"
        )
    column = op.reshape(op.stack([a for a in amaxes if a is not None]), (len(amaxes), 1))
    length = history.aval.shape[1]
    if length == 1:
        return column
    return op.concat([column, op.slice(history, (0, 0), (len(amaxes), length - 1))], axis=1)
