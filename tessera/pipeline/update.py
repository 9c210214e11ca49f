"""One pipeline rank's optimizer update, as programs: :class:`UpdateBuilder` compiles the
update of the parameters the rank's stages own (and, when the update needs the whole
model's gradients, a reduction program before it), over the optimizer state of just
those parameters (:func:`state_subset`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from tessera import op
from tessera.dist.collectives import shard
from tessera.dist.shard_spec import ShardSpec
from tessera.dist.tensor import DistTensor
from tessera.dtypes import as_dtype
from tessera.errors import TesseraError
from tessera.frontend import pytree
from tessera.frontend.tracer import Tensor
from tessera.ir.sharding import Sharding
from tessera.jit_function import JitFunction
from tessera.optim import decay_mask
from tessera.training import TrainState, zero_sharding
from tessera.training.grad_clip import clip_to_norm, squared_norm
from tessera.training.mixed_precision import LossScaled, nonfinite_probe

if TYPE_CHECKING:
    from tessera.pipeline.compile import PipelineCompiler
    from tessera.program import Lowered


def leaf_dtype(value: Any) -> Any:
    return as_dtype(value.dtype if isinstance(value, DistTensor) else torch.as_tensor(value).dtype)


@dataclass(frozen=True)
class _Slot:
    """Stands for one parameter (``index``) or a scalar (``None``) in a state layout."""

    index: int | None


def state_subset(optimizer: Any, opt_state: Any, count: int, owned: list[int]) -> Any:
    """The optimizer state of the parameters ``owned`` (of ``count``), as a pytree of the
    original state tensors (shared, not copied)."""
    slots = pytree.flatten(optimizer.state_layout([_Slot(i) for i in range(count)], _Slot(None)))[0]
    state_leaves = pytree.flatten(opt_state)[0]
    if len(state_leaves) != len(slots):
        raise TesseraError("the optimizer state does not match the optimizer's state layout")
    queues: dict[_Slot, list[Any]] = {}
    for slot, leaf in zip(slots, state_leaves, strict=True):
        queues.setdefault(slot, []).append(leaf)
    subset = optimizer.state_layout([_Slot(i) for i in owned], _Slot(None))
    subset_slots, subset_tree = pytree.flatten(subset)
    taken: dict[_Slot, int] = {}
    picked = []
    for slot in subset_slots:
        picked.append(queues[slot][taken.get(slot, 0)])
        taken[slot] = taken.get(slot, 0) + 1
    return pytree.unflatten(subset_tree, picked)


def owned_optimizer(optimizer: Any, params: Any, owned: list[int]) -> Any:
    """``optimizer`` for the list of parameters ``owned`` (leaf indices of ``params``):
    a ``weight_decay_mask`` becomes those parameters' flags."""
    inner = optimizer.inner if isinstance(optimizer, LossScaled) else optimizer
    mask = getattr(inner, "weight_decay_mask", None)
    if mask is None:
        return optimizer
    flags = decay_mask(mask, params, f"optim.{type(inner).__name__}")
    inner = dataclasses.replace(inner, weight_decay_mask=[flags[i] for i in owned])
    return LossScaled(inner, optimizer.precision) if isinstance(optimizer, LossScaled) else inner


def stats_dtype(leaves: Sequence[torch.Tensor]) -> torch.dtype:
    """The widest parameter dtype: that of the gradients' global statistics."""
    dtype = torch.float32
    for leaf in leaves:
        dtype = torch.promote_types(dtype, leaf_dtype(leaf).to_torch())
    return dtype


