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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from xdsl.dialects.builtin import FileLineColLoc, IntAttr, IntegerAttr, StringAttr, i64

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
from tessera.ir.sharding import Sharding, ShardingAttr
from tessera.transforms.remat import REGATHER


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
        if trace.manual:
            raise TraceError(
                f"graph.region {_name(fn)} inside a dist.shard_map body is not supported yet, "
                f"at {user_location()}"
            )
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


def scan(fn: Callable[..., Any], init: Any, xs: Any) -> tuple[Any, Any]:
    """``jax.lax.scan`` over dim 0 of ``xs``: ``carry, y = fn(carry, x)`` for each slice
    ``x`` of ``xs`` (a pytree of tensors of one leading length), starting from ``init``;
    returns the final carry and the ``y`` of every step stacked on dim 0 (None when
    ``fn`` returns None). ``fn`` is traced once and compiled once as a region (see the
    module docstring), so a stack of layers whose parameters are stacked on dim 0 costs
    one layer to compile and one ``graph.scan`` op in the program, whatever its depth::

        x, _ = graph.scan(lambda x, p: (layer(p, x), None), x, stacked_params)

    Outside tracing it runs ``fn`` step by step on torch tensors."""
    if not callable(fn):
        raise TraceError(f"graph.scan expects a function, found {type(fn).__name__} at {user_location()}")
    carries, carry_tree = pytree.flatten(init)
    slices, xs_tree = pytree.flatten(xs)
    lengths = {int(x.shape[0]) if getattr(x, "ndim", 0) else None for x in slices}
    if len(lengths) != 1 or None in lengths:
        raise TraceError(
            f"graph.scan: xs must be tensors of one leading length, found leading dims "
            f"{sorted(str(n) for n in lengths)} at {user_location()}"
        )
    (length,) = lengths
    if length == 0:
        raise TraceError(f"graph.scan: xs has no steps (leading dim 0) at {user_location()}")
    if not is_tracing():
        return _scan_eagerly(fn, init, xs, slices, xs_tree, length)
    trace = current_trace()
    leaves = [*carries, *slices]
    for leaf in leaves:
        if not isinstance(leaf, Tensor) or leaf.trace is not trace:
            raise TraceError(
                f"graph.scan {_name(fn)}: init and xs must be tensors of the traced function, "
                f"found {type(leaf).__name__} at {user_location()}"
            )
    gathers = [_sunk_gather(x) for x in slices]
    sources = [x if g is None else g[0] for x, g in zip(slices, gathers, strict=True)]
    sunk = tuple(None if g is None else g[1] for g in gathers)
    key = ("scan", fn, carry_tree, xs_tree, *(leaf.aval for leaf in leaves), sunk)
    traced = trace.regions.get(key)
    if traced is None:
        traced = trace.regions[key] = _trace_step(
            fn, trace, carries, carry_tree, slices, xs_tree, sunk
        )
    name, y_tree, result_types = traced
    op = graph.ScanOp.get(
        name, [t.value for t in [*carries, *sources]],
        _stacked(result_types, len(carries), length), length, len(carries),
    )  # fmt: skip
    if (frame := _user_frame()) is not None:
        op.location = FileLineColLoc(
            StringAttr(frame.f_code.co_filename), IntAttr(frame.f_lineno), IntAttr(0)
        )
    trace.block.add_op(op)
    results = [Tensor(trace, r) for r in op.results]
    carry = pytree.unflatten(carry_tree, results[: len(carries)])
    return carry, pytree.unflatten(y_tree, results[len(carries) :])


def _sunk_gather(x: Tensor) -> tuple[Tensor, ShardingAttr] | None:
    """A ZeRO-3 gather of a stacked parameter (a ``graph.shard`` tagged
    ``graph.regather`` that keeps dim 0 whole) moves into the scan's step: the scan reads
    the sharded stack, and each step gathers its own slice (again for its backward), so a
    rank holds one layer's whole parameters at a time, not the stack. Returns the
    gather's operand and the step's layout, or None."""
    gather = x.value.owner
    if not isinstance(gather, graph.ShardOp) or REGATHER not in gather.attributes:
        return None
    wanted = gather.sharding
    if wanted.sharding.dims[:1] != ((),) or wanted.sharding.partial:
        return None
    step = Sharding(wanted.sharding.dims[1:])
    x.trace.moved_gathers[x.value] = gather.input
    return Tensor(x.trace, gather.input), ShardingAttr.get(wanted.mesh_name, step)


