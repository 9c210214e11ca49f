"""Expert parallelism: all-to-all volume per MoE layer vs the analytic formula, and the
simulated step of a Mixtral-8x7B-like layer on GB200 NVL72 vs 8 x DGX H100.

The layer: hidden 4096, 8 SwiGLU experts of width 14336, top-2 softmax routing with
capacity factor 1.25, bf16; each sequence of ``--seq`` tokens is a routing group, one
group per rank. The experts are split over ``ep = 8``, the groups over ``dp x ep``
(``--dp`` x 8 ranks). Compiled, never run: the volumes are the program's collectives
(``lowered.collectives()``), the times ``lowered.simulate(topology)`` (``tessera.perf``).

Analytic volume per rank of one all-to-all: its local operand ``[groups/rank, E, C, H]``
with ``C = ceil(T * k * cf / E)``, i.e. ``tokens * top-k * cf * hidden * bytes`` (up to
the rounding of C). Forward: two (dispatch, combine); backward: their two transposes.

Topologies: ``gb200_nvl72`` (all ranks in one NVLink domain), and ``dgx_h100x8`` with the
mesh ``[ep, dp]``, ep major: each expert group spans the 8 nodes, so the all-to-alls
cross InfiniBand. E = exposed communication fraction, serial (every collective waited
for at once) and with ``overlap-comm``; for the routed experts alone and with a shared
SwiGLU expert of the same width (``op.moe_block``: its matmuls run while the combine
all-to-all is in flight). Last, one all-to-all of those bytes over EP groups spanning
nodes: the cost model's flat (direct) and hierarchical times (``perf.algorithms_for``).

    python benchmarks/moe.py [--seq 4096] [--dp 8]
"""

from __future__ import annotations

import argparse
import itertools
import math
import time

import torch

import tessera as ts
from tessera import dist, op, perf, schedule

BF16 = torch.bfloat16
HIDDEN, FFN, EXPERTS, TOP_K, CF = 4096, 14336, 8, 2, 1.25


def swiglu(x, w1, w3, w2):
    return (op.silu(x @ w1) * (x @ w3)) @ w2


def moe_layer(x, wr, w1, w3, w2, *shared):
    """The Mixtral MLP block: router, top-2, dispatch, SwiGLU experts, combine; with
    ``shared`` weights also a shared SwiGLU expert (DeepSeek/Qwen style), traced by
    ``op.moe_block`` between the experts and combine."""
    tokens = x.shape[1]
    weights, experts, _ = op.router(x @ wr, k=TOP_K)
    routing = op.route(experts, EXPERTS, op.expert_capacity(tokens, EXPERTS, TOP_K, CF))
    return op.moe_block(
        x,
        routing,
        weights,
        experts=lambda xe: swiglu(xe, w1, w3, w2),
        shared=(lambda t: swiglu(t, *shared)) if shared else None,
    )


def loss(*args):
    return op.mean(moe_layer(*args))


def _args(groups: int, seq: int, shared: bool) -> list[torch.Tensor]:
    shapes = [
        (groups, seq, HIDDEN),
        (HIDDEN, EXPERTS),
        (EXPERTS, HIDDEN, FFN),
        (EXPERTS, HIDDEN, FFN),
        (EXPERTS, FFN, HIDDEN),
    ]
    if shared:
        shapes += [(HIDDEN, FFN), (HIDDEN, FFN), (FFN, HIDDEN)]
    return [torch.empty(s, dtype=BF16) for s in shapes]


def lowered(
    backward: bool,
    seq: int,
    dp: int,
    axes: list[str],
    overlap: bool,
    topology: str,
    shared: bool = False,
):
    mesh = dist.Mesh(axes=axes, shape=tuple(8 if a == "ep" else dp for a in axes))
    groups = dist.ShardSpec(partition=(0,), mesh_axes=(("dp", "ep"),))
    experts = dist.ShardSpec(partition=(0,), mesh_axes=("ep",))
    args = _args(dp * 8, seq, shared)
    fn = ts.grad(loss, argnums=tuple(range(len(args)))) if backward else moe_layer
    shardings = (groups, None, experts, experts, experts) + (None,) * (len(args) - 5)
    with schedule.all_reduce_overlap(overlap), schedule.options(topology=topology):
        return ts.jit(fn, mesh=mesh, in_shardings=shardings).lower(*args)


