"""``autodiff``: reverse-mode differentiation of a graph function (a VJP per op).

For ``func.func @f`` whose first result is a scalar float (the loss), the pass adds
``@f_grad`` (or rewrites ``@f`` in place with ``in-place=true``) returning ``@f``'s results
followed by the gradient of the loss with respect to each argument listed in ``wrt``
(default: every float argument). The backward program is appended after the forward one:
ops are visited in reverse, each op's VJP rule (``tessera.opdefs.op_def(op).vjp``) maps its results' cotangents to its operands', and cotangents of a value used several
times are summed. Arguments the loss does not depend on get zeros.

Activation checkpointing (:mod:`tessera.transforms.remat`): ops tagged ``graph.checkpoint``
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

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import (
    ArrayAttr,
    DictionaryAttr,
    FunctionType,
    IntegerAttr,
    ModuleOp,
    StringAttr,
    i64,
)
from xdsl.ir import Attribute, Block, Operation, Region, SSAValue
from xdsl.passes import ModulePass
from xdsl.rewriter import InsertPoint, Rewriter
from xdsl.utils.exceptions import PassFailedException

from tessera.dtypes import DType
from tessera.errors import TesseraError
from tessera.ir import graph
from tessera.ir.abstract import aval
from tessera.ir.function_table import FunctionTable, register, table_of
from tessera.ir.grad_builder import GradBuilder
from tessera.ir.manual import in_specs, is_manual, op_varying, out_specs, varying
from tessera.ir.sharding import SHARDING_KEY, Sharding, ShardingAttr
from tessera.opdefs import Fusion, fusion_of, lookup
from tessera.opdefs.collective import per_rank_vjp
from tessera.transforms.remat import CHECKPOINT, REGATHER, REGENERATE, REMAT, RematPolicy


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
    varying: dict[SSAValue, frozenset[str]] | None = None,
) -> list[SSAValue]:
    """Emits with ``b`` the gradients of the scalar ``loss`` with respect to ``wrt``, by
    reverse accumulation over the ``forward`` ops (in program order). ``seeds`` gives
    further values' cotangents (a vector-Jacobian product: a pipeline stage's outputs
    seeded with the gradients the next stage sends back). Checkpointed blocks are
    recomputed as ``remat`` says (default: nothing saved), ``graph.regenerate`` blocks
    always; the forward ops lose their ``graph.checkpoint`` and ``graph.regenerate`` tags.

    ``varying`` (in a manual ``dist.shard_map`` body: the mesh axes each value varies
    along, ``tessera.ir.manual.varying``) makes the collectives' VJPs their per-rank
    transposes, and sums over an axis each cotangent that varies along an axis its
    value does not."""
    cotangents: dict[SSAValue, SSAValue] = dict(seeds or {})
    tracker = _Varying(varying, b) if varying is not None else None
    active = _active(forward, wrt)
    blocks = _checkpointed_blocks(forward, remat or RematPolicy())
    recomputed: dict[int, dict[Operation, Operation]] = {}
    if loss is not None:
        cotangents[loss] = b.constant(1.0, loss)
    for op in reversed(forward):
        result_cts = [cotangents.get(r) for r in op.results]
        if all(c is None for c in result_cts):
            continue
        if tracker is not None and isinstance(op, graph.CollectiveOp):
            vjp = tracker.collective_vjp
        elif isinstance(op, graph.CallOp) and is_manual(table_of(op).functions.get(op.callee_name)):
            # only the operands on a path from ``wrt`` get a cotangent: a shard_map's
            # backward computes (and communicates) nothing for the others
            needed = tuple(i for i, v in enumerate(op.operands) if v in active)
            vjp = functools.partial(_manual_call_vjp, needed=needed)
        elif isinstance(op, graph.CallOp):
            if tracker is not None:
                raise TesseraError(
                    f"{where}: a graph.call inside a dist.shard_map body is not differentiable yet"
                )
            vjp = functools.partial(_call_vjp, policy=remat or RematPolicy())
        elif isinstance(op, graph.ScanOp):
            vjp = functools.partial(_scan_vjp, policy=remat or RematPolicy())
        else:
            found = lookup(op)
            if found is None:
                raise TesseraError(
                    f"{where + ': ' if where else ''}{op.name} is not differentiable yet"
                )
            vjp = found.vjp
        block = blocks.get(op)
        if block is None:
            operand_cts = vjp(b, op, result_cts)
        else:
            if block.key not in recomputed:
                recomputed[block.key] = block.recompute(b)
            before = _last_before(b.point)
            operand_cts = vjp(b, recomputed[block.key][op], result_cts)
            block.tag(before, b.point)  # its VJP stays out of the forward's kernels too
        for operand, ct in zip(op.operands, operand_cts, strict=True):
            if ct is None:
                continue
            if tracker is not None:
                ct = tracker.summed(operand, ct)
            previous = cotangents.get(operand)
            cotangents[operand] = ct if previous is None else b.add(previous, ct)
    for block in {id(k): k for k in blocks.values()}.values():
        block.release(recomputed.get(block.key, {}))
    _regather([op for op in forward if REGATHER in op.attributes], forward, b.point.block)
    for op in forward:  # a graph.regather tag stays: it keeps cse from merging the op
        op.attributes.pop(CHECKPOINT, None)  # with another microbatch's
        op.attributes.pop(REGENERATE, None)
    return [cotangents.get(v) or b.zeros_like(v) for v in wrt]


def _regather(tagged: Sequence[Operation], forward: Sequence[Operation], block: Block) -> None:
    """Each ``graph.regather`` op's backward reads go to a copy of it (tagged
    ``graph.remat`` with the op's id, so ``cse`` keeps it apart), made just before the
    first of them."""
    if not tagged:
        return
    inside = set(forward)
    for op in forward:  # a region call's forward call, put after it (``_take_over``)
        taken = op.next_op
        if (
            isinstance(op, graph.CallOp | graph.ScanOp)
            and isinstance(taken, graph.CallOp | graph.ScanOp)
            and list(taken.operands) == list(op.operands)
        ):
            inside.add(taken)
    position = {op: i for i, op in enumerate(block.ops)}
    for op in tagged:
        result = op.results[0]
        later = [
            (position[reader], use)
            for use in list(result.uses)
            if (reader := block.find_ancestor_op_in_block(use.operation)) is not None
            and reader not in inside
            and not isinstance(reader, func.ReturnOp)
        ]
        if not later:
            continue
        first = min(later, key=lambda found: found[0])[1].operation
        copy = op.clone()
        tag = copy.attributes.pop(REGATHER)
        copy.attributes[REMAT] = tag if isinstance(tag, IntegerAttr) else IntegerAttr(-1, i64)
        Rewriter.insert_op(copy, InsertPoint.before(block.find_ancestor_op_in_block(first)))
        for _, use in later:
            use.operation.operands[use.index] = copy.results[0]


# --- manual regions (dist.shard_map): per-rank transposes -----------------------------


class _Varying:
    """The axes each value of a manual body varies along, kept up to date as the
    backward's ops are emitted (``tessera.ir.manual.op_varying``)."""

    def __init__(self, axes: dict[SSAValue, frozenset[str]], b: GradBuilder):
        self.axes = axes
        self.b = b
        self.last = _last_before(b.point)  # the last op whose results are recorded

    def _sync(self) -> None:
        op = self.last.next_op if self.last is not None else self.b.point.block.first_op
        while op is not None and op is not self.b.point.insert_before:
            if isinstance(op, graph.GraphOp):
                op_varying(op, self.axes)
            self.last, op = op, op.next_op

    def collective_vjp(
        self, b: GradBuilder, op: graph.GraphOp, cts: Sequence[SSAValue | None]
    ) -> list[SSAValue | None]:
        self._sync()
        ct = cts[0]
        if ct is None:
            return [None]
        return [per_rank_vjp(b, op, ct, self.axes.get(op.operands[0], frozenset()))]

    def summed(self, value: SSAValue, ct: SSAValue) -> SSAValue:
        """``ct`` summed over the axes it varies along and ``value`` does not."""
        self._sync()
        extra = self.axes.get(ct, frozenset()) - self.axes.get(value, frozenset())
        if not extra:
            return ct
        return self.b.op(graph.AllReduceOp, ct, axes=tuple(sorted(extra)), kind="sum")


