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
over microbatches and data-parallel ranks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as tdist

from tessera import numerics, op, schedule
from tessera.backends import distributed
from tessera.backends.execution import Execution, execution_for
from tessera.backends.layout import block
from tessera.compiled import JitFunction, default_kernels
from tessera.dist.shard_spec import ShardSpec
from tessera.dist.tensor import DistTensor
from tessera.driver import CompileConfig
from tessera.errors import ShardingError, TesseraError, TraceError
from tessera.frontend import pytree
from tessera.frontend.tracer import Tensor, Trace, tracing
from tessera.ir import pipeline_actions as A
from tessera.ir.abstract import AbstractTensor
from tessera.ir.sharding import Sharding
from tessera.perf.topology import load_topology
from tessera.pipeline.memory import PipelineMemoryStats, pipeline_memory
from tessera.pipeline.programs import StagePrograms, stage_programs
from tessera.pipeline.runtime import PipelineExecutor, Placement, RankState
from tessera.pipeline.split import balanced_cuts, plan_stages
from tessera.training import TrainingStep, TrainState, forward_only, training_params
from tessera.training_state import gathered, local_piece, write_piece

if TYPE_CHECKING:
    from tessera.compiled import Lowered


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
        m, kind, virtual = (
            options.pipeline_microbatches,
            options.pipeline_schedule,
            options.pipeline_virtual,
        )
        leaves, tree = pytree.flatten(state.params)
        batch_avals = [self._microbatch_aval(b, i, m) for i, b in enumerate(batch)]
        key = (
            tree,
            tuple(AbstractTensor(tuple(x.shape), _dtype(x)) for x in leaves),
            tuple(batch_avals),
            options,
        )
        if key not in self._cache:
            self._cache[key] = self._compile(
                state, tree, leaves, batch_avals, m, kind, virtual, options
            )
        return self._cache[key]

    def _microbatch_aval(self, value: Any, index: int, m: int) -> AbstractTensor:
        tensor = torch.as_tensor(value)
        rows = tensor.shape[0] if tensor.dim() else 0
        if tensor.dim() == 0 or rows % (self.dp * m):
            raise ShardingError(
                f"{self.step.__name__}: batch argument {index} has {rows} rows (dim 0), which "
                f"must split evenly over {self.dp} data-parallel ranks x {m} microbatches"
            )
        return AbstractTensor((rows // (self.dp * m), *tensor.shape[1:]), _dtype(tensor))

    def _compile(
        self, state: TrainState, tree: pytree.TreeDef, leaves: list[torch.Tensor],
        batch_avals: list[AbstractTensor], m: int, kind: str, virtual: int, options: Any,
    ) -> CompiledPipeline:  # fmt: skip
        from tessera.ir.pipeline_schedules import actions_of, pipeline_op, pipeline_schedule

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
        # trace the forward of one microbatch (graph.backward records the loss only)
        param_avals = [AbstractTensor(tuple(x.shape), _dtype(x)) for x in leaves]
        trace = Trace(name, [*param_avals, *batch_avals], mesh=self.mesh)
        args = list(trace.block.args)
        params = pytree.unflatten(tree, [Tensor(trace, a) for a in args[: len(leaves)]])
        batch = [Tensor(trace, a) for a in args[len(leaves) :]]
        with tracing(trace), forward_only() as recorded, training_params(params):
            returned = step.fn(params, *batch)
        if not (isinstance(returned, tuple) and len(returned) == 2) or not recorded:
            raise TraceError(f"{name} must return (graph.backward(loss), metrics)")
        loss = recorded[-1]
        metric_leaves, metric_tree = pytree.flatten(returned[1])
        for leaf in metric_leaves:
            if not isinstance(leaf, Tensor) or leaf.aval.shape != ():
                raise TraceError(
                    f"{name}: pipelined steps report scalar metrics only, found {leaf!r}"
                )
        outputs = [loss.value, *(t.value for t in metric_leaves)]
        forward = list(trace.block.ops)
        marks = trace.stage_marks
        if marks and len(marks) != count - 1:
            raise TraceError(
                f"{name}: {len(marks)} graph.stage() marks make {len(marks) + 1} stages, but the "
                f"mesh's {self.pp_axis}={self.ranks} x virtual={virtual} needs {count}"
            )
        topology = load_topology(options.topology)
        cuts = list(marks) if marks else balanced_cuts(forward, outputs, count, topology)
        plan = plan_stages(forward, cuts, outputs)
        kernels = step.kernels or default_kernels()
        split = kind == "zb-h1"
        config = CompileConfig(self.mesh, kernels, options)
        stages = stage_programs(
            name,
            plan,
            args[: len(leaves)],
            layouts,
            args[len(leaves) :],
            outputs,
            split,
            config,
            self.step.remat,
        )
        actions = pipeline_schedule(kind, self.ranks, m, virtual)
        ir = pipeline_op(kind, self.ranks, m, virtual, actions)
        ir.verify()
        lists = actions_of(ir)
        grad_layouts: dict[int, Sharding] = {}
        for s in stages:
            for position, p in enumerate(s.params):
                grad_layouts.setdefault(p, s.param_grad_layouts[position])
        updates, update_params = [], []
        for rank in range(self.ranks):
            owned = sorted(
                {p for s in stages if A.rank_of(s.index, self.ranks) == rank for p in s.params}
            )
            updates.append(
                self._update_program(state, leaves, owned, layouts, grad_layouts, m, kernels)
            )
            update_params.append(owned)
        return CompiledPipeline(
            stages, lists, ir, updates, update_params, layouts, m, cuts, metric_tree
        )

    def _update_program(
        self, state: TrainState, leaves: list[torch.Tensor], owned: list[int],
        layouts: list[Sharding], grad_layouts: dict[int, Sharding], m: int, kernels: str,
    ) -> Lowered:  # fmt: skip
        optimizer, scale = self.step.optimizer, 1.0 / (m * self.dp)
        dp = self.step.dp_axis

        def update(params: list[Any], opt_state: Any, grads: list[Any]) -> Any:
            total = [op.sum(g, axis=0) * scale for g in grads]
            return optimizer.update(params, total, opt_state)

        update.__name__ = f"{self.step.__name__}_update"
        params = [leaves[i] for i in owned]
        opt_state = _state_subset(optimizer, state.opt_state, len(leaves), owned)
        param_specs = [ShardSpec.from_sharding(layouts[i]) for i in owned]
        state_specs = optimizer.state_layout(param_specs, None)
        stacked = [Sharding(((dp,) if dp else (), *grad_layouts[i].dims)) for i in owned]
        grads = [torch.empty((self.dp, *leaves[i].shape), dtype=leaves[i].dtype) for i in owned]
        jitted = JitFunction(
            update, mesh=self.mesh, kernels=kernels, donate_argnums=(0, 1),
            in_shardings=(param_specs, state_specs, [ShardSpec.from_sharding(s) for s in stacked]),
            out_shardings=(param_specs, state_specs),
        )  # fmt: skip
        return jitted.lower(params, opt_state, grads)

    # --- one step -------------------------------------------------------------------------

    def __call__(self, state: TrainState, *batch: Any) -> Any:
        self.step._placed(state)  # under tessera run: this rank's shards
        compiled = self._latest = self.compiled(state, batch)
        leaves = pytree.flatten(state.params)[0]
        layouts = compiled.param_layouts
        mesh, m = self.mesh, compiled.microbatches
        tensors = [torch.as_tensor(b) for b in batch]
        rows = [t.shape[0] // (self.dp * m) for t in tensors]
        dp_axis = self.step.dp_axis

        kernels = self.step.kernels or default_kernels()
        execution = self._execution = execution_for(mesh, leaves, kernels)
        processes, device = execution.processes, execution.device

        def param_piece(index: int, rank: int) -> torch.Tensor:
            return local_piece(leaves[index], layouts[index], mesh, rank).to(device)

        def batch_piece(index: int, mb: int, rank: int) -> torch.Tensor:
            d = mesh.coords(rank)[dp_axis] if dp_axis else 0
            start = (d * m + mb) * rows[index]
            return tensors[index][start : start + rows[index]].to(device)

        executor = PipelineExecutor(
            compiled.stages, self.placement, param_piece, batch_piece, execution
        )
        if processes:
            rt = distributed.runtime()
            rt.check_mesh(mesh)
            self._prepare_groups(compiled, rt)
            states = [executor.run_process(compiled.lists, rt.rank)]
        else:
            states = executor.run_virtual(compiled.lists)
        self._sum_shared_grads(compiled, states, processes)
        # every update reads the old values before any writes (a tied parameter is
        # updated on each pipeline rank holding it)
        writes = [w for st in states for w in self._update(compiled, st, state, processes)]
        for target, member, layout, value in writes:
            write_piece(target, layout, mesh, member, value)
        state.step += 1
        return self._metrics(compiled, states, processes)

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

    def _update(
        self, compiled: CompiledPipeline, st: RankState, state: TrainState, processes: bool
    ) -> list[tuple[Any, int, Sharding, torch.Tensor]]:
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
            grads = [st.grads[p][position].unsqueeze(0) for p in owned]
            per_member.append(values + grads)
        plan = lowered.launch_plan(execution, st.members)
        results = execution.run_plan(plan, per_member, check_program=False)
        return [
            (target, member, layout, value)
            for member, outputs in zip(st.members, results, strict=True)
            for target, value, layout in zip(targets, outputs, out_layouts, strict=True)
        ]

    def _metrics(self, compiled: CompiledPipeline, states: list[RankState], processes: bool) -> Any:
        """Every metric, averaged over microbatches and data-parallel ranks."""
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
            rt = distributed.runtime()
            what = "summing the pipeline's metrics"
            try:
                on_device = totals.to(rt.device)
                with rt.waiting(what):
                    tdist.all_reduce(on_device)
                totals = on_device.cpu()
            except Exception as error:
                raise distributed.failure(rt, what, error) from None
        means = (totals / (members * compiled.microbatches)).float()
        return pytree.unflatten(compiled.metric_tree, list(means[1:]))


def _dtype(value: Any) -> Any:
    from tessera.dtypes import as_dtype

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


class PipelinedTrainingStep(TrainingStep):
    """A training step on a mesh with a pipeline axis: each call runs the pipelined
    schedule of its stage programs (:class:`PipelineStep`) instead of one program."""

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
        )

    def lower(self, state: TrainState, *batch: Any) -> Lowered:
        raise TesseraError(
            f"{self.__name__} is pipelined over {self.pp_axis!r}: it compiles into stage "
            f"programs, not one program; inspect {self.__name__}.pipeline().compiled(state, batch)"
        )
