"""Per-rank programs written by hand with ``dist.shard_map``, next to the automatic ones.

Four ports of the seed programs, each checked against torch in float64 (tolerance 1e-10:
the same sums in another order) on a virtual mesh:

- ``megatron``: a Megatron MLP with its one tp all-reduce written out, against
  ``ts.jit`` with shardings (which inserts the same all-reduce) and torch;
- ``ring``: ring attention with ``dist.ppermute``: the k/v blocks go round the cp ring,
  each block merged by the online softmax (causal and not), against torch's
  ``scaled_dot_product_attention`` and the automatic ring
  (``schedule.options(context_parallel="ring")``): the bytes each moves and its
  simulated step time;
- ``pipeline``: two stages over pp, GPipe microbatches passed by ``dist.send`` /
  ``dist.recv``; the loss and both stages' weight gradients against torch autograd, and
  one SGD step with them against ``graph.training_step`` on the same pp mesh (GPipe,
  the same microbatches);
- ``overlap``: an all-reduce started by ``dist.all_reduce_async``, an independent
  matmul, then ``h.wait()``: the scheduled program runs the kernel between the start
  and the wait.

    python examples/manual_regions.py

Prints each port's max difference and "OK"; exits with status 1 on a mismatch.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from typing import NamedTuple

import torch

import tessera as ts
from tessera import dist, graph, op, optim, schedule
from tessera.frontend.tracer import Tensor

TOLERANCE = 1e-10


class Port(NamedTuple):
    """One port's outcome: its largest difference from the reference and notes to print."""

    name: str
    max_difference: float
    notes: tuple[str, ...] = ()
    measured: tuple[tuple[str, float], ...] = ()  # named numbers (bytes, times) for tests

    @property
    def ok(self) -> bool:
        return self.max_difference <= TOLERANCE


def _randn(generator: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.float64, generator=generator)


def _difference(*pairs: tuple[torch.Tensor, torch.Tensor]) -> float:
    return max((a - b).abs().max().item() for a, b in pairs)


# --- a. Megatron MLP ---------------------------------------------------------------------

TP_MESH = dist.mesh({"dp": 2, "tp": 2})
BATCH = dist.ShardSpec(partition=(0,), mesh_axes=("dp",))
COLS = dist.ShardSpec(partition=(1,), mesh_axes=("tp",))
BATCH_COLS = dist.ShardSpec(partition=(0, 1), mesh_axes=("dp", "tp"))
ROWS = dist.ShardSpec(partition=(0,), mesh_axes=("tp",))


def megatron_mlp(x: Tensor, w1: Tensor, w2: Tensor) -> Tensor:
    """Per rank: its batch rows, its columns of w1 and rows of w2; one tp all-reduce."""
    return dist.all_reduce(op.gelu(x @ w1) @ w2, "tp")


def automatic_mlp(x: Tensor, w1: Tensor, w2: Tensor) -> Tensor:
    """The global program: ``ts.jit`` with shardings inserts the all-reduce."""
    return op.gelu(x @ w1) @ w2


def megatron(generator: torch.Generator) -> Port:
    x, w1, w2 = _randn(generator, 8, 16), _randn(generator, 16, 64), _randn(generator, 64, 16)
    manual = ts.jit(
        dist.shard_map(megatron_mlp, TP_MESH, in_specs=(BATCH, COLS, ROWS), out_specs=BATCH),
        mesh=TP_MESH,
    )
    automatic = ts.jit(automatic_mlp, mesh=TP_MESH, in_shardings=(BATCH, COLS, ROWS))
    expected = torch.nn.functional.gelu(x @ w1) @ w2
    got_manual, got_automatic = manual(x, w1, w2), automatic(x, w1, w2)
    lowered = {"manual": manual.lower(x, w1, w2), "automatic": automatic.lower(x, w1, w2)}
    notes = tuple(
        f"{name}: " + ", ".join(f"{c.kind}{list(c.mesh_axes)} {c.nbytes} B" for c in low.collectives())
        for name, low in lowered.items()
    )  # fmt: skip
    measured = tuple(
        (f"{name} bytes", sum(c.nbytes for c in low.collectives())) for name, low in lowered.items()
    )
    difference = _difference((got_manual, expected), (got_automatic, expected))
    return Port("megatron", difference, notes, measured)