def _active(forward: Sequence[Operation], wrt: Sequence[SSAValue]) -> set[SSAValue]:
    """The values of ``forward`` that depend on ``wrt`` (through operands, or through
    values an op's nested regions read)."""
    active = set(wrt)
    for op in forward:
        read = [*op.operands]
        if op.regions:
            read += [v for inner in op.walk() for v in inner.operands]
        if any(v in active for v in read):
            active.update(op.results)
    return active


def _manual_call_vjp(
    b: GradBuilder,
    op: graph.CallOp,
    cts: Sequence[SSAValue | None],
    needed: tuple[int, ...] | None = None,
) -> list[SSAValue | None]:
    """A shard_map's backward is a call of a manual function (in_specs: the primal
    arguments', then the float results' out_specs; out_specs: the ``needed`` float
    arguments' in_specs) that recomputes the body and transposes it per rank."""
    table = table_of(op)
    derivative = _manual_backward(table, op.callee_name, needed)
    seeds = [
        cts[i] if cts[i] is not None else b.zeros_like(op.results[i])
        for i in derivative.float_results
    ]
    types = [op.operands[i].type for i in derivative.float_arguments]
    return _call_backward(b, op, derivative, [*op.operands, *seeds], types)


def _call_backward(
    b: GradBuilder,
    op: graph.CallOp,
    derivative: _Derivative,
    operands: Sequence[SSAValue],
    types: Sequence[Attribute],
) -> list[SSAValue | None]:
    """Calls ``derivative``'s backward on ``operands`` at ``b``'s point (located at
    ``op``): its results are the cotangents of ``op``'s float arguments, the others None."""
    backward = graph.CallOp.get(derivative.backward, list(operands), list(types))
    backward.location = op.location
    Rewriter.insert_op(backward, b.point)
    operand_cts: list[SSAValue | None] = [None] * len(op.operands)
    for index, grad in zip(derivative.float_arguments, backward.results, strict=True):
        operand_cts[index] = grad
    return operand_cts


