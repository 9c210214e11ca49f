"""``graph.training_step`` on a mesh with a pipeline axis: microbatches through stages.

When the mesh has the step's ``pp_axis`` (``"pp"`` by default), a training step is
pipelined. The forward pass is traced once for one microbatch and split into
``pp × virtual`` stages (:mod:`tessera.pipeline.split`: the user's ``graph.stage()``
marks, or a cost-balanced split); each stage gets its forward and backward programs
(:mod:`tessera.pipeline.programs`), and pipeline rank ``r`` (coordinate ``r`` along
``pp``) owns stages ``r, r + pp, …``. The schedule set with
``schedule.pipeline_microbatches(m, kind=..., virtual=...)`` gives every pipeline rank
its list of actions, built as the Schedule IR's ``schedule.pipeline`` op and run from it
(:mod:`tessera.pipeline.runtime`).

The batch is split over the data-parallel axis (dim 0), then into ``m`` microbatches;
gradients are summed over microbatches on each rank, then (in the update program, one per
pipeline rank) over data-parallel ranks and scaled by ``1 / (m · dp)``, so the step
computes the gradient of the mean loss over the whole batch, as the unpipelined step
does. A parameter used by stages on several pipeline ranks (tied embeddings) has its
gradient summed across them before each updates its copy. Reported metrics are the mean
over microbatches and data-parallel ranks, as 0-d tensors in at least float32.

Every option of the step applies: ``precision`` casts the parameters and float batch
leaves to the compute dtype at the start of the traced forward, each cast moved into the
stage that first uses it (:func:`_sink`), and with loss scaling the last stage seeds its
backward with the scale; ``accumulate=k`` runs the schedule k times (rounds of m
microbatches) before the update; ``zero=1``/``2`` shard the optimizer state (and the
reduced gradients) over dp in the update programs; ``clip_grad_norm`` and the loss
scale's overflow check need every stage's gradients, so each pipeline rank first runs a
reduction program and the shares of ``[Σ g·0, Σ g²]`` are summed over pipeline ranks
before any update (:class:`_UpdateBuilder`); ``batch_shardings`` give each batch leaf's
layout inside a stage (dp, first on dim 0, is split by the pipeline itself).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as tdist
from xdsl.ir import Operation

from tessera import numerics, op, schedule
from tessera.backends import distributed
from tessera.backends.execution import Execution, execution_for
from tessera.backends.layout import block, piece
from tessera.dist.collectives import shard
from tessera.dist.shard_spec import ShardSpec
from tessera.dist.tensor import DistTensor
from tessera.driver import CompileConfig
from tessera.dtypes import as_dtype
from tessera.errors import ShardingError, TesseraError, TraceError
from tessera.frontend import pytree
from tessera.frontend.tracer import Tensor, Trace, tracing
from tessera.ir import pipeline_actions as A
from tessera.ir.abstract import AbstractTensor
from tessera.ir.sharding import Sharding
from tessera.jit_function import JitFunction, broadcast_prefix, default_kernels
from tessera.optim import decay_mask
from tessera.pipeline.memory import PipelineMemoryStats, pipeline_memory
from tessera.pipeline.programs import StagePrograms, stage_programs
from tessera.pipeline.runtime import PipelineExecutor, Placement, RankState
from tessera.pipeline.split import balanced_cuts, plan_stages
from tessera.training import (
    StepTrace,
    TrainingStep,
    TrainState,
    leaf_paths,
    metric_dtype,
    tracing_step,
    zero_sharding,
)
from tessera.training.grad_clip import clip_to_norm, squared_norm
from tessera.training.mixed_precision import LossScaled, nonfinite_probe, to_compute
from tessera.training.state import gathered, local_piece, write_piece

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


class PipelineStep:
    """The pipelined execution of a :class:`~tessera.training.TrainingStep`."""

    def __init__(self, step: TrainingStep, pp_axis: str):
        self.step = step
        self.mesh = step.mesh
        self.pp_axis = pp_axis
        self.ranks = self.mesh.axis_size(pp_axis)
        self.dp = self.mesh.axis_size(step.dp_axis) if step.dp_axis else 1
        self.placement = Placement(self.mesh, pp_axis, self.ranks)
        self._cache: dict[Any, CompiledPipeline] = {}
        self._latest: CompiledPipeline | None = None  # the last step's (for gather)
        self._execution: Execution | None = None  # where the last step ran

    # --- compilation ----------------------------------------------------------------------

    def compiled(self, state: TrainState, batch: Sequence[Any]) -> CompiledPipeline:
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
            tuple(AbstractTensor(tuple(x.shape), _dtype(x)) for x in leaves),
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
        return AbstractTensor((rows // (self.dp * m * k), *tensor.shape[1:]), _dtype(tensor))

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
        param_avals = [AbstractTensor(tuple(x.shape), _dtype(x)) for x in leaves]
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
        forward = _sink(traced, casts)
        marks = [
            _cut_before_casts(forward, forward.index(o) if o else len(forward), casts)
            for o in marked
        ]
        if marks and len(marks) != count - 1:
            raise TraceError(
                f"{name}: {len(marks)} graph.stage() marks make {len(marks) + 1} stages, but the "
                f"mesh's {self.pp_axis}={self.ranks} x virtual={virtual} needs {count}"
            )
        topology = self.mesh.machine(options.topology)
        cuts = list(marks) if marks else balanced_cuts(forward, outputs, count, topology)
        cuts = [_cut_before_casts(forward, c, casts) for c in cuts]
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
            update = _UpdateBuilder(self, state, leaves, owned, layouts, grad_layouts, m, kernels)
            reductions.append(update.reduction([p for p in owned if p not in counted]))
            counted.update(owned)
            updates.append(update.update())
            update_params.append(owned)
        return CompiledPipeline(
            stages, lists, ir, updates, update_params, layouts, m, cuts, metric_tree,
            metric_dtypes, reductions, batch_tree, _stats_dtype(leaves), batch_layouts,
        )  # fmt: skip

    # --- one step -------------------------------------------------------------------------

    def __call__(self, state: TrainState, *batch: Any) -> Any:
        self.step._placed(state)  # under tessera run: this rank's shards
        compiled = self._latest = self.compiled(state, batch)
        leaves = pytree.flatten(state.params)[0]
        layouts = compiled.param_layouts
        mesh, m, k = self.mesh, compiled.microbatches, self.step.accumulate
        tensors = [torch.as_tensor(b) for b in pytree.flatten(tuple(batch))[0]]
        rows = [t.shape[0] // (self.dp * m * k) for t in tensors]
        dp_axis = self.step.dp_axis

        kernels = self.step.kernels or default_kernels()
        execution = self._execution = execution_for(mesh, leaves, kernels)
        processes, device = execution.processes, execution.device

        def param_piece(index: int, rank: int) -> torch.Tensor:
            return local_piece(leaves[index], layouts[index], mesh, rank).to(device)

        current_round = 0  # accumulate > 1: the schedule runs once per round of m microbatches

        def batch_piece(index: int, mb: int, rank: int) -> torch.Tensor:
            if index == len(tensors):  # the loss scale (see _compile)
                return self._loss_scale(state, rank).to(device)
            d = mesh.coords(rank)[dp_axis] if dp_axis else 0
            start = ((d * k + current_round) * m + mb) * rows[index]
            rows_of_rank = tensors[index][start : start + rows[index]]
            return piece(rows_of_rank, compiled.batch_layouts[index], mesh, rank).to(device)

        executor = PipelineExecutor(
            compiled.stages, self.placement, param_piece, batch_piece, execution
        )
        states: list[RankState] | None = None
        if processes:
            rt = distributed.runtime()
            rt.check_mesh(mesh)
            self._prepare_groups(compiled, rt)
        for current_round in range(k):  # noqa: B007 - read by batch_piece
            if processes:
                states = [executor.run_process(compiled.lists, rt.rank, states and states[0])]
            else:
                states = executor.run_virtual(compiled.lists, states)
        assert states is not None
        self._sum_shared_grads(compiled, states, processes)
        reduced, stats = self._reduce(compiled, states, state, processes)
        # every update reads the old values before any writes (a tied parameter is
        # updated on each pipeline rank holding it)
        writes = [w for st in states for w in self._update(compiled, st, state, reduced, stats)]
        for target, member, layout, value in writes:
            write_piece(target, layout, mesh, member, value)
        state.step += 1
        return self._metrics(compiled, states, processes, stats)

    def _loss_scale(self, state: TrainState, rank: int) -> torch.Tensor:
        """The loss scale the forward multiplies the loss by (fp16 steps)."""
        leaf = state.opt_state["loss_scale"]["scale"]
        return local_piece(leaf, Sharding(()), self.mesh, rank).float()

    def gather(self, state: TrainState) -> TrainState:
        """The state with whole tensors on every process (a collective). Each process
        holds its rank's shards and updates those of the parameters its pipeline rank
        owns; for every parameter and optimizer-state tensor, the rank that holds an
        up-to-date piece first (lowest pipeline rank owning it, first data- and
        tensor-parallel copy) contributes it and a sum assembles the whole."""
        if not distributed.launched():
            return state
        if self._latest is None:  # no step yet: every rank's shards are up to date
            return TrainingStep.gather(self.step, state)
        self.step._placed(state)
        compiled = self._latest
        rt = distributed.runtime()
        param_leaves, tree = pytree.flatten(state.params)
        optimizer = self.step.optimizer
        layouts: dict[int, tuple[torch.Tensor, int, Sharding]] = {}  # id -> tensor, owner, layout
        for rank, owned in enumerate(compiled.update_params):
            if not owned:
                continue
            subset = _state_subset(optimizer, state.opt_state, len(param_leaves), owned)
            targets = [param_leaves[i] for i in owned] + pytree.flatten(subset)[0]
            arg_layouts = compiled.updates[rank].layouts()[0]
            for target, layout in zip(targets, arg_layouts, strict=False):
                layouts.setdefault(id(target), (target, rank, layout))
        coords = self.mesh.coords(rt.rank)
        whole: dict[int, torch.Tensor] = {}
        for key, (target, owner, layout) in layouts.items():
            contribution = torch.zeros(tuple(target.shape), dtype=target.dtype, device=rt.device)
            holds = coords[self.pp_axis] == owner and all(
                coords[a] == 0
                for a in self.mesh.axis_names
                if a != self.pp_axis and a not in layout.split_axes
            )
            if holds:
                index = block(rt.rank, layout, self.mesh, tuple(target.shape))
                contribution[index] = local_piece(target, layout, self.mesh, rt.rank).to(rt.device)
            what = "gathering the pipeline's state"
            try:
                with rt.waiting(what):
                    tdist.all_reduce(contribution)
            except Exception as error:
                raise distributed.failure(rt, what, error) from None
            whole[key] = contribution.cpu()
        state_leaves, state_tree = pytree.flatten(state.opt_state)
        for leaf in (*param_leaves, *state_leaves):  # no stage updates it: every shard is current
            if id(leaf) not in whole:
                whole[id(leaf)] = gathered(leaf, rt.rank)
        params = pytree.unflatten(tree, [whole[id(x)] for x in param_leaves])
        opt_state = pytree.unflatten(state_tree, [whole[id(x)] for x in state_leaves])
        return type(state)(params, opt_state, state.step)

    def _prepare_groups(self, compiled: CompiledPipeline, rt: distributed.Runtime) -> None:
        """Creates the process groups of every stage and update program, in the same
        order on every rank (``new_group`` is collective over the whole world), before
        ranks start running different programs. Each rank compiles only its own
        programs (the stages its action list computes, and its update) and the ranks
        exchange which groups they need."""
        pipeline_rank = self.placement.pipeline_rank(rt.rank)
        mine = {a.stage for a in compiled.lists[pipeline_rank] if a.kind in A.COMPUTE_KINDS}
        programs = [
            p.lowered
            for s in compiled.stages
            if s.index in mine
            for p in (s.forward, s.backward, s.backward_input, s.backward_weight)
            if p is not None
        ]
        modules = [lowered.module_at("schedule") for lowered in programs]
        modules.append(compiled.updates[pipeline_rank].module_at("schedule"))
        rt.prepare_shared(modules, self.mesh)

    def _sum_shared_grads(
        self, compiled: CompiledPipeline, states: list[RankState], processes: bool
    ) -> None:
        """Sums the gradient of a parameter used on several pipeline ranks (in pipeline
        rank order, the same sum on each)."""
        holders: dict[int, list[int]] = {}
        for rank, owned in enumerate(compiled.update_params):
            for p in owned:
                holders.setdefault(p, []).append(rank)
        shared = {p: ranks for p, ranks in holders.items() if len(ranks) > 1}
        if not shared:
            return
        if not processes:
            by_rank = {st.pipeline_rank: st for st in states}
            for p, ranks in sorted(shared.items()):
                pieces = [by_rank[r].grads[p] for r in ranks]
                # members at the same position hold the same (dp, tp) coordinates
                sums = [pieces[0][i].clone() for i in range(len(pieces[0]))]
                for other in pieces[1:]:
                    sums = [a + b for a, b in zip(sums, other, strict=True)]
                for r in ranks:
                    by_rank[r].grads[p] = [s.clone() for s in sums]
            return
        st = states[0]
        rt = distributed.runtime()
        for p, ranks in sorted(shared.items()):
            if st.pipeline_rank not in ranks:
                continue
            mine = st.grads[p][0].contiguous()
            works, received = [], {}
            for r in ranks:
                if r == st.pipeline_rank:
                    continue
                peer = self.placement.peer(rt.rank, r)
                buffer = torch.empty_like(mine)
                works.append(tdist.isend(mine, peer, tag=(1 << 20) + p))
                works.append(tdist.irecv(buffer, peer, tag=(1 << 20) + p))
                received[r] = buffer
            peers = [self.placement.peer(rt.rank, r) for r in ranks]
            what = f"summing the gradient of parameter {p} over pipeline ranks {ranks}"
            try:
                with rt.waiting(what, peers):
                    for work in works:
                        work.wait()  # type: ignore[attr-defined]
            except Exception as error:
                raise distributed.failure(rt, what, error, peers) from None
            parts = [mine if r == st.pipeline_rank else received[r] for r in ranks]
            total = parts[0].clone()
            for part in parts[1:]:
                total = total + part
            st.grads[p] = [total]

    def _run_update(
        self, lowered: Lowered, st: RankState, per_member: list[list[torch.Tensor]]
    ) -> list[list[torch.Tensor]]:
        execution = self._execution
        assert execution is not None
        results = lowered.executor.run_plan(execution, per_member, st.members, check_program=False)
        return [list(r) for r in results]

    def _reduce(
        self, compiled: CompiledPipeline, states: list[RankState], state: TrainState,
        processes: bool,
    ) -> tuple[dict[int, list[list[torch.Tensor]]], torch.Tensor | None]:  # fmt: skip
        """When the update needs the whole model's gradients (clipping by the global norm,
        the loss scale's overflow check): runs each pipeline rank's reduction program,
        which reduces its gradients over data-parallel ranks and computes its share of
        the statistics, and sums the shares over pipeline ranks. Returns the reduced
        gradients (per pipeline rank, per member) and the global statistics ``[nan probe,
        squared norm]`` (float64), or ``({}, None)`` when the update needs neither."""
        if all(r is None for r in compiled.reductions):
            return {}, None
        execution = self._execution
        assert execution is not None
        totals = torch.zeros(2, dtype=torch.float64)
        reduced: dict[int, list[list[torch.Tensor]]] = {}
        for st in states:
            lowered = compiled.reductions[st.pipeline_rank]
            owned = compiled.update_params[st.pipeline_rank]
            if lowered is None:
                continue
            scaled = self.step.precision.scaled
            per_member = [
                [st.grads[p][position].unsqueeze(0) for p in owned]
                + ([self._loss_scale(state, member).to(execution.device)] if scaled else [])
                for position, member in enumerate(st.members)
            ]
            results = self._run_update(lowered, st, per_member)
            reduced[st.pipeline_rank] = [r[: len(owned)] for r in results]
            first = self.placement.members(st.pipeline_rank)[0]
            if first in st.members:  # the statistics are replicated over the members
                probe, squares = results[st.members.index(first)][len(owned) :]
                totals += torch.stack([probe.double().cpu(), squares.double().cpu()])
        if processes:
            totals = _summed_over_processes(
                totals, "summing the gradients' global norm over pipeline ranks"
            )
        return reduced, totals

    def _update(
        self, compiled: CompiledPipeline, st: RankState, state: TrainState,
        reduced: dict[int, list[list[torch.Tensor]]], stats: torch.Tensor | None,
    ) -> list[tuple[Any, int, Sharding, torch.Tensor]]:  # fmt: skip
        """Runs pipeline rank ``st``'s update program; returns the writes of the new values
        of its parameters and optimizer state into ``state``: (state leaf, member, layout,
        the member's new piece)."""
        execution = self._execution
        assert execution is not None
        owned = compiled.update_params[st.pipeline_rank]
        if not owned:
            return []
        lowered = compiled.updates[st.pipeline_rank]
        param_leaves = pytree.flatten(state.params)[0]
        state_leaves = pytree.flatten(
            _state_subset(self.step.optimizer, state.opt_state, len(param_leaves), owned)
        )[0]
        arg_layouts, out_layouts = lowered.layouts()
        targets = [param_leaves[i] for i in owned] + state_leaves
        per_member = []
        for position, member in enumerate(st.members):
            values = [
                local_piece(t, layout, self.mesh, member).to(execution.device)
                for t, layout in zip(targets, arg_layouts[: len(targets)], strict=True)
            ]
            if stats is None:
                grads = [st.grads[p][position].unsqueeze(0) for p in owned]
            else:
                grads = reduced[st.pipeline_rank][position]
                grads += [v.to(compiled.stats_dtype).to(execution.device) for v in stats]
            per_member.append(values + grads)
        results = self._run_update(lowered, st, per_member)
        return [
            (target, member, layout, value)
            for member, outputs in zip(st.members, results, strict=True)
            for target, value, layout in zip(targets, outputs, out_layouts, strict=True)
        ]

    def _metrics(
        self, compiled: CompiledPipeline, states: list[RankState], processes: bool,
        stats: torch.Tensor | None,
    ) -> Any:  # fmt: skip
        """Every metric, averaged over microbatches and data-parallel ranks, as a 0-d
        tensor in its dtype widened to at least float32; with clipping, ``grad_norm``."""
        last = A.rank_of(len(compiled.stages) - 1, self.ranks)
        members = len(self.placement.members(last))
        count = compiled.stages[-1].metric_outputs
        totals = torch.zeros(count, dtype=torch.float64)
        for st in states:
            if st.pipeline_rank != last:
                continue
            for microbatch in st.metrics:
                for values in microbatch:
                    totals += torch.stack([v.double().cpu() for v in values])
        if processes:
            totals = _summed_over_processes(totals, "summing the pipeline's metrics")
        means = totals / (members * compiled.microbatches * self.step.accumulate)
        values = [v.to(d) for v, d in zip(means[1:], compiled.metric_dtypes, strict=True)]
        metrics = pytree.unflatten(compiled.metric_tree, values)
        if self.step.clip_grad_norm is not None and isinstance(metrics, dict) and stats is not None:
            metrics = {**metrics, "grad_norm": stats[1].sqrt().to(compiled.stats_dtype)}
        return metrics


def _summed_over_processes(totals: torch.Tensor, what: str) -> torch.Tensor:
    """``totals`` summed over every process (an all-reduce; a failure names ``what``)."""
    rt = distributed.runtime()
    try:
        on_device = totals.to(rt.device)
        with rt.waiting(what):
            tdist.all_reduce(on_device)
        return on_device.cpu()
    except Exception as error:
        raise distributed.failure(rt, what, error) from None


def _sink(ops: list[Operation], casts: Sequence[Operation]) -> list[Operation]:
    """``ops`` with each of ``casts`` (of parameters and batch leaves to the compute dtype,
    traced before the user's function) moved to just before its first user, so that it
    falls in the stage that uses it: a stage casts the parameters it owns instead of
    receiving them cast from the first stage."""
    moved = {c for c in casts if c.results[0].uses}
    rest = [o for o in ops if o not in moved]
    first_user: dict[Operation, Operation] = {}
    position = {o: i for i, o in enumerate(rest)}
    for cast in moved:
        users = [u.operation for u in cast.results[0].uses if u.operation in position]
        first_user[cast] = min(users, key=position.__getitem__)
    before: dict[Operation, list[Operation]] = {}
    for cast in casts:  # in trace order
        if cast in moved:
            before.setdefault(first_user[cast], []).append(cast)
    return [x for o in rest for x in (*before.get(o, ()), o)]


def _cut_before_casts(ops: Sequence[Operation], cut: int, casts: Sequence[Operation]) -> int:
    """A cut position moved before the casts just ahead of it (they feed the op after
    the cut: they belong to its stage)."""
    cast_set = {c for c in casts if c.results[0].uses}
    while 0 < cut <= len(ops) and ops[cut - 1] in cast_set:
        cut -= 1
    return cut


def _dtype(value: Any) -> Any:
    return as_dtype(value.dtype if isinstance(value, DistTensor) else torch.as_tensor(value).dtype)


@dataclass(frozen=True)
class _Slot:
    """Stands for one parameter (``index``) or a scalar (``None``) in a state layout."""

    index: int | None


def _state_subset(optimizer: Any, opt_state: Any, count: int, owned: list[int]) -> Any:
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


def _owned_optimizer(optimizer: Any, params: Any, owned: list[int]) -> Any:
    """``optimizer`` for the list of parameters ``owned`` (leaf indices of ``params``):
    a ``weight_decay_mask`` becomes those parameters' flags."""
    inner = optimizer.inner if isinstance(optimizer, LossScaled) else optimizer
    mask = getattr(inner, "weight_decay_mask", None)
    if mask is None:
        return optimizer
    flags = decay_mask(mask, params, f"optim.{type(inner).__name__}")
    inner = dataclasses.replace(inner, weight_decay_mask=[flags[i] for i in owned])
    return LossScaled(inner, optimizer.precision) if isinstance(optimizer, LossScaled) else inner


def _stats_dtype(leaves: Sequence[torch.Tensor]) -> torch.dtype:
    """The widest parameter dtype: that of the gradients' global statistics."""
    dtype = torch.float32
    for leaf in leaves:
        dtype = torch.promote_types(dtype, _dtype(leaf).to_torch())
    return dtype


class _UpdateBuilder:
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
        self, pipeline: PipelineStep, state: TrainState, leaves: list[torch.Tensor],
        owned: list[int], layouts: list[Sharding], grad_layouts: dict[int, Sharding],
        m: int, kernels: str,
    ):  # fmt: skip
        step = self.step = pipeline.step
        self.mesh, self.kernels, self.owned = pipeline.mesh, kernels, owned
        self.mean = 1.0 / (m * step.accumulate * pipeline.dp)
        self.params = [leaves[i] for i in owned]
        self.masters = [_dtype(x) for x in self.params]
        self.opt_state = _state_subset(step.optimizer, state.opt_state, len(leaves), owned)
        self.optimizer = _owned_optimizer(step.optimizer, state.params, owned)
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
        self.stats_dtype = _stats_dtype(leaves)

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


