"""The strategy search: every well-formed strategy for a model on a cluster, ranked by
simulated step time.

1. *Enumerate* dp · tp · pp · cp = GPUs (tp up to the NVLink domain, 8; cp while each rank
   keeps at least 2048 tokens), ep dividing dp and the experts, ZeRO 0–3, microbatch sizes
   1, 2, 4, schedules 1F1B, interleaved (2 chunks) and ZB-H1 when pp > 1 (GPipe holds every
   microbatch: never better than 1F1B in time, worse in memory), sequence parallelism on
   and off, recomputation none or full, precision bf16 or fp8 (fp8 only on devices with FP8
   tensor cores and for models whose layer runs with fp8 matmuls, as
   ``graph.training_step(precision="fp8")`` runs it: :func:`~tessera.plan.layer.fp8_unsupported`).
2. *Drop* what breaks a size rule (:func:`structural_violations`) or cannot fit even its
   model states, with the reason, counted by rule.
3. *Screen* the rest with :func:`estimate` and ``screen=True``: the compiled layer at one
   sequence per microbatch (one compile per tp, cp and sequence parallelism), scaled by
   the microbatch size, and the closed-form bubble; drop those whose memory does not fit
   (:func:`screen_memory`, checked before the step time). The screening's layer programs
   are independent: with ``jobs > 1`` forked workers compile them in parallel first
   (``tessera plan recommend --jobs``).
4. *Simulate* the ``finalists`` fastest exactly: the layer compiled at its microbatch size
   and the pipeline simulator; rank by step time.
"""

from __future__ import annotations

import functools
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

from tessera.plan.estimate import (
    ADAM_FP32,
    BF16,
    MEMORY_HEADROOM,
    Estimate,
    estimate,
    has_fp8,
    precision_machine,
    screen_memory,
)
from tessera.plan.layer import LayerShape, compiled_count, fp8_unsupported, prefetch_profiles
from tessera.plan.models import ModelSpec
from tessera.plan.strategy import Strategy
from tessera.plan.validate import memory_violation, structural_violations
from tessera.topology import Topology

TP_CHOICES = (1, 2, 4, 8)
CP_CHOICES = (1, 2, 4, 8, 16)
MICRO_BATCHES = (1, 2, 4)
MIN_TOKENS_PER_CP_RANK = 2048


