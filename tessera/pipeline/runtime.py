"""Runs a pipeline schedule's action lists: stage programs, transfers, gradient sums.

One *pipeline rank* is one coordinate along the ``pp`` mesh axis; its *members* are the
mesh ranks at that coordinate (its data- and tensor-parallel slice). Every action runs
for all members at once: a computation runs the stage's program on each member's local
values (on the virtual mesh, all members in this process; across processes, the one
member this process is), a send hands each member's values to the member with the same
data- and tensor-parallel coordinates on the neighbouring pipeline rank.

On the virtual mesh, :class:`PipelineExecutor` interleaves the pipeline ranks' lists in
one process: it runs a rank's next action whenever its inputs have arrived, so a list
that would deadlock on devices stops with an error here too. Across processes, each
process follows its own list; sends are ``isend`` (waited for at the end of the step)
and receives block, with a tag naming the microbatch, stage and direction.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as tdist

from tessera.backends import distributed
from tessera.backends.execution import Execution
from tessera.errors import ExecutionError
from tessera.ir import pipeline_actions as A
from tessera.ir.mesh import Mesh
from tessera.pipeline.programs import Program, StagePrograms

Values = list[list[torch.Tensor]]  # per member, the tensors of one message or output list


class Placement:
    """Where pipeline ranks live on the mesh."""

    def __init__(self, mesh: Mesh, pp_axis: str, ranks: int):
        self.mesh = mesh
        self.pp_axis = pp_axis
        self.ranks = ranks  # pipeline ranks (the pp axis size)
        # each group varies only along pp: its members at pp = 0, 1, ...
        self._line = {r: g for g in mesh.groups([pp_axis]) for r in g}

    def members(self, pipeline_rank: int) -> list[int]:
        """The mesh ranks at ``pipeline_rank`` along the pp axis, in rank order."""
        return sorted(g[pipeline_rank] for g in self.mesh.groups([self.pp_axis]))

    def pipeline_rank(self, rank: int) -> int:
        return self._line[rank].index(rank)

    def peer(self, rank: int, pipeline_rank: int) -> int:
        """The mesh rank at ``pipeline_rank`` with ``rank``'s other coordinates."""
        return self._line[rank][pipeline_rank]


@dataclass
class RankState:
    """One pipeline rank's step in progress."""

    pipeline_rank: int
    members: list[int]  # mesh ranks this process runs for (all members, or its own)
    position: int = 0  # next action
    saved: dict[tuple[int, int, str], Values] = field(default_factory=dict)  # (mb, stage, program)
    inbox: dict[tuple[str, int, int], Values] = field(default_factory=dict)  # (kind, mb, stage)
    grads: dict[int, list[torch.Tensor]] = field(default_factory=dict)  # param -> per member
    metrics: list[Values] = field(default_factory=list)  # last stage: per microbatch
    sends: list[object] = field(default_factory=list)  # isend works to wait for


