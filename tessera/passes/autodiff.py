"""``autodiff``: reverse-mode differentiation of a graph function (a VJP per op).

For ``func.func @f`` whose first result is a scalar float (the loss), the pass adds
``@f_grad`` (or rewrites ``@f`` in place with ``in-place=true``) returning ``@f``'s results
followed by the gradient of the loss with respect to each argument listed in ``wrt``
(default: every float argument). The backward program is appended after the forward one:
ops are visited in reverse, each op's VJP rule (``tessera.ops.op_def(op).vjp``) maps its results' cotangents to its operands', and cotangents of a value used several
times are summed. Arguments the loss does not depend on get zeros.

Activation checkpointing (:mod:`tessera.ir.remat`): ops tagged ``graph.checkpoint``
belong to checkpointed blocks. With the ``remat`` option (``nothing`` by default, or
``matmuls``; ``everything`` turns it off) the values of a block that the policy does not
save are recomputed in the backward program, just before the block's VJPs, which then
read the recomputed values; ``remat-every=n`` checkpoints every n-th block only.

``results=i,j,...`` picks the function's results, in order, among ``@f``'s results followed
by the gradients (default: all of them): ``ts.grad``'s programs drop the loss, and put
the gradients before the auxiliary results with ``has_aux``. The compile driver runs
this pass as the ``autodiff`` stage of gradient programs (``tessera.driver``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import FunctionType, IntegerAttr, ModuleOp, StringAttr, i64
from xdsl.ir import Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.rewriter import InsertPoint, Rewriter
from xdsl.utils.exceptions import PassFailedException

from tessera.errors import TesseraError
from tessera.ir.abstract import aval
from tessera.ir.grad_builder import GradBuilder
from tessera.ir.remat import CHECKPOINT, REMAT, RematPolicy
from tessera.ops import Fusion, fusion_of, lookup


def differentiate(
    function: func.FuncOp,
    wrt: Sequence[int] | None = None,
    remat: RematPolicy | None = None,
    results: Sequence[int] | None = None,
) -> None:
    """Appends the backward program to ``function`` (in place): its results become the
    original results followed by the gradients of the first result w.r.t. ``wrt`` (or
    those of ``results``, by index, in that order); checkpointed blocks are recomputed as
    ``remat`` says."""
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
        forward,
        loss,
        [args[i] for i in wrt],
        GradBuilder(InsertPoint.before(ret)),
        f"@{name}",
        remat=remat,
    )
    returned = [*ret.operands, *grads]
    if results is not None:
        for index in results:
            if not 0 <= index < len(returned):
                raise TesseraError(
                    f"@{name}: no result {index} among its {len(returned)} results and gradients"
                )
        returned = [returned[i] for i in results]
    ret.operands = returned
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
    remat: RematPolicy | None = None,
) -> list[SSAValue]:
    """Emits with ``b`` the gradients of the scalar ``loss`` with respect to ``wrt``, by
    reverse accumulation over the ``forward`` ops (in program order). ``seeds`` gives
    further values' cotangents (a vector-Jacobian product: a pipeline stage's outputs
    seeded with the gradients the next stage sends back). Checkpointed blocks are
    recomputed as ``remat`` says (default: nothing saved); the forward ops lose their
    ``graph.checkpoint`` tags."""
    cotangents: dict[SSAValue, SSAValue] = dict(seeds or {})
    blocks = _checkpointed_blocks(forward, remat or RematPolicy())
    recomputed: dict[int, dict[Operation, Operation]] = {}
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
        block = blocks.get(op)
        if block is None:
            operand_cts = found.vjp(b, op, result_cts)
        else:
            if block.key not in recomputed:
                recomputed[block.key] = block.recompute(b)
            before = _last_before(b.point)
            operand_cts = found.vjp(b, recomputed[block.key][op], result_cts)
            block.tag(before, b.point)  # its VJP stays out of the forward's kernels too
        for operand, ct in zip(op.operands, operand_cts, strict=True):
            if ct is None:
                continue
            previous = cotangents.get(operand)
            cotangents[operand] = ct if previous is None else b.add(previous, ct)
    for block in {id(k): k for k in blocks.values()}.values():
        block.release(recomputed.get(block.key, {}))
    for op in forward:
        op.attributes.pop(CHECKPOINT, None)
    return [cotangents.get(v) or b.zeros_like(v) for v in wrt]


class _Block:
    """The ops of one checkpointed block and the values its backward reads again."""

    def __init__(self, key: int, ops: list[Operation], policy: RematPolicy):
        self.key = key
        self.ops = ops
        inside = set(ops)
        self.saved = {
            op
            for op in ops
            if any(u.operation not in inside for r in op.results for u in r.uses)
            or (policy.save == "matmuls" and fusion_of(op) in (Fusion.MATMUL, Fusion.ATTENTION))
        }

    def tag(self, after: Operation | None, point: InsertPoint) -> None:
        """Tags ``graph.remat`` the ops between ``after`` and ``point``."""
        op = after.next_op if after is not None else point.block.first_op
        while op is not None and op is not point.insert_before:
            op.attributes[REMAT] = IntegerAttr(self.key, i64)
            op = op.next_op

    def recompute(self, b: GradBuilder) -> dict[Operation, Operation]:
        """Emits the block's ops again with ``b`` (tagged ``graph.remat``), reading the
        saved values for the saved ops; a copy of each op for its VJP to read."""
        values: dict[SSAValue, SSAValue] = {}
        copies: dict[Operation, Operation] = {}
        for op in self.ops:
            copy = op.clone(dict(values))
            copy.attributes.pop(CHECKPOINT, None)
            copy.attributes[REMAT] = IntegerAttr(self.key, i64)
            Rewriter.insert_op(copy, b.point)
            copies[op] = copy
            if op not in self.saved:
                values.update(zip(op.results, copy.results, strict=True))
        return copies

    def release(self, copies: dict[Operation, Operation]) -> None:
        """The saved ops' copies give way to the saved values (the VJPs read those)."""
        for op in reversed(self.ops):
            copy = copies.get(op)
            if copy is not None and op in self.saved:
                for old, new in zip(copy.results, op.results, strict=True):
                    old.replace_all_uses_with(new)
                Rewriter.erase_op(copy)


