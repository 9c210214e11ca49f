"""``ts.jit``: trace a Python function once per signature into a compiled program.

The signature of a call is its pytree structure, the shape and dtype of every array
leaf, and the value of every static leaf (Python scalars, strings, None and arguments
named in ``static_argnums``). A second call with the same signature reuses the compiled
program (a :class:`~tessera.program.Lowered`) without retracing
(``JitFunction.trace_count`` counts traces). Called from traced code, a ``JitFunction``
is inlined into the caller's program.
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from xdsl.dialects.builtin import UnitAttr
from xdsl.ir import Attribute

from tessera import environment, numerics, schedule
from tessera import op as _op_library  # noqa: F401 (gives traced tensors their operators)
from tessera.backends.cuda_graphs import CudaGraphs
from tessera.dist.collectives import MESH_SYMBOL, shard, shard_unread
from tessera.dist.shard_map import register_jit as _register_shard_map_jit
from tessera.dist.shard_spec import ShardSpec, check_shard_specs
from tessera.dist.tensor import DistTensor
from tessera.driver import KERNEL_BACKENDS, CompileConfig, collection_paused
from tessera.errors import (
    ArgumentError,
    ExecutionError,
    ShardingError,
    TesseraError,
    TraceError,
)
from tessera.execute import abstract, is_array
from tessera.frontend import pytree
from tessera.frontend.tracer import Tensor, Trace, current_trace, is_tracing, tracing
from tessera.ir.abstract import AbstractTensor
from tessera.ir.graph import DONATED
from tessera.ir.mesh import Mesh
from tessera.ir.sharding import SHARDING_KEY, Sharding, ShardingAttr
from tessera.program import Lowered, Signature


def default_kernels() -> str:
    """Generated Triton kernels, unless ``TESSERA_KERNELS=reference`` asks for the oracle."""
    return environment.kernels()


class JitFunction:
    """A function compiled by Tessera; call it like the original."""

    def __init__(
        self,
        fn: Callable[..., Any],
        static_argnums: int | Sequence[int] = (),
        mesh: Mesh | None = None,
        in_shardings: Any = None,
        out_shardings: Any = None,
        kernels: str | None = None,
        donate_argnums: int | Sequence[int] = (),
        cuda_graphs: bool = False,
        compile_options: Mapping[str, Any] | None = None,
    ):
        if mesh is not None and not isinstance(mesh, Mesh):
            raise ShardingError(
                f"ts.jit: mesh must be a dist.Mesh (dist.Mesh(axes=[...], shape=(...)) or "
                f"dist.mesh({{'dp': 2}})), found {type(mesh).__name__} {mesh!r}"
            )
        if mesh is None and (in_shardings is not None or out_shardings is not None):
            raise ShardingError("in_shardings and out_shardings need a mesh: ts.jit(fn, mesh=...)")
        check_shard_specs(in_shardings, "ts.jit: in_shardings")
        check_shard_specs(out_shardings, "ts.jit: out_shardings")
        if kernels is not None and kernels not in KERNEL_BACKENDS:
            raise ArgumentError(f"kernels must be one of {KERNEL_BACKENDS}, found {kernels!r}")
        self.kernels = kernels  # None: TESSERA_KERNELS or "triton", read when compiling
        if not isinstance(cuda_graphs, bool):
            raise ArgumentError(f"cuda_graphs must be True or False, found {cuda_graphs!r}")
        self.cuda_graphs = cuda_graphs
        self.mesh = mesh
        self.in_shardings = in_shardings
        self.out_shardings = out_shardings
        # name and docstring only: copying fn.__dict__ could overwrite our own attributes
        functools.update_wrapper(self, fn, updated=())
        self.__name__: str = getattr(fn, "__name__", "main")  # functools.partial has none
        self.fn = fn
        positional = _positional_count(fn)
        self.static_argnums = _argnums(static_argnums, "static_argnums", self.__name__, positional)
        self.donate_argnums = _argnums(donate_argnums, "donate_argnums", self.__name__, positional)
        if set(self.donate_argnums) & set(self.static_argnums):
            raise ArgumentError(f"{self.__name__}: an argument cannot be both static and donated")
        # further CompileConfig fields, fixed by the front-end (a training step's remat
        # and precision)
        self.compile_options = dict(compile_options or {})
        self.trace_count = 0
        self._cache: dict[tuple[Signature, CompileConfig], Lowered] = {}

    def compile_config(self) -> CompileConfig:
        """The configuration a program traced now compiles with: this function's mesh,
        kernels and compile options, and the settings of the user's context managers in
        force (``tessera.schedule``'s options, ``tessera.numerics``' mode), read here once."""
        return CompileConfig(
            self.mesh,
            self.kernels or default_kernels(),
            schedule.current(),
            numerics.mode(),
            **self.compile_options,
        )

    def signature(self, args: Sequence[Any], kwargs: dict[str, Any]) -> Signature:
        """What the program for these arguments is specialised on."""
        return self._signature(args, kwargs)[0]

    def _signature(
        self, args: Sequence[Any], kwargs: dict[str, Any]
    ) -> tuple[Signature, list[Any]]:
        """The signature and the leaves of ``(args, kwargs)``, static arguments as one
        leaf each."""
        if self.static_argnums and not all(
            -len(args) <= n < len(args) for n in self.static_argnums
        ):
            raise ArgumentError(
                f"{self.__name__} has static_argnums={self.static_argnums} but was called "
                f"with {len(args)} positional arguments"
            )
        static = {n % len(args) for n in self.static_argnums}
        marked = tuple(_Static(a) if i in static else a for i, a in enumerate(args))
        leaves, treedef = pytree.flatten((marked, kwargs))
        keys = []
        for index, leaf in enumerate(leaves):
            if isinstance(leaf, Tensor):
                raise TraceError(
                    f"{self.__name__}.lower() got a traced tensor {leaf.aval}; inside traced "
                    f"code call the function itself"
                )
            if is_array(leaf):
                try:
                    keys.append(abstract(leaf))
                except TesseraError as error:
                    where = _leaf_argument(self.fn, marked, kwargs, index)
                    raise ExecutionError(f"{self.__name__}: {where}: {error}") from None
            else:
                keys.append(leaf if isinstance(leaf, _Static) else _Static(leaf))
        try:
            hash(tuple(keys))
        except TypeError as error:
            raise TraceError(
                f"static arguments of {self.__name__} must be hashable: {error}"
            ) from None
        unsharded = Signature(treedef, tuple(keys))
        shardings = self._input_shardings(args, leaves, unsharded)
        return Signature(treedef, tuple(keys), shardings), leaves

    def _input_shardings(
        self, args: Sequence[Any], leaves: Sequence[Any], signature: Signature
    ) -> tuple[Sharding | None, ...]:
        """The sharding of each array leaf: from ``in_shardings`` (a pytree prefix of the
        positional arguments) or from a ``dist.tensor``'s layout."""
        if self.mesh is None:
            if any(isinstance(leaf, DistTensor) for leaf in leaves):
                raise ShardingError(
                    f"{self.__name__} got a dist.tensor argument but has no mesh: ts.jit(fn, mesh=...)"
                )
            return ()
        names = self._argument_names(signature)
        specs = self.in_shardings
        if specs is not None and not isinstance(specs, (tuple, list)):
            specs = (specs,) * len(args)
        if specs is not None and len(specs) != len(args):
            raise ShardingError(
                f"{self.__name__}: in_shardings has {len(specs)} entries for {len(args)} positional arguments"
            )
        per_leaf: list[ShardSpec | None] = []
        for index, arg in enumerate(args):
            _, tree = pytree.flatten(arg)
            per_leaf += broadcast_prefix(
                specs[index] if specs else None, tree, f"in_shardings[{index}]"
            )
        per_leaf += [None] * (len(leaves) - len(per_leaf))  # keyword arguments: open
        shardings: list[Sharding | None] = []
        array_names = iter(names)
        for leaf, spec in zip(leaves, per_leaf, strict=True):
            if not is_array(leaf):
                continue
            name = f"argument {next(array_names)!r} of {self.__name__}"
            sharding = spec.to_sharding(self.mesh, leaf.shape, name) if spec is not None else None
            if isinstance(leaf, DistTensor):
                if leaf.mesh != self.mesh:
                    raise ShardingError(
                        f"{name}: dist.tensor on {leaf.mesh} but the function runs on {self.mesh}"
                    )
                if sharding is not None and sharding != leaf.sharding:
                    raise ShardingError(
                        f"{name}: in_shardings says {sharding} but the dist.tensor is laid out {leaf.sharding}"
                    )
                sharding = leaf.sharding
            shardings.append(sharding)
        return tuple(shardings)

    def lower(self, *args: Any, **kwargs: Any) -> Lowered:
        """Traces (or fetches from the cache) the program for these arguments."""
        return self._lower(args, kwargs)[0]

    def _lower(self, args: Sequence[Any], kwargs: dict[str, Any]) -> tuple[Lowered, list[Any]]:
        signature, leaves = self._signature(args, kwargs)
        key = (signature, self.compile_config())
        lowered = self._cache.get(key)
        if lowered is None:
            with collection_paused():
                lowered = self._cache[key] = self._trace(*key)
        return lowered, leaves

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if is_tracing():  # called from traced code: inlined into the caller's program
            return self._inline(args, kwargs)
        lowered, leaves = self._lower(args, kwargs)
        if self.static_argnums:  # static arguments were one leaf each
            leaves, _ = pytree.flatten((args, kwargs))
        return lowered.run(leaves, checked=True)  # the signature matched its avals

    def _body(self, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
        """What the program computes, traced on the current trace (``ts.grad`` adds the
        backward pass)."""
        return self.fn(*args, **kwargs)

    def _inline(self, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
        """Traces the function into the program being traced, as ``jax.jit`` inside
        ``jax.jit`` does: the outer function's options govern the whole program; this
        function's shardings become sharding constraints on its arguments and results."""
        trace = current_trace()
        if self.mesh is not None and trace.mesh != self.mesh:
            where = f"{trace.mesh}" if trace.mesh is not None else "no mesh"
            raise ShardingError(
                f"{self.__name__} is compiled for {self.mesh} but is called from a function "
                f"traced with {where}; give the outer ts.jit the same mesh"
            )
        if self.in_shardings is not None:
            specs = self.in_shardings
            if not isinstance(specs, (tuple, list)):
                specs = (specs,) * len(args)
            if len(specs) != len(args):
                raise ShardingError(
                    f"{self.__name__}: in_shardings has {len(specs)} entries for "
                    f"{len(args)} positional arguments"
                )
            args = tuple(
                _constrain(arg, spec, f"in_shardings[{i}]")
                for i, (arg, spec) in enumerate(zip(args, specs, strict=True))
            )
        result = self._body(args, kwargs)
        if self.out_shardings is not None:
            result = _constrain(result, self.out_shardings, "out_shardings")
        return result

    def _trace(self, signature: Signature, config: CompileConfig) -> Lowered:
        self.trace_count += 1
        avals = [k for k in signature.leaves if isinstance(k, AbstractTensor)]
        trace = Trace(self.__name__, avals, mesh=self.mesh)
        for argument, name in zip(trace.block.args, self._argument_names(signature), strict=True):
            argument.name_hint = name
        arguments = iter(trace.block.args)
        leaves = [
            Tensor(trace, next(arguments)) if isinstance(k, AbstractTensor) else k.value
            for k in signature.leaves
        ]
        args, kwargs = pytree.unflatten(signature.treedef, leaves)
        check_call(self.fn, self.__name__, args, kwargs)
        with tracing(trace):
            out_leaves, out_tree, config = self._trace_results(args, kwargs, config)
        for leaf in out_leaves:
            if not isinstance(leaf, Tensor):
                raise TraceError(
                    f"{self.__name__} must return tensors (in tuples, lists or dicts), "
                    f"found {type(leaf).__name__}: {leaf!r}\n  in {where_defined(self.fn)}"
                )
            if leaf.trace is not trace:
                raise TraceError(f"{self.__name__} returned a tensor from another traced function")
        shardings = signature.shardings or (None,) * len(avals)
        donated = self._donated_leaves(signature)
        arg_attrs: list[dict[str, Attribute]] = [
            ({SHARDING_KEY: ShardingAttr.get(MESH_SYMBOL, s)} if s is not None else {})
            | ({DONATED: UnitAttr()} if index in donated else {})
            for index, s in enumerate(shardings)
        ]
        module = trace.finish(out_leaves, arg_attrs)
        lowered = Lowered(trace.name, module, signature, out_tree, config)
        lowered.executor.graphs = CudaGraphs(trace.name) if self.cuda_graphs else None
        return lowered

    def _trace_results(
        self, args: Sequence[Any], kwargs: dict[str, Any], config: CompileConfig
    ) -> tuple[list[Any], pytree.TreeDef, CompileConfig]:
        """Traces the program on the current trace: the leaves the traced module returns,
        the structure of the program's results, and the config it compiles with (as
        given; ``ts.grad`` traces the forward and adds the ``autodiff`` stage's options)."""
        out_leaves, out_tree = pytree.flatten(self._body(args, kwargs))
        if self.out_shardings is not None:
            specs = broadcast_prefix(self.out_shardings, out_tree, "out_shardings")
            # the outputs: a region call's unread results constrained in the call
            out_leaves = shard_unread(out_leaves, specs)
        return out_leaves, out_tree, config

    def _donated_leaves(self, signature: Signature) -> set[int]:
        """Indices (among the array arguments) of the leaves of ``donate_argnums``."""
        positional = signature.treedef.children[0].children
        donated = {
            n % len(positional)
            for n in self.donate_argnums
            if -len(positional) <= n < len(positional)
        }
        indices: set[int] = set()
        leaves = iter(signature.leaves)
        count = 0
        for index, child in enumerate(positional):
            for _ in range(child.num_leaves):
                if isinstance(next(leaves), AbstractTensor):
                    if index in donated:
                        indices.add(count)
                    count += 1
        return indices

    def _argument_names(self, signature: Signature) -> list[str]:
        """IR names of the array leaves: the parameter name plus the path into pytrees."""
        try:
            params = list(inspect.signature(self.fn).parameters)
        except (TypeError, ValueError):
            params = []
        positional, keyword = signature.treedef.children
        names: list[str] = []
        leaves = iter(signature.leaves)

        def visit(treedef: pytree.TreeDef, path: str) -> None:
            if treedef.kind == "leaf":
                if isinstance(next(leaves), AbstractTensor):
                    names.append(re.sub(r"\W", "_", path) or "arg")
                return
            keys = treedef.meta if treedef.kind == "dict" else range(len(treedef.children))
            for key, child in zip(keys, treedef.children, strict=True):
                visit(child, f"{path}_{key}")

        for index, child in enumerate(positional.children):
            visit(child, params[index] if index < len(params) else f"arg{index}")
        for key, child in zip(keyword.meta, keyword.children, strict=True):
            visit(child, str(key))
        return names


def check_call(
    fn: Callable[..., Any], name: str, args: Sequence[Any], kwargs: dict[str, Any]
) -> None:
    """A TraceError when ``fn`` cannot take these arguments (checked before tracing, so
    a TypeError raised inside ``fn`` is not mistaken for one)."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(*args, **kwargs)
    except TypeError as error:
        raise TraceError(
            f"{name} was called with {len(args)} positional argument(s)"
            f"{' and keywords ' + str(sorted(kwargs)) if kwargs else ''}: {error}\n"
            f"  {where_defined(fn)}"
        ) from None


def _positional_count(fn: Callable[..., Any]) -> int | None:
    """How many positional parameters ``fn`` has (None: any number, or unknown)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return None
    return sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)


def _argnums(
    value: int | Sequence[int], what: str, name: str, positional: int | None
) -> tuple[int, ...]:
    """``static_argnums`` / ``donate_argnums`` as a tuple of distinct ints, each in range
    of the function's positional parameters when their number is known."""
    nums = (value,) if isinstance(value, int) and not isinstance(value, bool) else value
    if isinstance(nums, (str, bytes)) or not isinstance(nums, Sequence):
        raise ArgumentError(f"{name}: {what} must be an int or a sequence of ints, found {value!r}")
    for num in nums:
        if not isinstance(num, int) or isinstance(num, bool):
            raise ArgumentError(f"{name}: {what} must hold ints, found {num!r} in {value!r}")
        if positional is not None and not -positional <= num < positional:
            raise ArgumentError(
                f"{name}: {what} has {num}, but the function takes {positional} positional "
                f"arguments"
            )
    if len(set(nums)) != len(nums):
        raise ArgumentError(f"{name}: {what} names an argument twice: {value!r}")
    return tuple(nums)


def _leaf_argument(
    fn: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any], index: int
) -> str:
    """``argument 'x'`` (and which of its leaves) holding the ``index``-th leaf of a call
    (for error messages)."""
    try:
        params = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        params = []
    named = [(params[i] if i < len(params) else str(i), a) for i, a in enumerate(args)]
    start = 0
    for name, value in [*named, *kwargs.items()]:
        count = len(pytree.flatten(value)[0])
        if index < start + count:
            return f"argument {name!r}" + (f" (leaf {index - start})" if count > 1 else "")
        start += count
    return f"argument {index}"


