"""Pipeline schedules: simulated bubbles and activation peaks against the closed forms,
the structure of the action lists, deadlock detection and input validation."""

from __future__ import annotations

import json
from collections import Counter
from itertools import pairwise

import pytest

from tessera.errors import TesseraError
from tessera.ir.pipeline_actions import (
    BACKWARD,
    BACKWARD_INPUT,
    BACKWARD_WEIGHT,
    COMPUTE_KINDS,
    FORWARD,
    RECV_ACTIVATION,
    RECV_GRAD,
    SEND_ACTIVATION,
    SEND_GRAD,
    Action,
    rank_of,
)
from tessera.perf.pipeline_simulate import simulate_pipeline
from tessera.perf.trace import COMPUTE
from tessera.pipeline import theory
from tessera.transforms.pipeline_schedules import SCHEDULE_KINDS, pipeline_schedule, stage_count

RANKS = (2, 4, 8)
MICROBATCHES = (4, 8, 16, 32, 64)


def cases() -> list[tuple[str, int, int, int]]:
    out = []
    for kind in SCHEDULE_KINDS:
        for p in RANKS:
            for m in MICROBATCHES:
                if kind != "interleaved":
                    out.append((kind, p, m, 1))
                elif m % p == 0:
                    out += [(kind, p, m, v) for v in (2, 4)]
    return out


CASES = cases()
IDS = [f"{k}-p{p}-m{m}-v{v}" for k, p, m, v in CASES]


@pytest.mark.parametrize(("kind", "p", "m", "v"), CASES, ids=IDS)
def test_bubble_and_peaks_match_theory(kind: str, p: int, m: int, v: int) -> None:
    sim = simulate_pipeline(pipeline_schedule(kind, p, m, v), 1.0, 1.0, 1.0)
    assert sim.bubble_fraction == pytest.approx(theory.bubble_fraction(kind, p, m, v), abs=1e-9)
    assert sim.busy_s == tuple(3.0 * m * v for _ in range(p))
    expected = tuple(theory.peak_activations(kind, p, m, r, v) for r in range(p))
    assert sim.peak_activations == expected
    if kind == "1f1b":
        assert max(sim.peak_activations) <= p


def test_zero_bubble_closed_forms() -> None:
    """ZB-H1's bubble is a third of 1F1B's (in idle time) once m >= p."""
    for p in RANKS:
        for m in (p, 2 * p, 64):
            one_f = simulate_pipeline(pipeline_schedule("1f1b", p, m), 1, 1, 1)
            zb = simulate_pipeline(pipeline_schedule("zb-h1", p, m), 1, 1, 1)
            assert zb.makespan_s == 3 * m + p - 1
            assert one_f.makespan_s - 3 * m == 3 * (zb.makespan_s - 3 * m)
            assert theory.bubble_fraction("zb-h1", p, m) == pytest.approx((p - 1) / (3 * m + p - 1))
    assert theory.bubble_fraction("zb-h1", 8, 4) == pytest.approx(11 / 23)  # 2m + 2p - 1 = 23


@pytest.mark.parametrize(("kind", "p", "m", "v"), [c for c in CASES if c[2] <= 16])
def test_lists_are_complete_and_consistent(kind: str, p: int, m: int, v: int) -> None:
    actions = pipeline_schedule(kind, p, m, v)
    stages = stage_count(p, v)
    assert len(actions) == p
    computes: Counter[tuple[str, int, int]] = Counter()
    sends: Counter[tuple[str, int, int, int]] = Counter()
    recvs: Counter[tuple[str, int, int, int]] = Counter()
    for rank, rank_actions in enumerate(actions):
        seen: set[tuple[str, int, int]] = set()
        for i, a in enumerate(rank_actions):
            assert rank_of(a.stage, p) == rank
            if a.kind in COMPUTE_KINDS:
                computes[(a.kind, a.microbatch, a.stage)] += 1
                if a.kind in (BACKWARD, BACKWARD_INPUT):
                    assert (FORWARD, a.microbatch, a.stage) in seen
                if a.kind == BACKWARD_WEIGHT:
                    assert (BACKWARD_INPUT, a.microbatch, a.stage) in seen
                seen.add((a.kind, a.microbatch, a.stage))
                _check_transfers_around(rank_actions, i, stages)
            elif a.kind in (SEND_ACTIVATION, SEND_GRAD):
                sends[(a.kind, a.microbatch, a.stage, a.peer)] += 1
            else:
                kind_sent = SEND_ACTIVATION if a.kind == RECV_ACTIVATION else SEND_GRAD
                recvs[(kind_sent, a.microbatch, a.peer, a.stage)] += 1
    split = kind == "zb-h1"
    backward_kinds = (BACKWARD_INPUT, BACKWARD_WEIGHT) if split else (BACKWARD,)
    expected = Counter(
        (k, mb, s) for mb in range(m) for s in range(stages) for k in (FORWARD, *backward_kinds)
    )
    assert computes == expected
    assert sends == recvs and set(sends.values()) <= {1}
    assert sum(sends.values()) == 2 * m * (stages - 1)


