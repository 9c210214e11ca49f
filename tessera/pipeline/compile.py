"""Compiling a pipelined training step: :class:`PipelineCompiler` traces the forward of
one microbatch, splits it into ``pp × virtual`` stages (:mod:`tessera.pipeline.split`),
compiles each stage's forward and backward programs (:mod:`tessera.pipeline.programs`),
builds every pipeline rank's action list from the schedule and each rank's optimizer
update (:mod:`tessera.pipeline.update`), once per parameter structure, batch signature
and schedule options (:class:`CompiledPipeline`). :mod:`tessera.pipeline.step` runs
them."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from tessera import numerics, op, schedule
from tessera.driver import CompileConfig
from tessera.dtypes import as_dtype
from tessera.errors import ShardingError, TesseraError, TraceError
from tessera.frontend import pytree
from tessera.frontend.tracer import Tensor, Trace, tracing
from tessera.ir import pipeline_actions as A
from tessera.ir.abstract import AbstractTensor
from tessera.ir.sharding import Sharding
from tessera.jit_function import broadcast_prefix, default_kernels
from tessera.pipeline.programs import StagePrograms, stage_programs
from tessera.pipeline.split import balanced_cuts, cut_before_casts, plan_stages, sink_casts
from tessera.pipeline.update import UpdateBuilder, leaf_dtype, stats_dtype
from tessera.training import (
    StepTrace,
    TrainingStep,
    TrainState,
    leaf_paths,
    metric_dtype,
    tracing_step,
)
from tessera.training.mixed_precision import to_compute

if TYPE_CHECKING:
    from tessera.program import Lowered


@dataclass
class CompiledPipeline:
    """A pipelined step for one parameter structure and batch signature."""

    stages: list[StagePrograms]
    lists: list[list[A.Action]]  # per pipeline rank
    pipeline_ir: Any  # the schedule.pipeline op the lists were read from
    updates: list[Lowered]  # per pipeline rank: the optimizer update of its parameters
    update_params: list[list[int]]  # per pipeline rank: the parameters it updates
    param_layouts: list[Sharding]
    microbatches: int
    cuts: list[int]
    metric_tree: pytree.TreeDef
    metric_dtypes: list[torch.dtype]  # each metric's reported dtype (at least float32)
    # per pipeline rank, when the update needs every stage's gradients (clipping by the
    # global norm, the loss scale's overflow check): the program reducing the gradients
    # and computing this rank's share of the global statistics (see _reduce_program)
    reductions: list[Lowered | None]
    batch_tree: pytree.TreeDef | None = None  # the batch arguments' structure
    stats_dtype: torch.dtype = torch.float32  # the global statistics' dtype (the masters')
    batch_layouts: list[Sharding] = dataclasses.field(default_factory=list)  # in a stage


class PipelineCompiler:
    """The compile half of a pipelined :class:`~tessera.training.TrainingStep`."""

    def __init__(self, step: TrainingStep, pp_axis: str):
        self.step = step
        self.mesh = step.mesh
        self.pp_axis = pp_axis
        self.ranks = self.mesh.axis_size(pp_axis)
        self.dp = self.mesh.axis_size(step.dp_axis) if step.dp_axis else 1
        self._cache: dict[Any, CompiledPipeline] = {}

    def compiled(self, state: TrainState, batch: Sequence[Any]) -> CompiledPipeline:
        """The programs for ``state``'s parameters and ``batch``'s signature (cached)."""
        options = schedule.current()
        mode = self.step.numerics or numerics.mode()
        m, kind, virtual = (
            options.pipeline_microbatches,
            options.pipeline_schedule,
            options.pipeline_virtual,
        )
        leaves, tree = pytree.flatten(state.params)
        batch_leaves, batch_tree, paths = self._batch_leaves(batch)
        chunks = m * self.step.accumulate
        batch_avals = [
            self._microbatch_aval(b, path, m) for b, path in zip(batch_leaves, paths, strict=True)
        ]
        key = (
            tree,
            tuple(AbstractTensor(tuple(x.shape), leaf_dtype(x)) for x in leaves),
            batch_tree,
            tuple(batch_avals),
            options,
            mode,
            chunks,
        )
        if key not in self._cache:
            with numerics.mode_of(mode):  # read into every program's config
                self._cache[key] = self._compile(
                    state, tree, leaves, batch_avals, m, kind, virtual, options, batch_tree
                )
        return self._cache[key]

    def _batch_leaves(self, batch: Sequence[Any]) -> tuple[list[Any], pytree.TreeDef, list[str]]:
        """The batch arguments' tensors (pytrees of them: tuples, lists, dicts), their
        structure and a name for each."""
        leaves, tree = pytree.flatten(tuple(batch))
        paths = [f"batch argument {p}" for p in leaf_paths(tree)]
        for leaf, path in zip(leaves, paths, strict=True):
            if not isinstance(leaf, (torch.Tensor, np.ndarray)):
                raise TesseraError(
                    f"{self.step.__name__}: {path} is a {type(leaf).__name__}; a pipelined "
                    f"step's batch holds tensors (split into microbatches along dim 0)"
                )
        return leaves, tree, paths

    def _batch_layouts(
        self, batch_tree: pytree.TreeDef, avals: list[AbstractTensor]
    ) -> list[Sharding]:
        """Each batch leaf's layout inside a stage: ``batch_shardings`` without the
        data-parallel axis, which the pipeline splits dim 0 over itself (it must come
        first on dim 0); replicated without ``batch_shardings``."""
        step = self.step
        if step.batch_shardings is None:
            return [Sharding.replicated(len(a.shape)) for a in avals]
        count = len(batch_tree.children)
        specs = [
            spec
            for argument, prefix in zip(batch_tree.children, step._batch_specs(count), strict=True)
            for spec in broadcast_prefix(prefix, argument, "batch_shardings")
        ]
        paths = [f"batch argument {p}" for p in leaf_paths(batch_tree)]
        layouts = []
        for spec, aval, path in zip(specs, avals, paths, strict=True):
            if spec is None:
                layouts.append(Sharding.replicated(len(aval.shape)))
                continue
            rows = aval.shape[0] * self.dp  # one microbatch over every dp rank
            try:
                whole = spec.to_sharding(self.mesh, (rows, *aval.shape[1:]), "")
            except ShardingError as error:
                raise ShardingError(
                    f"{step.__name__}: batch_shardings of {path}: one microbatch holds "
                    f"{aval.shape[0]} rows per {self.dp} data-parallel rank(s) "
                    f"({rows} in all, the batch over microbatches and accumulation rounds), "
                    f"{str(error).removeprefix(': ')}; use a larger batch or fewer microbatches"
                ) from None
            if self.pp_axis in whole.split_axes:
                raise ShardingError(
                    f"{step.__name__}: batch_shardings split {path} over the pipeline axis "
                    f"{self.pp_axis!r}; a pipelined step's stages each read the whole microbatch"
                )
            dp = step.dp_axis
            if dp in whole.split_axes and (dp not in whole.dims[0] or whole.dims[0][0] != dp):
                raise ShardingError(
                    f"{step.__name__}: batch_shardings split {path} over {dp!r} other than "
                    f"first on dim 0; a pipelined step splits dim 0 over {dp!r} into "
                    f"microbatches itself (e.g. partition=(0,), mesh_axes=(({dp!r}, 'ep'),))"
                )
            dims = [tuple(a for a in d if a != dp) for d in whole.dims]
            layout = Sharding(tuple(dims))
            layout.validate(self.mesh, aval.shape, f"{step.__name__}: {path} (one microbatch)")
            layouts.append(layout)
        return layouts

    def _microbatch_aval(self, value: Any, path: str, m: int) -> AbstractTensor:
        tensor = torch.as_tensor(value)
        rows = tensor.shape[0] if tensor.dim() else 0
        k = self.step.accumulate
        if tensor.dim() == 0 or rows % (self.dp * m * k):
            rounds = f" x accumulate={k}" if k > 1 else ""
            raise ShardingError(
                f"{self.step.__name__}: {path} has {rows} rows (dim 0), which must split "
                f"evenly over {self.dp} data-parallel ranks x {m} microbatches{rounds}"
            )
        return AbstractTensor((rows // (self.dp * m * k), *tensor.shape[1:]), leaf_dtype(tensor))

    def _compile(
        self, state: TrainState, tree: pytree.TreeDef, leaves: list[torch.Tensor],
        batch_avals: list[AbstractTensor], m: int, kind: str, virtual: int, options: Any,
        batch_tree: pytree.TreeDef,
    ) -> CompiledPipeline:  # fmt: skip
        from tessera.transforms.pipeline_schedules import actions_of, pipeline_op, pipeline_schedule

        step = self.step
        name = step.__name__
        layouts = step._layouts(leaves, tree).compute
        for path, layout in enumerate(layouts):
            if self.pp_axis in layout.split_axes:
                raise ShardingError(
                    f"{name}: param_shardings split parameter {path} over the pipeline axis "
                    f"{self.pp_axis!r}; stages own whole parameters"
                )
        count = self.ranks * virtual
        precision = step.precision
        # trace the forward of one microbatch (graph.backward records the loss only); with
        # loss scaling one more argument, the scale, multiplies the loss the backward seeds
        param_avals = [AbstractTensor(tuple(x.shape), leaf_dtype(x)) for x in leaves]
        scale_avals = [AbstractTensor((), as_dtype(torch.float32))] if precision.scaled else []
        trace = Trace(name, [*param_avals, *batch_avals, *scale_avals], mesh=self.mesh)
        args = list(trace.block.args)
        n, b = len(leaves), len(batch_avals)
        params = pytree.unflatten(tree, [Tensor(trace, a) for a in args[:n]])
        batch = [Tensor(trace, a) for a in args[n : n + b]]
        recorded: list[Tensor] = []  # graph.backward records the loss, not differentiating
        with tracing(trace):
            # mixed precision: the stages compute in the compute dtype from f32 masters
            params, batch = to_compute(params, precision), to_compute(batch, precision)
            casts = list(trace.block.ops)
            with (
                tracing_step(StepTrace(params, step.remat, recorded=recorded)),
                op.fp8_matmuls(precision.fp8),
            ):
                returned = step.fn(params, *pytree.unflatten(batch_tree, batch))
            if not (isinstance(returned, tuple) and len(returned) == 2) or not recorded:
                raise TraceError(f"{name} must return (graph.backward(loss), metrics)")
            loss = recorded[-1]
            metric_leaves, metric_tree = pytree.flatten(returned[1])
            for leaf in metric_leaves:
                if not isinstance(leaf, Tensor) or leaf.aval.shape != ():
                    raise TraceError(
                        f"{name}: a pipelined step reports scalar metrics only (each the mean "
                        f"over microbatches and data-parallel ranks), found {leaf!r}; reduce "
                        f"it to a scalar (op.mean) or compute it outside the step"
                    )
            if precision.scaled:  # the gradients of scale · loss, seeded as graph.backward does
                loss = loss * op.astype(Tensor(trace, args[-1]), loss.aval.dtype)
        outputs = [loss.value, *(t.value for t in metric_leaves)]
        metric_dtypes = [metric_dtype(t.aval.dtype.to_torch()) for t in metric_leaves]
        traced = list(trace.block.ops)
        marked = [traced[p] if p < len(traced) else None for p in trace.stage_marks]
        batch_layouts = self._batch_layouts(batch_tree, batch_avals)
        forward = sink_casts(traced, casts)
        marks = [
            cut_before_casts(forward, forward.index(o) if o else len(forward), casts)
            for o in marked
        ]
        if marks and len(marks) != count - 1:
            raise TraceError(
                f"{name}: {len(marks)} graph.stage() marks make {len(marks) + 1} stages, but the "
                f"mesh's {self.pp_axis}={self.ranks} x virtual={virtual} needs {count}"
            )
        topology = self.mesh.machine(options.topology)
        cuts = list(marks) if marks else balanced_cuts(forward, outputs, count, topology)
        cuts = [cut_before_casts(forward, c, casts) for c in cuts]
        plan = plan_stages(forward, cuts, outputs)
        kernels = step.kernels or default_kernels()
        split = kind == "zb-h1"
        config = CompileConfig(
            self.mesh, kernels, options, numerics.mode(), **step.compile_options()
        )
        stages = stage_programs(
            name,
            plan,
            args[:n],
            layouts,
            args[n:],
            outputs,
            split,
            config,
            [*batch_layouts, *(Sharding(()) for _ in scale_avals)],
        )
        actions = pipeline_schedule(kind, self.ranks, m, virtual)
        ir = pipeline_op(kind, self.ranks, m, virtual, actions)
        ir.verify()
        lists = actions_of(ir)
        grad_layouts: dict[int, Sharding] = {}
        for s in stages:
            for position, p in enumerate(s.params):
                grad_layouts.setdefault(p, s.param_grad_layouts[position])
        updates: list[Lowered] = []
        reductions: list[Lowered | None] = []
        update_params: list[list[int]] = []
        counted: set[int] = set()  # a tied parameter's gradient counts once in the norm
        for rank in range(self.ranks):
            owned = sorted(
                {p for s in stages if A.rank_of(s.index, self.ranks) == rank for p in s.params}
            )
            update = UpdateBuilder(self, state, leaves, owned, layouts, grad_layouts, m, kernels)
            reductions.append(update.reduction([p for p in owned if p not in counted]))
            counted.update(owned)
            updates.append(update.update())
            update_params.append(owned)
        return CompiledPipeline(
            stages, lists, ir, updates, update_params, layouts, m, cuts, metric_tree,
            metric_dtypes, reductions, batch_tree, stats_dtype(leaves), batch_layouts,
        )  # fmt: skip