def _last_before(point: InsertPoint) -> Operation | None:
    """The op just before ``point``."""
    if point.insert_before is not None:
        return point.insert_before.prev_op
    return point.block.last_op


def _checkpointed_blocks(
    forward: Sequence[Operation], policy: RematPolicy
) -> dict[Operation, _Block]:
    """Each op of a block that ``policy`` checkpoints, mapped to its block."""
    if not policy.active:
        return {}
    by_key: dict[int, list[Operation]] = {}
    for op in forward:
        tag = op.attributes.get(CHECKPOINT)
        if isinstance(tag, IntegerAttr):
            by_key.setdefault(tag.value.data, []).append(op)
    blocks: dict[Operation, _Block] = {}
    for index, (key, ops) in enumerate(by_key.items()):
        if index % policy.every == 0:
            block = _Block(key, ops, policy)
            blocks.update((op, block) for op in ops)
    return blocks


class AutodiffError(PassFailedException, TesseraError):
    """``autodiff`` failed (an op without a VJP, say): a pass failure, located by
    ``tessera-opt``, and a TesseraError, as ``ts.grad`` reports it."""


@dataclass(frozen=True)
class AutodiffPass(ModulePass):
    """Adds @f_grad: @f's results and the gradients of its first result (reverse mode)."""

    name = "autodiff"
    function: str = ""  # the function to differentiate (default: the only one)
    wrt: tuple[int, ...] = ()  # argument indices (default: every float argument)
    in_place: bool = False
    remat: str = "nothing"  # what checkpointed blocks save: nothing, matmuls, everything
    remat_every: int = 1  # checkpoint every n-th block only
    results: tuple[int, ...] = ()  # of (@f's results, the gradients); default all

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        functions = [f for f in op.ops if isinstance(f, func.FuncOp) and f.body.blocks]
        if self.function:
            functions = [f for f in functions if f.sym_name.data == self.function]
            if not functions:
                raise AutodiffError(f"autodiff: no function @{self.function}")
        elif len(functions) != 1:
            raise AutodiffError(
                "autodiff: the module has several functions; say which with function=NAME"
            )
        (target,) = functions
        if not self.in_place:
            copy = target.clone()
            copy.sym_name = StringAttr(f"{target.sym_name.data}_grad")
            op.body.block.insert_op_after(copy, target)
            target = copy
        try:
            policy = RematPolicy(self.remat, self.remat_every)
            differentiate(target, list(self.wrt) or None, policy, list(self.results) or None)
        except TesseraError as error:
            raise AutodiffError(f"autodiff: {error}") from None