def analytic(seq: int) -> int:
    """Bytes per rank of one all-to-all: one group's [E, C, H] slots (bf16)."""
    capacity = min(seq, math.ceil(seq * TOP_K * CF / EXPERTS))
    return EXPERTS * capacity * HIDDEN * 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, default=4096, help="tokens per group (= per rank)")
    parser.add_argument("--dp", type=int, default=8)
    args = parser.parse_args()
    started = time.time()
    one = analytic(args.seq)
    print(f"analytic all-to-all per rank: tokens {args.seq} x top-{TOP_K} x cf {CF} x hidden {HIDDEN} x 2 B "
          f"= {args.seq * TOP_K * CF * HIDDEN * 2 / 2**20:.2f} MiB; with C rounded: {one / 2**20:.2f} MiB\n")  # fmt: skip
    print("| program | all-to-alls | measured MiB/rank | analytic MiB/rank | other collectives |")
    print("|---|---:|---:|---:|---|")
    for backward, expected in ((False, 2), (True, 4)):
        low = lowered(backward, args.seq, args.dp, ["dp", "ep"], True, "gb200_nvl72")
        infos = low.collectives()
        a2a = [c for c in infos if c.kind == "all_to_all"]
        others = sorted(
            {f"{c.kind}[{','.join(c.mesh_axes)}]" for c in infos if c.kind != "all_to_all"}
        )
        name = "forward + backward" if backward else "forward"
        print(f"| {name} | {len(a2a)} (formula {expected}) | {sum(c.nbytes for c in a2a) / 2**20:.2f} "
              f"| {expected * one / 2**20:.2f} | {', '.join(others) or 'none'} |")  # fmt: skip
    print(
        "\n| topology | mesh | layer | program | serial T (ms) | overlapped T (ms) | compute only (ms) | comm (ms) | E serial | E overlapped |"
    )
    print("|---|---|---|---|---:|---:|---:|---:|---:|---:|")
    for topology, axes in (("gb200_nvl72", ["dp", "ep"]), ("dgx_h100x8", ["ep", "dp"])):
        for shared, backward in itertools.product((False, True), (False, True)):
            serial, overlapped = (
                lowered(backward, args.seq, args.dp, axes, o, topology, shared).simulate(topology)
                for o in (False, True)
            )
            mesh = " x ".join(f"{a}={8 if a == 'ep' else args.dp}" for a in axes)
            layer = "+ shared expert" if shared else "routed only"
            print(f"| {topology} | {mesh} | {layer} | {'fwd+bwd' if backward else 'fwd'} | {serial.step_time_s * 1e3:.3f} "
                  f"| {overlapped.step_time_s * 1e3:.3f} | {overlapped.compute_only_s * 1e3:.3f} "
                  f"| {overlapped.comm_time_s * 1e3:.3f} | {serial.exposed_fraction:.2f} "
                  f"| {overlapped.exposed_fraction:.2f} |")  # fmt: skip
    print(
        "\nOne all-to-all of the layer's per-rank bytes over an EP group of n ranks, "
        "flat (direct) vs hierarchical (inside each node, then one message per node pair):\n"
    )
    print("| topology | EP group | direct (ms) | hierarchical (ms) | chosen |")
    print("|---|---|---:|---:|---|")
    for topology, group, ranks in (
        ("gb200_nvl72", "64 ranks (one NVLink domain)", range(64)),
        ("dgx_h100x8", "8 ranks (8 nodes x 1, the mesh above)", range(0, 64, 8)),
        ("dgx_h100x8", "16 ranks (2 nodes x 8)", range(16)),
        ("dgx_h100x8", "64 ranks (8 nodes x 8)", range(64)),
    ):
        times = perf.algorithms_for(perf.load_topology(topology), "all_to_all", one, ranks)
        hier = times.get("hierarchical")
        print(f"| {topology} | {group} | {times['direct'] * 1e3:.3f} "
              f"| {'-' if hier is None else f'{hier * 1e3:.3f}'} | {min(times, key=times.__getitem__)} |")  # fmt: skip
    print(f"\n({time.time() - started:.0f} s; simulated, nothing ran on a GPU)")


if __name__ == "__main__":
    main()
