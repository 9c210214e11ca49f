"""Reference semantics of the graph dialect: one small torch function per op.

``IMPLS[op_type](op, *operands)`` computes an op on CPU torch tensors; the functions run
under xDSL's :class:`~xdsl.interpreter.Interpreter` (see :func:`run_function`). This is
the executor behind ``ts.jit`` until Triton kernels land, and the test oracle afterwards.
Low-precision (f16/bf16) normalisations and softmax are computed in f32, then rounded,
as torch's CPU kernels do.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from xdsl.dialects import func
from xdsl.dialects.builtin import FileLineColLoc, ModuleOp
from xdsl.interpreter import Interpreter, InterpreterFunctions, impl, register_impls
from xdsl.interpreters.func import FuncFunctions
from xdsl.ir import Block

from tessera.errors import ExecutionError, TesseraError, describe_location
from tessera.ir import graph
from tessera.ir.abstract import AbstractTensor
from tessera.ir.dense import dense_to_numpy

Impl = Callable[..., Any]
IMPLS: dict[type[graph.GraphOp], Impl] = {}


def reference(*op_types: type[graph.GraphOp]) -> Callable[[Impl], Impl]:
    """Registers ``fn(op, *operands)`` as the reference semantics of ``op_types``."""

    def register(fn: Impl) -> Impl:
        for op_type in op_types:
            IMPLS[op_type] = fn
        return fn

    return register


def _result_aval(op: graph.GraphOp, index: int = 0) -> AbstractTensor:
    return AbstractTensor.from_xdsl(op.results[index].type)


def _in_f32(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """Applies ``fn`` in f32 for f16/bf16 inputs and rounds back."""
    if x.dtype in (torch.float16, torch.bfloat16):
        return fn(x.float()).to(x.dtype)
    return fn(x)


_ELEMENTWISE: dict[type[graph.GraphOp], Impl] = {
    graph.NegOp: torch.neg,
    graph.AbsOp: torch.abs,
    graph.ReluOp: lambda x: torch.clamp_min(x, 0),
    graph.ExpOp: torch.exp,
    graph.LogOp: torch.log,
    graph.TanhOp: torch.tanh,
    graph.SqrtOp: torch.sqrt,
    graph.RsqrtOp: torch.rsqrt,
    graph.SiluOp: F.silu,
    graph.SigmoidOp: torch.sigmoid,
    graph.AddOp: torch.add,
    graph.SubOp: torch.sub,
    graph.MulOp: torch.mul,
    graph.DivOp: torch.div,
    graph.PowOp: torch.pow,
    graph.MaximumOp: torch.maximum,
    graph.MinimumOp: torch.minimum,
    graph.MatmulOp: torch.matmul,
    graph.SelectOp: torch.where,
}
for _op_type, _fn in _ELEMENTWISE.items():
    reference(_op_type)(lambda op, *xs, _fn=_fn: _fn(*xs))


@reference(graph.GeluOp)
def _gelu(op: graph.GeluOp, x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate=op.attrs()["approximate"])


_COMPARE = {
    "eq": torch.eq,
    "ne": torch.ne,
    "lt": torch.lt,
    "le": torch.le,
    "gt": torch.gt,
    "ge": torch.ge,
}


@reference(graph.CompareOp)
def _compare(op: graph.CompareOp, lhs: torch.Tensor, rhs: torch.Tensor) -> torch.Tensor:
    return _COMPARE[op.attrs()["predicate"]](lhs, rhs)


@reference(graph.CastOp)
def _cast(op: graph.CastOp, x: torch.Tensor) -> torch.Tensor:
    return x.to(_result_aval(op).dtype.to_torch())


@reference(graph.ConstantOp)
def _constant(op: graph.ConstantOp) -> torch.Tensor:
    aval = _result_aval(op)
    values = np.array(dense_to_numpy(op.value), order="C")  # a copy that keeps 0-d shapes
    return torch.from_numpy(values).to(aval.dtype.to_torch())


_REDUCE = {
    graph.SumOp: torch.sum,
    graph.MeanOp: torch.mean,
    graph.MaxOp: torch.amax,
    graph.MinOp: torch.amin,
}


@reference(*_REDUCE)
def _reduce(op: graph.ReductionOp, x: torch.Tensor) -> torch.Tensor:
    attrs = op.attrs()
    if not attrs["axes"]:  # torch reduces everything for dim=(); we reduce nothing
        return x.clone()
    result = _REDUCE[type(op)](x, dim=attrs["axes"], keepdim=attrs["keepdims"])
    return result.to(x.dtype)


@reference(graph.SoftmaxOp)
def _softmax(op: graph.SoftmaxOp, x: torch.Tensor) -> torch.Tensor:
    return _in_f32(lambda v: torch.softmax(v, dim=op.attrs()["axis"]), x)


@reference(graph.LogSoftmaxOp)
def _log_softmax(op: graph.LogSoftmaxOp, x: torch.Tensor) -> torch.Tensor:
    return _in_f32(lambda v: torch.log_softmax(v, dim=op.attrs()["axis"]), x)


@reference(graph.LayerNormOp)
def _layer_norm(op: graph.LayerNormOp, x: torch.Tensor) -> torch.Tensor:
    axes, eps = op.attrs()["axes"], op.attrs()["eps"]

    def normalize(v: torch.Tensor) -> torch.Tensor:
        mean = v.mean(dim=axes, keepdim=True)
        var = (v - mean).square().mean(dim=axes, keepdim=True)
        return (v - mean) * torch.rsqrt(var + eps)

    return _in_f32(normalize, x)


@reference(graph.RmsNormOp)
def _rms_norm(op: graph.RmsNormOp, x: torch.Tensor) -> torch.Tensor:
    axes, eps = op.attrs()["axes"], op.attrs()["eps"]
    return _in_f32(lambda v: v * torch.rsqrt(v.square().mean(dim=axes, keepdim=True) + eps), x)


def _check_gather_indices(op: graph.GatherOp, shape: list[int], indices: torch.Tensor) -> None:
    axis = op.attrs()["axis"]
    size = shape[axis]
    if indices.numel() and (int(indices.min()) < -size or int(indices.max()) >= size):
        raise ExecutionError(
            f"graph.gather: indices must be in [-{size}, {size}) for axis {axis} of a tensor "
            f"of shape {shape}, found values in [{int(indices.min())}, {int(indices.max())}]"
        )


def _check_labels(op: graph.CrossEntropyOp, shape: list[int], labels: torch.Tensor) -> None:
    classes = shape[-1]
    if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= classes):
        raise ExecutionError(
            f"graph.cross_entropy: labels must be in [0, {classes}) for logits of shape "
            f"{shape}, found values in [{int(labels.min())}, {int(labels.max())}]"
        )


def check_index_inputs(body: Block, inputs: Sequence[torch.Tensor]) -> None:
    """The reference's range checks of gather indices and cross-entropy labels that a
    kernel takes as inputs, for generated kernels (which would read out of bounds)."""
    env = dict(zip(body.args, inputs, strict=True))
    for op in body.ops:
        try:
            if isinstance(op, graph.GatherOp) and op.indices in env:
                _check_gather_indices(op, list(op.input.type.get_shape()), env[op.indices])  # type: ignore[attr-defined]
            elif isinstance(op, graph.CrossEntropyOp) and op.labels in env:
                _check_labels(op, list(op.logits.type.get_shape()), env[op.labels])  # type: ignore[attr-defined]
        except TesseraError as error:
            raise type(error)(f"{error}{_traced_at(op)}") from None


@reference(graph.CrossEntropyOp)
def _cross_entropy(
    op: graph.CrossEntropyOp, logits: torch.Tensor, labels: torch.Tensor
) -> torch.Tensor:
    classes = logits.shape[-1]
    _check_labels(op, list(logits.shape), labels)
    loss = F.cross_entropy(
        logits.reshape(-1, classes).float(),
        labels.reshape(-1).long(),
        reduction=op.attrs()["reduction"],
    )
    return loss.reshape(_result_aval(op).shape).to(logits.dtype)


@reference(graph.ReshapeOp)
def _reshape(op: graph.ReshapeOp, x: torch.Tensor) -> torch.Tensor:
    return x.reshape(_result_aval(op).shape)


@reference(graph.BroadcastToOp)
def _broadcast_to(op: graph.BroadcastToOp, x: torch.Tensor) -> torch.Tensor:
    return torch.broadcast_to(x, _result_aval(op).shape)


@reference(graph.TransposeOp)
def _transpose(op: graph.TransposeOp, x: torch.Tensor) -> torch.Tensor:
    return x.permute(op.attrs()["perm"])


@reference(graph.SliceOp)
def _slice(op: graph.SliceOp, x: torch.Tensor) -> torch.Tensor:
    a = op.attrs()
    return x[
        tuple(slice(*bounds) for bounds in zip(a["starts"], a["limits"], a["strides"], strict=True))
    ]


@reference(graph.ConcatOp)
def _concat(op: graph.ConcatOp, *xs: torch.Tensor) -> torch.Tensor:
    return torch.cat(xs, dim=op.attrs()["axis"])


@reference(graph.SplitOp)
def _split(op: graph.SplitOp, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    axis = op.attrs()["axis"]
    sizes = [AbstractTensor.from_xdsl(r.type).shape[axis] for r in op.results]
    return tuple(torch.split(x, sizes, dim=axis))


@reference(graph.GatherOp)
def _gather(op: graph.GatherOp, x: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    axis = op.attrs()["axis"]
    size = x.shape[axis]
    _check_gather_indices(op, list(x.shape), indices)
    picked = x.index_select(axis, indices.reshape(-1).long() % size)
    return picked.reshape(_result_aval(op).shape)


@reference(*graph.COLLECTIVE_OPS, graph.ShardOp)
def _layout_transition(op: graph.GraphOp, x: torch.Tensor) -> torch.Tensor:
    """In the global view a collective or sharding constraint leaves the value as is."""
    return x


EXECUTABLE_OPS = (*graph.GRAPH_OPS, *graph.COLLECTIVE_OPS, graph.ShardOp)
missing = [t.name for t in EXECUTABLE_OPS if t not in IMPLS]
assert not missing, f"graph ops without reference semantics: {missing}"


def _traced_at(op: graph.GraphOp) -> str:
    """The user's line that created ``op``, when the tracer recorded it."""
    location = op.location
    if not isinstance(location, FileLineColLoc):
        return ""
    return f"\n  at {describe_location(location.filename.data, location.line.data)}"


