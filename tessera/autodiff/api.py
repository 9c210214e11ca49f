"""``ts.grad`` and ``ts.value_and_grad``: gradients of a scalar-valued function.

Like JAX's: ``argnums`` picks the positional arguments to differentiate (an int gives
that argument's gradient, a tuple a tuple of them), each argument may be a pytree of
arrays (e.g. a dict of parameters) and its gradient has the same structure; with
``has_aux=True`` the function returns ``(loss, aux)`` and ``aux`` is passed through.

A gradient function is a transform of traced code: called inside traced code
(``ts.jit(ts.grad(f))``, or a ``ts.grad`` inside a ``@ts.jit`` model) it traces ``f``
into the caller's program and appends the backward ops (the ops' VJPs, as the
``autodiff`` pass does); called on arrays it is compiled like any ``ts.jit`` function,
whose options (``mesh``, ``in_shardings``, ...) it accepts: the traced program is the
forward, returning the loss (and ``aux``), and the compile driver's ``autodiff`` stage
appends the backward (``tessera.driver``; ``lowered.pipeline()`` prints it). With
``out_shardings``, which constrain the gradients as they are traced, or an argument
differentiated twice, the backward is traced too. Ops that only compute a loss the
caller drops are removed by the compile pipeline's ``dce``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from xdsl.dialects.builtin import FileLineColLoc
from xdsl.ir import BlockArgument, Operation
from xdsl.rewriter import InsertPoint

from tessera.driver import Autodiff, CompileConfig
from tessera.errors import ArgumentError, TraceError, describe_location
from tessera.execute import is_array
from tessera.frontend import pytree
from tessera.frontend.tracer import Tensor, Trace, current_trace
from tessera.ir import graph
from tessera.ir.grad_builder import GradBuilder
from tessera.jit_function import JitFunction, where_defined
from tessera.passes.autodiff import backprop
from tessera.program import Lowered, Signature


class GradFunction(JitFunction):
    """A function returning the gradients of ``fn`` (and its value, if asked)."""

    def __init__(
        self,
        fn: Callable[..., Any],
        argnums: int | Sequence[int],
        with_value: bool,
        has_aux: bool = False,
        **options: Any,
    ):
        if isinstance(fn, JitFunction) and fn.mesh is not None and "mesh" not in options:
            options["mesh"] = fn.mesh  # ts.grad(ts.jit(f, mesh=...)) runs on f's mesh
        super().__init__(fn, **options)
        nums = (argnums,) if isinstance(argnums, int) else argnums
        if (
            isinstance(nums, (str, bytes))
            or not isinstance(nums, Sequence)
            or not nums
            or not all(isinstance(n, int) and not isinstance(n, bool) for n in nums)
        ):
            raise ArgumentError(
                f"ts.grad: argnums must be an int or a non-empty sequence of ints, found {argnums!r}"
            )
        self.argnums = argnums
        self.with_value = with_value
        self.has_aux = has_aux

    def _trace(self, signature: Signature, config: CompileConfig) -> Lowered:
        lowered = super()._trace(signature, config)
        # the backward at once, so that its errors (an op without a VJP) come when
        # tracing, as inside traced code
        lowered.module_at("autodiff")
        return lowered

    def _body(self, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
        """Inside traced code: ``fn``'s forward, then its backward, traced at once."""
        return self._differentiated(self._forward(args, kwargs))

    def _trace_results(
        self, args: Sequence[Any], kwargs: dict[str, Any], config: CompileConfig
    ) -> tuple[list[Any], pytree.TreeDef, CompileConfig]:
        """A compiled gradient program: the traced module is ``fn``'s forward, returning
        the loss and the ``aux`` leaves; the config's ``autodiff`` stage appends the
        backward and returns what the function returns."""
        if self.out_shardings is not None:  # constraints on the gradients, as traced
            return super()._trace_results(args, kwargs, config)
        forward = self._forward(args, kwargs)
        trace = forward.loss.trace
        wrt = [t.value for t in forward.wrt]
        if not all(isinstance(v, BlockArgument) and v.block is trace.block for v in wrt):
            # an argument differentiated twice: its second use is a traced copy
            out_leaves, out_tree = pytree.flatten(self._differentiated(forward))
            return out_leaves, out_tree, config
        aux_leaves, aux_tree = pytree.flatten(forward.aux)
        returned = [forward.loss, *aux_leaves]
        # the program's results, each an index into (returned, the gradients)
        indexed = _Forward(
            _Result(0),
            pytree.unflatten(aux_tree, [_Result(1 + i) for i in range(len(aux_leaves))]),
            forward.wrt,
            forward.structures,
            forward.before,
        )
        gradients = [_Result(len(returned) + i) for i in range(len(wrt))]
        out_leaves, out_tree = pytree.flatten(self._differentiated(indexed, gradients))
        results = tuple(leaf.index for leaf in out_leaves)
        autodiff = Autodiff(
            trace.name,
            tuple(v.index for v in wrt if isinstance(v, BlockArgument)),
            () if results == tuple(range(len(returned) + len(wrt))) else results,
        )
        return returned, out_tree, config.replace(autodiff=autodiff)

    def _forward(self, args: Sequence[Any], kwargs: dict[str, Any]) -> _Forward:
        """Traces ``fn`` on the current trace, each differentiated leaf a tensor of its
        own (checked to be a float array)."""
        trace = current_trace()
        positional = list(args)
        nums = (self.argnums,) if isinstance(self.argnums, int) else tuple(self.argnums)
        wrt: list[Tensor] = []
        structures: list[tuple[pytree.TreeDef, list[bool]]] = []
        seen: set[int] = set()
        for num in nums:
            if not -len(positional) <= num < len(positional):
                raise ArgumentError(
                    f"argnums {num} is out of range for {len(positional)} positional arguments "
                    f"of {self.__name__}\n  {where_defined(self.fn)}"
                )
            num %= len(positional)
            leaves, tree = pytree.flatten(positional[num])
            differentiated = [is_array(leaf) or isinstance(leaf, Tensor) for leaf in leaves]
            if not any(differentiated):
                raise ArgumentError(
                    f"argument {num} of {self.__name__} has no arrays to differentiate\n"
                    f"  {where_defined(self.fn)}"
                )
            leaves = [
                _fresh(trace, leaf, seen, num, self.fn) if marked else leaf
                for leaf, marked in zip(leaves, differentiated, strict=True)
            ]
            wrt += [leaf for leaf, marked in zip(leaves, differentiated, strict=True) if marked]
            structures.append((tree, differentiated))
            positional[num] = pytree.unflatten(tree, leaves)
        before = trace.block.last_op
        loss, aux = self._split_result(self.fn(*positional, **kwargs), trace)
        return _Forward(loss, aux, wrt, structures, before)

    def _differentiated(self, forward: _Forward, gradients: Sequence[Any] | None = None) -> Any:
        """What the function returns: the gradients (by default traced now, appended to
        the forward), with the loss and ``aux`` as asked."""
        if gradients is None:
            trace = forward.loss.trace
            traced = backprop(
                _ops_after(trace, forward.before),
                forward.loss.value,
                [t.value for t in forward.wrt],
                GradBuilder(InsertPoint.at_end(trace.block)),
                self.__name__,
            )
            gradients = [Tensor(trace, g) for g in traced]
        each = iter(gradients)
        per_argument = [
            pytree.unflatten(tree, [next(each) if marked else None for marked in differentiated])
            for tree, differentiated in forward.structures
        ]
        grads = per_argument[0] if isinstance(self.argnums, int) else tuple(per_argument)
        loss, aux = forward.loss, forward.aux
        if self.with_value:
            return (loss, aux) if self.has_aux else loss, grads
        return (grads, aux) if self.has_aux else grads

    def _split_result(self, result: Any, trace: Trace) -> tuple[Tensor, Any]:
        """The loss (checked to be a float scalar of this trace) and the aux value."""
        aux = None
        where = f"\n  {where_defined(self.fn)}"
        if self.has_aux:
            if not isinstance(result, (tuple, list)) or len(result) != 2:
                raise TraceError(
                    f"{self.__name__} was differentiated with has_aux=True, so it must return "
                    f"a pair (loss, aux); found {type(result).__name__}{where}"
                )
            result, aux = result
        if not isinstance(result, Tensor):
            leaves, _ = pytree.flatten(result)
            hint = "; to return more, use has_aux=True and return (loss, aux)"
            raise TraceError(
                f"{self.__name__} must return one scalar (the loss) to be differentiated, "
                f"found {len(leaves)} outputs" + (hint if len(leaves) > 1 else "") + where
            )
        if result.trace is not trace:
            raise TraceError(f"{self.__name__} returned a tensor from another traced function")
        if result.aval.shape != () or not result.aval.dtype.is_float:
            raise TraceError(
                f"{self.__name__}: the loss must be a float scalar to be differentiated, "
                f"found {result.aval}{_computed_at(result) or where}"
            )
        return result, aux


