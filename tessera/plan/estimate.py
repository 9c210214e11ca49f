"""Per-rank memory and step time of one strategy, from the compiled layer.

Memory per rank (bytes), the rank of the first pipeline stage and of the last, whichever
holds more:

- model states, mixed precision as in the ZeRO paper (Rajbhandari et al. 2020, §3.1): bf16
  parameters (2 B) and gradients (2 B), fp32 master weights and Adam moments (12 B) per
  parameter; ZeRO-1 splits the 12 B over dp, ZeRO-2 the gradients too, ZeRO-3 the
  parameters too (expert parameters over dp / ep), plus three layers' gathered bf16
  parameters (the layer computing, the next prefetched, and one's unreduced gradient).
  Stage parameters: its layers' (dense
  weights over tp, routed experts over tp · ep) plus the embedding (first stage) or the
  output projection (last stage), over tp;
- activations: the compiled layer's saved activations (the forward values its backward
  reads, :func:`tessera.plan.layer.saved_activations`, per microbatch and layer) times
  the layers of the stage times the microbatches the schedule keeps in flight on that
  rank (:func:`tessera.pipeline.theory.peak_activations`); with full recomputation the
  layer input instead; plus the working set of the layer in its backward beyond what it
  keeps (``plan-memory``'s peak of the gradient program, less arguments and results);
  plus the last stage's fp32 logits and their gradient.

Step time: stage times are the simulated layer times (``profile_layer``) times the
stage's layers (a recomputed forward added under ``remat=full``; expert parallelism's
dispatch and combine all-to-alls priced with ``collective_time`` (``_expert_all_to_alls``:
node-limited routing, FP8 dispatch, exposed unless ``moe_overlap``); ZeRO-3's
per-microbatch parameter gathers and gradient reduce-scatters, prefetched a layer ahead:
exposed where they exceed the microbatch's compute, plus one layer's gather and
reduce-scatter at the ends), the
last stage adding the output projection (roofline). The pipeline simulator runs the
schedule (``pipeline_schedule``) with those times and the activation send time (on at
most 4·pp microbatches, extended at the busiest rank's pace: ``_simulated_pipeline``); with
``screen=True`` the closed-form bubble (:mod:`tessera.pipeline.theory`) replaces it. Then
the data-parallel gradient reduction (all-reduce, or reduce-scatter and parameter
all-gather with ZeRO ≥ 1), overlapped with the last microbatch's backward except its last
layer's bucket, and the optimizer step (memory-bound: 32 B read and written per parameter
the rank updates). FP8 runs the layer's linear matmuls at the device's FP8 rate (twice BF16's on
H100 and B200; a device without FP8 tensor cores, A100, is planned in BF16 only)
and keeps the attention kernels and the output projection in BF16, as FP8 recipes do
(DeepSeek-V3 report §3.3.1 keeps attention operators, the embedding and the output head
in BF16/FP32); its quantization kernels are not priced; MFU is against the peak of the
precision used.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any

from tessera.errors import TesseraError
from tessera.perf.collective_cost import collective_time
from tessera.perf.compute_cost import compute_time
from tessera.perf.pipeline_simulate import PipelineProgram, simulate_pipeline
from tessera.pipeline.theory import bubble_fraction, peak_activations
from tessera.plan.layer import LayerProfile, LayerShape, profile_layer
from tessera.plan.models import ModelSpec
from tessera.plan.strategy import Strategy, dp_group, rank_of
from tessera.topology import Topology
from tessera.transforms.pipeline_schedules import schedule_steps

BF16 = 2
ADAM_FP32 = 12  # master weights, first and second moments
MEMORY_HEADROOM = 0.9  # usable share of HBM (allocator fragmentation, NCCL buffers)


@dataclass(frozen=True)
class Memory:
    """Per-rank bytes of the most loaded pipeline rank."""

    params: int
    grads: int
    optimizer: int
    activations: int
    capacity: int

    @property
    def model_states(self) -> int:
        return self.params + self.grads + self.optimizer

    @property
    def total(self) -> int:
        return self.model_states + self.activations

    @property
    def fits(self) -> bool:
        return self.total <= MEMORY_HEADROOM * self.capacity


@dataclass(frozen=True)
class Estimate:
    """One strategy's predicted step."""

    strategy: Strategy
    memory: Memory
    step_s: float
    mfu: float
    tokens_per_s: float
    bubble: float
    exposed_comm_s: float
    simulated: bool  # pipeline simulator (True) or closed-form bubble (False)
    parts: dict[str, float] = field(default_factory=dict)
    # the step time split into what it is spent on (seconds, summing to step_s): see
    # BREAKDOWN
    breakdown: dict[str, float] = field(default_factory=dict)

    @property
    def headroom_bytes(self) -> int:
        """Usable memory left on the most loaded rank (negative: does not fit)."""
        return int(MEMORY_HEADROOM * self.memory.capacity) - self.memory.total

    def to_dict(self) -> dict[str, Any]:
        return {
            "strategy": self.strategy.to_dict(),
            "label": self.strategy.label(),
            "memory_gb": {
                "params": self.memory.params / 1e9, "grads": self.memory.grads / 1e9,
                "optimizer": self.memory.optimizer / 1e9,
                "activations": self.memory.activations / 1e9, "total": self.memory.total / 1e9,
                "capacity": self.memory.capacity / 1e9,
            },
            "step_s": self.step_s, "mfu": self.mfu, "tokens_per_s": self.tokens_per_s,
            "bubble": self.bubble, "exposed_comm_s": self.exposed_comm_s,
            "simulated": self.simulated, "parts_s": self.parts,
            "breakdown_s": self.breakdown, "headroom_gb": self.headroom_bytes / 1e9,
        }  # fmt: skip