# --- b. ring attention ---------------------------------------------------------------------

CP = 4
CP_MESH = dist.mesh({"cp": CP})
SEQ = dist.ShardSpec(partition=(2,), mesh_axes=("cp",))  # [batch, heads, seq, dim] by sequence


def ring_attention(q: Tensor, k: Tensor, v: Tensor, causal: bool = False) -> Tensor:
    """Per rank: its block of queries attends to every k/v block as they pass round the
    cp ring (rank i sends to i + 1), the next block's transfer started before this one's
    computation; the partial results merge by the online softmax (running max ``m``,
    normaliser ``l``, unnormalised output ``acc``). Causal: step 0 is the rank's own
    (diagonal) block, masked below the diagonal; at step s the block came from rank
    ``i - s``, wholly visible when that is an earlier rank (``i >= s``), else wholly masked."""
    n = dist.axis_size("cp")
    ring = [(i, (i + 1) % n) for i in range(n)]
    t = q.shape[2]
    scale = 1.0 / math.sqrt(q.shape[-1])
    me = dist.axis_index("cp")
    below = op.reshape(op.arange(t), (t, 1)) >= op.reshape(op.arange(t), (1, t))
    m = total = acc = None
    for step in range(n):
        if step < n - 1:  # the next blocks travel while this one computes
            next_k, next_v = dist.ppermute_async(k, "cp", ring), dist.ppermute_async(v, "cp", ring)
        scores = (q @ op.transpose(k, (0, 1, 3, 2))) * scale
        if causal:
            scores = op.where(below if step == 0 else me >= step, scores, -math.inf)
        block_max = op.max(scores, axis=-1, keepdims=True)
        new = block_max if m is None else op.maximum(m, block_max)
        p = op.exp(scores - new)
        if m is None or total is None or acc is None:
            total, acc = op.sum(p, axis=-1, keepdims=True), p @ v
        else:
            correction = op.exp(m - new)
            total = total * correction + op.sum(p, axis=-1, keepdims=True)
            acc = acc * correction + p @ v
        m = new
        if step < n - 1:
            k, v = next_k.wait(), next_v.wait()
    assert total is not None and acc is not None
    return acc / total


class RingCost(NamedTuple):
    """What a context-parallel attention program moves and its simulated step."""

    bytes_moved: int  # per rank, every collective of the program
    collectives: int
    step_s: float
    exposed_fraction: float


def ring_programs(causal: bool) -> tuple[ts.JitFunction, ts.JitFunction]:
    """The hand-written ring and the automatic one (``op.attention`` with its sequence
    split over cp, ``context_parallel="ring"``); causal: the automatic one over a
    sequence stored in zig-zag order (``zigzag=cp``), so that it too moves only k and v."""
    manual = ts.jit(
        dist.shard_map(
            lambda q, k, v: ring_attention(q, k, v, causal), CP_MESH, in_specs=SEQ, out_specs=SEQ
        ),
        mesh=CP_MESH,
    )
    with schedule.options(context_parallel="ring"):
        automatic = ts.jit(
            lambda q, k, v: op.attention(q, k, v, causal=causal, zigzag=CP if causal else None),
            mesh=CP_MESH,
            in_shardings=(SEQ, SEQ, SEQ),
        )
    return manual, automatic


def ring_cost(f: ts.JitFunction, *args: torch.Tensor) -> RingCost:
    """Bytes and simulated time (DGX H100, the default machine of a 4-rank mesh)."""
    with schedule.options(context_parallel="ring"):
        lowered = f.lower(*args)
    infos = lowered.collectives()
    simulated = lowered.simulate()
    return RingCost(
        sum(c.nbytes for c in infos),
        len(infos),
        simulated.step_time_s,
        simulated.exposed_fraction,
    )


