"""``graph.training_step``: a whole training step (forward, backward, optimizer update)
compiled as one program, with the parameters and optimizer state updated in place.

As in the seeds' chapter 7, the user writes the step's forward and asks for gradients;
the decorator adds the optimizer and the synchronisation::

    @graph.training_step(optimizer=optim.AdamW(lr=1e-3), mesh=mesh, zero=2,
                         param_shardings={"w1": cols, "w2": rows})
    def step(params, batch):
        loss = op.cross_entropy(model(params, batch["x"]), batch["y"])
        return graph.backward(loss), {"loss": loss}

    state = step.init(params)          # the parameters (updated in place) + optimizer state
    metrics = step(state, batch)       # one step; state.params now hold the new values
    weights = step.state_dict(state)   # the whole model on every rank, e.g. to torch.save

Nothing in the user's code synchronises: the batch is split over ``dp_axis`` and the
parameters are replicated over it (and laid out over the other axes as
``param_shardings`` says), so the gradients come out partial over dp and the sharding
passes insert the reductions. ``zero`` selects how much of the training state is
sharded over dp (Rajbhandari et al., ZeRO, 2020; FSDP is stage 3):

====  ===========================  =====================================================
zero  sharded over dp              communication per step (Ψ = parameter bytes per rank)
====  ===========================  =====================================================
0     nothing (plain DP)           all_reduce(grads): 2(n-1)/n Ψ
1     optimizer state              all_reduce(grads) + all_gather(params): 3(n-1)/n Ψ
2     + gradients                  reduce_scatter(grads) + all_gather(params): 2(n-1)/n Ψ
3     + parameters                 2 all_gather(params) + reduce_scatter(grads): 3(n-1)/n Ψ
====  ===========================  =====================================================

Stage 1 keeps a whole gradient on each rank (all-reduced, as DDP with torch's
``ZeroRedundancyOptimizer`` does); stage 2 reduces each gradient straight into the shard
its rank updates. Stage 3 gathers each parameter for its layer's forward and again for
its backward (``graph.regather``; FSDP's ``reshard_after_forward``), for each microbatch,
in the compute dtype (a bf16 step gathers bf16: FSDP's ``param_dtype``), and
``overlap-comm`` prefetches one all-gather ahead, so a rank holds about two layers' whole
parameters at a time, not the model's (``benchmarks/memory.py --tables zero`` prints
the peaks). A tensor is sharded over dp along its first dim that dp
divides (after any split it already has); one that has none (the step count, an odd
sized bias) stays replicated. From ZeRO-2 on, a parameter stack a ``graph.scan`` steps
over is sharded along such a dim after the scanned dim 0 (the first trace finds the
scanned stacks; the step is traced again when it does): each step of the scan then
reduce-scatters its layer's gradients and, under ZeRO-3, gathers its layer's parameters
(the gathers move into the scan's step), as the unrolled layers do.

Layers that are calls of one ``graph.region`` are kept stacked and run as one
``graph.scan`` (``scan_layers``, default on; :mod:`tessera.training.layer_stacks`): the
program takes each group of like layer parameters as one stack, and the state's leaves
are views into the stacks.

The step's program donates the parameters and optimizer state (``donate_argnums``):
``plan-memory`` lets the update write in their place, and the runtime copies the new
values into the tensors of the :class:`TrainState`. On the virtual mesh these are the
user's parameter tensors, updated in place as torch optimizers do; under ``tessera run``
each process holds and updates its rank's shards only (``DistTensor``; see
:mod:`tessera.training.state`), and :meth:`TrainingStep.gather` /
:meth:`TrainingStep.state_dict` give every rank the whole state.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from math import prod
from pathlib import Path
from typing import Any

import torch
from xdsl.dialects.builtin import IntegerAttr, i64
from xdsl.ir import Operation

from tessera import numerics as numerics_policy
from tessera import op
from tessera.backends import distributed
from tessera.dist.collectives import shard, shard_unread
from tessera.dist.shard_spec import ShardSpec, check_shard_specs
from tessera.dist.tensor import DistTensor
from tessera.dtypes import as_dtype
from tessera.errors import ShardingError, TesseraError, TraceError
from tessera.frontend import pytree
from tessera.frontend.tracer import Tensor, current_trace
from tessera.ir.abstract import AbstractTensor
from tessera.ir.graph import ScanOp
from tessera.ir.mesh import Mesh
from tessera.ir.sharding import Sharding
from tessera.jit_function import JitFunction, broadcast_prefix, check_call
from tessera.optim import decay_mask
from tessera.program import Lowered, MemoryStats, ModelStateMemory
from tessera.training import checkpoint, fault_injection, layer_stacks
from tessera.training.accumulation import accumulate_microbatches
from tessera.training.grad_clip import clip_by_global_norm
from tessera.training.layer_stacks import LayerStacks
from tessera.training.mixed_precision import (
    Fp8Delayed,
    LossScaled,
    Precision,
    to_compute,
    updated_history,
    widened,
)
from tessera.training.region_grads import reduced_in_regions
from tessera.training.state import TrainState, gathered, rank_shards, write_result
from tessera.transforms.remat import REGATHER, RematPolicy

ZERO_STAGES = (0, 1, 2, 3)


@dataclass
class _Layouts:
    """Per parameter leaf: the sharding it is used in, stored in, and reduced into."""

    compute: list[Sharding]  # as the forward and backward use it
    stored: list[Sharding]  # as TrainState keeps it between steps
    grad: list[Sharding]  # the reduced gradient the optimizer consumes
    state: list[Sharding]  # optimizer buffers shaped like the parameter
    opt_state: list[Sharding] = field(default_factory=list)  # per optimizer-state leaf


@dataclass
class StepTrace:
    """The training step being traced, as ``graph.backward`` reads it while the step's
    function runs: its parameters (what ``graph.backward(loss)`` differentiates), its
    remat policy (the step's ``remat=``, as recorded in its programs' config), the loss
    scale (a traced tensor: the backward seeds the loss's cotangent with it) and, while a
    pipelined step traces its forward, where ``graph.backward`` records the loss instead
    of differentiating."""

    params: Any
    remat: RematPolicy = field(default_factory=RematPolicy)
    loss_scale: Tensor | None = None
    recorded: list[Tensor] | None = None


# the training steps being traced (trace-time state only: nothing reads it afterwards)
_traced_steps: list[StepTrace] = []


@contextmanager
def tracing_step(step: StepTrace) -> Iterator[StepTrace]:
    """Within the block, ``graph.backward`` differentiates as ``step`` says."""
    _traced_steps.append(step)
    try:
        yield step
    finally:
        _traced_steps.pop()


def traced_step() -> StepTrace | None:
    """The training step being traced, if any."""
    return _traced_steps[-1] if _traced_steps else None


def zero_sharding(
    sharding: Sharding, shape: Sequence[int], mesh: Mesh, axis: str, first: int = 0
) -> Sharding:
    """``sharding`` with ``axis`` added to the first dim from ``first`` it divides, inside
    the dim's other axes: a rank's block of the outermost dim is contiguous, so
    ``bucket-gradients`` can pack its reduce-scatters and all-gathers with the others'
    without a transposed copy. (A parameter stack a ``graph.scan`` steps over starts at
    dim 1: each step reads one layer's slice, which must be whole along dim 0.)"""
    if axis in sharding.split_axes or mesh.axis_size(axis) == 1:
        return sharding
    size = mesh.axis_size(axis)
    for dim in range(first, len(shape)):
        if shape[dim] % (sharding.shards(mesh, dim) * size) == 0:
            dims = list(sharding.dims)
            dims[dim] = (*dims[dim], axis)
            return Sharding(tuple(dims))
    return sharding


class TrainingStep:
    """A compiled training step; see the module docstring. ``graph.training_step`` makes
    one (a pipelined one on a mesh with a pipeline axis), with these options."""

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        optimizer: Any,
        mesh: Mesh | None = None,
        param_shardings: Any = None,
        batch_shardings: Any = None,
        zero: int = 0,
        dp_axis: str = "dp",
        kernels: str | None = None,
        module: str | None = None,
        pp_axis: str = "pp",
        remat: RematPolicy | str | bool | None = None,
        clip_grad_norm: float | None = None,
        accumulate: int = 1,
        precision: Precision | str | None = None,
        numerics: str | None = None,
        cuda_graphs: bool = False,
        scan_layers: bool = True,
    ):
        """``fn(params, *batch) -> (grads, metrics)`` compiled with the ``optimizer``'s
        update, on ``mesh`` (a ``dist.Mesh``; None: one device). ``param_shardings`` is a pytree prefix of ``dist.ShardSpec`` for the
        parameters (their tensor-parallel layout), ``batch_shardings`` one spec per batch
        argument (default: dim 0 over ``dp_axis``), ``zero`` the ZeRO stage, ``kernels``
        as ``ts.jit``'s, ``module`` the program's name, ``pp_axis`` the mesh axis a
        pipelined step's stages are laid over (:mod:`tessera.pipeline.step`), ``remat``
        what the backward keeps of the ``graph.checkpoint`` blocks (``graph.Remat``,
        ``"nothing"``, ``"matmuls"``, ``"everything"``; default nothing),
        ``clip_grad_norm`` the global norm the gradients are clipped to (metric
        ``"grad_norm"``: their norm before), ``accumulate`` the microbatches each batch is
        cut into (gradients averaged), ``precision`` the mixed-precision policy
        (``graph.Precision``, or ``"bf16"`` / ``"fp16"`` / ``"fp8"``: :mod:`tessera.training.mixed_precision`),
        ``numerics`` the step's numerics policy (``"fast"`` or ``"deterministic"``;
        default the global one: :mod:`tessera.numerics`), ``cuda_graphs`` whether the
        step replays from a CUDA graph (``ts.jit``'s option; not for pipelined steps),
        ``scan_layers`` whether layers that are calls of one ``graph.region`` are kept
        stacked and run as one ``graph.scan`` (:mod:`tessera.training.layer_stacks`;
        False: one call each)."""
        if zero not in ZERO_STAGES:
            raise TesseraError(f"training_step: zero must be one of {ZERO_STAGES}, found {zero!r}")
        if not (hasattr(optimizer, "update") and hasattr(optimizer, "init")):
            raise TesseraError(
                "training_step: optimizer must be an optimizer object such as "
                f"optim.AdamW(lr=...) or optim.SGD(lr=...), found {type(optimizer).__name__}"
            )
        has_dp = mesh is not None and dp_axis in mesh.axis_names
        if zero and not has_dp:
            axes = list(mesh.axis_names) if mesh is not None else []
            raise ShardingError(
                f"training_step: zero={zero} shards over the data-parallel axis {dp_axis!r}, "
                f"but the mesh has axes {axes}; pass mesh=... with that axis or dp_axis=..."
            )
        try:
            self.remat = RematPolicy() if remat is None else RematPolicy.of(remat)
        except TesseraError as error:
            raise TesseraError(f"training_step: {error}") from None
        if clip_grad_norm is not None and not (
            isinstance(clip_grad_norm, (int, float)) and clip_grad_norm > 0
        ):
            raise TesseraError(
                f"training_step: clip_grad_norm must be a positive number, found {clip_grad_norm!r}"
            )
        if not isinstance(accumulate, int) or accumulate < 1:
            raise TesseraError(
                f"training_step: accumulate must be a positive int (microbatches per step), "
                f"found {accumulate!r}"
            )
        if not isinstance(scan_layers, bool):
            raise TesseraError(f"training_step: scan_layers must be True or False, found {scan_layers!r}")
        self.scan_layers = scan_layers
        self.clip_grad_norm = clip_grad_norm
        self.accumulate = accumulate
        self.precision = Precision.of(precision)
        self.numerics = (
            None if numerics is None else numerics_policy.check(numerics, "training_step: numerics")
        )
        self.fn = fn
        self.optimizer = (
            LossScaled(optimizer, self.precision) if self.precision.scaled else optimizer
        )
        if self.precision.delayed:
            if self.precision.scaled or accumulate > 1:
                raise TesseraError(
                    "training_step: delayed fp8 scaling with loss scaling or gradient "
                    "accumulation is not supported yet; use fp8_scaling='current'"
                )
            self.optimizer = Fp8Delayed(self.optimizer, self.precision)
        self.mesh = mesh
        check_shard_specs(param_shardings, "training_step: param_shardings")
        check_shard_specs(batch_shardings, "training_step: batch_shardings")
        self.param_shardings = param_shardings
        self.batch_shardings = batch_shardings
        self.zero = zero
        self.dp_axis = dp_axis if has_dp else None
        self.kernels = kernels
        self.cuda_graphs = cuda_graphs  # ts.jit's option for the step's program
        self.__name__ = module or getattr(fn, "__name__", "training_step")
        self.pp_axis = pp_axis if mesh is not None and pp_axis in mesh.axis_names else None
        if self.pp_axis and zero >= 3:
            raise ShardingError(
                f"training_step: zero=3 (parameters sharded over {dp_axis!r}) with the "
                f"pipeline axis {pp_axis!r} is not supported: a pipeline stage's programs "
                f"read whole parameters between microbatches; use zero=2 (gradients and "
                f"optimizer state sharded over {dp_axis!r}) or zero=1 with pipelining"
            )
        self._jit: dict[tuple[pytree.TreeDef, int], tuple[JitFunction, _Layouts]] = {}
        # per parameter tree: the leaves a graph.scan steps over (ZeRO keeps their dim 0
        # whole), as the last trace found them
        self._scanned: dict[pytree.TreeDef, frozenset[int]] = {}
        self._found_scanned: set[int] = set()
        # per parameter tree: the layers it keeps stacked (tessera.training.layer_stacks)
        self._stacks: dict[pytree.TreeDef, LayerStacks | None] = {}
        self._entries: dict[pytree.TreeDef, tuple[layer_stacks.Entries, pytree.TreeDef]] = {}
        self._fp8_tensors = 0  # delayed fp8 scaling: the fp8 tensors the step quantises

    # --- user API ---------------------------------------------------------------------------

    def init(self, params: Any) -> TrainState:
        """The training state for ``params`` (a pytree of float tensors) and fresh
        optimizer state. On the virtual mesh ``params`` are kept, not copied: steps update
        them in place (layers the step stacks are copied into their stacks at the first
        step, and the state's leaves become views into them: read them from the state).
        Under ``tessera run`` the state holds this rank's shards (copies: ``params`` are
        never updated); :meth:`gather` and :meth:`state_dict` give the whole state."""
        params = _float_tensors(params)
        return self._placed(TrainState(params, self.optimizer.init(params)))

    def __call__(self, state: TrainState, *batch: Any) -> Any:
        """Runs one step: updates ``state`` in place and returns the metrics."""
        fault_injection.before_step(state.step)  # off unless TESSERA_FAULT_INJECT is set
        self._placed(state)
        lowered = self.lower(state, *batch)
        params, opt_state = self._program_state(state, self._compiled(state, batch)[1])
        with numerics_policy.mode_of(self.numerics):  # the collectives' order as compiled
            new_params, new_opt_state, metrics = lowered(params, opt_state, *batch)
        for old, new in zip(
            pytree.flatten((params, opt_state))[0],
            pytree.flatten((new_params, new_opt_state))[0],
            strict=True,
        ):
            write_result(old, new)  # one process per rank: its shard only
        state.step += 1
        return global_metrics(metrics)

    def state_dict(self, state: TrainState) -> dict[str, Any]:
        """The whole training state on every rank, as ``{"params", "opt_state", "step"}``
        (a collective under ``tessera run``: every rank must call it), e.g. to
        ``torch.save`` on rank 0; :meth:`load_state_dict` makes a state from it again."""
        whole = self.gather(state)
        return {"params": whole.params, "opt_state": whole.opt_state, "step": whole.step}

    def load_state_dict(self, state_dict: dict[str, Any]) -> TrainState:
        """The training state saved by :meth:`state_dict` (laid out as :meth:`init`
        lays out a state: the tensors themselves on the virtual mesh, this rank's shards
        under ``tessera run``)."""
        missing = {"params", "opt_state", "step"} - set(state_dict)
        if missing:
            raise TesseraError(
                f"{self.__name__}.load_state_dict: the state dict has no {sorted(missing)}; "
                f"pass what {self.__name__}.state_dict(state) returned"
            )
        params = _float_tensors(state_dict["params"])
        expected = pytree.flatten(self.optimizer.init(params))[1]
        if pytree.flatten(state_dict["opt_state"])[1] != expected:
            raise TesseraError(
                f"{self.__name__}.load_state_dict: the optimizer state does not match "
                f"{type(self.optimizer).__name__}'s state for these parameters"
            )
        state = TrainState(params, state_dict["opt_state"], int(state_dict["step"]))
        return self._placed(state)

    def save(
        self,
        state: TrainState,
        path: str | Path,
        *,
        extra: dict[str, Any] | None = None,
        blocking: bool = True,
    ) -> checkpoint.PendingSave | None:
        """Writes ``state`` (parameters, optimizer state, step, torch RNG) to the directory
        ``path`` as a sharded, atomic ``torch.distributed.checkpoint``
        (:mod:`tessera.training.checkpoint`; a collective under ``tessera run``), with the
        JSON ``extra`` (a data position; read back by ``checkpoint.read_extra``). With
        ``blocking=False`` the state is copied and written in the background: the returned
        :class:`~tessera.training.checkpoint.PendingSave`'s ``wait()`` ends it."""
        leaves, paths = self._named_leaves(state)
        return checkpoint.save(leaves, paths, state.step, path, extra, blocking=blocking)

    def restore(
        self, state: TrainState, path: str | Path, *, trust_unverified: bool = False
    ) -> TrainState:
        """Fills ``state`` (from :meth:`init`, on this step's mesh) with the checkpoint at
        ``path``, saved on any mesh (resharded on load); returns it. Its files are checked
        against its manifest first, which must carry this user's HMAC unless
        ``trust_unverified`` (:mod:`tessera.training.checkpoint`)."""
        leaves, paths = self._named_leaves(state)
        try:
            state.step = checkpoint.restore(leaves, paths, path, trust_unverified=trust_unverified)
        except TesseraError as error:
            raise TesseraError(f"{self.__name__}.restore: {error}") from None
        return state

    def _named_leaves(self, state: TrainState) -> tuple[list[Any], list[str]]:
        self._placed(state)
        param_leaves, tree = pytree.flatten(state.params)
        state_leaves, state_tree = pytree.flatten(state.opt_state)
        paths = [f"params{p}" for p in leaf_paths(tree)]
        paths += [f"opt_state{p}" for p in leaf_paths(state_tree)]
        return [*param_leaves, *state_leaves], paths

    def pipeline(self) -> Any:
        """The pipelined execution of this step; only steps on a mesh with a pipeline
        axis have one (:class:`tessera.pipeline.step.PipelinedTrainingStep`)."""
        raise TesseraError(
            f"{self.__name__} is not pipelined: its mesh has no pipeline axis (pp_axis)"
        )

    def gather(self, state: TrainState) -> TrainState:
        """The state with whole tensors on every process. Under ``tessera run`` each
        process holds and updates only its rank's shards of ``state``; this gathers them
        (a collective: every process must call it). Without processes it returns
        ``state`` itself."""
        if not self._processes():
            return state
        self._placed(state)
        leaves, tree = pytree.flatten((state.params, state.opt_state))
        rank = distributed.runtime().rank
        params, opt_state = pytree.unflatten(tree, [gathered(leaf, rank) for leaf in leaves])
        return TrainState(params, opt_state, state.step)

    def _processes(self) -> bool:
        """Whether this step runs one rank per process (``tessera run``)."""
        return self.mesh is not None and distributed.launched()

    def _placed(self, state: TrainState, relaid: bool = False) -> TrainState:
        """``state`` as this process keeps it: under ``tessera run`` its leaves become this
        rank's shards (in place; see :mod:`tessera.training.state`); ``relaid``: the
        step's layouts changed, shards laid out otherwise are cut again."""
        if not self._processes():
            return state
        assert self.mesh is not None
        param_leaves, tree = pytree.flatten(state.params)
        state_leaves, state_tree = pytree.flatten(state.opt_state)
        if not relaid and all(isinstance(x, DistTensor) for x in (*param_leaves, *state_leaves)):
            return state
        param_layouts, state_layouts = self._state_layouts(param_leaves, tree)
        rank = distributed.runtime().rank
        paths = [f"state.params{p}" for p in leaf_paths(tree)]
        params = rank_shards(param_leaves, param_layouts, self.mesh, rank, paths, self.__name__)
        paths = [f"state.opt_state{p}" for p in leaf_paths(state_tree)]
        opt_state = rank_shards(state_leaves, state_layouts, self.mesh, rank, paths, self.__name__)
        state.params = pytree.unflatten(tree, params)
        state.opt_state = pytree.unflatten(state_tree, opt_state)
        return state

    def _state_layouts(
        self, leaves: Sequence[Any], tree: pytree.TreeDef
    ) -> tuple[list[Sharding], list[Sharding]]:
        """How the state is laid out between steps: each parameter, each optimizer-state
        leaf."""
        layouts = self._layouts(leaves, tree)
        state_tree = self.optimizer.state_layout(
            pytree.unflatten(tree, layouts.state), Sharding(())
        )
        return layouts.stored, pytree.flatten(state_tree)[0]

    def lower(self, state: TrainState, *batch: Any) -> Lowered:
        """The compiled step for this state and batch (cached by signature)."""
        if not isinstance(state, TrainState):
            raise TesseraError(
                f"{self.__name__} expects a TrainState (from {self.__name__}.init(params)) "
                f"first, found {type(state).__name__}"
            )
        jitted, layouts = self._compiled(state, batch)
        with numerics_policy.mode_of(self.numerics):  # read into the program's config
            self._found_scanned = set()
            params, opt_state = self._program_types(state)
            lowered = jitted.lower(params, opt_state, *batch)
            if self._found_scanned_stacks(state):  # ZeRO laid them out over the layers
                self._placed(state, relaid=True)
                jitted, layouts = self._compiled(state, batch)
                params, opt_state = self._program_types(state)
                lowered = jitted.lower(params, opt_state, *batch)
            if self.precision.delayed and self._sized_histories(state):
                params, opt_state = self._program_types(state)
                lowered = jitted.lower(params, opt_state, *batch)
        lowered.model_states = lambda: self._model_states(lowered, params, opt_state, layouts)
        return lowered

    def _program_types(self, state: TrainState) -> tuple[Any, Any]:
        """The program's parameters and optimizer state as a signature needs them: the
        state's own, or meta tensors shaped as their stacks (nothing copied)."""
        param_leaves, tree = pytree.flatten(state.params)
        stacks = self._stacks.get(tree)
        if stacks is None:
            return state.params, state.opt_state
        entries, program_tree = self._state_entries(tree, stacks)
        params = layer_stacks.by_entries(stacks.entries, param_leaves, _meta_stack)
        opt_state = layer_stacks.by_entries(entries, pytree.flatten(state.opt_state)[0], _meta_stack)
        return pytree.unflatten(stacks.tree(), params), pytree.unflatten(program_tree, opt_state)

    def _program_state(self, state: TrainState, layouts: _Layouts) -> tuple[Any, Any]:
        """The parameters and optimizer state as the step's program (laid out as
        ``layouts``) takes them: the state's own, or, for a step that stacks its layers,
        their stacks (made on first use: the state's leaves become views into them;
        :mod:`.layer_stacks`)."""
        param_leaves, tree = pytree.flatten(state.params)
        stacks = self._stacks.get(tree)
        if stacks is None:
            return state.params, state.opt_state
        entries, program_tree = self._state_entries(tree, stacks)
        state_leaves, state_tree = pytree.flatten(state.opt_state)
        if self._processes():  # this rank's shards
            assert self.mesh is not None
            rank = distributed.runtime().rank
            params, views = layer_stacks.stacked_shards(
                param_leaves, stacks.entries, layouts.stored, self.mesh, rank
            )
            opt_state, opt_views = layer_stacks.stacked_shards(
                state_leaves, entries, layouts.opt_state, self.mesh, rank
            )
        else:
            params, views = layer_stacks.stacked_storage(param_leaves, stacks.entries)
            opt_state, opt_views = layer_stacks.stacked_storage(state_leaves, entries)
        if any(a is not b for a, b in zip(views, param_leaves, strict=True)):
            state.params = pytree.unflatten(tree, views)
        if any(a is not b for a, b in zip(opt_views, state_leaves, strict=True)):
            state.opt_state = pytree.unflatten(state_tree, opt_views)
        return pytree.unflatten(stacks.tree(), params), pytree.unflatten(program_tree, opt_state)

    def _state_entries(
        self, tree: pytree.TreeDef, stacks: LayerStacks
    ) -> tuple[layer_stacks.Entries, pytree.TreeDef]:
        """:func:`layer_stacks.state_entries` for the parameter tree ``tree`` (once per tree:
        every step asks)."""
        if tree not in self._entries:
            self._entries[tree] = layer_stacks.state_entries(self.optimizer, tree, stacks)
        return self._entries[tree]

    def _found_scanned_stacks(self, state: TrainState) -> bool:
        """Whether the trace just made found parameters a ``graph.scan`` steps over that
        the step's layouts did not know of; then they are known (and the step's programs
        for this tree forgotten), so that ZeRO-2/3 shard them along a dim other than the
        scanned one and each step reduces and gathers its own layer."""
        tree = pytree.flatten(state.params)[1]
        found = frozenset(self._found_scanned)
        stacks = self._stacks.get(tree)  # the program's parameters are its stacks, then the rest
        known = frozenset(range(len(stacks.groups))) if stacks is not None else frozenset()
        if self.zero < 2 or self.dp_axis is None or found <= known | self._scanned.get(tree, frozenset()):
            return False
        self._scanned[tree] = found | self._scanned.get(tree, frozenset())
        for key in [k for k in self._jit if k[0] == tree]:
            del self._jit[key]
        return True

    def _sized_histories(self, state: TrainState) -> bool:
        """Delayed fp8 scaling: gives a state without amax histories (from ``init``) one
        zero row per fp8 tensor the step quantises (counted by the trace just made);
        whether it did."""
        fp8 = state.opt_state["fp8"]
        if fp8["amax_history"].shape[0] or not self._fp8_tensors:
            return False
        fp8["amax_history"] = torch.zeros(self._fp8_tensors, self.precision.amax_history)
        self._placed(state)  # under tessera run: this rank's (replicated) copy
        return True

    def compile_options(self) -> dict[str, Any]:
        """The step's options its programs' compile configuration records
        (:class:`tessera.driver.CompileConfig`): ``remat`` and ``precision``."""
        return {"remat": self.remat, "precision": self.precision}

    def memory(self, state: TrainState, *batch: Any) -> MemoryStats:
        """Per-rank peak bytes, and bytes of parameters, gradients and optimizer state."""
        return self.lower(state, *batch).memory()

    # --- compilation ------------------------------------------------------------------------

    def _compiled(self, state: TrainState, batch: Sequence[Any]) -> tuple[JitFunction, _Layouts]:
        leaves, user_tree = pytree.flatten(state.params)
        batch_args = len(batch)
        if (user_tree, batch_args) in self._jit:
            return self._jit[user_tree, batch_args]
        if user_tree not in self._stacks:
            self._stacks[user_tree] = self._find_stacks(leaves, user_tree, batch)
        stacks = self._stacks[user_tree]
        tree = stacks.tree() if stacks is not None else user_tree  # the program's parameters
        layouts = self._layouts(leaves, user_tree, stacks)
        state_tree = self.optimizer.state_layout(
            pytree.unflatten(tree, layouts.state), Sharding(())
        )
        layouts.opt_state = pytree.flatten(state_tree)[0]

        def specs(shardings: list[Sharding], structure: pytree.TreeDef = tree) -> Any:
            return pytree.unflatten(structure, [ShardSpec.from_sharding(s) for s in shardings])

        state_specs = specs(layouts.opt_state, pytree.flatten(state_tree)[1])
        out_params = specs(layouts.stored)
        batch_specs = self._batch_specs(batch_args)
        in_shardings = None
        out_shardings = None
        if self.mesh is not None:
            in_shardings = (specs(layouts.stored), state_specs, *batch_specs)
            out_shardings = (out_params, state_specs, None)
        program = self._program(user_tree, layouts, stacks)
        jitted = JitFunction(
            program,
            mesh=self.mesh,
            in_shardings=in_shardings,
            out_shardings=out_shardings,
            kernels=self.kernels,
            donate_argnums=(0, 1),
            cuda_graphs=self.cuda_graphs,
            compile_options=self.compile_options(),
        )
        self._jit[user_tree, batch_args] = (jitted, layouts)
        return jitted, layouts

    def _find_stacks(
        self, leaves: Sequence[Any], tree: pytree.TreeDef, batch: Sequence[Any]
    ) -> LayerStacks | None:
        """The layers this step keeps stacked for parameters ``leaves`` (None: none, or
        ``scan_layers`` is off)."""
        if not self.scan_layers:
            return None
        compute = self._layouts(leaves, tree).compute
        decayed = self._decay_flags(tree, len(leaves))
        dtypes = [leaf.dtype for leaf in leaves]
        avals = [AbstractTensor(tuple(leaf.shape), as_dtype(leaf.dtype)) for leaf in leaves]

        def alike(i: int, j: int) -> bool:
            return (compute[i], dtypes[i], decayed[i]) == (compute[j], dtypes[j], decayed[j])

        def micro(x: Any) -> Any:  # the shapes the step's function sees
            if not isinstance(x, torch.Tensor) or self.accumulate == 1 or x.ndim == 0:
                return x
            shape = (x.shape[0] // self.accumulate, *x.shape[1:])
            return torch.empty(shape, dtype=x.dtype, device="meta")

        flat = [pytree.flatten(b) for b in batch]
        micro_batch = [pytree.unflatten(structure, [micro(x) for x in xs]) for xs, structure in flat]
        return layer_stacks.find(
            self.fn, tree, avals, micro_batch, self.mesh, alike,
            lambda used: tracing_step(StepTrace(used, self.remat, recorded=[])),
        )  # fmt: skip

    def _decay_flags(self, tree: pytree.TreeDef, count: int) -> list[bool]:
        """Per parameter: whether the optimizer decays it (all alike without a mask)."""
        inner = _innermost(self.optimizer)
        mask = getattr(inner, "weight_decay_mask", None)
        if mask is None or not getattr(inner, "weight_decay", 0):
            return [True] * count
        return decay_mask(mask, pytree.unflatten(tree, [0] * count), type(inner).__name__)

    def _program_optimizer(self, tree: pytree.TreeDef, stacks: LayerStacks | None) -> Any:
        """The optimizer for the program's parameters: for stacked layers, its weight-decay
        mask given per stack (the layers of a stack share theirs)."""
        inner = _innermost(self.optimizer)
        if stacks is None or getattr(inner, "weight_decay_mask", None) is None:
            return self.optimizer
        flags = self._decay_flags(tree, stacks.count)
        stacked = layer_stacks.by_entries(stacks.entries, flags, lambda group: group[0])
        mask = pytree.unflatten(stacks.tree(), stacked)
        return _with_inner(self.optimizer, dataclasses.replace(inner, weight_decay_mask=mask))

    def _batch_specs(self, count: int) -> tuple[Any, ...]:
        """One spec (or pytree prefix of specs) per batch argument."""
        specs = self.batch_shardings
        if specs is None:
            split = self.dp_axis is not None
            return (
                ShardSpec(partition=(0,), mesh_axes=(self.dp_axis,)) if split else None,
            ) * count
        if not isinstance(specs, (tuple, list)):
            return (specs,) * count
        if len(specs) != count:
            raise ShardingError(
                f"{self.__name__}: batch_shardings has {len(specs)} entries for {count} batch arguments"
            )
        return tuple(specs)

    def _layouts(
        self, leaves: Sequence[torch.Tensor], tree: pytree.TreeDef, stacks: LayerStacks | None = None
    ) -> _Layouts:
        """The layouts of the parameters ``leaves`` (of ``tree``), or, with ``stacks``, of
        the program's parameters: each stack laid out as its layers, dim 0 whole."""
        shapes = [tuple(int(d) for d in leaf.shape) for leaf in leaves]
        if self.mesh is None:
            program = shapes if stacks is None else stacks.storage_shapes(shapes)
            whole = [Sharding.replicated(len(s)) for s in program]
            return _Layouts(whole, whole, whole, whole)
        specs = broadcast_prefix(self.param_shardings, tree, "param_shardings")
        compute = []
        for spec, shape, path in zip(specs, shapes, leaf_paths(tree), strict=True):
            name = f"parameter {path} of {self.__name__}"
            sharding = (
                spec.to_sharding(self.mesh, shape, name)
                if spec is not None
                else Sharding.replicated(len(shape))
            )
            if self.dp_axis is not None and self.dp_axis in sharding.split_axes:
                raise ShardingError(
                    f"{name}: param_shardings split it over the data-parallel axis "
                    f"{self.dp_axis!r}; use zero=3 to shard parameters over dp"
                )
            compute.append(sharding)
        scanned = self._scanned.get(tree, frozenset())
        if stacks is not None:  # the program's parameters: the stacks, then the others
            compute = layer_stacks.by_entries(stacks.entries, compute, _stacked_layout)
            shapes = stacks.storage_shapes(shapes)
            scanned = scanned | frozenset(range(len(stacks.groups)))
        if self.dp_axis is None:
            return _Layouts(compute, compute, compute, compute)
        sharded = [
            zero_sharding(s, shape, self.mesh, self.dp_axis, first=int(index in scanned))
            for index, (s, shape) in enumerate(zip(compute, shapes, strict=True))
        ]
        stored = sharded if self.zero >= 3 else compute
        grad = sharded if self.zero >= 2 else compute
        state = sharded if self.zero >= 1 else compute
        return _Layouts(compute, stored, grad, state)

    def _program(
        self, tree: pytree.TreeDef, layouts: _Layouts, stacks: LayerStacks | None
    ) -> Callable[..., Any]:
        """The step's program over the parameters of ``tree`` (the program takes their
        ``stacks``' storage when there are some)."""
        user_fn, mesh = self.fn, self.mesh
        optimizer = self._program_optimizer(tree, stacks)
        program_tree = stacks.tree() if stacks is not None else tree

        def constrain(
            values: list[Tensor], shardings: list[Sharding], wanted: list[Sharding]
        ) -> list[Tensor]:
            if mesh is None:
                return values
            return [
                v if have == want else shard(v, want)
                for v, have, want in zip(values, shardings, wanted, strict=True)
            ]

        def gather_parameters(stored: list[Tensor]) -> list[Tensor]:
            """The parameters in the compute dtype, laid out for computing: under ZeRO-3
            each is cast, then gathered (in the compute dtype, as FSDP's ``param_dtype``)
            for the forward and again for the backward (``graph.regather``, one id per
            gather so ``cse`` keeps each microbatch's apart), so it is whole only while
            its layer computes."""
            cast = to_compute(stored, precision)
            used = constrain(cast, layouts.stored, layouts.compute)
            trace = current_trace()
            for before, after in zip(cast, used, strict=True):
                if after is not before:
                    after.value.owner.attributes[REGATHER] = IntegerAttr(trace.checkpoints, i64)
                    trace.checkpoints += 1
            return used

        precision = self.precision

        def call(
            stored: list[Tensor],
            batch: Sequence[Any],
            scale: Tensor | None,
            fp8: op.Fp8History | None = None,
        ) -> tuple[list[Tensor], Any]:
            used_leaves = gather_parameters(stored)  # per microbatch
            traced = StepTrace(None, self.remat, scale)
            leaves = used_leaves if stacks is None else stacks.unstacked(used_leaves)
            used = traced.params = pytree.unflatten(tree, leaves)
            batch = to_compute(tuple(batch), precision)
            with (
                tracing_step(traced),
                op.fp8_matmuls(precision.fp8),
                op.fp8_history(fp8),
            ):
                returned = user_fn(used, *batch)
            self._found_scanned.update(scanned_leaves(stored, used_leaves))
            if not (isinstance(returned, tuple) and len(returned) == 2):
                raise TraceError(
                    f"{self.__name__} must return (grads, metrics), as graph.backward's "
                    f"gradients and a dict of metrics"
                )
            grads, metrics = returned
            grad_leaves, grad_tree = pytree.flatten(grads)
            if grad_tree != tree:
                raise TraceError(
                    f"{self.__name__}: the gradients returned have a different structure "
                    f"from the parameters; return graph.backward(loss) as is"
                )
            if stacks is not None:  # a stack's gradient (a scan's, when graph.backward rolled it)
                grad_leaves = stacks.restacked(grad_leaves)
            if mesh is not None:  # a region call's or scan's: reduced inside it, per microbatch
                wide = precision.mixed and precision.reduce == "f32"
                masters = [p.aval.dtype if wide else None for p in stored]
                summed = self.dp_axis if self.accumulate > 1 else None
                grad_leaves = reduced_in_regions(grad_leaves, layouts.grad, masters, summed)
            return grad_leaves, metrics

        def program(params: Any, opt_state: Any, *batch: Any) -> Any:
            stored = pytree.flatten(params)[0]
            check_call(user_fn, self.__name__, (params, *batch), {})
            scale = opt_state["loss_scale"]["scale"] if precision.scaled else None
            fp8 = None
            if precision.delayed:  # no rows while the step counts its fp8 tensors
                history = opt_state["fp8"]["amax_history"]
                fp8 = op.Fp8History(history if history.aval.shape[0] else None, precision.fp8_margin)
            if self.accumulate == 1:
                grad_leaves, metrics = call(stored, batch, scale, fp8)
            else:
                grad_leaves, metrics = accumulate_microbatches(
                    lambda micro: call(stored, micro, scale), batch, self.accumulate, self._dp_size()
                )
            masters = [p.aval.dtype for p in stored]
            if precision.mixed and precision.reduce == "f32":  # the reductions in f32
                grad_leaves = [widened(g, d) for g, d in zip(grad_leaves, masters, strict=True)]
            if mesh is not None:  # a backward region call's results: constrained in the call
                grad_leaves = shard_unread(grad_leaves, layouts.grad)
            grad_leaves = [op.astype(g, d) for g, d in zip(grad_leaves, masters, strict=True)]
            if scale is not None:
                grad_leaves = [g / scale for g in grad_leaves]
            if self.clip_grad_norm is not None:
                grad_leaves, norm = clip_by_global_norm(grad_leaves, self.clip_grad_norm)
                if isinstance(metrics, dict):
                    metrics = {**metrics, "grad_norm": norm}
            new_params, new_state = optimizer.update(
                params, pytree.unflatten(program_tree, grad_leaves), opt_state
            )
            if fp8 is not None:
                self._fp8_tensors = len(fp8.amaxes)
                if fp8.history is not None:
                    new_state["fp8"] = {"amax_history": updated_history(fp8.history, fp8.amaxes)}
            return new_params, new_state, widened_metrics(metrics)

        program.__name__ = self.__name__
        return program

    def _dp_size(self) -> int:
        return self.mesh.axis_size(self.dp_axis) if self.mesh and self.dp_axis else 1

    def _model_states(
        self, lowered: Lowered, params: Any, opt_state: Any, layouts: _Layouts
    ) -> ModelStateMemory:
        mesh = self.mesh or Mesh(("device",), (1,))
        param_leaves = pytree.flatten(params)[0]
        state_leaves = pytree.flatten(opt_state)[0]

        def local_bytes(shardings: Sequence[Sharding], leaves: Sequence[Any]) -> int:
            return sum(
                prod(s.local_shape(mesh, tuple(leaf.shape))) * as_dtype(leaf.dtype).itemsize
                for s, leaf in zip(shardings, leaves, strict=True)
            )

        # the layouts the compiled program really gives its arguments
        arg_layouts, _ = lowered.layouts()
        count = len(param_leaves)
        stored = arg_layouts[:count]
        state_layouts = arg_layouts[count : count + len(state_leaves)]
        return ModelStateMemory(
            params=local_bytes(stored, param_leaves),
            grads=local_bytes(layouts.grad, param_leaves),
            optimizer_state=local_bytes(state_layouts, state_leaves),
        )


def scanned_leaves(stored: Sequence[Tensor], used: Sequence[Tensor]) -> list[int]:
    """While tracing: the parameters (``stored``, as the step received them; ``used``,
    as its function got them: cast and gathered) that a ``graph.scan`` steps over, as
    they are or as what made them from the stored one."""
    found = []
    for index, (origin, value) in enumerate(zip(stored, used, strict=True)):
        chain, current = [value.value], value.value
        while current is not origin.value and isinstance(current.owner, Operation):
            if len(current.owner.operands) != 1:
                break
            current = current.owner.operands[0]
            chain.append(current)
        if any(
            isinstance(use.operation, ScanOp) and use.index >= use.operation.carry_count
            for v in chain
            for use in v.uses
        ):
            found.append(index)
    return found


def _meta_stack(layers: list[Any]) -> torch.Tensor:
    """A meta tensor shaped as ``layers`` stacked on dim 0."""
    return torch.empty((len(layers), *layers[0].shape), dtype=layers[0].dtype, device="meta")


def _stacked_layout(layers: list[Sharding]) -> Sharding:
    """A stack's layout: its layers' (one), after dim 0, which is whole."""
    return Sharding(((), *layers[0].dims))


def _innermost(optimizer: Any) -> Any:
    """The optimizer a loss-scaling or fp8 wrapper (``.inner``) wraps, or ``optimizer``."""
    while hasattr(optimizer, "inner"):
        optimizer = optimizer.inner
    return optimizer


def _with_inner(optimizer: Any, inner: Any) -> Any:
    """``optimizer`` with the optimizer its wrappers wrap replaced by ``inner``."""
    if not hasattr(optimizer, "inner"):
        return inner
    outer = copy.copy(optimizer)
    outer.inner = _with_inner(optimizer.inner, inner)
    return outer


def metric_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a metric is reported in: its own, widened to at least float32."""
    return torch.promote_types(dtype, torch.float32) if dtype.is_floating_point else dtype


def widened_metrics(metrics: Any) -> Any:
    """While tracing: every float metric cast to at least float32 (a bf16 step's loss is
    reported in f32, a float64 step's in f64)."""
    leaves, tree = pytree.flatten(metrics)
    widened = []
    for leaf in leaves:
        if isinstance(leaf, Tensor) and leaf.aval.dtype.is_float:
            leaf = op.astype(leaf, metric_dtype(leaf.aval.dtype.to_torch()))
        widened.append(leaf)
    return pytree.unflatten(tree, widened)


def global_metrics(metrics: Any) -> Any:
    """Metrics as values on every process: under ``tessera run`` a replicated result is
    this rank's copy, any other is gathered (a collective, called by every rank in the
    same order, as the step is)."""
    leaves, tree = pytree.flatten(metrics)
    values = []
    for leaf in leaves:
        if isinstance(leaf, distributed.LocalResult):
            leaf = leaf.local if leaf.sharding.is_replicated else leaf.full()
        values.append(leaf)
    return pytree.unflatten(tree, values)


def _float_tensors(params: Any) -> Any:
    """``params`` with every leaf a float tensor (tensors kept as they are)."""
    leaves, tree = pytree.flatten(params)
    tensors = []
    for leaf in leaves:
        tensor = leaf if isinstance(leaf, torch.Tensor) else torch.as_tensor(leaf)
        if not tensor.is_floating_point():
            raise TesseraError(
                f"training_step: parameters must be float tensors, found {tensor.dtype}"
            )
        tensors.append(tensor)
    return pytree.unflatten(tree, tensors)


def leaf_paths(tree: pytree.TreeDef) -> list[str]:
    """``['w']``, ``[0]['x']``, …: where each leaf of ``tree`` is (``<root>`` for a bare leaf)."""
    paths: list[str] = []

    def visit(node: pytree.TreeDef, path: str) -> None:
        if node.kind == "leaf":
            paths.append(path or "<root>")
            return
        keys = node.meta if node.kind == "dict" else range(len(node.children))
        for key, child in zip(keys, node.children, strict=True):
            visit(child, f"{path}[{key!r}]")

    visit(tree, "")
    return paths