BREAKDOWN = {
    "compute": "the busiest pipeline rank's layers, head and embedding (not recomputed)",
    "recompute": "the forward run again in the backward (remat=full)",
    "exposed_comm": "tensor/context/expert-parallel and ZeRO-3 collectives not hidden "
    "behind compute, inside the stages",
    "bubble": "pipeline idle time and stage-to-stage sends",
    "dp_exposed": "the data-parallel gradient reduction (and ZeRO all-gather) left after "
    "the last backward",
    "optimizer": "the optimizer update of the rank's parameters",
}


def stage_layers(layers: int, stages: int) -> list[int]:
    """Layers per model stage: as even as possible, the first and last stages (which hold
    the embedding and the output projection) taking fewer when it cannot be even."""
    base, extra = divmod(layers, stages)
    counts = [base] * stages
    order = [*range(1, stages - 1), 0, stages - 1] if stages > 2 else list(range(stages))
    for index in order[:extra]:
        counts[index] += 1
    return counts


def stage_params(
    model: ModelSpec, s: Strategy, layers: int, first: bool, last: bool
) -> tuple[float, float]:
    """(dense, expert) parameters a rank of a stage with ``layers`` layers holds."""
    return _stage_params(model, s.tp, s.ep, layers, first, last)


@functools.lru_cache(maxsize=4096)
def _stage_params(
    model: ModelSpec, tp: int, ep: int, layers: int, first: bool, last: bool
) -> tuple[float, float]:
    moe_share = model.moe_layers / model.layers
    dense_layer = model.dense_layer_params() if not model.is_moe else (
        (1 - moe_share) * model.dense_layer_params()
        + moe_share * (model.moe_layer_params() - model.expert_params())
    )  # fmt: skip
    dense = layers * dense_layer / tp
    embedding = model.vocab * model.hidden / tp
    if first:
        dense += embedding
    if last and (not first or not model.tied_embeddings):
        dense += embedding
    expert = layers * moe_share * model.expert_params() / (tp * ep)
    return dense, expert


