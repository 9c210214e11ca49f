"""The precision policy of a training step (:class:`Precision`): the dtype it computes in,
the dtype its gradients are reduced in, and its loss scaling. The policy is part of a
compiled program's configuration (``tessera.driver.CompileConfig``);
:mod:`tessera.training.mixed_precision` applies it while tracing."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from tessera import environment
from tessera.errors import TesseraError

# fp8: matmuls in (emulated) fp8 with per-tensor current scaling, the rest in bf16
COMPUTE_DTYPES = {
    "f32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.bfloat16,
}  # fmt: skip
REDUCE_OPTIONS = ("f32", "compute")
FP8_SCALINGS = ("current", "delayed")


@dataclass(frozen=True)
class Precision:
    """A training step's precision policy (see :mod:`tessera.training.mixed_precision`). ``loss_scale``:
    ``"dynamic"``, a fixed float, or None (no scaling); default dynamic for fp16.
    ``fp8_scaling`` (fp8 only): ``"current"`` (each tensor's own amax, the default) or
    ``"delayed"`` (as Transformer Engine's ``DelayedScaling``: each fp8 tensor's scale is
    ``max(its last amax_history amaxes) · 2^fp8_margin / fp8 max``, the history kept in
    the training state, ``opt_state["fp8"]``)."""

    compute: str = "f32"
    reduce: str = "f32"
    loss_scale: str | float | None = "default"
    init_scale: float = 2.0**16
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    fp8_scaling: str = "current"
    amax_history: int = 16
    fp8_margin: int = 0

    def __post_init__(self) -> None:
        if self.compute not in COMPUTE_DTYPES:
            raise TesseraError(
                f"precision: compute must be one of {tuple(COMPUTE_DTYPES)}, found {self.compute!r}"
            )
        if self.reduce not in REDUCE_OPTIONS:
            raise TesseraError(
                f"precision: reduce must be one of {REDUCE_OPTIONS}, found {self.reduce!r}"
            )
        if self.fp8_scaling not in FP8_SCALINGS:
            raise TesseraError(
                f"precision: fp8_scaling must be one of {FP8_SCALINGS}, found {self.fp8_scaling!r}"
            )
        if self.fp8_scaling == "delayed" and self.compute != "fp8":
            raise TesseraError(
                f"precision: fp8_scaling='delayed' needs compute='fp8', found {self.compute!r}"
            )
        for name in ("amax_history", "fp8_margin"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < (1 if name == "amax_history" else 0):
                raise TesseraError(
                    f"precision: {name} must be an int of at least "
                    f"{1 if name == 'amax_history' else 0}, found {value!r}"
                )
        if self.loss_scale == "default":
            object.__setattr__(self, "loss_scale", "dynamic" if self.compute == "fp16" else None)
        scale = self.loss_scale
        if not (scale is None or scale == "dynamic" or isinstance(scale, (int, float))):
            raise TesseraError(
                f"precision: loss_scale must be 'dynamic', a number or None, found {scale!r}"
            )

    @staticmethod
    def of(value: Precision | str | None) -> Precision:
        """A policy from a policy, a compute dtype name or None (f32)."""
        if isinstance(value, Precision):
            return value
        if value is None:
            return Precision()
        if isinstance(value, str):
            return Precision(value)
        raise TesseraError(
            f"precision must be a graph.Precision or one of {tuple(COMPUTE_DTYPES)}, found {value!r}"
        )

    @property
    def dtype(self) -> torch.dtype:
        return COMPUTE_DTYPES[self.compute]

    @property
    def mixed(self) -> bool:
        return self.compute != "f32"

    @property
    def fp8(self) -> bool:
        """Whether matmuls compute in fp8 (:func:`tessera.op.fp8_matmul`)."""
        return self.compute == "fp8"

    @property
    def delayed(self) -> bool:
        """Whether fp8 scales come from amax histories (delayed scaling)."""
        return self.fp8_scaling == "delayed"

    @property
    def scaled(self) -> bool:
        return self.loss_scale is not None


def fp8_dots() -> bool:
    """Whether fp8 matmuls traced now multiply in fp8 in the generated kernels
    (``graph.matmul``'s ``fp8`` property): ``TESSERA_FP8_DOTS`` ``on`` or ``off``, else
    (``auto``) on a CUDA GPU of compute capability 8.9 or later (Ada, Hopper, Blackwell)
    and not under Triton's interpreter."""
    setting = environment.fp8_dots()
    if setting != "auto":
        return setting == "on"
    interpreted = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    return (
        not interpreted
        and torch.cuda.is_available()
        and torch.cuda.get_device_capability() >= (8, 9)
    )


__all__ = ["COMPUTE_DTYPES", "FP8_SCALINGS", "REDUCE_OPTIONS", "Precision", "fp8_dots"]
