"""``graph.training_step`` on a mesh with a pipeline axis: microbatches through stages.

When the mesh has the step's ``pp_axis`` (``"pp"`` by default), a training step is
pipelined. The forward pass is traced once for one microbatch and split into
``pp × virtual`` stages (:mod:`tessera.pipeline.split`: the user's ``graph.stage()``
marks, or a cost-balanced split); each stage gets its forward and backward programs
(:mod:`tessera.pipeline.programs`), and pipeline rank ``r`` (coordinate ``r`` along
``pp``) owns stages ``r, r + pp, …``. The schedule set with
``schedule.pipeline_microbatches(m, kind=..., virtual=...)`` gives every pipeline rank
its list of actions, built as the Schedule IR's ``schedule.pipeline`` op and run from it
(:mod:`tessera.pipeline.runtime`). Compiling all that is
:mod:`tessera.pipeline.compile`'s (:class:`~tessera.pipeline.compile.PipelineCompiler`,
with each rank's update from :mod:`tessera.pipeline.update`); this module runs a step:
the schedule, the shared gradients' sums, the updates and the metrics.

The batch is split over the data-parallel axis (dim 0), then into ``m`` microbatches;
gradients are summed over microbatches on each rank, then (in the update program, one per
pipeline rank) over data-parallel ranks and scaled by ``1 / (m · dp)``, so the step
computes the gradient of the mean loss over the whole batch, as the unpipelined step
does. A parameter used by stages on several pipeline ranks (tied embeddings) has its
gradient summed across them before each updates its copy. Reported metrics are the mean
over microbatches and data-parallel ranks, as 0-d tensors in at least float32.

Every option of the step applies: ``precision`` casts the parameters and float batch
leaves to the compute dtype at the start of the traced forward, each cast moved into the
stage that first uses it (:func:`~tessera.pipeline.split.sink_casts`), and with loss
scaling the last stage seeds its backward with the scale; ``accumulate=k`` runs the schedule k times (rounds of m
microbatches) before the update; ``zero=1``/``2`` shard the optimizer state (and the
reduced gradients) over dp in the update programs; ``clip_grad_norm`` and the loss
scale's overflow check need every stage's gradients, so each pipeline rank first runs a
reduction program and the shares of ``[Σ g·0, Σ g²]`` are summed over pipeline ranks
before any update (:class:`~tessera.pipeline.update.UpdateBuilder`); ``batch_shardings``
give each batch leaf's layout inside a stage (dp, first on dim 0, is split by the
pipeline itself).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as tdist

from tessera import numerics
from tessera.backends import distributed
from tessera.backends.execution import Execution, execution_for
from tessera.backends.layout import block, piece
from tessera.errors import TesseraError
from tessera.frontend import pytree
from tessera.ir import pipeline_actions as A
from tessera.ir.abstract import AbstractTensor
from tessera.ir.sharding import Sharding
from tessera.jit_function import default_kernels
from tessera.pipeline.compile import CompiledPipeline, PipelineCompiler
from tessera.pipeline.memory import PipelineMemoryStats, pipeline_memory
from tessera.pipeline.runtime import PipelineExecutor, Placement, RankState
from tessera.pipeline.update import leaf_dtype, state_subset
from tessera.training import (
    TrainingStep,
    TrainState,
)
from tessera.training.state import gathered, local_piece, write_piece

if TYPE_CHECKING:
    from tessera.program import Lowered


class PipelineStep:
    """The pipelined execution of a :class:`~tessera.training.TrainingStep`."""

    def __init__(self, step: TrainingStep, pp_axis: str):
        self.compiler = compiler = PipelineCompiler(step, pp_axis)
        self.step, self.mesh, self.pp_axis = step, compiler.mesh, pp_axis
        self.ranks, self.dp = compiler.ranks, compiler.dp
        self.placement = Placement(self.mesh, pp_axis, self.ranks)
        self._latest: CompiledPipeline | None = None  # the last step's (for gather)
        self._execution: Execution | None = None  # where the last step ran

    def compiled(self, state: TrainState, batch: Sequence[Any]) -> CompiledPipeline:
        """The step's stage and update programs for ``state``'s parameters and ``batch``'s
        signature under the schedule options in force (compiled once per signature)."""
        return self.compiler.compiled(state, batch)

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
            subset = state_subset(optimizer, state.opt_state, len(param_leaves), owned)
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
            state_subset(self.step.optimizer, state.opt_state, len(param_leaves), owned)
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


class PipelinedTrainingStep(TrainingStep):
    """A training step on a mesh with a pipeline axis: each call runs the pipelined
    schedule of its stage programs (:class:`PipelineStep`) instead of one program."""

    @functools.wraps(TrainingStep.__init__)  # its options (signature and docstring)
    def __init__(self, fn: Callable[..., Any], **options: Any):
        super().__init__(fn, **options)
        assert self.pp_axis is not None
        if self.precision.delayed:
            raise TesseraError(
                "training_step: delayed fp8 scaling in a pipelined step is not supported "
                "yet; use fp8_scaling='current'"
            )
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
            [AbstractTensor(tuple(x.shape), leaf_dtype(x)) for x in leaves],
            self.mesh,  # type: ignore[arg-type]
            compiled.reductions,
        )

    def lower(self, state: TrainState, *batch: Any) -> Lowered:
        raise TesseraError(
            f"{self.__name__} is pipelined over {self.pp_axis!r}: it compiles into stage "
            f"programs, not one program; inspect {self.__name__}.pipeline().compiled(state, batch)"
        )