@dataclass(frozen=True)
class _Layout:
    """How a model's layers and parameters lie on ``pp`` pipeline ranks of ``virtual``
    chunks each (parameters split over tp and ep).

    A stage's times depend on its layer count and on whether it is the last stage alone:
    stages of the same *kind* take the same times, and so do ranks whose chunks are of
    the same kinds, so maxima over stages (ranks) need the first of each kind."""

    counts: tuple[int, ...]  # layers per stage (stage_layers)
    kind_of: tuple[int, ...]  # per stage, the first stage of its kind
    stage_kinds: tuple[int, ...]  # the first stage of each kind, in order
    rank_kinds: tuple[tuple[int, ...], ...]  # the first rank of each kind: its chunks' kinds
    busiest_layers: int  # the most layers a rank holds
    # the first and the last rank: (rank, layers, dense parameters, expert parameters)
    edges: tuple[tuple[int, int, float, float], ...]
    stage_params: tuple[float, float]  # (dense, expert) of the largest stage, times virtual
    one_layer: float  # dense + expert parameters of one layer


@functools.lru_cache(maxsize=1024)
def _layout(model: ModelSpec, tp: int, ep: int, pp: int, virtual: int) -> _Layout:
    stages = pp * virtual
    counts = tuple(stage_layers(model.layers, stages))
    kinds = [(count, stage == stages - 1) for stage, count in enumerate(counts)]
    first = {kind: stage for stage, kind in reversed([*enumerate(kinds)])}
    kind_of = tuple(first[kind] for kind in kinds)
    ranks = {tuple(kind_of[c] for c in range(r, stages, pp)): r for r in reversed(range(pp))}
    rank_layers = [sum(counts[c] for c in range(r, stages, pp)) for r in range(pp)]
    edges = []
    for rank in (0, pp - 1) if pp > 1 else (0,):
        layers = rank_layers[rank]
        params = _stage_params(model, tp, ep, layers, rank == 0, rank == pp - 1)
        edges.append((rank, layers, *params))
    d1, e1 = _stage_params(model, tp, ep, 1, False, False)
    return _Layout(
        counts=counts,
        kind_of=kind_of,
        stage_kinds=tuple(sorted(first.values())),
        rank_kinds=tuple(chunks for chunks, _ in sorted(ranks.items(), key=lambda x: x[1])),
        busiest_layers=max(rank_layers),
        edges=tuple(edges),
        stage_params=_stage_params(model, tp, ep, max(counts) * virtual, False, False),
        one_layer=d1 + e1,
    )


def memory(
    model: ModelSpec, s: Strategy, profile: LayerProfile, topology: Topology, global_batch: int
) -> Memory:
    """Per-rank memory of the worse of the first and the last pipeline stage."""
    layout = _layout(model, s.tp, s.ep, s.pp, s.virtual)
    m = s.microbatches(global_batch)
    keep = profile.input_bytes if s.remat == "full" else profile.stash_bytes
    expert_dp = max(1, s.dp // s.ep)
    gathered = 0.0
    if s.zero >= 3 and s.dp > 1:  # a layer in use, the next prefetched, one's gradient
        gathered = 3 * BF16 * layout.one_layer
    worst: tuple[int, int, int, int] | None = None
    for rank, layers, dense, expert in layout.edges:
        split = dense / s.dp + expert / expert_dp  # what ZeRO leaves a rank
        whole = dense + expert
        if s.pp == 1:
            in_flight = 1
        elif s.schedule == "interleaved":
            in_flight = _peak_activations("interleaved", s.pp, m, rank, s.virtual)
        else:
            in_flight = _peak_activations(s.schedule, s.pp, m, rank)
        per_unit = layers / s.virtual
        activations = in_flight * per_unit * keep + max(0, profile.work_bytes - keep)
        if rank == s.pp - 1:  # the last stage's logits
            tokens = s.micro_batch * profile.shape.seq // s.cp
            activations += 2 * 4 * tokens * model.vocab / s.tp
        candidate = (
            int(BF16 * (split if s.zero >= 3 else whole) + gathered),
            int(BF16 * (split if s.zero >= 2 else whole)),
            int(ADAM_FP32 * (split if s.zero >= 1 else whole)),
            int(activations),
        )
        if worst is None or sum(candidate) > sum(worst):
            worst = candidate
    assert worst is not None
    return Memory(*worst, capacity=topology.device.memory_bytes)


_peak_activations = functools.lru_cache(maxsize=4096)(peak_activations)
_bubble_fraction = functools.lru_cache(maxsize=1024)(bubble_fraction)


class _Identity:
    """A topology as a cache key, equal to the same object only (a Topology holds dicts,
    so it has no hash); a cache holding the key keeps the topology, and so its id."""

    __slots__ = ("topology",)

    def __init__(self, topology: Topology) -> None:
        self.topology = topology

    def __hash__(self) -> int:
        return id(self.topology)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Identity) and other.topology is self.topology