class UpdateBuilder:
    """One pipeline rank's update: the optimizer step of the parameters its stages own.

    The gradients arrive summed over microbatches on each (dp, tp) member, stacked along a
    leading dim split over dp; their sum over it is the data-parallel reduction, which
    the sharding passes make an all-reduce, or a reduce-scatter into the shard each rank
    updates under ``zero=2`` (the optimizer state is sharded over dp from ``zero=1`` on,
    as in the unpipelined step). When the update depends on every stage's gradients
    (``clip_grad_norm``, fp16 loss scaling), it is split in two: a reduction program
    (gradients reduced and unscaled, this rank's share of ``[Σ g·0, Σ g²]``) and the
    update proper, which reads the shares summed over pipeline ranks."""

    def __init__(
        self, pipeline: PipelineCompiler, state: TrainState, leaves: list[torch.Tensor],
        owned: list[int], layouts: list[Sharding], grad_layouts: dict[int, Sharding],
        m: int, kernels: str,
    ):  # fmt: skip
        step = self.step = pipeline.step
        self.mesh, self.kernels, self.owned = pipeline.mesh, kernels, owned
        self.mean = 1.0 / (m * step.accumulate * pipeline.dp)
        self.params = [leaves[i] for i in owned]
        self.masters = [leaf_dtype(x) for x in self.params]
        self.opt_state = state_subset(step.optimizer, state.opt_state, len(leaves), owned)
        self.optimizer = owned_optimizer(step.optimizer, state.params, owned)
        dp = step.dp_axis
        self.compute = [layouts[i] for i in owned]
        sharded = [
            zero_sharding(layout, tuple(x.shape), self.mesh, dp) if dp else layout
            for layout, x in zip(self.compute, self.params, strict=True)
        ]
        self.state_layouts = sharded if step.zero >= 1 else self.compute
        self.grad_layouts = sharded if step.zero >= 2 else self.compute
        self.stacked = [Sharding(((dp,) if dp else (), *grad_layouts[i].dims)) for i in owned]
        self.dp = pipeline.dp
        self.global_stats = step.clip_grad_norm is not None or step.precision.scaled
        self.stats_dtype = stats_dtype(leaves)

    def _specs(self, layouts: Sequence[Sharding]) -> list[ShardSpec]:
        return [ShardSpec.from_sharding(s) for s in layouts]

    def _reduced(self, stacked: list[Tensor], scale: Tensor | None) -> list[Tensor]:
        """The mean gradients over microbatches and dp ranks (unscaled), as the optimizer
        consumes them."""
        precision = self.step.precision
        totals = []
        for g, want, master in zip(stacked, self.grad_layouts, self.masters, strict=True):
            if precision.mixed and precision.reduce == "compute":
                g = op.astype(g, precision.dtype)
            total = op.astype(shard(op.sum(g, axis=0), want), master) * self.mean
            totals.append(total if scale is None else total / op.astype(scale, master))
        return totals

    def _grads_like(self) -> list[torch.Tensor]:
        return [torch.empty((self.dp, *x.shape), dtype=x.dtype) for x in self.params]

    def reduction(self, counted: list[int]) -> Lowered | None:
        """The reduction program (when the update needs global statistics): stacked
        gradients (and the loss scale) → reduced gradients, ``Σ g·0`` and ``Σ g²`` over
        the gradients ``counted`` here (a parameter shared by several pipeline ranks is
        counted on the first)."""
        if not self.global_stats or not self.owned:
            return None
        positions = [self.owned.index(p) for p in counted]
        scaled, dtype = self.step.precision.scaled, self.stats_dtype

        def reduce(grads: list[Any], *scale: Any) -> Any:
            totals = self._reduced(grads, scale[0] if scaled else None)
            mine = [op.astype(totals[i], dtype) for i in positions]
            if not mine:
                zero = op.zeros((), dtype)
                return totals, zero, zero
            return totals, nonfinite_probe(mine), squared_norm(mine)

        reduce.__name__ = f"{self.step.__name__}_reduce"
        scale_args = [torch.tensor(1.0)] if scaled else []
        jitted = JitFunction(
            reduce, mesh=self.mesh, kernels=self.kernels,
            in_shardings=(self._specs(self.stacked), *([None] * len(scale_args))),
            out_shardings=(self._specs(self.grad_layouts), None, None),
            compile_options=self.step.compile_options(),
        )  # fmt: skip
        return jitted.lower(self._grads_like(), *scale_args)

    def update(self) -> Lowered:
        """The update program: parameters, their optimizer state, the gradients (stacked,
        or reduced by :meth:`reduction`, then followed by the global statistics) → the new
        parameters and state."""
        step, optimizer = self.step, self.optimizer
        clip, scaled = step.clip_grad_norm, step.precision.scaled

        def update(params: list[Any], opt_state: Any, grads: list[Any], *stats: Any) -> Any:
            if not self.global_stats:
                return optimizer.update(params, self._reduced(grads, None), opt_state)
            probe, squares = stats
            if clip is not None:
                grads = clip_to_norm(grads, op.sqrt(squares), clip)
            if scaled:
                return optimizer.update(params, grads, opt_state, finite=op.equal(probe, probe))
            return optimizer.update(params, grads, opt_state)

        update.__name__ = f"{step.__name__}_update"
        param_specs = self._specs(self.compute)
        state_specs = optimizer.state_layout(self._specs(self.state_layouts), None)
        if self.global_stats:
            grads = [torch.empty(tuple(x.shape), dtype=x.dtype) for x in self.params]
            grad_specs = self._specs(self.grad_layouts)
            stats = [torch.zeros((), dtype=self.stats_dtype)] * 2
        else:
            grads, grad_specs, stats = self._grads_like(), self._specs(self.stacked), []
        jitted = JitFunction(
            update, mesh=self.mesh, kernels=self.kernels, donate_argnums=(0, 1),
            in_shardings=(param_specs, state_specs, grad_specs, *([None] * len(stats))),
            out_shardings=(param_specs, state_specs),
            compile_options=self.step.compile_options(),
        )  # fmt: skip
        return jitted.lower(self.params, self.opt_state, grads, *stats)