def where_defined(fn: Callable[..., Any]) -> str:
    """``name defined at file:line``: where ``fn`` is defined, for errors about the
    function as a whole."""
    code = getattr(inspect.unwrap(fn), "__code__", None)
    name = getattr(fn, "__qualname__", repr(fn))
    return f"{name} defined at {code.co_filename}:{code.co_firstlineno}" if code else name


@dataclass(frozen=True)
class _Static:
    """A leaf the program is specialised on, compared by type and value: ``1``, ``1.0``
    and ``True`` are equal in Python but trace differently (``x * 1.0`` is float)."""

    value: Any
    kind: type = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", type(self.value))


def jit(
    fn: Callable[..., Any] | None = None,
    *,
    static_argnums: int | Sequence[int] = (),
    mesh: Mesh | None = None,
    in_shardings: Any = None,
    out_shardings: Any = None,
    kernels: str | None = None,
    donate_argnums: int | Sequence[int] = (),
    cuda_graphs: bool = False,
) -> Any:
    """Compiles ``fn`` with Tessera; usable as ``@jit`` or ``@jit(static_argnums=...)``.

    With a ``mesh``, ``in_shardings`` gives one entry per positional argument (a
    ``dist.ShardSpec``, None for "let Tessera choose", or a pytree of those matching the
    argument) and ``out_shardings`` constrains the outputs the same way. ``kernels`` is
    ``"triton"`` (generated kernels; the default, or ``TESSERA_KERNELS``) or
    ``"reference"`` (the reference executor). ``donate_argnums`` (as in JAX) marks
    arguments whose buffers the program may reuse once it has read them: ``plan-memory``
    frees them after their last use and lets an elementwise update write in their place.
    ``cuda_graphs=True`` replays each launch plan from a CUDA graph captured at its second
    call (its results are copies; where a plan cannot be captured, e.g. without CUDA, it
    runs as usual after a ``CudaGraphWarning``: :mod:`tessera.backends.cuda_graphs`).
    """
    options = {
        "static_argnums": static_argnums,
        "mesh": mesh,
        "in_shardings": in_shardings,
        "out_shardings": out_shardings,
        "kernels": kernels,
        "donate_argnums": donate_argnums,
        "cuda_graphs": cuda_graphs,
    }
    if fn is None:
        return lambda f: jit(f, **options)
    if not callable(fn):
        raise ArgumentError(f"ts.jit expects a function, found {type(fn).__name__}")
    if inspect.isclass(fn):
        raise ArgumentError("ts.jit expects a function, found a class")
    return JitFunction(fn, **options)


