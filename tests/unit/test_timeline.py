"""Recorded timelines (``tessera.perf.record_timeline``): on the virtual mesh and over gloo
processes, in the simulator's trace format, with the schedule's kernels and collectives."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from test_distributed import SCRIPTS, tessera_run

import tessera as ts
from tessera import dist, op, perf
from tessera.ir import schedule as schedule_ir
from tessera.perf import timeline as perf_timeline
from tessera.perf.trace import COMPUTE

COLS = dist.ShardSpec(partition=(1,), mesh_axes=("tp",))
ROWS = dist.ShardSpec(partition=(0,), mesh_axes=("tp",))
SHARDINGS = (dist.ShardSpec(replicate=True), COLS, ROWS, COLS, ROWS)


def two_mlps(x, w1, w2, v1, v2):
    return op.gelu(x @ w1) @ w2, op.gelu(x @ v1) @ v2


def _args(seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shapes = ((16, 8), (8, 32), (32, 8), (8, 32), (32, 8))
    return [torch.randn(s, generator=g) for s in shapes]


def _schedule_order(lowered: ts.Lowered) -> list[str]:
    """Kernel names and collective labels in the scheduled program's order."""
    module = lowered.module_at("schedule")
    names = []
    for o in module.walk():
        if isinstance(o, schedule_ir.KernelOp):
            names.append(o.kernel_name)
        elif isinstance(o, schedule_ir.StartOp):
            names.append(o.label)
    return names


def test_virtual_mesh_run_records_every_kernel_and_collective_per_rank() -> None:
    mesh = dist.mesh({"tp": 2})
    f = ts.jit(two_mlps, mesh=mesh, in_shardings=SHARDINGS, kernels="reference")
    args = _args()
    unrecorded = f(*args)
    with perf.record_timeline() as timeline:
        recorded = f(*args)
    assert perf_timeline.active() is None
    for a, b in zip(unrecorded, recorded, strict=True):
        assert torch.equal(a, b)
    order = _schedule_order(f.lower(*args))
    assert sum(name.startswith("all_reduce") for name in order) >= 1
    for rank in range(2):
        events = timeline.rank_events(rank)
        assert [e.name for e in events] == order  # program order, one rank at a time
        assert {e.stream for e in events} == {COMPUTE, "comm"}
        assert all(e.end_s >= e.start_s >= 0 for e in events)
    kernels = timeline.kernel_times()
    assert all(len(times) == 2 for times in kernels.values())  # once per rank
    assert set(kernels) == {n for n in order if not n.startswith("all_reduce")}


def test_recorded_trace_is_chrome_trace_json(tmp_path: Path) -> None:
    mesh = dist.mesh({"tp": 2})
    f = ts.jit(two_mlps, mesh=mesh, in_shardings=SHARDINGS, kernels="reference")
    with perf.record_timeline() as timeline:
        f(*_args())
        f(*_args(1))  # two runs: events accumulate
    path = tmp_path / "recorded.json"
    timeline.save_trace(path)
    trace = json.loads(path.read_text())
    complete = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(complete) == 2 * len(timeline.rank_events(0)) == len(timeline.events)
    assert {e["pid"] for e in complete} == {0, 1}
    threads = {
        (e["pid"], e["args"]["name"]) for e in trace["traceEvents"] if e["name"] == "thread_name"
    }
    assert threads == {(0, "compute"), (0, "comm"), (1, "compute"), (1, "comm")}
    assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in complete)


def test_gloo_run_records_a_causal_timeline_and_overlap_keeps_results(tmp_path: Path) -> None:
    """Two processes: the overlapped and serial schedules agree bit for bit (checked in the
    script), and the gathered trace holds both ranks; every collective starts after the
    kernel that made its operand and ends before the kernel that uses its result."""
    path = tmp_path / "gloo.json"
    result = tessera_run(2, SCRIPTS / "timeline.py", str(path))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "rank 0 OK" in result.stdout and "rank 1 OK" in result.stdout
    trace = json.loads(path.read_text())
    complete = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    mesh = dist.mesh({"tp": 2})
    f = ts.jit(two_mlps, mesh=mesh, in_shardings=SHARDINGS)
    lowered = f.lower(*_args())
    order = _schedule_order(lowered)
    module = lowered.module_at("schedule")
    ops = [o for o in module.walk() if isinstance(o, (schedule_ir.KernelOp, schedule_ir.StartOp))]
    for rank in (0, 1):
        mine = sorted((e for e in complete if e["pid"] == rank), key=lambda e: e["ts"])
        assert sorted(e["name"] for e in mine) == sorted(order)
        kernels = [e for e in mine if e["cat"] == "compute"]
        assert [e["name"] for e in kernels] == [n for n in order if not n.startswith("all_reduce")]
        by_kernel = {e["name"]: e for e in kernels}
        comm = iter(e for e in mine if e["cat"] == "communication")
        for o in ops:
            if not isinstance(o, schedule_ir.StartOp):
                continue
            event = next(comm)
            producer = o.operands[0].owner
            assert (
                event["ts"]
                >= by_kernel[producer.kernel_name]["ts"] + by_kernel[producer.kernel_name]["dur"]
            )
            wait = next(iter(o.handle.uses)).operation
            users = [u.operation for r in wait.results for u in r.uses]
            for user in users:
                if isinstance(user, schedule_ir.KernelOp):
                    assert event["ts"] + event["dur"] <= by_kernel[user.kernel_name]["ts"] + 1e-3
