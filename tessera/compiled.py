"""``ts.jit``: trace a Python function once per signature, then run the compiled program.

The signature of a call is its pytree structure, the shape and dtype of every array
leaf, and the value of every static leaf (Python scalars, strings, None and arguments
named in ``static_argnums``). A second call with the same signature reuses the compiled
program without retracing (``JitFunction.trace_count`` counts traces).
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from xdsl.dialects.builtin import ModuleOp

from tessera.backends.reference import run_function
from tessera.dtypes import as_dtype
from tessera.errors import ExecutionError, TesseraError, TraceError
from tessera.frontend import pytree
from tessera.frontend.tracer import Tensor, Trace, tracing
from tessera.ir.abstract import AbstractTensor

STAGES = ("graph",)


def _is_array(leaf: Any) -> bool:
    """Arrays are traced; numpy scalars (``np.float32(1)``) count as 0-d arrays."""
    return isinstance(leaf, (torch.Tensor, np.ndarray, np.generic))


def _abstract(leaf: torch.Tensor | np.ndarray | np.generic) -> AbstractTensor:
    return AbstractTensor(tuple(int(d) for d in leaf.shape), as_dtype(leaf.dtype))


@dataclass(frozen=True)
class Signature:
    """What a compiled program is specialised on."""

    treedef: pytree.TreeDef
    leaves: tuple[Any, ...]  # AbstractTensor for arrays, the value itself for static leaves


class Lowered:
    """A traced program for one signature (like ``jax.jit(f).lower(...)``)."""

    def __init__(self, name: str, module: ModuleOp, signature: Signature, out_tree: pytree.TreeDef):
        self.name = name
        self.module = module
        self.signature = signature
        self.out_tree = out_tree

    def as_text(self, stage: str = "graph") -> str:
        """The IR at ``stage``: ``"graph"`` is the traced Graph IR."""
        if stage not in STAGES:
            raise TesseraError(f"unknown or not yet available stage {stage!r}; available: {STAGES}")
        return str(self.module)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        leaves, _ = pytree.flatten((args, kwargs))
        return self.run(leaves)

    def run(self, leaves: Sequence[Any]) -> Any:
        arrays = [leaf for leaf in leaves if _is_array(leaf)]
        expected, found = self._input_avals(), [_abstract(a) for a in arrays]
        if found != expected:
            raise ExecutionError(
                f"{self.name} was compiled for arrays {', '.join(map(str, expected)) or 'none'}; "
                f"found {', '.join(map(str, found)) or 'none'}"
            )
        to_numpy = any(not isinstance(a, torch.Tensor) for a in arrays)
        inputs = [_to_torch(a, aval) for a, aval in zip(arrays, expected, strict=True)]
        outputs = [_unaliased(o, inputs) for o in run_function(self.module, self.name, inputs)]
        results = [o.numpy() if to_numpy and o.dtype != torch.bfloat16 else o for o in outputs]
        return pytree.unflatten(self.out_tree, results)

    def _input_avals(self) -> list[AbstractTensor]:
        return [leaf for leaf in self.signature.leaves if isinstance(leaf, AbstractTensor)]


def _to_torch(array: torch.Tensor | np.ndarray | np.generic, aval: AbstractTensor) -> torch.Tensor:
    """A CPU tensor of ``aval``'s dtype; numpy data is copied (``np.array`` keeps 0-d shapes)."""
    tensor = array if isinstance(array, torch.Tensor) else torch.from_numpy(np.array(array, order="C"))
    return tensor.detach().to(device="cpu", dtype=aval.dtype.to_torch())


def _unaliased(output: torch.Tensor, inputs: Sequence[torch.Tensor]) -> torch.Tensor:
    """``output``, copied if it shares memory with an argument: results are new values."""
    address = output.untyped_storage().data_ptr()
    if any(address == i.untyped_storage().data_ptr() for i in inputs):
        return output.clone()
    return output


class JitFunction:
    """A function compiled by Tessera; call it like the original."""

    def __init__(self, fn: Callable[..., Any], static_argnums: Sequence[int] = ()):
        functools.update_wrapper(self, fn)
        self.__name__: str = getattr(fn, "__name__", "main")  # functools.partial has none
        self.fn = fn
        self.static_argnums = tuple(static_argnums)
        self.trace_count = 0
        self._cache: dict[Signature, Lowered] = {}

    def signature(self, args: Sequence[Any], kwargs: dict[str, Any]) -> Signature:
        static = {n % len(args) for n in self.static_argnums if -len(args) <= n < len(args)}
        marked = tuple(_Static(a) if i in static else a for i, a in enumerate(args))
        leaves, treedef = pytree.flatten((marked, kwargs))
        keys = []
        for leaf in leaves:
            if _is_array(leaf):
                keys.append(_abstract(leaf))
            else:
                keys.append(leaf if isinstance(leaf, _Static) else _Static(leaf))
        try:
            hash(tuple(keys))
        except TypeError as error:
            raise TraceError(f"static arguments of {self.__name__} must be hashable: {error}") from None
        return Signature(treedef, tuple(keys))

    def lower(self, *args: Any, **kwargs: Any) -> Lowered:
        """Traces (or fetches from the cache) the program for these arguments."""
        signature = self.signature(args, kwargs)
        if signature not in self._cache:
            self._cache[signature] = self._trace(signature)
        return self._cache[signature]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        lowered = self.lower(*args, **kwargs)
        leaves, _ = pytree.flatten((args, kwargs))
        return lowered.run(leaves)

    def _trace(self, signature: Signature) -> Lowered:
        self.trace_count += 1
        avals = [k for k in signature.leaves if isinstance(k, AbstractTensor)]
        trace = Trace(self.__name__, avals)
        for argument, name in zip(trace.block.args, self._argument_names(signature), strict=True):
            argument.name_hint = name
        arguments = iter(trace.block.args)
        leaves = [
            Tensor(trace, next(arguments)) if isinstance(k, AbstractTensor) else k.value
            for k in signature.leaves
        ]
        args, kwargs = pytree.unflatten(signature.treedef, leaves)
        with tracing(trace):
            result = self.fn(*args, **kwargs)
        out_leaves, out_tree = pytree.flatten(result)
        for leaf in out_leaves:
            if not isinstance(leaf, Tensor):
                raise TraceError(
                    f"{self.__name__} must return tensors (in tuples, lists or dicts), "
                    f"found {type(leaf).__name__}: {leaf!r}\n  in {_definition(self.fn)}"
                )
            if leaf.trace is not trace:
                raise TraceError(f"{self.__name__} returned a tensor from another traced function")
        return Lowered(trace.name, trace.finish(out_leaves), signature, out_tree)


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


def _definition(fn: Callable[..., Any]) -> str:
    """``file:line`` where ``fn`` is defined, for errors about the function as a whole."""
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
    fn: Callable[..., Any] | None = None, *, static_argnums: int | Sequence[int] = ()
) -> Any:
    """Compiles ``fn`` with Tessera; usable as ``@jit`` or ``@jit(static_argnums=...)``."""
    nums = (static_argnums,) if isinstance(static_argnums, int) else tuple(static_argnums)
    if fn is None:
        return lambda f: JitFunction(f, nums)
    if not callable(fn):
        raise TesseraError(f"ts.jit expects a function, found {type(fn).__name__}")
    if inspect.isclass(fn):
        raise TesseraError("ts.jit expects a function, found a class")
    return JitFunction(fn, nums)


__all__ = ["ExecutionError", "JitFunction", "Lowered", "jit"]
