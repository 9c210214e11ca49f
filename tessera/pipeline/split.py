"""Splitting a traced forward pass into pipeline stages.

The forward ops of one microbatch, in program order, are cut into ``count`` consecutive
stages, either where the user called ``graph.stage()`` while tracing or, without marks,
where the cost model balances the stages: :func:`balanced_cuts` minimises the slowest
stage's time, a stage's time being its ops' roofline time plus the time to send what
crosses its end to the next stage (dynamic programming over the cut positions).

A value made in stage ``a`` and used in stage ``b > a`` is sent from ``a`` to ``a + 1``
and passed on, stage by stage, to ``b`` (pipeline transfers are between neighbours).
Ops without operands (constants) belong to no stage: every stage that uses one makes
its own copy, so constants never travel.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from xdsl.ir import Operation, SSAValue

from tessera.errors import TesseraError
from tessera.ir import graph
from tessera.ir.abstract import aval
from tessera.ir.function_table import table_of
from tessera.perf.compute_cost import attention_flops, compute_time, matmul_flops
from tessera.topology import Topology


@dataclass
class StagePlan:
    """Which forward ops each stage runs and what crosses between stages."""

    ops: list[list[Operation]]  # per stage, in program order (constants excluded)
    received: list[list[SSAValue]]  # per stage: values received from the previous stage
    sent: list[list[SSAValue]]  # per stage: values sent to the next stage

    @property
    def count(self) -> int:
        return len(self.ops)


def is_free(op: Operation) -> bool:
    """An op every stage recomputes instead of receiving (a constant: no operands)."""
    return not op.operands


def _users_stage(value: SSAValue, stage_of: dict[Operation, int], last: int) -> int:
    """The latest stage that uses ``value`` (the function's return counts as the last)."""
    latest = -1
    for use in value.uses:
        owner = use.operation
        latest = max(latest, stage_of.get(owner, last))
    return latest


def plan_stages(
    forward: Sequence[Operation], cuts: Sequence[int], outputs: Sequence[SSAValue]
) -> StagePlan:
    """The stages of ``forward`` cut before the ops at positions ``cuts`` (increasing);
    ``outputs`` (the loss and metrics) are needed by the last stage."""
    count = len(cuts) + 1
    bounds = [0, *cuts, len(forward)]
    stage_of: dict[Operation, int] = {}
    ops: list[list[Operation]] = [[] for _ in range(count)]
    for stage in range(count):
        for op in forward[bounds[stage] : bounds[stage + 1]]:
            if not is_free(op):
                stage_of[op] = stage
                ops[stage].append(op)
    for stage, stage_ops in enumerate(ops):
        if not stage_ops:
            raise TesseraError(
                f"pipeline stage {stage} of {count} has no work: put each graph.stage() "
                f"after some computation, or use fewer stages"
            )
    received: list[list[SSAValue]] = [[] for _ in range(count)]
    sent: list[list[SSAValue]] = [[] for _ in range(count)]
    needed_at_end = set(outputs)
    for op in forward:
        if op not in stage_of:
            continue
        made = stage_of[op]
        for value in op.results:
            latest = _users_stage(value, stage_of, count - 1)
            if value in needed_at_end:
                latest = count - 1
            for stage in range(made, latest):
                sent[stage].append(value)
                received[stage + 1].append(value)
    return StagePlan(ops, received, sent)


def _op_time(op: Operation, topology: Topology) -> float:
    """The roofline time of one forward op alone (no launch overhead); a region call's
    is its callee's ops'."""
    if isinstance(op, graph.CallOp | graph.ScanOp):
        callee = table_of(op).get(op.callee_name)
        steps = op.steps if isinstance(op, graph.ScanOp) else 1
        return steps * sum(_op_time(o, topology) for o in callee.body.block.ops if o.results)
    values = [*op.operands, *op.results]
    nbytes = sum(aval(v).nbytes for v in values)
    if isinstance(op, graph.MatmulOp):
        flops = matmul_flops(op)
    elif isinstance(op, graph.AttentionOp):
        flops = attention_flops(op)
    else:
        flops = 0.0
    dtype = aval(op.results[0]).dtype.value if op.results else "f32"
    device = topology.device
    return compute_time(device, flops, nbytes, dtype) - device.launch_overhead_s


def balanced_cuts(
    forward: Sequence[Operation], outputs: Sequence[SSAValue], count: int, topology: Topology
) -> list[int]:
    """``count - 1`` cut positions that minimise the slowest stage's time (compute plus
    sending its crossing values over the topology's innermost link)."""
    ops = list(forward)
    costed = [i for i, op in enumerate(ops) if not is_free(op)]
    if len(costed) < count:
        raise TesseraError(f"cannot split {len(costed)} forward ops into {count} pipeline stages")
    prefix = [0.0]
    for op in ops:
        prefix.append(prefix[-1] + (0.0 if is_free(op) else _op_time(op, topology)))
    link = topology.levels[0]
    position = {op: i for i, op in enumerate(ops)}
    ends = set(outputs)
    # crossing[k]: bytes made before position k and used at or after it
    crossing = [0.0] * (len(ops) + 1)
    for i, op in enumerate(ops):
        if is_free(op):
            continue
        for value in op.results:
            last_use = max((position.get(u.operation, len(ops)) for u in value.uses), default=i)
            if value in ends:
                last_use = len(ops)
            for k in range(i + 1, last_use + 1):
                crossing[k] += aval(value).nbytes
    # the link's latency is paid at every cut alike: only the bytes tell cuts apart
    send = [c / link.bandwidth for c in crossing]
    candidates = [0, *[i for i in costed[1:]], len(ops)]  # cut before a costed op
    n = len(candidates)
    inf = float("inf")
    # best[j][b]: the slowest of j stages covering ops before candidates[b]
    best = [[inf] * n for _ in range(count + 1)]
    choice = [[-1] * n for _ in range(count + 1)]
    best[0][0] = 0.0
    for j in range(1, count + 1):
        for b in range(1, n):
            end = candidates[b]
            tail = send[end] if j < count else 0.0
            for a in range(b):
                if best[j - 1][a] == inf:
                    continue
                stage = prefix[end] - prefix[candidates[a]] + tail
                worst = max(best[j - 1][a], stage)
                if worst < best[j][b]:
                    best[j][b], choice[j][b] = worst, a
    cuts, b = [], n - 1
    for j in range(count, 1, -1):
        b = choice[j][b]
        cuts.append(candidates[b])
    return sorted(cuts)


def sink_casts(ops: list[Operation], casts: Sequence[Operation]) -> list[Operation]:
    """``ops`` with each of ``casts`` (of parameters and batch leaves to the compute dtype,
    traced before the user's function) moved to just before its first user, so that it
    falls in the stage that uses it: a stage casts the parameters it owns instead of
    receiving them cast from the first stage."""
    moved = {c for c in casts if c.results[0].uses}
    rest = [o for o in ops if o not in moved]
    first_user: dict[Operation, Operation] = {}
    position = {o: i for i, o in enumerate(rest)}
    for cast in moved:
        users = [u.operation for u in cast.results[0].uses if u.operation in position]
        first_user[cast] = min(users, key=position.__getitem__)
    before: dict[Operation, list[Operation]] = {}
    for cast in casts:  # in trace order
        if cast in moved:
            before.setdefault(first_user[cast], []).append(cast)
    return [x for o in rest for x in (*before.get(o, ()), o)]


def cut_before_casts(ops: Sequence[Operation], cut: int, casts: Sequence[Operation]) -> int:
    """A cut position moved before the casts just ahead of it (they feed the op after
    the cut: they belong to its stage)."""
    cast_set = {c for c in casts if c.results[0].uses}
    while 0 < cut <= len(ops) and ops[cut - 1] in cast_set:
        cut -= 1
    return cut
