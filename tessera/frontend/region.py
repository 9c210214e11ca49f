"""``graph.region``: trace a repeated block once and call it from one compiled body.

``graph.region(fn)`` returns ``fn`` whose calls inside a traced function become
``graph.call`` ops of one outlined ``func.func`` per distinct signature (the pytree
structure, the shapes and dtypes of its tensors, its other arguments' values), as
``torch.compiler.nested_compile_region`` and a ``jax.lax.scan`` over layers do::

    @graph.region
    def layer(p, x):
        return x + op.matmul(op.gelu(op.matmul(x, p["w1"])), p["w2"])

    for p in params["layers"]:
        x = layer(p, x)      # one graph.call each; @layer is traced once

Every compile stage then runs once per distinct region (and per distinct layout of its
arguments, see ``shard-propagate``), not per call: sharding propagation, collective
insertion, partitioning, scheduling, tile lowering, and autodiff (the backward of a call
is a call of the region's derivative). The runtime runs every call of a region from its
one launch plan. A region takes every tensor it reads as an argument (a tensor of the
enclosing function captured by closure is an error), returns tensors, and its values
leave it complete: a partial sum is reduced before the region returns.
``graph.checkpoint`` composes either way round (a checkpointed body saves only what the
remat policy keeps; a checkpointed call is recomputed whole), and ``graph.stage()``
marks go between calls, not inside a region. Outside tracing the function runs as is.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from xdsl.dialects.builtin import FileLineColLoc, IntAttr, StringAttr

from tessera.errors import TraceError
from tessera.frontend import pytree
from tessera.frontend.tracer import (
    Tensor,
    Trace,
    _user_frame,
    current_trace,
    is_tracing,
    tracing,
    user_location,
)
from tessera.ir import graph
from tessera.ir.abstract import AbstractTensor


@dataclass(frozen=True)
class _Traced:
    """A region traced for one signature: its function's name and its outputs' tree."""

    name: str
    out_tree: pytree.TreeDef
    result_types: tuple[Any, ...]


def region(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` whose every traced call is a ``graph.call`` of one function per distinct
    signature (see the module docstring)."""
    if not callable(fn):
        raise TraceError(
            f"graph.region expects a function, found {type(fn).__name__} at {user_location()}"
        )

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        if not is_tracing():
            return fn(*args, **kwargs)
        trace = current_trace()
        leaves, treedef = pytree.flatten((args, kwargs))
        tensors = [leaf for leaf in leaves if isinstance(leaf, Tensor)]
        key = (fn, treedef, *(_key(leaf) for leaf in leaves))
        try:
            traced = trace.regions.get(key)
        except TypeError:
            raise TraceError(
                f"graph.region {_name(fn)}: its non-tensor arguments must be hashable "
                f"(they are part of the region's signature), at {user_location()}"
            ) from None
        if traced is None:
            traced = trace.regions[key] = _trace(fn, trace, leaves, treedef)
        for tensor in tensors:
            if tensor.trace is not trace:
                raise TraceError(
                    f"graph.region {_name(fn)} was called with a tensor of another traced "
                    f"function at {user_location()}"
                )
        op = graph.CallOp.get(traced.name, [t.value for t in tensors], traced.result_types)
        if (frame := _user_frame()) is not None:
            op.location = FileLineColLoc(
                StringAttr(frame.f_code.co_filename), IntAttr(frame.f_lineno), IntAttr(0)
            )
        trace.block.add_op(op)
        results = [Tensor(trace, r) for r in op.results]
        return pytree.unflatten(traced.out_tree, results)

    call.__tessera_region__ = fn  # type: ignore[attr-defined]
    return call


def _name(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__name__", "region")


def _key(leaf: Any) -> Any:
    if isinstance(leaf, Tensor):
        return leaf.aval
    return ("static", type(leaf), leaf)


def _trace(fn: Callable[..., Any], outer: Trace, leaves: list[Any], treedef: Any) -> _Traced:
    """Traces ``fn``'s body once into a private function of ``outer``'s table."""
    avals: list[AbstractTensor] = [leaf.aval for leaf in leaves if isinstance(leaf, Tensor)]
    name = outer.functions.unique_name(_name(fn).strip("<>") or "region")
    body = Trace(name, avals, mesh=outer.mesh, functions=outer.functions, region=name)
    body.regions = outer.regions  # a region called inside regions is traced once too
    arguments = iter(body.block.args)
    inner = [Tensor(body, next(arguments)) if isinstance(leaf, Tensor) else leaf for leaf in leaves]
    for leaf, argument in zip(
        (x for x in leaves if isinstance(x, Tensor)), body.block.args, strict=True
    ):
        if leaf.value.name_hint:
            argument.name_hint = leaf.value.name_hint
    args, kwargs = pytree.unflatten(treedef, inner)
    with tracing(body):
        result = fn(*args, **kwargs)
    if body.stage_marks:
        raise TraceError(
            f"graph.region {name}: graph.stage() marks a pipeline stage boundary between "
            f"calls, not inside a region"
        )
    out_leaves, out_tree = pytree.flatten(result)
    for leaf in out_leaves:
        if not isinstance(leaf, Tensor) or leaf.trace is not body:
            what = type(leaf).__name__ if not isinstance(leaf, Tensor) else "a tensor of another function"
            raise TraceError(
                f"graph.region {name} must return tensors it computed, found {what} "
                f"(called at {user_location()})"
            )
    function = body.finish_function(out_leaves, private=True)
    outer.functions.add(function)
    return _Traced(name, out_tree, tuple(leaf.value.type for leaf in out_leaves))