def _manual_backward(
    table: FunctionTable, name: str, needed: tuple[int, ...] | None = None
) -> _Derivative:
    """The backward of manual function ``@name`` for the gradients of its float
    arguments among ``needed`` (all when None; derived once per set)."""
    key = (name, "manual-vjp", needed)
    if key in table.derived:
        return table.derived[key]  # type: ignore[return-value]
    source = table.get(name)
    backward = source.clone()
    block = backward.body.block
    register(block, table)
    ret = block.last_op
    assert isinstance(ret, func.ReturnOp)
    primal, outputs = list(block.args), list(ret.operands)
    axes = varying(backward)
    float_results = tuple(i for i, v in enumerate(outputs) if aval(v).dtype.is_float)
    float_arguments = tuple(
        i
        for i, a in enumerate(primal)
        if aval(a).dtype.is_float and (needed is None or i in needed)
    )
    seeds: dict[SSAValue, SSAValue] = {}
    b = GradBuilder(InsertPoint.before(ret))
    for index in float_results:
        ct = block.insert_arg(outputs[index].type, len(block.args))
        axes[ct] = axes[outputs[index]]
        value = outputs[index]
        seeds[value] = ct if value not in seeds else b.add(seeds[value], ct)
    forward = [o for o in block.ops if o is not ret]
    grads = backprop(
        forward,
        None,
        [primal[i] for i in float_arguments],
        b,
        f"@{name}",
        seeds=seeds,
        varying=axes,
    )
    ret.operands = grads
    ins, outs = in_specs(source), out_specs(source)
    arg_specs = [*ins, *(outs[i] for i in float_results)]
    result_specs = [ins[i] for i in float_arguments]

    def attrs(specs: Sequence[Sharding | None]) -> ArrayAttr:
        return ArrayAttr([
            DictionaryAttr({SHARDING_KEY: ShardingAttr.get("mesh", s)} if s is not None else {})
            for s in specs
        ])  # fmt: skip

    backward.arg_attrs = attrs(arg_specs)
    backward.res_attrs = attrs(result_specs)
    backward.function_type = FunctionType.from_lists(
        [a.type for a in block.args], [v.type for v in ret.operands]
    )
    every = tuple(i for i, a in enumerate(primal) if aval(a).dtype.is_float)
    suffix = "" if float_arguments == every else "_" + "_".join(map(str, float_arguments))
    backward.sym_name = StringAttr(f"{name}_bwd{suffix}")
    derivative = _Derivative(name, table.add(backward), float_results, float_arguments)
    table.derived[key] = derivative  # type: ignore[assignment]
    return derivative


