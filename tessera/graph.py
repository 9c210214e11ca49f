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
option, or ``graph.backward``'s) does not save of it (:mod:`tessera.ir.remat`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from xdsl.rewriter import InsertPoint

from tessera.errors import ShardingError, TesseraError, TraceError
from tessera.frontend import pytree
from tessera.frontend.checkpoint import checkpoint
from tessera.frontend.region import region, scan
from tessera.frontend.tracer import Tensor, current_trace, user_location
from tessera.ir.grad_builder import GradBuilder
from tessera.ir.mesh import Mesh
from tessera.ir.remat import RematPolicy as Remat
from tessera.mixed_precision import Precision
from tessera.op import astype
from tessera.passes.autodiff import backprop
from tessera.pipeline.step import PipelinedTrainingStep
from tessera.training import (
    TrainingStep,
    TrainState,
    active_loss_scale,
    active_params,
    active_remat,
    forward_only_loss,
)

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
    nothing saved)."""
    if not isinstance(loss, Tensor):
        raise TraceError(
            f"graph.backward expects a traced scalar loss, found {type(loss).__name__} at {user_location()}"
        )
    if loss.aval.shape != () or not loss.aval.dtype.is_float:
        raise TraceError(
            f"graph.backward: the loss must be a float scalar, found {loss.aval} at {user_location()}"
        )
    if params is None:
        params = active_params()
    try:
        policy = active_remat() if remat is None else Remat.of(remat)
    except TesseraError as error:
        raise TraceError(f"graph.backward: {error}, at {user_location()}") from None
    if forward_only_loss(loss):  # a pipelined step differentiates stage by stage
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
    scale = active_loss_scale()  # a training step's loss scaling: the gradients of scale·loss
    seeds = None if scale is None else {loss.value: astype(scale, loss.aval.dtype).value}
    forward = list(trace.block.ops)
    grads = backprop(
        forward,
        None if seeds else loss.value,
        [leaf.value for leaf in leaves],
        GradBuilder(InsertPoint.at_end(trace.block)),
        "graph.backward",
        seeds,
        remat=policy,
    )
    return pytree.unflatten(tree, [Tensor(trace, g) for g in grads])


def training_step(
    fn: Callable[..., Any] | None = None,
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
    remat: Remat | str | bool | None = None,
    clip_grad_norm: float | None = None,
    accumulate: int = 1,
    precision: Precision | str | None = None,
    numerics: str | None = None,
    cuda_graphs: bool = False,
) -> Any:
    """Compiles ``fn(params, *batch) -> (grads, metrics)`` into a training step with the
    ``optimizer``'s update (see :mod:`tessera.training`). ``param_shardings`` is a
    pytree prefix of ``dist.ShardSpec`` for the parameters (their tensor-parallel
    layout), ``batch_shardings`` one spec per batch argument (default: dim 0 over
    ``dp_axis``), ``zero`` the ZeRO stage, ``module`` the program's name, ``remat`` what the backward
    keeps of the ``graph.checkpoint`` blocks (``graph.Remat``, ``"nothing"``,
    ``"matmuls"``, ``"everything"``; default nothing), ``clip_grad_norm`` the global
    norm the gradients are clipped to (metric ``"grad_norm"``: their norm before),
    ``accumulate`` the microbatches each batch is cut into (gradients averaged),
    ``precision`` the mixed-precision policy (``graph.Precision``, or ``"bf16"`` /
    ``"fp16"``: :mod:`tessera.mixed_precision`), ``numerics`` the step's numerics policy
    (``"fast"`` or ``"deterministic"``; default the global one: :mod:`tessera.numerics`),
    ``cuda_graphs`` whether the step replays from a CUDA graph (``ts.jit``'s option; not
    for pipelined steps). On a
    mesh with ``pp_axis`` the step is pipelined (:mod:`tessera.pipeline.step`)."""
    options = {
        "optimizer": optimizer, "mesh": mesh, "param_shardings": param_shardings,
        "batch_shardings": batch_shardings, "zero": zero, "dp_axis": dp_axis,
        "kernels": kernels, "module": module, "pp_axis": pp_axis, "remat": remat,
        "clip_grad_norm": clip_grad_norm, "accumulate": accumulate, "precision": precision,
        "numerics": numerics, "cuda_graphs": cuda_graphs,
    }  # fmt: skip
    if mesh is not None and not isinstance(mesh, Mesh):
        raise ShardingError(
            f"training_step: mesh must be a dist.Mesh, found {type(mesh).__name__} {mesh!r}"
        )
    pipelined = mesh is not None and pp_axis in mesh.axis_names
    if pipelined and cuda_graphs:
        raise TesseraError(
            "training_step: cuda_graphs=True is not supported for pipelined steps (their "
            "stage programs run one at a time)"
        )
    kind = PipelinedTrainingStep if pipelined else TrainingStep

    def build(f: Callable[..., Any]) -> TrainingStep:
        return kind(f, **options)

    return build if fn is None else build(fn)
