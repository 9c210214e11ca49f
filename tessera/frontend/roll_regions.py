"""Rolling a chain of region calls over stacked parameters into one ``graph.scan``.

A training step whose layers are ``graph.region`` calls can keep each group of
like parameters (every layer's ``wq``) in one stack and hand the layers slices of it
(:mod:`tessera.training.layer_stacks`), so that the traced forward reads::

    %x1 = graph.call @layer(%x0, %wq_0, ...)      // %wq_i = the i-th slice of %wq
    %x2 = graph.call @layer(%x1, %wq_1, ...)
    ...

Before ``graph.backward`` differentiates that forward, :func:`roll_region_chains` makes
such a chain one ``graph.scan`` over the stacks, as ``graph.scan`` traced by hand would
be, so the program, its compile and its Schedule IR hold one layer whatever the depth
(``jax.lax.scan`` over layers; MaxText's ``scan_layers``). A chain is calls of one
region in which each call's results are read by the next call only, one operand each
(the carry); every other operand is the i-th slice of a stack as long as the chain (a
scanned input) or one value in every call (carried through unchanged). Chains of any
other form stay calls.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

from xdsl.dialects.builtin import IntegerAttr, i64
from xdsl.ir import Attribute, Block, SSAValue

from tessera.frontend.region import _sunk_gather, step_trace
from tessera.frontend.tracer import SliceTensor, Tensor, Trace
from tessera.ir import graph
from tessera.ir.abstract import AbstractTensor
from tessera.transforms.remat import CHECKPOINT

# given the values one operand has in each call of a chain, the stack they are the
# slices of in order (a key), or None
StackOf = Callable[[list[SSAValue]], Hashable | None]


@dataclass(frozen=True)
class Chain:
    """Calls of one region that one ``graph.scan`` can make: ``carries[j]`` is the operand
    each call's result ``j`` feeds in the next, ``stacked`` the operands that are slices
    of a stack (position to stack), ``invariant`` those with one value in every call."""

    calls: tuple[graph.CallOp, ...]
    carries: tuple[int, ...]
    stacked: dict[int, Hashable]
    invariant: tuple[int, ...]


def region_chains(block: Block, stack_of: StackOf) -> list[Chain]:
    """The chains of ``block`` (see the module docstring), in block order; ``stack_of``
    says which operands are slices of a stack."""
    calls = [o for o in block.ops if isinstance(o, graph.CallOp)]
    following = {call: nxt for call in calls if (nxt := _next_call(call)) is not None}
    followed = set(following.values())
    chains = []
    for first in calls:
        if first in followed or first not in following:
            continue
        run = [first]
        while run[-1] in following:
            run.append(following[run[-1]])
        chain = _chain(run, stack_of)
        if chain is not None:
            chains.append(chain)
    return chains


def _next_call(call: graph.CallOp) -> graph.CallOp | None:
    """The call of the same region that alone reads every result of ``call``, once each."""
    readers = {use.operation for r in call.results for use in r.uses}
    if len(readers) != 1 or not call.results:
        return None
    (reader,) = readers
    if not isinstance(reader, graph.CallOp) or reader.callee_name != call.callee_name:
        return None
    if any(len(list(r.uses)) != 1 for r in call.results):
        return None
    return reader


def _chain(calls: list[graph.CallOp], stack_of: StackOf) -> Chain | None:
    """``calls`` as a chain, or None when an operand is neither carry, slice nor invariant
    or a call carries what the others do not (a checkpoint tag on some calls only)."""
    first = calls[0]
    carries = tuple(next(iter(r.uses)).index for r in first.results)
    for before, after in itertools.pairwise(calls):
        if tuple(next(iter(r.uses)).index for r in before.results) != carries:
            return None
        if any(after.operands[c] is not r for c, r in zip(carries, before.results, strict=True)):
            return None
    if len({CHECKPOINT in c.attributes for c in calls}) > 1:
        return None
    stacked: dict[int, Hashable] = {}
    invariant = []
    for position in range(len(first.operands)):
        if position in carries:
            continue
        values = [c.operands[position] for c in calls]
        if all(v is values[0] for v in values):
            invariant.append(position)
            continue
        stack = stack_of(values)
        if stack is None:
            return None
        stacked[position] = stack
    return Chain(tuple(calls), carries, stacked, tuple(invariant))


def roll_region_chains(trace: Trace) -> dict[SSAValue, SliceTensor]:
    """Makes each chain of ``trace``'s block whose stacked operands are its lazy slices
    (:meth:`Trace.lazy_slices`) one ``graph.scan`` over their stacks; returns the slices
    the scans now read whole, by value."""

    def stack_of(values: list[SSAValue]) -> Hashable | None:
        found = [trace.slices.get(v) for v in values]
        first = found[0]
        if first is None:
            return None
        stack = first.stack
        ordered = all(f is not None and f.stack is stack and f.index == i for i, f in enumerate(found))
        return stack.value if ordered and stack.aval.shape[0] == len(values) else None

    rolled: dict[SSAValue, SliceTensor] = {}
    for chain in region_chains(trace.block, stack_of):
        first = chain.calls[0]
        stacks = {p: trace.slices[first.operands[p]].stack for p in chain.stacked}
        _roll(trace, chain, stacks)
        for call in chain.calls:
            rolled.update((call.operands[p], trace.slices[call.operands[p]]) for p in chain.stacked)
        for call in reversed(chain.calls):
            trace.block.erase_op(call)
    return rolled


def _roll(trace: Trace, chain: Chain, stacks: dict[int, Tensor]) -> graph.ScanOp:
    """The ``graph.scan`` of ``chain``, before its first call; its last call's results are
    replaced by the scan's."""
    first, last = chain.calls[0], chain.calls[-1]
    invariants = [first.operands[p] for p in chain.invariant]
    carried = [first.operands[p] for p in chain.carries] + invariants
    positions = sorted(stacks)
    gathers = [_sunk_gather(stacks[p]) for p in positions]
    sources = [stacks[p] if g is None else g[0] for p, g in zip(positions, gathers, strict=True)]
    sunk = tuple(None if g is None else g[1] for g in gathers)
    key = (
        "roll", first.callee_name, chain.carries, chain.invariant, tuple(positions), sunk,
        CHECKPOINT in first.attributes,
    )  # fmt: skip
    if key not in trace.regions:  # one step function however many chains share it
        trace.regions[key] = _step_function(trace, chain, stacks, sunk)
    name, types = trace.regions[key]
    # every result a carry: the step returns the region's results and the invariants
    scan = graph.ScanOp.get(
        name, [*carried, *(s.value for s in sources)], types, len(chain.calls), len(types)
    )
    scan.location = first.location
    trace.block.insert_op_before(scan, first)
    for old, new in zip(last.results, scan.results, strict=False):
        old.replace_all_uses_with(new)
    return scan


