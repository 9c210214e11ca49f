"""Ring attention or all-gathered keys and values: the cost model's choice for attention
whose sequence is split over ``n`` ranks (context parallelism).

Both move the same bytes, ``(n - 1)`` blocks of k and v per rank; they differ in what
hides them and in what they add:

- ``all_gather``: one collective the kernel waits for (exposed), then one kernel over
  all the keys: ``gather(n · kv) + compute(n blocks)``;
- ``ring``: ``n`` steps, each computing one block while the next arrives, so a step
  costs ``max(compute(block) + merge, permute(kv))``; each step adds kernel launches
  (its attention calls and the online-softmax merge, memory-bound over the output), and
  causal attention adds the zig-zag relayout of q, k, v and the output.

So short sequences and grouped-query attention (little compute or few k/v bytes per
step: launches and merges dominate) gather, and long sequences ring. The ring also
keeps per-rank memory at ``O(T / n)``, which this time model does not weigh.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from math import prod

from tessera.ir import graph
from tessera.ir.abstract import aval
from tessera.ir.mesh import Mesh
from tessera.ir.sharding import Sharding
from tessera.ir.sharding_rules import Assignment, ShardingRule
from tessera.perf.collective_cost import collective_time
from tessera.perf.compute_cost import attention_flops, compute_time
from tessera.topology import Topology
from tessera.transforms.ring_attention import RingLayouts, ring_calls


@dataclass(frozen=True)
class ContextCost:
    """Modelled seconds of one attention op under each method."""

    ring: float
    all_gather: float

    @property
    def method(self) -> str:
        return "ring" if self.ring < self.all_gather else "all_gather"


def context_cost(
    topology: Topology,
    ranks: int,
    *,
    block_flops: float,
    kv_bytes: int,
    io_bytes: int,
    dtype: str,
    calls_per_step: int,
    merge_bytes: int,
    relayout_bytes: int = 0,
    steps: int | None = None,
) -> ContextCost:
    """Both methods' time for ``ranks`` ranks: ``block_flops`` is the FLOPs of one rank's
    queries against one block of keys, ``kv_bytes`` one rank's k and v, ``io_bytes``
    the bytes one attention call reads and writes (q, the output, k and v),
    ``merge_bytes`` what a step's merge reads and writes, ``relayout_bytes`` what the
    ring moves besides k and v (the zig-zag relayout) and ``steps`` the ring steps that
    compute (all ``ranks`` by default; a mask may leave some out)."""
    group = list(range(min(ranks, topology.num_devices)))
    device = topology.device
    step = compute_time(device, block_flops, io_bytes, dtype)
    step += (calls_per_step - 1) * device.launch_overhead_s
    merge = compute_time(device, 0.0, merge_bytes, dtype)  # one fused elementwise kernel
    permute = collective_time(topology, "collective_permute", kv_bytes, group).time_s
    gather = collective_time(topology, "all_gather", ranks * kv_bytes, group).time_s
    relayout = collective_time(topology, "collective_permute", relayout_bytes, group).time_s
    ring_step = step + (merge if ranks > 1 else 0.0)
    steps = ranks if steps is None else steps
    ring = (steps - 1) * max(ring_step, permute) + ring_step + (relayout if relayout_bytes else 0.0)
    whole = compute_time(device, ranks * block_flops, ranks * io_bytes, dtype)
    return ContextCost(ring=ring, all_gather=gather + whole)


@dataclass(frozen=True)
class RingPlan:
    """How an attention op would run round a ring of ``size`` ranks over ``axes``."""

    op: graph.GraphOp
    axes: tuple[str, ...]
    size: int
    zigzag: bool  # causal: the zig-zag split balances the ranks' work
    relayout: bool  # the zig-zag pairs are moved there (the op's sequence is not stored so)
    layouts: RingLayouts

    def cost(self, machine: Topology) -> ContextCost:
        """Both methods priced on ``machine``."""
        q, k, v = (aval(x) for x in self.op.operands[:3])
        backward = isinstance(self.op, graph.AttentionBackwardOp)
        kv = k.nbytes + v.nbytes
        if self.op.attrs().get("segments"):  # the key segment ids travel with k and v
            kv += aval(self.op.operands[7 if backward else 4]).nbytes
        io = q.nbytes + kv + q.nbytes * (2 if backward else 1)
        calls = ring_calls(self.op, self.size, self.zigzag)
        return context_cost(
            machine,
            self.size,
            block_flops=attention_flops(self.op),
            kv_bytes=2 * kv if backward else kv,  # the backward's dk, dv travel too
            io_bytes=io,
            dtype=str(q.dtype),
            calls_per_step=max(calls),
            merge_bytes=(6 if backward else 3) * q.nbytes,  # accumulators: read 2, write 1
            relayout_bytes=io if self.relayout else 0,
            steps=sum(1 for c in calls if c),
        )


def ring_plan(
    op: graph.GraphOp,
    rule: ShardingRule,
    assignment: Assignment,
    operands: Sequence[Sharding],
    mesh: Mesh,
) -> RingPlan | None:
    """The ring for ``op`` (with local operand types) when it can run as one: attention
    whose query rows and keys are split over the same axes, every operand in the layout
    the split implies, as many local queries as keys, and (causal or windowed) no
    zig-zag order but over the ring's ranks; None otherwise (it then all-gathers k and
    v). Segment ids and windows ring (:mod:`tessera.transforms.ring_attention`)."""
    if not isinstance(op, graph.AttentionOp | graph.AttentionBackwardOp):
        return None
    rows, keys = rule.operands[0][-2], rule.operands[1][-2]
    axes = assignment.get(keys, ())
    size = prod(mesh.axis_size(a) for a in axes)
    if size < 2 or assignment.get(rows, ()) != axes:
        return None

    def implied(dims: Sequence[int | None]) -> Sharding:
        return Sharding(tuple(assignment.get(f, ()) if f is not None else () for f in dims))

    wanted = tuple(implied(dims) for dims in rule.operands)
    if tuple(operands) != wanted:
        return None
    q, k = aval(op.operands[0]), aval(op.operands[1])
    if q.shape[-2] != k.shape[-2]:
        return None
    attrs = op.attrs()
    positional = bool(attrs["causal"] or attrs.get("window"))
    stored = attrs.get("zigzag", 0) if positional else 0
    if stored and (stored != size or q.shape[-2] % 2):
        return None  # not the ring's zig-zag pairs: gathered (see ``unzigzag-attention``)
    zigzag = bool(stored) or (bool(attrs["causal"]) and q.shape[-2] % 2 == 0)
    relayout = zigzag and not stored
    layouts = RingLayouts(wanted, tuple(implied(dims) for dims in rule.results))
    return RingPlan(op, tuple(axes), size, zigzag, relayout, layouts)


__all__ = ["ContextCost", "RingPlan", "context_cost", "ring_plan"]