@dataclass
class SearchResult:
    """The ranked feasible strategies and why the others were dropped."""

    ranked: list[Estimate]
    dropped: Counter[str] = field(default_factory=Counter)
    candidates: int = 0
    screened: int = 0
    compiled_programs: int = 0
    seconds: float = 0.0

    @property
    def best(self) -> Estimate | None:
        return self.ranked[0] if self.ranked else None


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def candidates(model: ModelSpec, gpus: int, global_batch: int, seq: int) -> Iterator[Strategy]:
    """Every strategy of the search space (well-formed or not)."""
    for tp in TP_CHOICES:
        for cp in CP_CHOICES:
            if cp > 1 and seq // cp < MIN_TOKENS_PER_CP_RANK:
                continue
            if gpus % (tp * cp):
                continue
            for pp in _divisors(gpus // (tp * cp)):
                if pp > model.layers:
                    continue
                dp = gpus // (tp * cp * pp)
                eps = [e for e in _divisors(dp) if model.experts % e == 0] if model.is_moe else [1]
                for ep in eps:
                    for mb in MICRO_BATCHES:
                        schedules = (
                            [("1f1b", 1), ("interleaved", 2), ("zb-h1", 1)] if pp > 1
                            else [("1f1b", 1)]
                        )  # fmt: skip
                        for schedule, virtual in schedules:
                            for zero in (0, 1, 2, 3):
                                for sp in (True, False) if tp > 1 else (False,):
                                    for remat in ("none", "full"):
                                        for precision in ("bf16", "fp8"):
                                            yield Strategy(dp, tp, pp, cp, ep, zero, mb,
                                                           schedule, virtual, remat,
                                                           precision, sp)  # fmt: skip


def model_state_bytes(model: ModelSpec, s: Strategy) -> float:
    """A lower bound of the per-rank model states (no embedding, even stages)."""
    dense_params, expert_params = _split_params(model)
    dense = dense_params / (s.tp * s.pp)
    expert = expert_params / (s.tp * s.pp * s.ep)
    expert_dp = max(1, s.dp // s.ep)

    def part(bytes_per: int, divided: bool) -> float:
        return bytes_per * (dense / s.dp + expert / expert_dp if divided else dense + expert)

    return part(BF16, s.zero >= 3) + part(BF16, s.zero >= 2) + part(ADAM_FP32, s.zero >= 1)


@functools.lru_cache(maxsize=64)
def _split_params(model: ModelSpec) -> tuple[int, int]:
    """The model's (dense, routed expert) parameters."""
    expert = model.moe_layers * model.expert_params()
    return model.params() - expert, expert


def search(
    model: ModelSpec,
    topology: Topology,
    gpus: int,
    global_batch: int,
    seq: int,
    finalists: int = 12,
    fix: dict[str, object] | None = None,
    jobs: int = 1,
) -> SearchResult:
    """The ranked strategies (``fix``: fields every candidate must have, e.g. ``{"tp": 8}``;
    ``jobs``: worker processes compiling the screening's layer programs in parallel)."""
    started = time.perf_counter()
    result = SearchResult(ranked=[])
    capacity = MEMORY_HEADROOM * topology.device.memory_bytes
    plausible: list[Strategy] = []
    fp8 = has_fp8(topology)
    for s in candidates(model, gpus, global_batch, seq):
        if fix and any(getattr(s, k) != v for k, v in fix.items()):
            continue
        result.candidates += 1
        if s.precision == "fp8" and not fp8:
            result.dropped["the device has no FP8 tensor cores"] += 1
            continue
        if s.precision == "fp8" and fp8_unsupported(model.layer, model.mlp):
            result.dropped["the model's ops do not all run in FP8"] += 1
            continue
        problems = structural_violations(model, s, gpus, global_batch, seq)
        if problems:
            result.dropped[_reason(problems[0])] += 1
            continue
        if model_state_bytes(model, s) > capacity:
            result.dropped["model states alone exceed GPU memory"] += 1
            continue
        plausible.append(s)
    machines = {id(m): m for m in (precision_machine(topology, s.precision) for s in plausible)}
    screening = (LayerShape.of(model, seq, 1, s.tp, s.cp, s.sp) for s in plausible)
    prefetch_profiles(screening, list(machines.values()), jobs)
    screened: list[Estimate] = []
    for s in plausible:
        result.screened += 1
        if not screen_memory(model, s, topology, global_batch, seq).fits:
            result.dropped["activations and model states exceed GPU memory"] += 1
            continue
        screened.append(estimate(model, s, topology, global_batch, seq, screen=True))
    screened.sort(key=lambda e: e.step_s)
    final = []
    for rough in screened[:finalists]:
        exact = estimate(model, rough.strategy, topology, global_batch, seq)
        if memory_violation(exact):
            result.dropped["activations and model states exceed GPU memory"] += 1
            continue
        final.append(exact)
    final.sort(key=lambda e: e.step_s)
    result.ranked = final + screened[finalists:]
    result.compiled_programs = compiled_count()
    result.seconds = time.perf_counter() - started
    return result


def _reason(message: str) -> str:
    """A violation message without its numbers: the rule, for counting."""
    for rule in ("does not divide", "is not a multiple", "stages, but", "pipeline schedule",
                 "must divide dp", "needs experts"):  # fmt: skip
        if rule in message:
            return {
                "does not divide": "a size does not divide heads, KV heads, MLP, sequence or experts",
                "is not a multiple": "global batch not a multiple of dp x micro_batch",
                "stages, but": "more pipeline stages than layers",
                "pipeline schedule": "pipeline schedule needs more microbatches",
                "must divide dp": "ep does not divide dp",
                "needs experts": "ep on a dense model",
            }[rule]
    return message


def with_fields(s: Strategy, **changes: object) -> Strategy:
    return replace(s, **changes)  # type: ignore[arg-type]