# --- regions: the VJP of a call is a call of the callee's derivative -----------------


@dataclass(frozen=True)
class _Derivative:
    """A region's forward (its results, then the residuals its backward reads) and
    backward (primal arguments, residuals and the float results' cotangents to the float
    arguments' gradients)."""

    forward: str
    backward: str
    float_results: tuple[int, ...]
    float_arguments: tuple[int, ...]


def _call_vjp(
    b: GradBuilder, op: graph.CallOp, cts: Sequence[SSAValue | None], policy: RematPolicy
) -> list[SSAValue | None]:
    """The call becomes a call of the region's forward, which also returns the
    residuals; the backward calls the region's backward on them."""
    table = table_of(op)
    derivative = _derivative(table, op.callee_name, policy)
    forward_types = table.get(derivative.forward).function_type.outputs.data
    forward = graph.CallOp.get(derivative.forward, list(op.operands), forward_types)
    count = _take_over(op, forward)
    seeds = [
        cts[i] if cts[i] is not None else b.zeros_like(forward.results[i])
        for i in derivative.float_results
    ]
    backward_types = table.get(derivative.backward).function_type.outputs.data
    operands = [*op.operands, *forward.results[count:], *seeds]
    return _call_backward(b, op, derivative, operands, backward_types)


def _scan_vjp(
    b: GradBuilder, op: graph.ScanOp, cts: Sequence[SSAValue | None], policy: RematPolicy
) -> list[SSAValue | None]:
    """The scan becomes a scan of the step's forward, which also stacks the residuals
    and the carries each step received; the backward scans the step's backward over
    them in the other direction, the carries' cotangents as its carries."""
    table = table_of(op)
    carries, length = op.carry_count, op.steps
    derivative = _derivative(table, op.callee_name, policy, carries)
    step_types = table.get(derivative.forward).function_type.outputs.data
    forward = graph.ScanOp.get(
        derivative.forward, list(op.operands),
        [*step_types[:carries], *(graph.scan_stack(t, length) for t in step_types[carries:])],
        length, carries, op.reversed,
    )  # fmt: skip
    count = _take_over(op, forward)
    saved = list(forward.results[count:])  # residuals, then the carries received
    residuals, received = saved[: len(saved) - carries], saved[len(saved) - carries :]
    seeds = [
        cts[i] if cts[i] is not None else b.zeros_like(forward.results[i])
        for i in derivative.float_results
    ]
    step_grads = table.get(derivative.backward).function_type.outputs.data
    backward = graph.ScanOp.get(
        derivative.backward,
        [*seeds[:carries], *received, *op.operands[carries:], *residuals, *seeds[carries:]],
        [*step_grads[:carries], *(graph.scan_stack(t, length) for t in step_grads[carries:])],
        length, carries, not op.reversed,
    )  # fmt: skip
    backward.location = op.location
    Rewriter.insert_op(backward, b.point)
    operand_cts: list[SSAValue | None] = [None] * len(op.operands)
    for index, grad in zip(derivative.float_arguments, backward.results, strict=True):
        operand_cts[index] = grad
    return operand_cts


