"""``graph.wait``: where per-rank code waits for an asynchronous collective.

``h = dist.all_reduce_async(x, "tp")`` binds the collective where it is called; ``h.wait()``
binds ``graph.wait`` on its result. As a value it is the identity (its reference, VJP,
tile code and sharding are an elementwise copy's), so every pass before the schedule
treats it as one. Its position is what it carries: ``lower-graph-to-schedule`` places the
collective's ``schedule.wait`` there (see :mod:`tessera.passes.lower_graph_to_schedule`),
and ``overlap-comm`` leaves that wait where it is.
"""

from __future__ import annotations

from tessera.ir import graph
from tessera.ir.grad_builder import GradBuilder
from tessera.ir.sharding_rules import elementwise
from tessera.opdefs.registry import Cotangents, Fusion, Pointwise, on_operands, register


def _identity_vjp(b: GradBuilder, op: graph.GraphOp, cts: Cotangents) -> Cotangents:
    return [cts[0]]


register(
    graph.WaitOp,
    sharding=elementwise,
    partial="all",
    vjp=_identity_vjp,
    reference=on_operands(lambda x: x),
    tile=Pointwise(lambda b, op, a: a[0]),
    fusion=Fusion.ELEMENTWISE,
)
