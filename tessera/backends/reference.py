"""Reference semantics of the graph dialect: each op's torch function, interpreted.

``op_def(op).reference(op, *operands)`` (declared with the op in :mod:`tessera.ops`)
computes an op on CPU torch tensors; this module runs them under xDSL's
:class:`~xdsl.interpreter.Interpreter` (see :func:`run_function`). It is the executor
behind ``ts.jit`` without Triton kernels, and the test oracle.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from xdsl.dialects import func
from xdsl.dialects.builtin import FileLineColLoc, ModuleOp
from xdsl.interpreter import Interpreter, InterpreterFunctions, impl, register_impls
from xdsl.interpreters.func import FuncFunctions
from xdsl.ir import Block

from tessera.errors import ExecutionError, TesseraError, describe_location
from tessera.ir import graph
from tessera.ops import op_def, registered
from tessera.ops.indexing import check_indices
from tessera.ops.normalization import check_labels


def check_index_inputs(body: Block, inputs: Sequence[torch.Tensor]) -> None:
    """The reference's range checks of gather indices and cross-entropy labels that a
    kernel takes as inputs, for generated kernels (which would read out of bounds)."""
    env = dict(zip(body.args, inputs, strict=True))
    for op in body.ops:
        try:
            if isinstance(op, graph.GatherOp) and op.indices in env:
                check_indices(op, list(op.input.type.get_shape()), env[op.indices])  # type: ignore[attr-defined]
            elif isinstance(op, graph.CrossEntropyOp) and op.labels in env:
                check_labels(op, list(op.logits.type.get_shape()), env[op.labels])  # type: ignore[attr-defined]
        except TesseraError as error:
            raise type(error)(f"{error}{_traced_at(op)}") from None


def _traced_at(op: graph.GraphOp) -> str:
    """The user's line that created ``op``, when the tracer recorded it."""
    location = op.location
    if not isinstance(location, FileLineColLoc):
        return ""
    return f"\n  at {describe_location(location.filename.data, location.line.data)}"


def _interpreter_method(op_type: type[graph.GraphOp]) -> Any:
    fn = op_def(op_type).reference

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
        {f"run_{t.name.replace('.', '_')}": _interpreter_method(t) for t in registered()},
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