# DeepSeek-V3 report §3.2.2: its overlapped all-to-all kernels occupy 20 of an H800's 132 SMs
OVERLAP_COMM_SM_SHARE = 20 / 132


def _expert_all_to_alls(
    model: ModelSpec, s: Strategy, same: _Identity, tokens: int, profile: LayerProfile
) -> tuple[float, float, float]:
    """Seconds of one MoE layer's expert all-to-alls: (one pass's dispatch and combine,
    what the forward exposes, what the backward exposes).

    Each pass (forward; backward) runs a dispatch and a combine of the microbatch's routed
    token copies over the expert-parallel group. With node-limited routing
    (``model.route_groups``) and a group spanning nodes, a token crosses the inter-node
    link once per node it reaches, at most ``route_groups`` copies instead of ``top_k``
    (DeepSeek-V3 report §3.2.2: the copies for one node's experts are forwarded over
    NVLink). Under FP8 one of the two runs in FP8 (the activations before the up
    projection; the gradients before the down projection, §3.3.3), the other in BF16.
    With ``s.moe_overlap`` the forward's and backward's all-to-alls hide behind the other
    microbatch's forward and backward compute of the layer (DualPipe, §3.2.1): only what
    outlasts it is exposed, split evenly between the passes (and the layer's compute runs
    on the SMs the communication leaves, ``OVERLAP_COMM_SM_SHARE``, in :func:`estimate`)."""
    if not (model.is_moe and s.ep > 1):
        return 0.0, 0.0, 0.0
    group = _dp_group(s.dp, s.tp, s.cp, s.ep)
    copies = model.top_k
    if model.route_groups and same.topology.level_of(group) > 0:
        copies = min(copies, model.route_groups)
    elements = tokens * copies * model.hidden // s.tp
    low = 1 if s.precision == "fp8" else BF16
    one_pass = _collective_s(same, "all_to_all", elements * low, group) + _collective_s(
        same, "all_to_all", elements * BF16, group
    )
    if not s.moe_overlap:
        return one_pass, one_pass, one_pass
    exposed = max(0.0, 2 * one_pass - (profile.forward_s + profile.backward_s))
    return one_pass, exposed / 2, exposed / 2


@functools.lru_cache(maxsize=4096)
def _collective_s(machine: _Identity, kind: str, nbytes: int, ranks: tuple[int, ...]) -> float:
    """``collective_time(...).time_s``, asked once (a topology does not change)."""
    return collective_time(machine.topology, kind, nbytes, ranks).time_s


@functools.lru_cache(maxsize=1024)
def _dp_group(dp: int, tp: int, cp: int, size: int | None = None) -> tuple[int, ...]:
    return tuple(dp_group(Strategy(dp=dp, tp=tp, cp=cp), size))