def _check_transfers_around(rank_actions: list[Action], i: int, stages: int) -> None:
    """A forward's recv right before and send right after it; a backward's likewise."""
    a = rank_actions[i]
    before = rank_actions[i - 1] if i > 0 else None
    after = rank_actions[i + 1] if i + 1 < len(rank_actions) else None
    if a.kind == FORWARD:
        if a.stage > 0:
            assert before == Action(RECV_ACTIVATION, a.microbatch, a.stage, a.stage - 1)
        if a.stage < stages - 1:
            assert after == Action(SEND_ACTIVATION, a.microbatch, a.stage, a.stage + 1)
    elif a.kind in (BACKWARD, BACKWARD_INPUT):
        if a.stage < stages - 1:
            assert before == Action(RECV_GRAD, a.microbatch, a.stage, a.stage + 1)
        if a.stage > 0:
            assert after == Action(SEND_GRAD, a.microbatch, a.stage, a.stage - 1)


@pytest.mark.parametrize("kind", SCHEDULE_KINDS)
def test_simulated_dependencies_hold(kind: str) -> None:
    """With uneven times and latency, no compute starts before its inputs exist."""
    p, m, v, lag = 4, 8, 2 if kind == "interleaved" else 1, 0.3
    stages = stage_count(p, v)
    f = [1.0 + 0.25 * s for s in range(stages)]
    b = [1.5 - 0.1 * s for s in range(stages)]
    w = [0.5 + 0.2 * s for s in range(stages)]
    sim = simulate_pipeline(pipeline_schedule(kind, p, m, v), f, b, w, p2p_s=lag)
    span = {
        (e.name.split()[0], e.args["microbatch"], e.args["stage"]): (e.start_s, e.end_s)
        for e in sim.events
        if e.stream == COMPUTE
    }
    eps = 1e-12
    for (k, mb, s), (start, _) in span.items():
        if k == FORWARD and s > 0:
            assert start >= span[(FORWARD, mb, s - 1)][1] + lag - eps
        if k in (BACKWARD, BACKWARD_INPUT):
            assert start >= span[(FORWARD, mb, s)][1] - eps
            if s < stages - 1:
                assert start >= span[(k, mb, s + 1)][1] + lag - eps
        if k == BACKWARD_WEIGHT:
            assert start >= span[(BACKWARD_INPUT, mb, s)][1] - eps
    for rank in range(p):
        computes = sorted(
            (e.start_s, e.end_s) for e in sim.rank_events(rank) if e.stream == COMPUTE
        )
        assert all(a[1] <= b[0] + eps for a, b in pairwise(computes))


def gpipe_makespan(f: list[float], b: list[float], m: int, lag: float) -> float:
    """GPipe by recurrence: a pass starts after the rank's previous pass and the
    neighbouring stage's pass of the same microbatch (plus the transfer)."""
    p = len(f)
    fwd = [[0.0] * p for _ in range(m)]
    for i in range(m):
        for s in range(p):
            prev = fwd[i - 1][s] if i else 0.0
            upstream = fwd[i][s - 1] + lag if s else 0.0
            fwd[i][s] = max(prev, upstream) + f[s]
    bwd = [[0.0] * p for _ in range(m)]
    for i in range(m):
        for s in reversed(range(p)):
            prev = bwd[i - 1][s] if i else fwd[m - 1][s]
            downstream = bwd[i][s + 1] + lag if s < p - 1 else 0.0
            bwd[i][s] = max(prev, downstream) + b[s]
    return max(bwd[m - 1])