def _take_over(op: Operation, forward: Operation) -> int:
    """Puts ``forward`` (a call of the derivative's forward) after ``op`` in its place:
    ``op``'s users read ``forward``'s leading results instead (``op``, dead, goes at the
    next ``dce``). Returns how many results ``op`` had."""
    forward.location = op.location
    forward.attributes.update({k: v for k, v in op.attributes.items() if k != CHECKPOINT})
    Rewriter.insert_op(forward, InsertPoint.after(op))
    for old, new in zip(op.results, forward.results[: len(op.results)], strict=True):
        old.replace_all_uses_with(new)
    return len(op.results)


def _derivative(
    table: FunctionTable, name: str, policy: RematPolicy, scan_carries: int | None = None
) -> _Derivative:
    """The forward and backward of region ``@name`` (derived once per remat policy). For
    the step of a scan with ``scan_carries`` carries, the forward also returns the carries
    it received, and the backward takes the carries' cotangents first (its carries)."""
    key = (name, f"vjp:{policy.save}:{policy.every}:{scan_carries}")
    if key in table.derived:
        return table.derived[key]  # type: ignore[return-value]
    combined = table.get(name).clone()
    block = combined.body.block
    register(block, table)  # regions it calls are differentiated through the same table
    ret = block.last_op
    assert isinstance(ret, func.ReturnOp)
    primal = list(block.args)
    outputs = list(ret.operands)
    float_results = tuple(i for i, v in enumerate(outputs) if aval(v).dtype.is_float)
    float_arguments = tuple(i for i, a in enumerate(primal) if aval(a).dtype.is_float)
    carries = scan_carries or 0
    if float_results[:carries] != tuple(range(carries)):
        raise TesseraError(f"@{name}: a scan differentiated through must carry float tensors only")
    cotangents = [block.insert_arg(outputs[i].type, len(block.args)) for i in float_results]
    forward_ops = [o for o in block.ops if o is not ret]
    b = GradBuilder(InsertPoint.before(ret))
    start = b.full(0.0, DType.f32)  # a marker: the backward's ops follow it
    seeds: dict[SSAValue, SSAValue] = {}
    for index, ct in zip(float_results, cotangents, strict=True):
        value = outputs[index]
        seeds[value] = ct if value not in seeds else b.add(seeds[value], ct)
    grads = backprop(
        forward_ops,
        None,
        [primal[i] for i in float_arguments],
        b,
        f"@{name}",
        seeds=seeds,
        remat=policy,
    )
    ops = list(block.ops)
    split = ops.index(start.owner)  # type: ignore[arg-type]
    forward_part, backward_part = ops[:split], ops[split + 1 : -1]
    defined = {r for o in forward_part for r in o.results}
    constants = {o for o in forward_part if isinstance(o, graph.ConstantOp)}
    residuals: list[SSAValue] = []
    for o in backward_part:
        for v in o.operands:
            if v in defined and v.owner not in constants and v not in residuals:
                residuals.append(v)
    residuals, views = _views_recomputed(residuals, forward_part, set(primal), constants)
    redone = {*views, *backward_part}
    used_constants = [
        o for o in forward_part if o in constants and any(
            u.operation in redone for r in o.results for u in r.uses
        )
    ]  # fmt: skip
    forward_results = [*outputs, *residuals]
    backward_arguments = [*primal, *residuals, *cotangents]
    if scan_carries is not None:
        forward_results += primal[:carries]
        backward_arguments = [
            *cotangents[:carries], *primal, *residuals, *cotangents[carries:],
        ]  # fmt: skip
    forward = _outline(f"{name}_fwd", primal, _live(forward_part, forward_results), forward_results)
    backward = _outline(
        f"{name}_bwd", backward_arguments, [*used_constants, *views, *backward_part], list(grads)
    )
    derivative = _Derivative(
        table.add(forward), table.add(backward), float_results, float_arguments
    )
    table.derived[key] = derivative  # type: ignore[assignment]
    return derivative