@dataclass(frozen=True)
class _Forward:
    """``fn``'s traced forward: the loss, ``aux``, the differentiated tensors, and per
    differentiated argument its structure and which of its leaves are differentiated;
    ``before`` is the last op traced before ``fn`` ran."""

    loss: Any
    aux: Any
    wrt: list[Tensor]
    structures: list[tuple[pytree.TreeDef, list[bool]]]
    before: Operation | None


@dataclass(frozen=True)
class _Result:
    """Stands for a result of a gradient program: ``index`` into the forward's results
    (the loss, then ``aux``'s leaves) followed by the gradients."""

    index: int


def _computed_at(tensor: Tensor) -> str:
    """``\n  computed at file:line: source`` for a traced op's result (else empty)."""
    owner = tensor.value.owner
    location = getattr(owner, "location", None)
    if not isinstance(location, FileLineColLoc):
        return ""
    return f"\n  computed at {describe_location(location.filename.data, location.line.data)}"


def _fresh(trace: Trace, leaf: Any, seen: set[int], num: int, fn: Callable[..., Any]) -> Tensor:
    """``leaf`` as a tensor of ``trace`` that no other differentiated leaf shares (an
    argument given twice gets a copy, so each position has its own gradient)."""
    name = getattr(fn, "__name__", "the function")
    tensor = leaf if isinstance(leaf, Tensor) else _constant(leaf)
    if tensor.trace is not trace:
        raise TraceError(f"argument {num} of {name} is a tensor of another traced function")
    if not tensor.dtype.is_float:
        raise ArgumentError(
            f"argument {num} of {name} holds {tensor.aval}; only float arrays have gradients "
            f"(differentiate with respect to other arguments: argnums=...)\n  {where_defined(fn)}"
        )
    if id(tensor.value) in seen:
        (tensor,) = trace.bind(graph.ReshapeOp, [tensor], shape=tensor.shape)
    seen.add(id(tensor.value))
    return tensor


def _constant(array: Any) -> Tensor:
    from tessera import op

    return op.constant(array)


def _ops_after(trace: Trace, before: Operation | None) -> list[Operation]:
    """The ops traced after ``before`` (all of them when it is None)."""
    op = trace.block.first_op if before is None else before.next_op
    ops = []
    while op is not None:
        ops.append(op)
        op = op.next_op
    return ops


def value_and_grad(
    fn: Callable[..., Any],
    argnums: int | Sequence[int] = 0,
    has_aux: bool = False,
    **options: Any,
) -> GradFunction:
    """``f(*args) -> (loss, gradients)`` (``((loss, aux), gradients)`` with
    ``has_aux``); ``options`` are :func:`tessera.jit`'s."""
    return GradFunction(fn, argnums, with_value=True, has_aux=has_aux, **options)


def grad(
    fn: Callable[..., Any],
    argnums: int | Sequence[int] = 0,
    has_aux: bool = False,
    **options: Any,
) -> GradFunction:
    """``f(*args) -> gradients`` of a scalar-valued ``fn`` (``(gradients, aux)`` with
    ``has_aux``); ``options`` are :func:`tessera.jit`'s."""
    return GradFunction(fn, argnums, with_value=False, has_aux=has_aux, **options)