def _stacked(types: tuple[Any, ...], carries: int, length: int) -> list[Any]:
    return [*types[:carries], *(graph.scan_stack(t, length) for t in types[carries:])]


def step_trace(
    outer: Trace, name: str, avals: list[AbstractTensor], sunk: Sequence[ShardingAttr | None]
) -> tuple[Trace, list[Tensor]]:
    """The trace of a scan's step function, a private function of ``outer`` named after
    ``name``, and its arguments: the last ``len(sunk)`` are slices, each with a ``sunk``
    layout gathered to it first (:func:`_sunk_gather`)."""
    name = outer.functions.unique_name(name)
    body = Trace(name, avals, mesh=outer.mesh, functions=outer.functions, region=name)
    body.regions = outer.regions  # a region called inside the step is traced once too
    args = [Tensor(body, a) for a in body.block.args]
    for index, layout in enumerate(sunk, start=len(args) - len(sunk)):
        if layout is not None:
            (args[index],) = body.bind(graph.ShardOp, [args[index]], sharding=layout)
            args[index].value.owner.attributes[REGATHER] = IntegerAttr(body.checkpoints, i64)
            body.checkpoints += 1
    return body, args


def _trace_step(
    fn: Callable[..., Any],
    outer: Trace,
    carries: list[Any],
    carry_tree: Any,
    slices: list[Any],
    xs_tree: Any,
    sunk: tuple[ShardingAttr | None, ...],
) -> tuple[str, Any, tuple[Any, ...]]:
    """Traces one step of ``fn`` into a private function: (carries, slices) -> (carries,
    ys); a slice with a ``sunk`` layout is gathered to it first (:func:`_sunk_gather`)."""
    avals = [c.aval for c in carries] + [
        AbstractTensor(s.aval.shape[1:], s.aval.dtype) for s in slices
    ]
    body, args = step_trace(outer, _name(fn).strip("<>") or "scan", avals, sunk)
    name = body.name
    carry = pytree.unflatten(carry_tree, args[: len(carries)])
    x = pytree.unflatten(xs_tree, args[len(carries) :])
    with tracing(body):
        result = fn(carry, x)
    if not isinstance(result, tuple) or len(result) != 2:
        raise TraceError(
            f"graph.scan {name} must return (carry, y), found {type(result).__name__} "
            f"(called at {user_location()})"
        )
    new_carry, y = result
    carry_out, out_tree = pytree.flatten(new_carry)
    if out_tree != carry_tree or [getattr(c, "aval", None) for c in carry_out] != avals[: len(carries)]:
        found = [getattr(c, "aval", type(c).__name__) for c in carry_out]
        raise TraceError(
            f"graph.scan {name}: the carry must keep its structure, shapes and dtypes; "
            f"{[c.aval for c in carries]} in, {found} out (called at {user_location()})"
        )
    ys, y_tree = pytree.flatten(y)
    for leaf in [*carry_out, *ys]:
        if not isinstance(leaf, Tensor) or leaf.trace is not body:
            raise TraceError(
                f"graph.scan {name} must return tensors it computed, found "
                f"{type(leaf).__name__} (called at {user_location()})"
            )
    if body.stage_marks:
        raise TraceError(f"graph.scan {name}: graph.stage() marks go between calls, not inside a scan")
    function = body.finish_function([*carry_out, *ys], private=True)
    outer.functions.add(function)
    return name, y_tree, tuple(leaf.value.type for leaf in [*carry_out, *ys])


def _scan_eagerly(
    fn: Callable[..., Any], init: Any, xs: Any, slices: list[Any], xs_tree: Any, length: int
) -> tuple[Any, Any]:
    import torch

    carry, steps = init, []
    for i in range(length):
        carry, y = fn(carry, pytree.unflatten(xs_tree, [s[i] for s in slices]))
        steps.append(y)
    ys, y_tree = zip(*(pytree.flatten(y) for y in steps), strict=True)
    stacked = [torch.stack(list(column)) for column in zip(*ys, strict=True)]
    return carry, pytree.unflatten(y_tree[0], stacked)