def _step_function(
    trace: Trace, chain: Chain, stacks: dict[int, Tensor], sunk: tuple[Any, ...]
) -> tuple[str, list[Attribute]]:
    """The scan's step: the region's body inlined (a call inside the step would end each
    layer's work at its boundary, as a call does), reading each stacked operand's slice
    (gathered first where the stack's ZeRO-3 gather moved into the step) and returning
    the invariants as they came; its name and result types."""
    first = chain.calls[0]
    carried = [first.operands[p] for p in [*chain.carries, *chain.invariant]]
    positions = sorted(stacks)
    avals = [AbstractTensor.from_xdsl(v.type) for v in carried] + [
        AbstractTensor(stacks[p].aval.shape[1:], stacks[p].aval.dtype) for p in positions
    ]
    body, args = step_trace(trace, f"{first.callee_name}_scan", avals, sunk)
    by_position = dict(zip([*chain.carries, *chain.invariant, *positions], args, strict=True))
    callee = trace.functions.get(first.callee_name)
    mapping: dict[SSAValue, SSAValue] = {
        a: by_position[p].value for p, a in enumerate(callee.body.block.args)
    }
    # each op a layer's checkpoint when the calls were checkpointed
    tag = IntegerAttr(body.checkpoints, i64) if CHECKPOINT in first.attributes else None
    returned: list[SSAValue] = []
    for op in callee.body.block.ops:
        if op is callee.body.block.last_op:
            returned = [mapping[v] for v in op.operands]
            break
        copy = op.clone(mapping)
        if tag is not None:
            copy.attributes[CHECKPOINT] = tag
        body.block.add_op(copy)
    if tag is not None:
        body.checkpoints += 1
    outputs = [Tensor(body, r) for r in returned] + args[len(chain.carries) : len(carried)]
    trace.functions.add(body.finish_function(outputs, private=True))
    return body.name, [t.value.type for t in outputs]