@pytest.mark.parametrize(("p", "m", "lag"), [(2, 4, 0.0), (4, 8, 0.1), (8, 16, 0.05), (3, 5, 0.2)])
def test_gpipe_uneven_stages_match_recurrence(p: int, m: int, lag: float) -> None:
    f = [1.0 + 0.3 * ((s * 7) % 5) for s in range(p)]
    bi = [0.8 + 0.2 * ((s * 3) % 4) for s in range(p)]
    bw = [0.5 + 0.1 * s for s in range(p)]
    sim = simulate_pipeline(pipeline_schedule("gpipe", p, m), f, bi, bw, p2p_s=lag)
    full = [x + y for x, y in zip(bi, bw, strict=True)]
    assert sim.makespan_s == pytest.approx(gpipe_makespan(f, full, m, lag))
    assert sim.busy_s == pytest.approx([m * (f[s] + full[s]) for s in range(p)])
    # equal stages: (m + p - 1)(F + B) plus one transfer per hop each way
    equal = simulate_pipeline(pipeline_schedule("gpipe", p, m), 1.0, 1.5, 0.5, p2p_s=lag)
    assert equal.makespan_s == pytest.approx((m + p - 1) * 3.0 + 2 * (p - 1) * lag)


def test_interleaved_with_one_chunk_is_1f1b() -> None:
    for p in RANKS:
        for m in (p, 2 * p):
            assert pipeline_schedule("interleaved", p, m, 1) == pipeline_schedule("1f1b", p, m)


def test_trace(tmp_path) -> None:
    sim = simulate_pipeline(pipeline_schedule("zb-h1", 2, 4), 1.0, 1.0, 1.0, p2p_s=0.1)
    path = tmp_path / "pipeline.json"
    sim.save_trace(path)
    trace = json.loads(path.read_text())
    names = [e["name"] for e in trace["traceEvents"] if e["ph"] == "X"]
    assert "backward_weight mb3 s1" in names and "send_activation mb0 s0->s1" in names
    assert trace["otherData"]["bubble_fraction"] == pytest.approx(sim.bubble_fraction)
    assert len(sim.bubble_fractions) == 2 and "bubble" in sim.summary()


def test_deadlock_is_reported() -> None:
    """Both ranks wait for the other's gradient before sending anything."""
    rank0 = [
        Action(FORWARD, 0, 0),
        Action(RECV_GRAD, 0, 0, 1),
        Action(BACKWARD, 0, 0),
        Action(SEND_ACTIVATION, 0, 0, 1),
    ]
    rank1 = [Action(RECV_ACTIVATION, 0, 1, 0), Action(FORWARD, 0, 1), Action(BACKWARD, 0, 1)]
    rank1.append(Action(SEND_GRAD, 0, 1, 0))
    with pytest.raises(TesseraError, match=r"deadlock.*rank 0 waits at recv_grad\(mb=0, stage=0"):
        simulate_pipeline([rank0, rank1], 1.0, 1.0, 1.0)


def test_simulator_rejects_bad_inputs() -> None:
    actions = pipeline_schedule("1f1b", 2, 4)
    with pytest.raises(TesseraError, match="forward_s has 1 times but the schedule has 2 stages"):
        simulate_pipeline(actions, [1.0], 1.0, 1.0)
    with pytest.raises(TesseraError, match="stage 1 runs on rank 1"):
        simulate_pipeline([actions[1], actions[0]], 1.0, 1.0, 1.0)
    with pytest.raises(TesseraError, match="p2p_s must be >= 0"):
        simulate_pipeline(actions, 1.0, 1.0, 1.0, p2p_s=-1.0)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("pipedream", 4, 8), "unknown pipeline schedule 'pipedream'; known: gpipe, 1f1b"),
        (("1f1b", 0, 8), "ranks must be an integer >= 1, got 0"),
        (("gpipe", 4, 0), "microbatches must be an integer >= 1, got 0"),
        (("zb-h1", 4, 8, 2), "virtual must be 1 \\(got 2\\); only 'interleaved'"),
        (("interleaved", 4, 8, 0), "virtual must be an integer >= 1, got 0"),
        (("interleaved", 4, 6, 2), r"microbatches \(6\) must be a multiple of ranks \(4\)"),
    ],
)
def test_invalid_arguments(args: tuple, message: str) -> None:
    with pytest.raises(TesseraError, match=message):
        pipeline_schedule(*args)
    with pytest.raises(TesseraError, match=message):
        theory.bubble_fraction(*args)


def test_theory_rank_out_of_range() -> None:
    with pytest.raises(TesseraError, match=r"rank must be in \[0, 4\), got 4"):
        theory.peak_activations("1f1b", 4, 8, 4)