class PipelineExecutor:
    """Executes one training step's actions (see the module docstring)."""

    def __init__(
        self,
        stages: Sequence[StagePrograms],
        placement: Placement,
        params: Callable[[int, int], torch.Tensor],
        batch: Callable[[int, int, int], torch.Tensor],
        execution: Execution,
    ):
        self.stages = stages
        self.placement = placement
        self.params = params  # (param index, mesh rank) -> local piece
        self.batch = batch  # (batch index, microbatch, mesh rank) -> local microbatch
        self.execution = execution
        self.processes = execution.processes
        self.mesh = placement.mesh

    # --- running programs -----------------------------------------------------------------

    def _run(self, program: Program, state: RankState, mb: int, stage: int) -> Values:
        per_member = [
            [self._argument(state, source, mb, stage, member) for source in program.inputs]
            for member in state.members
        ]
        executor = program.lowered.executor
        results = executor.run_plan(self.execution, per_member, state.members, check_program=False)
        return [list(r) for r in results]

    def _argument(
        self, state: RankState, source: tuple, mb: int, stage: int, member: int
    ) -> torch.Tensor:
        index = state.members.index(member)
        kind = source[0]
        if kind == "param":
            return self.params(source[1], member)
        if kind == "batch":
            return self.batch(source[1], mb, member)
        if kind == "received":
            return state.inbox[(A.RECV_ACTIVATION, mb, stage)][index][source[1]]
        if kind == "seed":
            position = self.stages[stage].sent_grads.index(source[1])
            return state.inbox[(A.RECV_GRAD, mb, stage)][index][position]
        _, program, output = source
        return state.saved[(mb, stage, program)][index][output]

    # --- actions --------------------------------------------------------------------------

    def compute(self, state: RankState, action: A.Action) -> None:
        stage = self.stages[action.stage]
        mb, s = action.microbatch, action.stage
        if action.kind == A.FORWARD:
            outputs = self._run(stage.forward, state, mb, s)
            state.saved[(mb, s, "forward")] = outputs
            if stage.metric_outputs:
                state.metrics.append([o[: stage.metric_outputs] for o in outputs])
            return
        program = {
            A.BACKWARD: stage.backward,
            A.BACKWARD_INPUT: stage.backward_input,
            A.BACKWARD_WEIGHT: stage.backward_weight,
        }[action.kind]
        if program is None:
            raise ExecutionError(
                f"pipeline stage {s} was compiled for "
                f"{'a split' if stage.backward is None else 'a whole'} backward; the schedule "
                f"asks for {action.kind}"
            )
        outputs = self._run(program, state, mb, s)
        grads_back = len(stage.received_grads)
        if action.kind != A.BACKWARD_WEIGHT and grads_back:
            state.saved[(mb, s, "grads_back")] = [o[:grads_back] for o in outputs]
        if action.kind == A.BACKWARD_INPUT:
            state.saved[(mb, s, "backward_input")] = outputs
            return
        param_grads = [o[grads_back:] if action.kind == A.BACKWARD else o for o in outputs]
        for position, param in enumerate(stage.params):
            pieces = [g[position] for g in param_grads]
            total = state.grads.get(param)
            state.grads[param] = (
                pieces if total is None else [t + p for t, p in zip(total, pieces, strict=True)]
            )
        for key in [k for k in state.saved if k[0] == mb and k[1] == s]:  # the stage is done
            if key[2] != "grads_back":
                del state.saved[key]
        state.inbox.pop((A.RECV_ACTIVATION, mb, s), None)
        state.inbox.pop((A.RECV_GRAD, mb, s), None)

    def outgoing(self, state: RankState, action: A.Action) -> Values:
        """The values a send action sends, per member."""
        mb, s = action.microbatch, action.stage
        if action.kind == A.SEND_ACTIVATION:
            count = len(self.stages[s].sent)
            return [o[:count] for o in state.saved[(mb, s, "forward")]]
        return state.saved.pop((mb, s, "grads_back"))

    def incoming_shapes(self, action: A.Action) -> list[tuple[tuple[int, ...], torch.dtype]]:
        """The local shapes and dtypes a receive gets (per member, the same)."""
        stage = self.stages[action.stage]
        if action.kind == A.RECV_ACTIVATION:
            values, layouts = stage.received, stage.received_layouts
        else:
            values = [stage.sent[i] for i in stage.sent_grads]
            layouts = [stage.sent_layouts[i] for i in stage.sent_grads]
        return [
            (layout.local_shape(self.mesh, v.shape), v.dtype.to_torch())
            for v, layout in zip(values, layouts, strict=True)
        ]

    # --- the virtual mesh -----------------------------------------------------------------

    def run_virtual(
        self, lists: Sequence[Sequence[A.Action]], states: list[RankState] | None = None
    ) -> list[RankState]:
        """Runs every pipeline rank's list in this process; given ``states`` (from an
        earlier round of gradient accumulation), adds to their gradients and metrics."""
        if states is None:
            states = [RankState(r, self.placement.members(r)) for r in range(len(lists))]
        for st in states:
            st.position = 0
        while any(st.position < len(lists[st.pipeline_rank]) for st in states):
            progressed = False
            for st in states:
                todo = lists[st.pipeline_rank]
                while st.position < len(todo):
                    action = todo[st.position]
                    if action.kind in A.COMPUTE_KINDS:
                        self.compute(st, action)
                    elif action.kind in (A.SEND_ACTIVATION, A.SEND_GRAD):
                        receiver = states[A.rank_of(action.peer, len(lists))]  # type: ignore[arg-type]
                        kind = (
                            A.RECV_ACTIVATION if action.kind == A.SEND_ACTIVATION else A.RECV_GRAD
                        )
                        receiver.inbox[(kind, action.microbatch, action.peer)] = self.outgoing(
                            st, action
                        )  # type: ignore[index]
                    elif (action.kind, action.microbatch, action.stage) not in st.inbox:
                        break  # a receive whose message has not been sent yet
                    st.position += 1
                    progressed = True
            if not progressed:
                stuck = ", ".join(
                    f"pipeline rank {st.pipeline_rank} at {lists[st.pipeline_rank][st.position]}"
                    for st in states
                    if st.position < len(lists[st.pipeline_rank])
                )
                raise ExecutionError(f"the pipeline schedule deadlocks: {stuck}")
        return states

    # --- processes ------------------------------------------------------------------------

    def _tag(self, action: A.Action, index: int) -> int:
        """The gloo/NCCL tag of tensor ``index`` of a transfer (same on both ends)."""
        sender_stage = action.stage if action.kind.startswith("send") else action.peer
        grad = action.kind in (A.SEND_GRAD, A.RECV_GRAD)
        stages = len(self.stages)
        return ((action.microbatch * stages + sender_stage) * 2 + grad) * 64 + index  # type: ignore[operator]

    def run_process(
        self, lists: Sequence[Sequence[A.Action]], rank: int, state: RankState | None = None
    ) -> RankState:
        """Runs this process's pipeline rank's list (one member: ``rank``); given
        ``state`` (an earlier round's), adds to its gradients and metrics."""
        pipeline_rank = self.placement.pipeline_rank(rank)
        st = state or RankState(pipeline_rank, [rank])
        rt = distributed.runtime()
        for action in lists[pipeline_rank]:
            if action.kind in A.COMPUTE_KINDS:
                self.compute(st, action)
                continue
            peer = self.placement.peer(rank, A.rank_of(action.peer, len(lists)))  # type: ignore[arg-type]
            what = f"{action} with rank {peer}"
            try:
                if action.kind in (A.SEND_ACTIVATION, A.SEND_GRAD):
                    for i, tensor in enumerate(self.outgoing(st, action)[0]):
                        st.sends.append(
                            tdist.isend(tensor.contiguous(), peer, tag=self._tag(action, i))
                        )
                    continue
                received = []
                with rt.waiting(what, [rank, peer]):
                    for i, (shape, dtype) in enumerate(self.incoming_shapes(action)):
                        buffer = torch.empty(shape, dtype=dtype, device=rt.device)
                        tdist.irecv(buffer, peer, tag=self._tag(action, i)).wait()
                        received.append(buffer)
                st.inbox[(action.kind, action.microbatch, action.stage)] = [received]
            except Exception as error:
                raise distributed.failure(rt, what, error, [rank, peer]) from None
        what = "the step's last sends"
        try:
            with rt.waiting(what):
                for work in st.sends:
                    work.wait()  # type: ignore[attr-defined]
        except Exception as error:
            raise distributed.failure(rt, what, error) from None
        st.sends.clear()
        return st