class PipelinedTrainingStep(TrainingStep):
    """A training step on a mesh with a pipeline axis: each call runs the pipelined
    schedule of its stage programs (:class:`PipelineStep`) instead of one program."""

    @functools.wraps(TrainingStep.__init__)  # its options (signature and docstring)
    def __init__(self, fn: Callable[..., Any], **options: Any):
        super().__init__(fn, **options)
        assert self.pp_axis is not None
        self._pipeline = PipelineStep(self, self.pp_axis)

    def __call__(self, state: TrainState, *batch: Any) -> Any:
        with numerics.mode_of(self.numerics):
            return self._pipeline(state, *batch)

    def pipeline(self) -> PipelineStep:
        return self._pipeline

    def gather(self, state: TrainState) -> TrainState:
        return self._pipeline.gather(state)

    def memory(self, state: TrainState, *batch: Any) -> PipelineMemoryStats:
        """Per-rank peak bytes over the schedule (the worst pipeline rank's, and every
        rank's in ``ranks``): a stage program's plan-memory peak plus the residuals,
        received values and accumulated gradients the runtime holds between programs
        (:mod:`tessera.pipeline.memory`); the schedule options in force pick the
        schedule, as for a call."""
        compiled = self._pipeline.compiled(state, batch)
        leaves = pytree.flatten(state.params)[0]
        return pipeline_memory(
            compiled.stages,
            compiled.lists,
            compiled.updates,
            compiled.update_params,
            compiled.param_layouts,
            [AbstractTensor(tuple(x.shape), _dtype(x)) for x in leaves],
            self.mesh,  # type: ignore[arg-type]
            compiled.reductions,
        )

    def lower(self, state: TrainState, *batch: Any) -> Lowered:
        raise TesseraError(
            f"{self.__name__} is pipelined over {self.pp_axis!r}: it compiles into stage "
            f"programs, not one program; inspect {self.__name__}.pipeline().compiled(state, batch)"
        )