@functools.lru_cache(maxsize=1024)
def _profile(
    model: ModelSpec, seq: int, micro_batch: int, tp: int, cp: int, sp: bool,
    machine: _Identity, exact: bool,
) -> LayerProfile:  # fmt: skip
    """``profile_layer`` of the layer at these sizes (a pure function of its arguments,
    asked once per search)."""
    shape = LayerShape.of(model, seq, micro_batch, tp, cp, sp)
    return profile_layer(shape, machine.topology, exact=exact)


@functools.lru_cache(maxsize=256)
def _flops_per_token(model: ModelSpec, seq: int) -> float:
    return model.flops_per_token(seq)


_FP8_MACHINES: dict[int, tuple[Topology, Topology]] = {}  # id(topology) -> (it, with FP8)


def has_fp8(topology: Topology) -> bool:
    """Whether the devices have FP8 tensor cores (an ``fp8`` matmul rate: H100, B200; not A100)."""
    return "fp8" in topology.device.matmul_flops


def precision_machine(topology: Topology, precision: str) -> Topology:
    """The machine the layers of a ``precision`` strategy run on (FP8: the FP8 matmul rate)."""
    if precision != "fp8":
        return topology
    if not has_fp8(topology):
        raise TesseraError(f"{topology.device.name} has no FP8 tensor cores: plan bf16")
    cached = _FP8_MACHINES.get(id(topology))
    if cached is None or cached[0] is not topology:  # made once per topology: a search
        cached = _FP8_MACHINES[id(topology)] = (topology, _fp8_machine(topology))  # asks often
    return cached[1]


def _fp8_machine(topology: Topology) -> Topology:
    """``topology`` with its linear matmuls at the FP8 rate (twice BF16's on H100 and B200)."""
    fp8 = topology.device.matmul_flops["fp8"]
    return topology.with_overrides(
        {"device": {"matmul_flops": {"bf16": fp8, "f16": fp8}}},
        source="FP8 tensor cores: the device's fp8 matmul rate",
    )


SIMULATED_ROUNDS = 4  # microbatches simulated: at most this many per pipeline rank


def _simulated_pipeline(
    s: Strategy, m: int, forward: list[float], backward: list[float], p2p: float
) -> tuple[float, float]:
    """Makespan and bubble fraction of the schedule on ``m`` microbatches.

    The pipeline simulator runs at most ``SIMULATED_ROUNDS · pp`` microbatches (a
    multiple of pp, as the interleaved schedule wants): past its warm-up a schedule runs
    at its busiest rank's pace, so each further microbatch adds that rank's forward and
    backward time to the makespan (``tests/unit/test_plan.py`` checks the extension
    against the full simulation)."""
    virtual = s.virtual if s.schedule == "interleaved" else 1
    simulated = min(m, SIMULATED_ROUNDS * s.pp)
    run = _simulated_makespan(
        s.schedule, s.pp, simulated, virtual, tuple(forward), tuple(backward), p2p
    )
    stages = len(forward)
    work = [sum(forward[c] + backward[c] for c in range(r, stages, s.pp)) for r in range(s.pp)]
    makespan = run + (m - simulated) * max(work)
    bubble = 1 - m * sum(work) / (s.pp * makespan) if makespan > 0 else 0.0
    return makespan, bubble


@functools.lru_cache(maxsize=1024)
def _simulated_makespan(
    kind: str,
    ranks: int,
    microbatches: int,
    virtual: int,
    forward: tuple[float, ...],
    backward: tuple[float, ...],
    p2p: float,
) -> float:
    """The simulated makespan (strategies differing only where the pipeline does not
    look, e.g. ZeRO 0-2, share it)."""
    program = _schedule(kind, ranks, microbatches, virtual)
    if kind == "zb-h1":  # input and weight gradients: half of the backward each
        halves = [b / 2 for b in backward]
        run = simulate_pipeline(program, forward, halves, halves, p2p, record_events=False)
    else:
        run = simulate_pipeline(program, forward, backward, 0.0, p2p, record_events=False)
    return run.makespan_s