def ring(generator: torch.Generator) -> Port:
    q, k, v = (_randn(generator, 1, 2, 32, 8) for _ in range(3))
    differences, notes, measured = [], [], []
    for causal in (False, True):
        manual, automatic = ring_programs(causal)
        expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
        if causal:  # the automatic ring's sequence is stored in zig-zag order
            order = dist.zigzag_order(q.shape[2], CP)
            with schedule.options(context_parallel="ring"):
                got = automatic(q[:, :, order], k[:, :, order], v[:, :, order])
            differences += [_difference((got, expected[:, :, order]))]
            automatic_args = (q[:, :, order], k[:, :, order], v[:, :, order])
        else:
            with schedule.options(context_parallel="ring"):
                differences += [_difference((automatic(q, k, v), expected))]
            automatic_args = (q, k, v)
        differences += [_difference((manual(q, k, v), expected))]
        for name, f, args in (
            ("manual", manual, (q, k, v)),
            ("automatic", automatic, automatic_args),
        ):
            cost = ring_cost(f, *args)
            key = f"{'causal' if causal else 'full'} {name}"
            measured += [(f"{key} bytes", cost.bytes_moved), (f"{key} step_s", cost.step_s)]
            notes.append(
                f"causal={causal} {name}: {cost.collectives} collectives, {cost.bytes_moved} B, "
                f"simulated step {cost.step_s * 1e6:.1f} us (exposed {cost.exposed_fraction:.2f})"
            )  # fmt: skip
    return Port("ring", max(differences), tuple(notes), tuple(measured))


# --- c. pipeline ---------------------------------------------------------------------------

PP_MESH = dist.mesh({"pp": 2})
STAGES = dist.ShardSpec(partition=(0,), mesh_axes=("pp",))  # [stage, ...]: one per rank


def gpipe(x: Tensor, w: Tensor) -> Tensor:
    """Two stages, GPipe forward: ``x`` is every microbatch ``[M, b, d]`` (on both
    ranks), ``w`` this stage's weight ``[1, d, d]``. At tick t stage 0 computes
    microbatch t and sends it on; stage 1 computes the microbatch stage 0 sent at tick
    t - 1. Both ranks run every tick (SPMD), so stage 0's outputs and stage 1's first
    tick are discarded. Returns ``[1, M, b, d]``: on stage 1, the microbatches' outputs."""
    microbatches, d = x.shape[0], x.shape[2]
    first = dist.axis_index("pp") == 0
    weight = op.reshape(w, (d, d))
    received = op.zeros(x.shape[1:], x.dtype)
    outputs = []
    for tick in range(microbatches + 1):
        inputs = op.where(first, x[min(tick, microbatches - 1)], received)
        h = op.tanh(inputs @ weight)
        dist.send(h, "pp", to=[(0, 1)])
        received = dist.recv("pp", frm=[(0, 1)], like=h)  # stage 1: stage 0's h of this tick
        if tick:
            outputs.append(h)  # on stage 1: microbatch tick - 1
    return op.reshape(op.stack(outputs), (1, microbatches, *x.shape[1:]))


PIPELINE = dist.shard_map(gpipe, PP_MESH, in_specs=(None, STAGES), out_specs=STAGES)


def pipeline_loss(x: Tensor, w: Tensor, target: Tensor) -> Tensor:
    """Mean squared error of stage 1's outputs (the last stage's block of the result)."""
    out = PIPELINE(x, w)[1]
    return op.mean((out - target) * (out - target))


def pipeline(generator: torch.Generator) -> Port:
    x, target = _randn(generator, 4, 2, 8), _randn(generator, 4, 2, 8)
    w = _randn(generator, 2, 8, 8) / math.sqrt(8)
    loss, (grad,) = ts.jit(ts.value_and_grad(pipeline_loss, argnums=(1,)), mesh=PP_MESH)(
        x, w, target
    )
    leaf = w.clone().requires_grad_()
    expected = ((torch.tanh(torch.tanh(x @ leaf[0]) @ leaf[1]) - target) ** 2).mean()
    expected.backward()
    assert leaf.grad is not None
    # the automatic pipeline: graph.training_step on the same pp mesh, GPipe over the same
    # 4 microbatches, one SGD step; its new weights are w - lr * (the manual gradient)
    stepped, automatic_loss = automatic_pipeline_step(x, w, target, LR)
    manual_step = w - LR * grad
    notes = (
        f"loss {loss.item():.6f} (torch {expected.item():.6f}, graph.training_step "
        f"{automatic_loss.item():.6f}); dW of both stages; one SGD step equals "
        f"graph.training_step's on pp=2 (GPipe, 4 microbatches)",
    )
    difference = _difference(
        (loss, expected.detach()), (grad, leaf.grad), (automatic_loss, loss), (stepped, manual_step)
    )
    return Port("pipeline", difference, notes)


