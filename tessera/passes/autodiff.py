"""``autodiff``: reverse-mode differentiation of a graph function (a VJP per op).

For ``func.func @f`` whose first result is a scalar float (the loss), the pass adds
``@f_grad`` (or rewrites ``@f`` in place with ``in-place=true``) returning ``@f``'s results
followed by the gradient of the loss with respect to each argument listed in ``wrt``
(default: every float argument). The backward program is appended after the forward one:
ops are visited in reverse, each op's VJP rule (``tessera.ops.op_def(op).vjp``) maps its results' cotangents to its operands', and cotangents of a value used several
times are summed. Arguments the loss does not depend on get zeros.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import FunctionType, ModuleOp, StringAttr
from xdsl.ir import Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.rewriter import InsertPoint
from xdsl.utils.exceptions import PassFailedException

from tessera.errors import TesseraError
from tessera.ir.abstract import aval
from tessera.ir.grad_builder import GradBuilder
from tessera.ops import lookup


def differentiate(function: func.FuncOp, wrt: Sequence[int] | None = None) -> None:
    """Appends the backward program to ``function`` (in place): its results become the
    original results followed by the gradients of the first result w.r.t. ``wrt``."""
    name = function.sym_name.data
    block = function.body.block
    ret = block.last_op
    assert isinstance(ret, func.ReturnOp)
    if not ret.operands:
        raise TesseraError(f"@{name}: a function to differentiate must return a loss")
    loss = ret.operands[0]
    loss_type = aval(loss)
    if loss_type.shape != () or not loss_type.dtype.is_float:
        raise TesseraError(
            f"@{name}: the loss (first result) must be a float scalar to differentiate, found {loss_type}"
        )
    args = list(block.args)
    if wrt is None:
        wrt = [i for i, a in enumerate(args) if aval(a).dtype.is_float]
    for index in wrt:
        if not 0 <= index < len(args):
            raise TesseraError(f"@{name}: no argument {index} to differentiate with respect to")
        if not aval(args[index]).dtype.is_float:
            raise TesseraError(
                f"@{name}: argument {index} is {aval(args[index])}; only float arguments have gradients"
            )
    forward = [op for op in block.ops if op is not ret]
    grads = backprop(
        forward, loss, [args[i] for i in wrt], GradBuilder(InsertPoint.before(ret)), f"@{name}"
    )
    ret.operands = [*ret.operands, *grads]
    function.function_type = FunctionType.from_lists(
        [a.type for a in args], [v.type for v in ret.operands]
    )


def backprop(
    forward: Sequence[Operation],
    loss: SSAValue | None,
    wrt: Sequence[SSAValue],
    b: GradBuilder,
    where: str = "",
    seeds: Mapping[SSAValue, SSAValue] | None = None,
) -> list[SSAValue]:
    """Emits with ``b`` the gradients of the scalar ``loss`` with respect to ``wrt``, by
    reverse accumulation over the ``forward`` ops (in program order). ``seeds`` gives
    further values' cotangents (a vector-Jacobian product: a pipeline stage's outputs
    seeded with the gradients the next stage sends back)."""
    cotangents: dict[SSAValue, SSAValue] = dict(seeds or {})
    if loss is not None:
        cotangents[loss] = b.constant(1.0, loss)
    for op in reversed(forward):
        result_cts = [cotangents.get(r) for r in op.results]
        if all(c is None for c in result_cts):
            continue
        found = lookup(op)
        if found is None:
            raise TesseraError(
                f"{where + ': ' if where else ''}{op.name} is not differentiable yet"
            )
        operand_cts = found.vjp(b, op, result_cts)
        for operand, ct in zip(op.operands, operand_cts, strict=True):
            if ct is None:
                continue
            previous = cotangents.get(operand)
            cotangents[operand] = ct if previous is None else b.add(previous, ct)
    return [cotangents.get(v) or b.zeros_like(v) for v in wrt]


@dataclass(frozen=True)
class AutodiffPass(ModulePass):
    """Adds @f_grad: @f's results and the gradients of its first result (reverse mode)."""

    name = "autodiff"
    function: str = ""  # the function to differentiate (default: the only one)
    wrt: tuple[int, ...] = ()  # argument indices (default: every float argument)
    in_place: bool = False

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        functions = [f for f in op.ops if isinstance(f, func.FuncOp) and f.body.blocks]
        if self.function:
            functions = [f for f in functions if f.sym_name.data == self.function]
            if not functions:
                raise PassFailedException(f"autodiff: no function @{self.function}")
        elif len(functions) != 1:
            raise PassFailedException(
                "autodiff: the module has several functions; say which with function=NAME"
            )
        (target,) = functions
        if not self.in_place:
            copy = target.clone()
            copy.sym_name = StringAttr(f"{target.sym_name.data}_grad")
            op.body.block.insert_op_after(copy, target)
            target = copy
        try:
            differentiate(target, list(self.wrt) or None)
        except TesseraError as error:
            raise PassFailedException(f"autodiff: {error}") from None