def _interpreter_method(op_type: type[graph.GraphOp]) -> Any:
    fn = IMPLS[op_type]

    def run(
        self: Any, interpreter: Interpreter, op: graph.GraphOp, args: tuple[Any, ...]
    ) -> tuple[Any, ...]:
        try:
            result = fn(op, *args)
        except TesseraError as error:
            raise type(error)(f"{error}{_traced_at(op)}") from None
        except Exception as error:  # a torch error: name the op that raised it
            raise ExecutionError(f"{op.name} failed: {error}{_traced_at(op)}") from None
        return result if isinstance(result, tuple) else (result,)

    return impl(op_type)(run)


GraphFunctions = register_impls(
    type(
        "GraphFunctions",
        (InterpreterFunctions,),
        {f"run_{t.name.replace('.', '_')}": _interpreter_method(t) for t in EXECUTABLE_OPS},
    )
)


def run_function(
    module: ModuleOp, name: str, args: Sequence[torch.Tensor]
) -> tuple[torch.Tensor, ...]:
    """Runs ``func.func @name`` of ``module`` on CPU torch tensors."""
    function = next(
        (o for o in module.ops if isinstance(o, func.FuncOp) and o.sym_name.data == name), None
    )
    if function is None:
        raise ExecutionError(f"no function @{name} in the module")
    interpreter = Interpreter(module)
    interpreter.register_implementations(FuncFunctions())
    interpreter.register_implementations(GraphFunctions())
    try:
        return tuple(interpreter.call_op(name, tuple(args)))
    except TesseraError as error:  # drop the notes xDSL attaches (the whole module)
        raise type(error)(str(error)) from None
