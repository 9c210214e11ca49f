"""The schedule simulator against closed forms, overlap-comm's effect, and trace files."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

import tessera as ts
from tessera import dist, op, schedule
from tessera.errors import TesseraError
from tessera.perf import Device, Link, Topology, collective_time, compute_time, gb200_nvl72
from tessera.perf.simulate import COMPUTE

ALPHA, BANDWIDTH = 5e-6, 100e9  # a flat 8-device machine without SHARP
DEVICE = Device(
    name="test device",
    matmul_flops={"f32": 100e12, "bf16": 400e12, "f16": 400e12},
    matmul_efficiency=0.5,
    memory_bandwidth=1e12,
    memory_efficiency=0.5,
    memory_bytes=80 * 2**30,
    launch_overhead_s=1e-6,
)
FLAT8 = Topology("flat8", 8, DEVICE, (Link("switch", 8, ALPHA, BANDWIDTH),))
ROW = dist.ShardSpec(partition=(0,), mesh_axes=("tp",))
COL = dist.ShardSpec(partition=(1,), mesh_axes=("tp",))


def ring_all_reduce(n: int, nbytes: int) -> float:
    return 2 * (n - 1) * ALPHA + 2 * (n - 1) / n * nbytes / BANDWIDTH


def matmul_seconds(m: int, k: int, n: int) -> float:
    """Roofline of one f32 matmul kernel on DEVICE (compute-bound at these sizes)."""
    flops, nbytes = 2 * m * k * n, 4 * (m * k + k * n + m * n)
    return DEVICE.launch_overhead_s + max(flops / 50e12, nbytes / 0.5e12)


def test_a_partial_sum_all_reduce_takes_the_ring_formula() -> None:
    """x @ w with the contraction split over 8 ranks, then its all-reduce of 64 MiB:
    T = the matmul's roofline + 2(n−1)α + 2(n−1)/n·S/B (the ring beats the tree at this
    size), and with nothing to overlap E = 1."""
    mesh = dist.mesh({"tp": 8})
    x, w = torch.empty(4096, 8192), torch.empty(8192, 4096)
    jitted = ts.jit(op.matmul, mesh=mesh, in_shardings=(COL, ROW), kernels="reference")
    sim = jitted.lower(x, w).simulate(FLAT8)
    nbytes = 4096 * 4096 * 4
    assert collective_time(FLAT8, "all_reduce", nbytes, range(8)).algorithm == "ring"
    assert sim.comm_time_s == pytest.approx(ring_all_reduce(8, nbytes), rel=1e-12)
    compute = matmul_seconds(4096, 8192 // 8, 4096)
    assert sim.compute_only_s == pytest.approx(compute, rel=1e-12)
    assert sim.step_time_s == pytest.approx(compute + ring_all_reduce(8, nbytes), rel=1e-12)
    assert sim.exposed_fraction == pytest.approx(1.0)


def _row_parallel(overlap: bool, size: int = 2048) -> ts.Lowered:
    """y = x @ w (w split by rows: a partial sum, all-reduced) next to an independent
    matmul u @ v whose result is only needed at the end, after a transpose."""

    def f(x, w, u, v):
        y = op.matmul(x, w)
        z = op.transpose(op.matmul(u, v), (1, 0))
        return y, z

    mesh = dist.mesh({"tp": 8})
    shapes = [(size, size), (size, size), (2 * size, size), (size, 2 * size)]
    arrays = [torch.empty(*shape) for shape in shapes]
    with schedule.all_reduce_overlap(overlap):
        jitted = ts.jit(f, mesh=mesh, in_shardings=(COL, ROW, None, None), kernels="reference")
        return jitted.lower(*arrays)


def test_serial_schedule_exposes_all_communication() -> None:
    sim = _row_parallel(overlap=False).simulate(FLAT8)
    assert sim.comm_time_s > 0
    assert sim.exposed_fraction == pytest.approx(1.0, abs=1e-12)
    assert sim.step_time_s == pytest.approx(sim.compute_only_s + sim.comm_time_s, rel=1e-12)


def test_overlap_hides_the_all_reduce_behind_independent_compute() -> None:
    """With overlap-comm the all-reduce runs while u @ v computes: T = the compute alone
    when the matmul is longer than the transfer (E = 0), closed form on both sides."""
    size = 2048
    serial, overlapped = (_row_parallel(o, size).simulate(FLAT8) for o in (False, True))
    transfer = ring_all_reduce(8, size * size * 4)
    local = matmul_seconds(size, size // 8, size)  # x @ w on each rank's rows of w
    full = matmul_seconds(2 * size, size, 2 * size)
    assert full > transfer  # the independent matmul covers the transfer
    assert serial.comm_time_s == pytest.approx(transfer, rel=1e-12)
    assert serial.compute_only_s == pytest.approx(overlapped.compute_only_s, rel=1e-12)
    assert overlapped.step_time_s == pytest.approx(overlapped.compute_only_s, rel=1e-12)
    assert overlapped.exposed_fraction == pytest.approx(0.0, abs=1e-12)
    assert serial.step_time_s - overlapped.step_time_s == pytest.approx(transfer, rel=1e-9)
    kernels = [e for e in overlapped.rank_events(0) if e.stream == COMPUTE]
    assert [e.duration_s for e in kernels][:2] == pytest.approx([local, full], rel=1e-12)


def test_overlap_changes_no_result() -> None:
    """overlap-comm only reorders: the same outputs, bit for bit, on the virtual mesh."""
    rng = np.random.default_rng(0)
    shapes = [(16, 16), (16, 16), (32, 16), (16, 32)]
    arrays = [rng.standard_normal(shape).astype(np.float32) for shape in shapes]
    results = []
    for overlap in (False, True):
        lowered = _row_parallel(overlap, 16)
        text = lowered.as_text("schedule")
        start, wait = text.index("schedule.start all_reduce"), text.index("schedule.wait")
        assert ("schedule.kernel" in text[start:wait]) is overlap  # work between them
        results.append([np.asarray(r) for r in lowered(*arrays)])
    for a, b in zip(*results, strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(
        results[0][0], arrays[0].astype(np.float64) @ arrays[1], rtol=1e-5, atol=1e-5
    )


def test_compute_roofline() -> None:
    flops, nbytes = 2 * 1024**3, 12 * 1024**2
    assert compute_time(DEVICE, flops, nbytes, "f32") == pytest.approx(1e-6 + flops / 50e12)
    assert compute_time(DEVICE, 0, nbytes, "f32") == pytest.approx(1e-6 + nbytes / 0.5e12)


def test_nvl72_trace_is_valid_chrome_trace_json(tmp_path) -> None:
    """A 9 × 8 (dp × tp) step on the GB200 NVL72 preset: the trace file loads as JSON with
    one process per rank, complete events with non-negative times, and metadata names."""
    mesh = dist.mesh({"dp": 9, "tp": 8}, topology="nvl72")
    batch = dist.ShardSpec(partition=(0,), mesh_axes=("dp",))

    def layer(x, w1, w2):
        return op.matmul(op.gelu(op.matmul(x, w1)), w2)

    jitted = ts.jit(layer, mesh=mesh, in_shardings=(batch, COL, ROW), kernels="reference")
    sim = jitted.lower(torch.empty(72 * 16, 512), torch.empty(512, 2048), torch.empty(2048, 512))
    sim = sim.simulate()
    assert sim.topology == gb200_nvl72().name
    path = tmp_path / "trace.json"
    sim.save_trace(path)
    trace = json.loads(path.read_text())
    events = trace["traceEvents"]
    complete = [e for e in events if e["ph"] == "X"]
    assert {e["pid"] for e in complete} == set(range(72))
    for e in complete:
        assert {"name", "ts", "dur", "pid", "tid"} <= set(e)
        assert e["ts"] >= 0 and e["dur"] >= 0 and math.isfinite(e["ts"] + e["dur"])
    names = {(e["pid"], e["args"]["name"]) for e in events if e["name"] == "thread_name"}
    assert (0, "compute") in names and (0, "comm") in names
    assert any(e["name"] == "all_reduce[tp]" for e in complete)
    end = max(e["ts"] + e["dur"] for e in complete)
    assert end == pytest.approx(sim.step_time_s * 1e6, rel=1e-9)


def test_simulate_errors_name_the_problem() -> None:
    mesh = dist.mesh({"tp": 16})
    jitted = ts.jit(op.matmul, mesh=mesh, in_shardings=(COL, ROW), kernels="reference")
    lowered = jitted.lower(torch.empty(16, 32), torch.empty(32, 16))
    with pytest.raises(TesseraError, match="16 ranks but topology 'flat8' has only 8"):
        lowered.simulate(FLAT8)
    with pytest.raises(TesseraError, match="unknown"):
        lowered.simulate("no_such_machine")


def test_dp_gradient_all_reduces_hide_under_the_backward() -> None:
    """A data-parallel training step of L layers (compiled at realistic sizes, not run):
    serial, all gradient all-reduces are exposed (E = 1); with overlap-comm each starts as
    the backward makes it, and at most about one layer's worth is exposed (E ≤ 1/L + 0.05),
    the issue's goal."""
    from tessera import graph, optim

    layers, dim, dp = 4, 1024, 4
    mesh = dist.mesh({"dp": dp})

    def step(p, x):
        for i in range(layers):
            x = x + op.gelu(x @ p[f"w1_{i}"]) @ p[f"w2_{i}"]
        loss = op.mean(x * x)
        return graph.backward(loss), {"loss": loss}

    params = {f"w1_{i}": torch.empty(dim, 4 * dim) for i in range(layers)}
    params |= {f"w2_{i}": torch.empty(4 * dim, dim) for i in range(layers)}
    simulations = []
    for overlap in (False, True):
        with schedule.all_reduce_overlap(overlap), schedule.options(topology="dgx_h100"):
            training = graph.training_step(step, optimizer=optim.SGD(lr=0.1), mesh=mesh)
            lowered = training.lower(training.init(params), torch.empty(dp * 4096, dim))
            simulations.append(lowered.simulate(FLAT8))
    serial, overlapped = simulations
    assert serial.exposed_fraction == pytest.approx(1.0, abs=1e-12)
    assert overlapped.exposed_fraction <= 1 / layers + 0.05
    assert overlapped.step_time_s < serial.step_time_s


def test_collective_permutes_take_one_message_each() -> None:
    """chunk(x, 3) of columns split over tp = 4 keeps them split (the split makes all
    three pieces): 7 of its 9 collective permutes send a block (the other 2 keep a
    rank's own block, free), each priced α + S/B for its block of S bytes, one after the
    other on the comm stream."""
    mesh = dist.mesh({"tp": 4})
    x = torch.empty(1024, 3 * 1024)
    fn = lambda x: op.tanh(op.chunk(x, 3, axis=1)[0] + op.chunk(x, 3, axis=1)[2])  # noqa: E731
    with schedule.all_reduce_overlap(False):
        lowered = ts.jit(fn, mesh=mesh, in_shardings=(COL,), kernels="reference").lower(x)
        sim = lowered.simulate(FLAT8)
    permutes = [c for c in lowered.collectives() if c.kind == "collective_permute"]
    block = 1024 * 1024 // 4 * 4  # a 1024 x 256 f32 block
    assert [c.nbytes for c in permutes] == [block] * 7
    assert sim.comm_time_s == pytest.approx(len(permutes) * (ALPHA + block / BANDWIDTH), rel=1e-12)