@functools.lru_cache(maxsize=64)
def _schedule(kind: str, ranks: int, microbatches: int, virtual: int) -> PipelineProgram:
    """The pipeline schedule, compiled for the simulator (once per shape: strategies
    share it)."""
    return PipelineProgram.from_steps(schedule_steps(kind, ranks, microbatches, virtual))


def screen_memory(
    model: ModelSpec, s: Strategy, topology: Topology, global_batch: int, seq: int
) -> Memory:
    """The memory ``estimate(..., screen=True)`` reports, without the step time (a search
    drops most strategies on memory alone)."""
    machine = _Identity(precision_machine(topology, s.precision))
    profile = _profile(model, seq, s.micro_batch, s.tp, s.cp, s.sp, machine, False)
    return memory(model, s, profile, topology, global_batch)


def estimate(
    model: ModelSpec,
    s: Strategy,
    topology: Topology,
    global_batch: int,
    seq: int,
    screen: bool = False,
) -> Estimate:
    """Memory and step time of strategy ``s`` (``topology`` holds at least ``s.gpus``)."""
    machine = precision_machine(topology, s.precision)
    same = _Identity(topology)  # collectives run on the topology, layers on the machine
    profile = _profile(model, seq, s.micro_batch, s.tp, s.cp, s.sp, _Identity(machine), not screen)
    mem = memory(model, s, profile, topology, global_batch)
    m = s.microbatches(global_batch)
    device = machine.device
    tokens = s.micro_batch * seq // s.cp  # per rank and microbatch

    # expert parallelism: dispatch and combine, forward and backward, per MoE layer
    a2a_pass, a2a_f, a2a_b = _expert_all_to_alls(model, s, same, tokens, profile)
    moe_share = model.moe_layers / model.layers
    # overlapped all-to-alls run on SMs taken from compute: the layers run that much slower
    slowdown = 1 / (1 - OVERLAP_COMM_SM_SHARE) if a2a_pass and s.moe_overlap else 1.0
    layer_f = profile.forward_s * slowdown + a2a_f * moe_share
    layer_b = profile.backward_s * slowdown + a2a_b * moe_share
    if s.precision == "fp8":  # attention stays BF16: add back what the doubled rate took off
        bf16 = topology.device.matmul_flops["bf16"] * topology.device.matmul_efficiency
        layer_f += profile.attention_forward_flops / (2 * bf16)
        layer_b += profile.attention_backward_flops / (2 * bf16)
    if s.remat == "full":
        layer_b += profile.forward_s

    # stage times, by kind of stage (_Layout): the first stage of each kind -> its time
    stages = s.pp * s.virtual
    layout = _layout(model, s.tp, s.ep, s.pp, s.virtual)
    forward = {c: layout.counts[c] * layer_f for c in layout.stage_kinds}
    backward = {c: layout.counts[c] * layer_b for c in layout.stage_kinds}
    head = 2.0 * tokens * model.hidden * model.vocab / s.tp
    forward[stages - 1] += compute_time(topology.device, head, 0, "bf16")  # BF16 with FP8 too
    backward[stages - 1] += compute_time(topology.device, 2 * head, 0, "bf16")

    # ZeRO-3 gathers the stage's parameters twice per microbatch (forward; backward, with
    # any recomputation) and reduce-scatters their gradients, layer by layer, each layer's
    # prefetched during the previous one's compute: the first layer's gather and the last
    # layer's reduce-scatter are exposed, the rest only where they outlast the compute
    zero3_exposed = 0.0
    stage_layer_count = max(layout.counts) * s.virtual
    dense, expert = layout.stage_params
    group = _dp_group(s.dp, s.tp, s.cp)
    if s.zero == 3 and s.dp > 1:
        nbytes = int(BF16 * (dense + expert))
        gather = _collective_s(same, "all_gather", nbytes, group)
        scatter = _collective_s(same, "reduce_scatter", nbytes, group)
        per_mb = 2 * gather + scatter
        busiest = max(forward[c] + backward[c] for c in layout.stage_kinds)
        edges = (gather + scatter) / stage_layer_count
        zero3_exposed = max(0.0, per_mb - busiest) + edges
        backward = {c: b + zero3_exposed for c, b in backward.items()}

    p2p = 0.0
    if s.pp > 1:
        p2p = _collective_s(same, "send", profile.input_bytes, (0, rank_of(s, pp=1)))
    busiest_work = m * max(
        sum(forward[c] + backward[c] for c in chunks) for chunks in layout.rank_kinds
    )
    if s.pp == 1:
        makespan = m * (forward[0] + backward[0])
        bubble = 0.0
        simulated = True
    elif screen:
        busiest_rank = max(
            sum(forward[c] + backward[c] for c in chunks) for chunks in layout.rank_kinds
        )
        virtual = s.virtual if s.schedule == "interleaved" else 1
        bubble = _bubble_fraction(s.schedule, s.pp, m, virtual)
        makespan = m * busiest_rank / (1 - bubble) + 2 * (s.pp - 1) * p2p
        simulated = False
    else:
        makespan, bubble = _simulated_pipeline(
            s, m, [forward[c] for c in layout.kind_of], [backward[c] for c in layout.kind_of], p2p
        )
        simulated = True

    # data-parallel gradient reduction and, with ZeRO, the parameter all-gather
    dp_time = 0.0
    if s.dp > 1:
        expert_group = _dp_group(s.dp, s.tp, s.cp, max(1, s.dp // s.ep))
        for count, ranks in ((dense, group), (expert, expert_group)):
            nbytes = int(BF16 * count)
            if nbytes == 0 or len(ranks) < 2:
                continue
            if s.zero == 0:
                dp_time += _collective_s(same, "all_reduce", nbytes, ranks)
            elif s.zero in (1, 2):
                dp_time += _collective_s(same, "reduce_scatter", nbytes, ranks)
                dp_time += _collective_s(same, "all_gather", nbytes, ranks)
    last_backward = max(backward.values()) / max(1, s.virtual)
    per_layer = dp_time / max(1, max(layout.counts))
    dp_exposed = max(dp_time - last_backward, per_layer) if dp_time else 0.0
    owned = (dense + expert) / (s.dp if s.zero >= 1 else 1)
    optimizer = compute_time(device, 0, 32 * owned, "f32")
    step = makespan + dp_exposed + optimizer

    layer_exposed = profile.forward_exposed_comm_s + profile.backward_exposed_comm_s
    in_stages = m * layout.busiest_layers * (layer_exposed + (a2a_f + a2a_b) * moe_share)
    in_stages += m * zero3_exposed
    exposed = in_stages + dp_exposed + (2 * m * p2p if s.pp > 1 else 0.0)
    recompute = m * layout.busiest_layers * profile.forward_s if s.remat == "full" else 0.0
    breakdown = {
        "compute": busiest_work - recompute - in_stages,
        "recompute": recompute,
        "exposed_comm": in_stages,
        "bubble": makespan - busiest_work,
        "dp_exposed": dp_exposed,
        "optimizer": optimizer,
    }
    flops = _flops_per_token(model, seq) * global_batch * seq
    peak = machine.device.matmul_flops["bf16"] * s.gpus  # the precision's peak
    return Estimate(
        strategy=s,
        memory=mem,
        step_s=step,
        mfu=flops / (step * peak) if step > 0 else math.nan,
        tokens_per_s=global_batch * seq / step,
        bubble=bubble,
        exposed_comm_s=exposed,
        simulated=simulated,
        parts={
            "pipeline": makespan,
            "dp_exposed": dp_exposed,
            "optimizer": optimizer,
            "layer_forward": profile.forward_s,
            "layer_backward": profile.backward_s,
            "all_to_all": a2a_pass,
            "p2p": p2p,
        },
        breakdown=breakdown,
    )
