"""``ts.grad`` and ``ts.value_and_grad``: compiled gradients of a scalar-valued function.

Like JAX's: ``argnums`` picks the positional arguments to differentiate (an int gives
that argument's gradient, a tuple a tuple of them), each argument may be a pytree of
arrays (e.g. a dict of parameters) and its gradient has the same structure. The
function is traced once per signature, the ``autodiff`` pass appends the backward
program, and the whole program compiles and runs like any ``ts.jit`` function.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from xdsl.dialects import func
from xdsl.dialects.builtin import FunctionType

from tessera.compiled import JitFunction, Lowered, Signature
from tessera.errors import TesseraError, TraceError
from tessera.frontend import pytree
from tessera.ir.abstract import AbstractTensor
from tessera.passes.autodiff import differentiate


class GradFunction(JitFunction):
    """A JitFunction whose program returns gradients (and the value, if asked)."""

    def __init__(
        self, fn: Callable[..., Any], argnums: int | Sequence[int], with_value: bool, **options: Any
    ):
        super().__init__(fn, **options)
        self.argnums = argnums
        self.with_value = with_value

    def _trace(self, signature: Signature) -> Lowered:
        lowered = super()._trace(signature)
        if lowered.out_tree.num_leaves != 1:
            raise TraceError(
                f"{self.__name__} must return one scalar (the loss) to be differentiated, "
                f"found {lowered.out_tree.num_leaves} outputs"
            )
        positional = signature.treedef.children[0].children
        nums = (self.argnums,) if isinstance(self.argnums, int) else tuple(self.argnums)
        wrt: list[int] = []
        structures = []
        for num in nums:
            if not -len(positional) <= num < len(positional):
                raise TesseraError(
                    f"argnums {num} is out of range for {len(positional)} positional arguments"
                )
            num %= len(positional)
            start = sum(child.num_leaves for child in positional[:num])
            leaves = signature.leaves[start : start + positional[num].num_leaves]
            if not any(isinstance(leaf, AbstractTensor) for leaf in leaves):
                raise TesseraError(
                    f"argument {num} of {self.__name__} has no arrays to differentiate"
                )
            first = sum(isinstance(leaf, AbstractTensor) for leaf in signature.leaves[:start])
            index = first
            marks = []
            for leaf in leaves:
                if isinstance(leaf, AbstractTensor):
                    if not leaf.dtype.is_float:
                        raise TesseraError(
                            f"argument {num} of {self.__name__} holds {leaf}; only float arrays have gradients"
                        )
                    wrt.append(index)
                    index += 1
                    marks.append(0)
                else:
                    marks.append(None)
            structures.append(pytree.unflatten(positional[num], marks))
        function = next(
            op
            for op in lowered.module.ops
            if isinstance(op, func.FuncOp) and op.sym_name.data == lowered.name
        )
        try:
            differentiate(function, wrt)
        except TesseraError as error:
            raise type(error)(f"{self.__name__}: {error}") from None
        if not self.with_value:  # drop the loss
            ret = function.body.block.last_op
            assert isinstance(ret, func.ReturnOp)
            ret.operands = list(ret.operands)[1:]
            function.function_type = FunctionType.from_lists(
                [a.type for a in function.args], [v.type for v in ret.operands]
            )
        lowered.module.verify()
        grads = structures[0] if isinstance(self.argnums, int) else tuple(structures)
        tree = (0, grads) if self.with_value else grads
        return Lowered(
            lowered.name,
            lowered.module,
            signature,
            pytree.flatten(tree)[1],
            lowered.mesh,
            lowered.kernels,
        )


def value_and_grad(
    fn: Callable[..., Any], argnums: int | Sequence[int] = 0, **options: Any
) -> GradFunction:
    """``f(*args) -> (loss, gradients)``; ``options`` are :func:`tessera.jit`'s."""
    return GradFunction(fn, argnums, with_value=True, **options)


def grad(fn: Callable[..., Any], argnums: int | Sequence[int] = 0, **options: Any) -> GradFunction:
    """``f(*args) -> gradients`` of a scalar-valued ``fn``; ``options`` are :func:`tessera.jit`'s."""
    return GradFunction(fn, argnums, with_value=False, **options)