def _constrain(value: Any, specs: Any, what: str) -> Any:
    """``value`` (a pytree) with each traced tensor constrained to its spec in ``specs``
    (a pytree prefix of ``value`` of ``dist.ShardSpec`` or None)."""
    leaves, tree = pytree.flatten(value)
    per_leaf = broadcast_prefix(specs, tree, what)
    return pytree.unflatten(
        tree,
        [
            shard(leaf, spec) if spec is not None and isinstance(leaf, Tensor) else leaf
            for leaf, spec in zip(leaves, per_leaf, strict=True)
        ],
    )


def broadcast_prefix(prefix: Any, tree: pytree.TreeDef, what: str) -> list[Any]:
    """One entry per leaf of ``tree``: a leaf of ``prefix`` applies to its whole subtree."""
    if prefix is None or isinstance(prefix, ShardSpec):
        return [prefix] * tree.num_leaves
    prefix_leaves, prefix_tree = pytree.flatten(prefix)
    if prefix_tree == tree:
        return prefix_leaves
    if (
        tree.kind in ("tuple", "list", "namedtuple")
        and isinstance(prefix, (tuple, list))
        and len(prefix) == len(tree.children)
    ):
        return [
            x
            for p, child in zip(prefix, tree.children, strict=True)
            for x in broadcast_prefix(p, child, what)
        ]
    if tree.kind == "dict" and isinstance(prefix, dict) and set(prefix) == set(tree.meta):
        return [
            x
            for key, child in zip(tree.meta, tree.children, strict=True)
            for x in broadcast_prefix(prefix[key], child, what)
        ]
    raise ShardingError(f"{what} does not match the structure of the values it describes")


_register_shard_map_jit(jit)  # dist.shard_map called outside tracing runs as ts.jit

__all__ = [
    "JitFunction",
    "broadcast_prefix",
    "check_call",
    "default_kernels",
    "jit",
    "where_defined",
]
