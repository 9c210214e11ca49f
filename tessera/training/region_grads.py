"""Gradients made by region calls and scans, reduced inside them as the step wants them.

A ``graph.region`` call or a ``graph.scan`` returns complete values: a gradient partial
over dp inside it is reduced before it returns, as the call's ``graph.result_shardings``
say (``shard-propagate``). A training step's gradients reach their ZeRO layout through
the step's own ops, which the call cannot see past: under mixed precision the widening
cast to f32 (the reduction belongs after it), with accumulation the sum over the
microbatches. So for the gradients a region call or scan makes, the step does both where
the gradient is made, per microbatch:

- the widening cast moves into the callee (a variant that returns the gradient cast:
  the reduction runs in f32 after the cast, as unrolled);
- the gradient is constrained to its reduced layout on the call (``graph.result_shardings``),
  so ZeRO-2/3 reduce-scatter it inside the call, each microbatch (as DeepSpeed's ZeRO-2
  and FSDP do), rather than all-reducing it whole and slicing; a gradient kept whole
  over dp (ZeRO-0/1) summed over microbatches leaves the call partial instead, and the
  sum is all-reduced once (as DDP's ``no_sync``), not each microbatch's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from xdsl.dialects import func
from xdsl.dialects.builtin import StringAttr, SymbolRefAttr, UnitAttr
from xdsl.ir import Operation
from xdsl.rewriter import InsertPoint, Rewriter

from tessera.analysis.reduction_points import REDUCE_WIDENED
from tessera.dist.collectives import shard_unread
from tessera.dtypes import DType
from tessera.frontend.tracer import Tensor, current_trace
from tessera.ir import graph
from tessera.ir.abstract import AbstractTensor, aval
from tessera.ir.sharding import Sharding

Caller = graph.CallOp | graph.ScanOp


def reduced_in_regions(
    grads: Sequence[Tensor],
    layouts: Sequence[Sharding],
    widen_to: Sequence[DType | None],
    summed_over: str | None = None,
) -> list[Tensor]:
    """``grads`` with each one a region call or scan makes (and nothing reads yet) cast
    to ``widen_to`` inside the callee (None: as it is) and constrained to its layout on
    the call; the others as they are. With ``summed_over`` (the dp axis, when the step
    sums microbatches) a layout not split over that axis is kept partial over it: the
    sum of the microbatches' gradients is reduced once, after it (as DDP's ``no_sync``)."""
    made: dict[Caller, list[int]] = {}
    for index, grad in enumerate(grads):
        _drop_dead_readers(grad)
        owner = grad.value.owner
        if isinstance(owner, Caller) and not grad.value.uses and _region(owner):
            made.setdefault(owner, []).append(index)
    found = list(grads)
    for call, indices in made.items():
        widened = {
            grads[i].value.index: widen_to[i]  # type: ignore[attr-defined]
            for i in indices
            if widen_to[i] is not None and grads[i].aval.dtype != widen_to[i]
        }
        results = _widened_call(call, widened) if widened else list(call.results)
        for i in indices:
            found[i] = Tensor(grads[i].trace, results[grads[i].value.index])  # type: ignore[attr-defined]
    chosen = [i for indices in made.values() for i in indices]
    wanted = [
        Sharding(layouts[i].dims, ((summed_over, "sum"),))
        if summed_over is not None and summed_over not in layouts[i].split_axes
        else layouts[i]
        for i in chosen
    ]
    constrained = shard_unread([found[i] for i in chosen], wanted)
    for i, grad in zip(chosen, constrained, strict=True):
        found[i] = grad
    return found


def _drop_dead_readers(grad: Tensor) -> None:
    """Erases the graph ops that read ``grad`` and whose results nothing reads (the
    backward's step past the parameters, into their casts), so that it is unread."""
    for use in list(grad.value.uses):
        reader = use.operation
        if isinstance(reader, graph.GraphOp) and not any(r.uses for r in reader.results):
            Rewriter.erase_op(reader)


def _region(call: Caller) -> bool:
    callee = current_trace().functions.functions.get(call.callee_name)
    return callee is not None and graph.MANUAL not in callee.attributes


def _widened_call(call: Caller, widened: dict[int, DType]) -> list[Any]:
    """A call of a variant of ``call``'s callee that returns results ``widened`` cast (the
    cast tagged to carry the partial sums), in place of ``call``; its results."""
    trace = current_trace()
    key = ("widened", call.callee_name, tuple(sorted((i, d.name) for i, d in widened.items())))
    name = trace.regions.get(key)
    if name is None:
        variant = trace.functions.get(call.callee_name).clone()
        returned = variant.body.block.last_op
        assert isinstance(returned, func.ReturnOp)
        for index, dtype in widened.items():
            value = returned.operands[index]
            cast = graph.build(graph.CastOp, [value], dtype=dtype)
            cast.attributes[REDUCE_WIDENED] = UnitAttr()
            Rewriter.insert_op(cast, InsertPoint.before(returned))
            returned.operands[index] = cast.results[0]
        name = trace.regions[key] = trace.functions.unique_name(f"{call.callee_name}_widened")
        variant.sym_name = StringAttr(name)
        variant.function_type = func.FunctionType.from_lists(
            [a.type for a in variant.body.block.args], [v.type for v in returned.operands]
        )
        trace.functions.add(variant)
    types = [r.type for r in call.results]
    for index, dtype in widened.items():  # (a scan's stacked result: its shape is stacked)
        types[index] = AbstractTensor(aval(call.results[index]).shape, dtype).to_xdsl()
    replacement: Operation = type(call).create(
        operands=list(call.operands),
        result_types=types,
        properties={**call.properties, "callee": SymbolRefAttr(name)},
        attributes=dict(call.attributes),
    )
    replacement.location = call.location
    Rewriter.insert_op(replacement, InsertPoint.after(call))
    for index, (old, new) in enumerate(zip(call.results, replacement.results, strict=True)):
        if index not in widened:
            old.replace_all_uses_with(new)
    return list(replacement.results)