def _views_recomputed(
    residuals: Sequence[SSAValue],
    forward: Sequence[Operation],
    primal: set[SSAValue],
    constants: set[Operation],
) -> tuple[list[SSAValue], list[Operation]]:
    """The residuals with each made by a layout op (a reshape, a transpose, a broadcast:
    :attr:`Fusion.LAYOUT`) of one operand replaced by that operand, when the operand is a
    primal argument, a constant (the backward copies those), another residual, or no
    larger; and those layout ops, in forward order, for the backward to redo. A view the
    forward returns would be materialised (its result leaves the function), where the
    backward's kernels read it in place, as the unrolled step's do: XLA and Inductor's
    min-cut partitioners recompute such ops rather than save them."""
    order = {o: i for i, o in enumerate(forward)}
    kept = list(residuals)
    views: set[Operation] = set()
    changed = True
    while changed:
        changed = False
        for v in list(kept):
            maker = v.owner
            if not isinstance(maker, Operation) or maker not in order or len(maker.operands) != 1:
                continue
            if fusion_of(maker) is not Fusion.LAYOUT or len(maker.results) != 1:
                continue
            source = maker.operands[0]
            if not (source in primal or source in kept or aval(source).nbytes <= aval(v).nbytes):
                continue
            kept.remove(v)
            if source not in primal and source not in kept and source.owner not in constants:
                kept.append(source)
            views.add(maker)
            changed = True
    return kept, sorted(views, key=order.__getitem__)


def _live(ops: Sequence[Operation], needed: Sequence[SSAValue]) -> list[Operation]:
    """The ops of ``ops`` that ``needed`` depends on, in order."""
    wanted = set(needed)
    kept: list[Operation] = []
    for op in reversed(ops):
        if any(r in wanted for r in op.results):
            kept.append(op)
            wanted.update(op.operands)
    return kept[::-1]


def _outline(
    name: str, arguments: Sequence[SSAValue], ops: Sequence[Operation], results: Sequence[SSAValue]
) -> func.FuncOp:
    """A private function of ``arguments`` computing ``results`` by copies of ``ops``."""
    block = Block(arg_types=[a.type for a in arguments])
    mapping: dict[SSAValue, SSAValue] = {}
    for old, new in zip(arguments, block.args, strict=True):
        new.name_hint = old.name_hint
        mapping[old] = new
    for op in ops:
        copy = op.clone(dict(mapping))
        copy.attributes.pop(CHECKPOINT, None)
        block.add_op(copy)
        mapping.update(zip(op.results, copy.results, strict=True))
    block.add_op(func.ReturnOp(*[mapping[v] for v in results]))
    return func.FuncOp(
        name,
        ([a.type for a in arguments], [v.type for v in results]),
        Region(block),
        visibility="private",
    )


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
            copy.attributes.pop(REGENERATE, None)
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
    """Each op of a block that ``policy`` checkpoints, or of a ``graph.regenerate`` block
    (recomputed whatever the policy), mapped to its block."""
    by_key: dict[int, list[Operation]] = {}
    regenerated: dict[int, list[Operation]] = {}
    for op in forward:
        if isinstance(tag := op.attributes.get(REGENERATE), IntegerAttr):
            regenerated.setdefault(tag.value.data, []).append(op)
        elif policy.active and isinstance(tag := op.attributes.get(CHECKPOINT), IntegerAttr):
            by_key.setdefault(tag.value.data, []).append(op)
    blocks: dict[Operation, _Block] = {}
    for index, (key, ops) in enumerate(by_key.items()):
        if index % policy.every == 0:
            block = _Block(key, ops, policy)
            blocks.update((op, block) for op in ops)
    for key, ops in regenerated.items():
        block = _Block(key, ops, RematPolicy("nothing"))
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