LR = 0.1


def automatic_pipeline_step(
    x: torch.Tensor, w: torch.Tensor, target: torch.Tensor, lr: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The same two-stage model as ``graph.training_step`` on ``PP_MESH`` (stages cut by
    ``graph.stage()``, GPipe over ``x``'s microbatches, SGD): the new weights stacked as
    ``w`` is, and the step's loss."""

    @graph.training_step(optimizer=optim.SGD(lr=lr), mesh=PP_MESH)
    def step(p, inputs, targets):
        h = op.tanh(inputs @ p["w0"])
        graph.stage()
        out = op.tanh(h @ p["w1"])
        loss = op.mean((out - targets) * (out - targets))
        return graph.backward(loss), {"loss": loss}

    microbatches, rows, d = x.shape
    state = step.init({"w0": w[0].clone(), "w1": w[1].clone()})
    with schedule.options(pipeline_microbatches=microbatches, pipeline_schedule="gpipe"):
        metrics = step(state, x.reshape(microbatches * rows, d), target.reshape(-1, d))  # in place
    params = step.gather(state).params
    return torch.stack([params["w0"], params["w1"]]), metrics["loss"]


# --- d. overlap through an async handle --------------------------------------------------------


def overlapped(x: Tensor, w: Tensor, b: Tensor, c: Tensor) -> tuple[Tensor, Tensor]:
    """The all-reduce of a row-parallel matmul's partial sum starts, an independent
    matmul computes, then the handle is waited for."""
    handle = dist.all_reduce_async(x @ w, "tp")
    independent = op.tanh(b @ c)
    return handle.wait() * 2.0, independent


def overlap(generator: torch.Generator) -> Port:
    x, w = _randn(generator, 8, 16), _randn(generator, 16, 8)
    b, c = _randn(generator, 8, 8), _randn(generator, 8, 8)
    region = dist.shard_map(
        overlapped, TP_MESH, in_specs=(BATCH_COLS, ROWS, BATCH, None), out_specs=(BATCH, BATCH)
    )
    f = ts.jit(region, mesh=TP_MESH)
    summed, independent = f(x, w, b, c)
    difference = _difference((summed, 2 * x @ w), (independent, torch.tanh(b @ c)))
    order = schedule_order(f.lower(x, w, b, c).as_text("schedule"))
    start, wait = order.index("start all_reduce"), order.index("wait")
    between = order[start + 1 : wait]  # kernels: the all-reduce's operand is made before
    if not between:
        difference = math.inf  # no overlap: a failure
    notes = (
        "schedule: " + " -> ".join(order),
        f"between start and wait: {', '.join(between) or 'nothing'}",
    )
    return Port("overlap", difference, notes, (("kernels between", len(between)),))


def schedule_order(text: str) -> list[str]:
    """The manual function's starts, waits and kernels, in order (kernels by name)."""
    region = text.split("graph.manual", 1)[1].split("func.return", 1)[0]
    order = []
    for line in region.splitlines():
        if "schedule.start" in line:
            order.append("start " + line.split("schedule.start", 1)[1].split()[0])
        elif "schedule.wait" in line:
            order.append("wait")
        elif "schedule.kernel" in line:
            order.append(line.split("@", 1)[1].split("(", 1)[0])
    return order


PORTS: dict[str, Callable[[torch.Generator], Port]] = {
    "megatron": megatron,
    "ring": ring,
    "pipeline": pipeline,
    "overlap": overlap,
}


def main() -> int:
    torch.set_num_threads(1)
    failed = []
    for name, port in PORTS.items():
        result = port(torch.Generator().manual_seed(0))
        print(
            f"{name}: max |difference| vs torch {result.max_difference:.3e} (tolerance {TOLERANCE:g})"
        )
        for note in result.notes:
            print(f"  {note}")
        if not result.ok:
            failed.append(name)
    if failed:
        print(f"MISMATCH: {', '.join(failed)}")
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
