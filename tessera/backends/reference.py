"""Reference semantics of the graph dialect: each op's torch function, compiled.

``op_def(op).reference`` (declared with the op in :mod:`tessera.opdefs`) computes an op on
CPU torch tensors. :func:`graph_plan` compiles a graph function into one closure of the
ops' bound references (:func:`tessera.backends.schedule_runner.compile_block`), the
executor behind ``ts.jit(kernels="reference")`` without a mesh and the test oracle;
:func:`run_function` runs one once. :func:`index_check` gives generated kernels the
reference's range checks of gather indices and cross-entropy labels (deferred, for a CUDA
graph capture, by :func:`deferred_index_checks`).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Sequence

import torch
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Block

from tessera.backends.schedule_runner import compile_block, traced_at
from tessera.errors import ExecutionError, TesseraError
from tessera.ir import graph
from tessera.opdefs.indexing import check_indices
from tessera.opdefs.normalization import check_labels

IndexCheck = Callable[[Sequence[torch.Tensor]], None]


def index_check(body: Block) -> IndexCheck | None:
    """The reference's range checks of the gather indices and cross-entropy labels that
    a kernel (``body``) takes as inputs, as one function of the kernel's inputs (None
    when it takes none): generated kernels would read out of bounds instead."""
    args = {arg: index for index, arg in enumerate(body.args)}
    checks: list[tuple[Callable[[torch.Tensor], None], int, graph.GraphOp]] = []
    for op in body.ops:
        if isinstance(op, graph.GatherOp) and op.indices in args:
            shape = list(op.input.type.get_shape())  # type: ignore[attr-defined]
            checks.append((functools.partial(check_indices, op, shape), args[op.indices], op))
        elif isinstance(op, graph.CrossEntropyOp) and op.labels in args:
            shape = list(op.logits.type.get_shape())  # type: ignore[attr-defined]
            checks.append((functools.partial(check_labels, op, shape), args[op.labels], op))
    if not checks:
        return None
    runs = [(functools.partial(_located, fn, op), index) for fn, index, op in checks]

    def check(inputs: Sequence[torch.Tensor]) -> None:
        for run, index in runs:
            if _deferred is not None:
                _deferred.append((inputs[index], run))
            else:
                run(inputs[index])

    return check


def _located(fn: Callable[[torch.Tensor], None], op: graph.GraphOp, x: torch.Tensor) -> None:
    """``fn(x)``, its error naming where ``op`` was traced."""
    try:
        fn(x)
    except TesseraError as error:
        raise type(error)(f"{error}{traced_at(op)}") from None


DeferredCheck = tuple[torch.Tensor, Callable[[torch.Tensor], None]]  # (the tensor, its check)
_deferred: list[DeferredCheck] | None = None


@contextlib.contextmanager
def deferred_index_checks() -> Iterator[list[DeferredCheck]]:
    """Inside, :func:`index_check`'s checks do not run: each is recorded with the tensor it
    reads (a CUDA graph capture cannot read values on the host; the caller checks them
    before each replay)."""
    global _deferred
    saved, _deferred = _deferred, []
    try:
        yield _deferred
    finally:
        _deferred = saved


def graph_plan(module: ModuleOp, name: str) -> Callable[..., list[torch.Tensor]]:
    """``func.func @name`` of ``module`` (graph ops) compiled into one closure."""
    function = next(
        (o for o in module.ops if isinstance(o, func.FuncOp) and o.sym_name.data == name), None
    )
    if function is None:
        raise ExecutionError(f"no function @{name} in the module")
    return compile_block(function.body.block, what=f"@{name}")


def run_function(
    module: ModuleOp, name: str, args: Sequence[torch.Tensor]
) -> tuple[torch.Tensor, ...]:
    """Runs ``func.func @name`` of ``module`` on CPU torch tensors (compiled for this call)."""
    return tuple(graph_plan(module, name)(*args))
