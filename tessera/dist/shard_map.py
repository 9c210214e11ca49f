"""``dist.shard_map``: a manual region, where code sees each rank's block and communicates
explicitly (JAX's ``shard_map``).

``dist.shard_map(f, mesh, in_specs, out_specs)`` returns a function of global tensors:
each argument is laid out as its ``in_spec``, ``f`` runs once per rank on that rank's
blocks, and its results are the blocks of global values laid out as ``out_specs``.
Inside ``f`` the collectives are per rank (``dist.all_reduce(x, "tp")`` sums the
blocks of the ranks along ``tp``; ``dist.ppermute``, ``dist.axis_index``,
``dist.axis_size``). Around it the specs are sharding constraints, so automatic
sharding composes: the operands are resharded to the ``in_specs``, the results leave
with the ``out_specs``.

Design: ``f`` is traced once per signature into a private *manual* function (local
types, ``graph.partitioned`` and ``graph.manual``; the specs are its arguments' and
results' ``graph.sharding``, see :mod:`tessera.ir.manual`), called from the global
function by ``graph.call`` on global values. ``shard-propagate`` does not enter it (its
results are closed to the ``out_specs``), ``insert-collectives`` reshards the operands
to the ``in_specs``, and after ``shard-partition`` the call is an ordinary per-rank call,
scheduled, lowered and run like a ``graph.region``'s. The verifier checks the
replication the ``out_specs`` claim (:func:`tessera.ir.manual.varying`); tracing
reports the same error at the user's line.

Outside ``@ts.jit``, calling the returned function compiles and runs it on ``mesh``'s
virtual mesh (or processes), as ``ts.jit`` of it would.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from xdsl.dialects.builtin import FileLineColLoc, IntAttr, StringAttr, UnitAttr
from xdsl.ir import Attribute

from tessera.dist.shard_spec import ShardSpec
from tessera.errors import ShardingError, TraceError
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
from tessera.ir import graph, manual
from tessera.ir.abstract import AbstractTensor
from tessera.ir.mesh import Mesh
from tessera.ir.sharding import SHARDING_KEY, AxisSizes, Sharding, ShardingAttr

MESH_SYMBOL = "mesh"
Spec = ShardSpec | None

# ts.jit, registered by tessera.jit_function (which sits above this package): runs a
# shard_map called outside tracing
_jit: Callable[..., Any] | None = None


def register_jit(jit: Callable[..., Any]) -> None:
    global _jit
    _jit = jit


@dataclass(frozen=True)
class _Traced:
    name: str
    out_tree: pytree.TreeDef
    result_types: tuple[Attribute, ...]


def shard_map(
    f: Callable[..., Any],
    mesh: Mesh,
    in_specs: Spec | Sequence[Any],
    out_specs: Spec | Sequence[Any],
) -> Callable[..., Any]:
    """``f`` run once per rank of ``mesh`` on its blocks of the arguments (see the module
    docstring). ``in_specs``: one ``ShardSpec`` (or None: replicated) per positional
    argument, applied to every tensor of that argument's pytree (a single spec stands
    for every argument); ``out_specs``: likewise per result of ``f``."""
    where = user_location()
    if not callable(f):
        raise TraceError(f"dist.shard_map expects a function, found {type(f).__name__} at {where}")
    if not isinstance(mesh, Mesh):
        raise ShardingError(
            f"dist.shard_map needs a dist.Mesh, found {type(mesh).__name__} at {where}"
        )

    jitted: list[Any] = []  # ts.jit of the region, made on the first call outside tracing

    @functools.wraps(f)
    def call(*args: Any) -> Any:
        if not is_tracing():
            if _jit is None:  # registered on import (this package sits below ts.jit)
                importlib.import_module("tessera.jit_function")
            assert _jit is not None
            if not jitted:
                jitted.append(_jit(call, mesh=mesh))
            return jitted[0](*args)
        trace = current_trace()
        if trace.mesh != mesh:
            raise ShardingError(
                f"dist.shard_map over {mesh} inside a function traced over "
                f"{trace.mesh if trace.mesh is not None else 'no mesh'}: give ts.jit the same "
                f"mesh (ts.jit(fn, mesh=...)), at {user_location()}"
            )
        if trace.manual:
            raise TraceError(
                f"dist.shard_map inside a dist.shard_map body is not supported, at {user_location()}"
            )
        leaves, treedef = pytree.flatten(args)
        specs = _leaf_specs(in_specs, args, "in_specs")
        tensors = [leaf for leaf in leaves if isinstance(leaf, Tensor)]
        for leaf in leaves:
            if not isinstance(leaf, Tensor) or leaf.trace is not trace:
                raise TraceError(
                    f"dist.shard_map {_name(f)} takes tensors of the traced function, found "
                    f"{type(leaf).__name__} at {user_location()}"
                )
        shardings = [
            _sharding(
                spec, mesh, t.shape, f"dist.shard_map {_name(f)}: in_specs of argument leaf #{i}"
            )
            for i, (spec, t) in enumerate(zip(specs, tensors, strict=True))
        ]
        # traced once per program and signature (the trace's regions are its program's)
        key = ("shard_map", f, treedef, *(t.aval for t in tensors), *shardings, repr(out_specs))
        found = trace.regions.get(key)
        if found is None:
            found = trace.regions[key] = _trace(
                f, trace, mesh, tensors, shardings, treedef, out_specs
            )
        op = graph.CallOp.get(found.name, [t.value for t in tensors], found.result_types)
        if (frame := _user_frame()) is not None:
            op.location = FileLineColLoc(
                StringAttr(frame.f_code.co_filename), IntAttr(frame.f_lineno), IntAttr(0)
            )
        trace.block.add_op(op)
        return pytree.unflatten(found.out_tree, [Tensor(trace, r) for r in op.results])

    return call


def _name(f: Callable[..., Any]) -> str:
    return getattr(f, "__name__", "shard_map").strip("<>") or "shard_map"


def _leaf_specs(specs: Any, tree: Sequence[Any], what: str) -> list[Spec]:
    """One spec per tensor leaf of ``tree`` (a sequence of arguments or results)."""
    if specs is None or isinstance(specs, ShardSpec):
        specs = [specs] * len(tree)
    if not isinstance(specs, (tuple, list)) or len(specs) != len(tree):
        count = len(specs) if isinstance(specs, (tuple, list)) else type(specs).__name__
        raise ShardingError(
            f"dist.shard_map: {what} needs one ShardSpec (or None) per "
            f"{'argument' if what == 'in_specs' else 'result'}: {len(tree)}, found {count}, "
            f"at {user_location()}"
        )
    leaf_specs: list[Spec] = []
    for spec, item in zip(specs, tree, strict=True):
        if spec is not None and not isinstance(spec, ShardSpec):
            raise ShardingError(
                f"dist.shard_map: {what} entries are dist.ShardSpec or None, found "
                f"{type(spec).__name__} {spec!r}, at {user_location()}"
            )
        leaf_specs += [spec] * len(pytree.flatten(item)[0])
    return leaf_specs


def _sharding(spec: Spec, mesh: Mesh, shape: tuple[int, ...], what: str) -> Sharding:
    if spec is None:
        return Sharding.replicated(len(shape))
    try:
        return spec.to_sharding(mesh, shape, what)
    except ShardingError as error:
        raise ShardingError(f"{error}, at {user_location()}") from None


def _trace(
    f: Callable[..., Any],
    outer: Trace,
    mesh: Mesh,
    tensors: list[Tensor],
    shardings: list[Sharding],
    treedef: Any,
    out_specs: Any,
) -> _Traced:
    """Traces ``f`` on per-rank blocks into a manual function of ``outer``'s table."""
    name = outer.functions.unique_name(_name(f))
    locals_ = [
        t.aval.with_shape(s.local_shape(mesh, t.shape))
        for t, s in zip(tensors, shardings, strict=True)
    ]
    body = Trace(name, locals_, mesh=mesh, functions=outer.functions, region=name)
    body.manual = True
    body.regions = outer.regions
    args = pytree.unflatten(treedef, [Tensor(body, a) for a in body.block.args])
    with tracing(body):
        result = f(*args)
    if body.sends:
        unmatched = "; ".join(f"over {list(s.axes)} to {s.pairs} at {s.where}" for s in body.sends)
        raise ShardingError(
            f"dist.shard_map {name}: a dist.send has no matching dist.recv (the same axis "
            f"and pairs): {unmatched}"
        )
    if body.stage_marks:
        raise TraceError(f"dist.shard_map {name}: graph.stage() marks go outside a shard_map body")
    single = not isinstance(result, (tuple, list))
    results = [result] if single else list(result)
    out_leaves, out_tree = pytree.flatten(result)
    for leaf in out_leaves:
        if not isinstance(leaf, Tensor) or leaf.trace is not body:
            what = (
                type(leaf).__name__
                if not isinstance(leaf, Tensor)
                else "a tensor of another function"
            )
            raise TraceError(
                f"dist.shard_map {name} must return tensors it computed, found {what} "
                f"(called at {user_location()})"
            )
    specs = _leaf_specs(
        [out_specs] if single and not isinstance(out_specs, (tuple, list)) else out_specs,
        results,
        "out_specs",
    )
    outs = [
        _out_sharding(
            spec, mesh, leaf.aval, f"dist.shard_map {name}: out_specs of result leaf #{i}"
        )
        for i, (leaf, spec) in enumerate(zip(out_leaves, specs, strict=True))
    ]
    sizes = AxisSizes(tuple(zip(mesh.axis_names, mesh.shape, strict=True)))
    global_types = tuple(
        manual.global_type(leaf.value.type, s, sizes)
        for leaf, s in zip(out_leaves, outs, strict=True)
    )
    function = body.finish_function(
        out_leaves,
        arg_attrs=[{SHARDING_KEY: ShardingAttr.get(MESH_SYMBOL, s)} for s in shardings],
        result_attrs=[{SHARDING_KEY: ShardingAttr.get(MESH_SYMBOL, s)} for s in outs],
        private=True,
    )
    function.attributes[graph.PARTITIONED] = UnitAttr()
    function.attributes[manual.MANUAL] = UnitAttr()
    axes = manual.varying(function)
    for index, (leaf, spec) in enumerate(zip(out_leaves, outs, strict=True)):
        message = manual.replication_error(index, spec, axes[leaf.value], mesh.axis_names)
        if message is not None:
            raise ShardingError(f"dist.shard_map {name}: {message}, at {user_location()}")
    outer.functions.add(function)
    return _Traced(name, out_tree, global_types)


def _out_sharding(spec: Spec, mesh: Mesh, local: AbstractTensor, what: str) -> Sharding:
    """The sharding ``spec`` states of the global value whose blocks are ``local`` (the
    global shape is the block times the splits, so any split divides it)."""
    return _sharding(spec, mesh, tuple(n * mesh.size for n in local.shape), what)
