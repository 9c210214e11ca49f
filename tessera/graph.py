"""``tessera.graph``: graph-level operations inside traced code.

``graph.backward(loss, params)`` differentiates the program traced so far: it appends the
backward ops to the trace (the same VJP rules as the ``autodiff`` pass) and returns the
gradient of the scalar ``loss`` with respect to every tensor in ``params`` (a pytree),
with ``params``' structure — as in the seeds' training steps::

    @ts.jit
    def step(params, batch):
        loss = op.cross_entropy(model(params, batch["input"]), batch["labels"])
        grads = graph.backward(loss, params)
        return optim.sgd(params, grads, lr=0.1), {"loss": loss}

Inside ``@graph.training_step`` (see :mod:`tessera.training`), ``graph.backward(loss)``
differentiates with respect to the step's parameters, and the decorator applies the
optimizer and the synchronisation.

``graph.checkpoint(block)`` marks a block for activation checkpointing: the backward
recomputes what the remat policy (``graph.Remat``; the training step's ``remat=``
option, or ``graph.backward``'s) does not save of it (:mod:`tessera.transforms.remat`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from xdsl.rewriter import InsertPoint

from tessera.errors import ShardingError, TesseraError, TraceError
from tessera.frontend import pytree
from tessera.frontend.checkpoint import checkpoint
from tessera.frontend.region import region, scan
from tessera.frontend.roll_regions import roll_region_chains
from tessera.frontend.tracer import Tensor, current_trace, user_location
from tessera.ir.grad_builder import GradBuilder
from tessera.ir.mesh import Mesh
from tessera.op import astype, current_fp8_history
from tessera.passes.autodiff import backprop
from tessera.pipeline.step import PipelinedTrainingStep
from tessera.precision import Precision
from tessera.training import TrainingStep, TrainState, traced_step
from tessera.transforms.remat import RematPolicy as Remat

__all__ = [
    "Precision",
    "Remat",
    "TrainState",
    "TrainingStep",
    "backward",
    "checkpoint",
    "region",
    "scan",
    "stage",
    "training_step",
]


def stage() -> None:
    """Marks a pipeline stage boundary in the traced forward pass: the ops traced after
    this call belong to the next stage (on a mesh with a ``pp`` axis; elsewhere it has no
    effect). Without marks, a pipelined step splits the forward where the cost model
    balances the stages."""
    trace = current_trace()
    trace.stage_marks.append(sum(1 for _ in trace.block.ops))


def backward(loss: Tensor, params: Any = None, remat: Remat | str | bool | None = None) -> Any:
    """Gradients of the scalar ``loss`` with respect to the tensors of ``params`` (by
    default, inside ``@graph.training_step``, the step's parameters). ``remat`` is the
    policy for the ``graph.checkpoint`` blocks (default: the training step's, else
    nothing saved). Chains of region calls over slices of stacked parameters (a training
    step's layer stacks) first become one ``graph.scan`` each
    (:mod:`tessera.frontend.roll_regions`)."""
    if not isinstance(loss, Tensor):
        raise TraceError(
            f"graph.backward expects a traced scalar loss, found {type(loss).__name__} at {user_location()}"
        )
    if loss.aval.shape != () or not loss.aval.dtype.is_float:
        raise TraceError(
            f"graph.backward: the loss must be a float scalar, found {loss.aval} at {user_location()}"
        )
    step = traced_step()  # inside @graph.training_step: the step being traced
    if params is None:
        if step is None:
            raise TraceError(
                "graph.backward(loss) without params is only valid inside "
                "@graph.training_step; pass the tensors to differentiate: "
                f"graph.backward(loss, params), at {user_location()}"
            )
        params = step.params
    try:
        policy = Remat.of(remat) if remat is not None else step.remat if step else Remat()
    except TesseraError as error:
        raise TraceError(f"graph.backward: {error}, at {user_location()}") from None
    if step is not None and step.recorded is not None:  # a pipelined step's forward
        step.recorded.append(loss)  # differentiated stage by stage, by the pipeline
        return params
    leaves, tree = pytree.flatten(params)
    for leaf in leaves:
        if not isinstance(leaf, Tensor) or leaf.trace is not loss.trace:
            raise TraceError(
                f"graph.backward: params must be tensors of the same traced function, at {user_location()}"
            )
        if not leaf.aval.dtype.is_float:
            raise TraceError(
                f"graph.backward: only float tensors have gradients, found {leaf.aval} at {user_location()}"
            )
    trace = loss.trace
    scale = step.loss_scale if step else None  # loss scaling: the gradients of scale·loss
    seeds = None if scale is None else {loss.value: astype(scale, loss.aval.dtype).value}
    # layers that are region calls over slices of stacked parameters: one graph.scan each
    # (the slices these do not read are traced now)
    rolled = {id(t) for t in roll_region_chains(trace).values()} if trace.slices else set()
    trace.materialize_slices()  # (a slice read elsewhere too: its gradient is the stack's)
    stacks = {x.stack.value: x.stack for x in leaves if id(x) in rolled}  # type: ignore[attr-defined]
    wrt = [leaf for leaf in leaves if id(leaf) not in rolled] + list(stacks.values())
    forward = list(trace.block.ops)
    # delayed fp8 scaling: the gradients' amaxes come back as the gradients of probes
    history = current_fp8_history() if step is not None else None
    probes = list(history.probes.items()) if history is not None else []
    grads = backprop(
        forward,
        None if seeds else loss.value,
        [trace.moved_gathers.get(leaf.value, leaf.value) for leaf in wrt]
        + [probe.value for _, probe in probes],
        GradBuilder(InsertPoint.at_end(trace.block)),
        "graph.backward",
        seeds,
        remat=policy,
    )
    for (slot, _), amax in zip(probes, grads[len(wrt) :], strict=True):
        assert history is not None
        history.amaxes[slot] = Tensor(trace, amax)
    if history is not None:
        history.probes.clear()
    of = {leaf.value: Tensor(trace, g) for leaf, g in zip(wrt, grads, strict=False)}
    # a slice's gradient: the slice of its stack's (lazy: traced if an op reads it)
    pieces = {v: trace.lazy_slices(of[v]) for v in stacks}
    return pytree.unflatten(
        tree,
        [
            pieces[x.stack.value][x.index] if id(x) in rolled else of[x.value]  # type: ignore[attr-defined]
            for x in leaves
        ],
    )


def training_step(fn: Callable[..., Any] | None = None, **options: Any) -> Any:
    """Compiles ``fn(params, *batch) -> (grads, metrics)`` into a training step with the
    ``optimizer``'s update (see :mod:`tessera.training`); usable as
    ``@graph.training_step(optimizer=...)``. On a mesh with ``pp_axis`` the step is
    pipelined (:mod:`tessera.pipeline.step`). The options are
    :class:`~tessera.training.TrainingStep`'s (this function's signature is theirs):
    """
    try:
        inspect.signature(TrainingStep).bind(fn, **options)
    except TypeError as error:
        raise TypeError(f"training_step: {error}") from None
    mesh = options.get("mesh")
    if mesh is not None and not isinstance(mesh, Mesh):
        raise ShardingError(
            f"training_step: mesh must be a dist.Mesh, found {type(mesh).__name__} {mesh!r}"
        )
    pipelined = mesh is not None and options.get("pp_axis", "pp") in mesh.axis_names
    if pipelined and options.get("cuda_graphs"):
        raise TesseraError(
            "training_step: cuda_graphs=True is not supported for pipelined steps (their "
            "stage programs run one at a time)"
        )
    kind = PipelinedTrainingStep if pipelined else TrainingStep

    def build(f: Callable[..., Any]) -> TrainingStep:
        return kind(f, **options)

    return build if fn is None else build(fn)


def _signature_of_training_step() -> inspect.Signature:
    """``training_step``'s signature: ``fn`` (optional: a decorator with options), then
    :class:`TrainingStep`'s options, defined there once."""
    step = inspect.signature(TrainingStep)
    fn, *options = step.parameters.values()
    fn = fn.replace(default=None, annotation="Callable[..., Any] | None")
    return step.replace(parameters=[fn, *options], return_annotation="Any")


training_step.__signature__ = _signature_of_training_step()  # type: ignore[attr-defined]
training_step.__doc__ = "\n\n".join(
    inspect.cleandoc(doc) for doc in (training_step.__doc__, TrainingStep.__init__.__doc__) if doc
)
