"""Measured kernel times against the roofline cost model, on the machine this runs on.

Runs the Megatron tensor-parallel layer forward (``comm_volume.transformer_layer``) on the
virtual mesh (every tp rank in this process, one after another) with the generated Triton
kernels, records its timeline (``tessera.perf.record_timeline``: CUDA events on a GPU) and
prints, per kernel of one rank's schedule: FLOPs, bytes at its boundary, the measured time
(median over ranks and repeats, after a warm-up run that compiles and tunes), the time
``tessera.perf.compute_cost.kernel_time`` models on the topology's device, and their ratio.
Then one rank's compute total, measured and modelled (the simulator's compute-only step).

The layer's size defaults to the device's: on a GPU a 70B-like layer (hidden 8192, seq
4096, 64 heads, tp 8); on a CPU, where the kernels run in Triton's interpreter, a small
one (hidden 256, seq 128, 4 heads, tp 2: 3.5 minutes on a busy 2-core machine, of which
the warm-up run 60 s and each timed run 11-35 s). Each phase prints a line as it starts
(lowering, the warm-up run that compiles every kernel, each timed repeat), and a long
phase prints how long it has run every 15 s (on stderr: stdout is the table).

    python benchmarks/cost_model.py                  # the device's size (see above)
    python benchmarks/cost_model.py --hidden 8192 --seq 4096 --heads 64 --tp 8   # 70B-like, on a GPU
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import torch

import tessera as ts
from tessera import dist, perf, schedule
from tessera.ir import schedule as schedule_ir
from tessera.perf.compute_cost import is_view, kernel_bytes, kernel_flops, kernel_time

sys.path.insert(0, str(Path(__file__).parent))
import comm_volume  # the Megatron layer, its layouts and inputs

SIZES = {  # the layer's default size on each kind of device
    "cuda": {"hidden": 8192, "seq": 4096, "heads": 64, "tp": 8},  # 70B-like
    "cpu": {"hidden": 256, "seq": 128, "heads": 4, "tp": 2},  # Triton's interpreter
}
HEARTBEAT_S = 15.0


@contextlib.contextmanager
def phase(what: str) -> Iterator[None]:
    """Prints ``what`` as it starts, a line every ``HEARTBEAT_S`` seconds while it runs,
    and its time when done (to stderr: stdout is the table)."""
    started = time.perf_counter()
    print(f"{what} ...", file=sys.stderr, flush=True)
    done = threading.Event()

    def heartbeat() -> None:
        while not done.wait(HEARTBEAT_S):
            print(
                f"  ... {what}: {time.perf_counter() - started:.0f} s so far",
                file=sys.stderr,
                flush=True,
            )

    thread = threading.Thread(target=heartbeat, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
    print(f"  {what}: {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cuda = torch.cuda.is_available()
    size = SIZES["cuda" if cuda else "cpu"]
    on = "a GPU" if cuda else "a CPU"
    parser.add_argument(
        "--hidden", type=int, default=size["hidden"], help=f"default on {on}: %(default)s"
    )
    parser.add_argument(
        "--seq", type=int, default=size["seq"], help=f"default on {on}: %(default)s"
    )
    parser.add_argument(
        "--heads", type=int, default=size["heads"], help=f"default on {on}: %(default)s"
    )
    parser.add_argument("--tp", type=int, default=size["tp"], help=f"default on {on}: %(default)s")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--topology", default="dgx_h100", help="whose device the model prices")
    parser.add_argument("--json", type=Path, help="write the measured kernel times here")
    parser.add_argument(
        "--collective-matmul", action="store_true",
        help="lower with schedule.options(collective_matmul=True): the chunked program",
    )  # fmt: skip
    args = parser.parse_args()
    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32

    options = {"collective_matmul": args.collective_matmul, "topology": args.topology}
    mesh = dist.mesh({"tp": args.tp})
    x_spec, p_specs = comm_volume.layouts(mesh, has_dp=False)
    layer = ts.jit(
        comm_volume.transformer_layer, static_argnums=2, mesh=mesh,
        in_shardings=(x_spec, p_specs, None),
    )  # fmt: skip
    x, params = comm_volume.layer_inputs(1, args.seq, args.hidden)
    x = x.to(device, dtype)
    params = {n: p.to(device, dtype) for n, p in params.items()}
    print(
        f"cost model: hidden {args.hidden}, seq {args.seq}, heads {args.heads}, tp {args.tp} on "
        f"{'a GPU' if cuda else 'a CPU (Triton interpreter: slow)'}",
        file=sys.stderr, flush=True,
    )  # fmt: skip
    with (
        phase("tracing and compiling the layer (graph, shardings, schedule)"),
        schedule.options(**options),
    ):
        lowered = layer.lower(x, params, args.heads)
        lowered.module_at("schedule")
    topology = perf.load_topology(args.topology)

    started = time.time()
    with phase(
        "warm-up run: generating, compiling" + (" and tuning" if cuda else "") + " every kernel"
    ):
        lowered(x, params, args.heads)
    warm_s = time.time() - started
    with perf.record_timeline() as timeline:
        for i in range(args.repeats):
            with phase(f"timed run {i + 1} of {args.repeats} ({args.tp} ranks)"):
                lowered(x, params, args.heads)
    measured = {name: statistics.median(t) for name, t in timeline.kernel_times().items()}

    kernels = [
        o for o in lowered.module_at("schedule").walk() if isinstance(o, schedule_ir.KernelOp)
    ]
    with phase(f"simulating the schedule on {args.topology}"):
        simulation = lowered.simulate(topology)
    where = torch.cuda.get_device_name() if cuda else "CPU (Triton interpreter)"
    print(f"# {where}; model: {topology.device.name} ({args.topology}); hidden {args.hidden}, "
          f"seq {args.seq}, heads {args.heads}, tp {args.tp}, {str(dtype).removeprefix('torch.')}, "
          f"collective_matmul={args.collective_matmul}; "
          f"median of {args.repeats} runs x {args.tp} ranks; warm-up {warm_s:.1f} s")  # fmt: skip
    print("| kernel | GFLOP | MB | measured (µs) | model (µs) | measured / model |")
    print("|---|---:|---:|---:|---:|---:|")
    total_measured = total_model = 0.0
    rows = []
    for kernel in kernels:
        name = kernel.kernel_name
        model = kernel_time(topology.device, kernel)
        took = measured[name]
        total_measured += took
        total_model += model
        view = " (view)" if is_view(kernel) else ""
        ratio = f"{took / model:.2f}" if model else "–"
        print(f"| {name}{view} | {kernel_flops(kernel) / 1e9:.2f} | {kernel_bytes(kernel) / 1e6:.1f} "
              f"| {took * 1e6:.1f} | {model * 1e6:.1f} | {ratio} |")  # fmt: skip
        rows.append({"kernel": name, "flops": kernel_flops(kernel), "bytes": kernel_bytes(kernel),
                     "measured_s": took, "model_s": model})  # fmt: skip
    print(f"| **one rank's kernels** | | | {total_measured * 1e6:.1f} | {total_model * 1e6:.1f} "
          f"| {total_measured / total_model:.2f} |")  # fmt: skip
    print(f"simulated on {args.topology}: {simulation.summary()}")
    if args.json:
        args.json.write_text(json.dumps({"device": where, "kernels": rows}, indent=1))


if __name__ == "__main__":
    main()
