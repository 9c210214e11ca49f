"""Train a small GPT with Tessera on a dp x tp mesh, and check it against torch.

    python examples/train_gpt.py                      # virtual 2 x 2 mesh, 50 steps
    python examples/train_gpt.py --steps 10 --dp 1 --tp 1
    python examples/train_gpt.py --zero 3             # parameters, grads, state sharded over dp
    python examples/train_gpt.py --vocab-parallel     # the embedding's vocabulary split over tp
    python examples/train_gpt.py --remat nothing      # recompute each block's activations
    python examples/train_gpt.py --precision bf16     # bf16 compute, f32 master weights
    python examples/train_gpt.py --deterministic      # sums over ranks in a fixed order
    python examples/train_gpt.py --sequence-parallel  # the residual stream's sequence split over tp too
    python examples/train_gpt.py --micro-batch 1      # 1 sequence per microbatch and dp rank (accumulation)
    python examples/train_gpt.py --cp 2 --tp 1        # the sequence split over cp: ring attention
    python examples/train_gpt.py --cp 2 --tp 1 --no-zigzag   # ... with the batch in natural order
    python examples/train_gpt.py --steps 5 --save ckpt && python examples/train_gpt.py --resume ckpt
    python examples/train_gpt.py --steps 50 --save ckpt --checkpoint-every 10 --keep-last 2
                                                      # run again: resumes from ckpt/step_<k>
    tessera run -n 4 examples/train_gpt.py --steps 5  # one process per rank (gloo)
    tessera run -n 4 --max-restarts 3 examples/train_gpt.py --save ckpt --checkpoint-every 5
                                                      # a failed rank: all restart, resume from ckpt
    tessera run -n 8 examples/train_gpt.py --pp 2 --microbatches 4 --schedule 1f1b
                                                      # pp x dp x tp = 2 x 2 x 2, pipelined
    python examples/train_gpt.py --pp 2 --precision bf16 --clip 1.0 --zero 1 --remat nothing \
        --accumulate 2 --lr-schedule warmup_cosine --warmup 2 --steps 10
                                                      # every option at once (the seeds' LLM setup)

The model: token embedding plus learned positions, ``--layers`` pre-LN transformer blocks
with causal attention, a final layer norm and a tied output projection; the loss is the
cross-entropy of the next token on synthetic data (a fixed random token stream). One
``@graph.training_step`` does the forward pass, ``graph.backward`` and an AdamW update,
so the whole step is one compiled program that updates the training state in place (on
the virtual mesh the parameter tensors themselves; under ``tessera run`` each rank's
shards, which ``step.state_dict(state)`` gathers): the batch is split over ``dp``, the attention and MLP weights Megatron-style over ``tp``, and
the sharding passes insert every collective (the dp gradient reductions included;
``--zero`` shards optimizer state, gradients and parameters over dp; ``--vocab-parallel``
splits the tied embedding over tp by vocabulary rows, Megatron's vocab-parallel
embedding and cross-entropy). With ``--pp``, the
mesh gets a ``pp`` axis: the forward is split into balanced pipeline stages, each batch
into ``--microbatches``, run with the ``--schedule`` (gpipe, 1f1b, interleaved with
``--virtual`` chunks per rank, zb-h1). With ``--cp N`` the mesh gets a ``cp`` axis the
sequence is split over (contiguous blocks), attention runs context-parallel
(``--cp-method``: ring attention by default), and the batch arrives as Megatron-LM's
``get_batch_on_this_cp_rank`` stores it: each sequence in zig-zag order over cp
(``tokens[:, dist.zigzag_order(T, N)]``, 2N chunks, rank r holding true chunks r and
2N-1-r, which balances the causal work), the position embedding looked up at the true
positions and attention told so (``zigzag=N``). The ring then moves only k and v (every
collective permute over cp a shift from rank i to i + 1; the report counts them), and
the loss, a mean over tokens, equals the natural-order loss. ``--no-zigzag`` keeps the
batch in natural order: the ring then moves q, k, v into the zig-zag layout and the
results back by extra permutes ("relayouts" in the report). Each transformer block is a
``graph.checkpoint`` block: ``--remat`` says what the backward keeps of it (``everything``,
the default; ``matmuls``; ``nothing``: only the block's input, the rest recomputed). ``--precision bf16``
computes in bf16 with f32 master weights and AdamW state and f32 gradient reductions (the loss is then compared with torch to
``LOSS_RTOL_MIXED``). ``--deterministic`` selects the deterministic numerics (every sum
over ranks added in mesh order: bit-identical runs). ``--save DIR`` writes the training
state as a sharded checkpoint ``DIR/step_<k>`` after the last step (and every
``--checkpoint-every`` steps, keeping the newest ``--keep-last``), and a run whose ``DIR``
holds a complete one resumes from it up to ``--steps``; ``--resume DIR`` starts from one
(saved on any mesh: resharded on load) and runs ``--steps`` more, the torch loop from the
same weights and AdamW moments. With ``--save``, SIGTERM or SIGUSR1 (a job preempted)
saves at the next step boundary and ends the run (``tessera.training.preemption``);
``--async-save`` writes checkpoints from a background thread while the steps go on.
``--log-every N`` prints every N-th step's loss.
``--clip`` clips by the global norm, ``--accumulate K`` runs K rounds of microbatches per
update, ``--lr-schedule`` (``warmup_cosine``, ``warmup_linear_decay``,
``linear_warmup``) with ``--warmup`` and ``--min-lr`` varies the lr inside the compiled
step; ``--precision fp16`` scales the loss dynamically; ``--precision fp8`` runs the blocks'
matmuls in emulated fp8 (per-tensor scaled e4m3 operands, e5m2 gradients; the output head
in bf16). Every option combines with
``--pp``. Each step's loss is compared with a torch single-device loop (float64,
torch.optim.AdamW with ``clip_grad_norm_`` and ``LambdaLR``; for fp16, an fp16 copy of
the model decides which steps overflow, as ``GradScaler`` does) started from the same
parameters.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
from typing import Any

import _training_options as training_options
import torch
import torch.nn.functional as F
from _report import LossCheck

from tessera import dist, graph, op, optim, schedule
from tessera.training import CheckpointManager, checkpoint_policy
from tessera.training.preemption import Preemption

LOSS_RTOL = 2e-4  # f32 program vs float64 torch, per step (rounding differences accumulate)
LOSS_RTOL_MIXED = 5e-2  # bf16/fp16 program (8/11 mantissa bits) vs float64 torch


@graph.checkpoint
def gpt_block(
    p, x, i: int, n_head: int, zigzag: int | None = None, residual: dist.ShardSpec | None = None
):
    """Transformer block ``i`` (pre-LN, causal attention, GELU MLP) of ``x [B, T, C]``;
    ``zigzag = n``: the sequence stored in zig-zag order over ``n`` ranks; ``residual``:
    the layout of the residual stream after each add (sequence parallelism)."""

    def keep(t):
        return dist.shard(t, residual) if residual is not None else t

    B, T, C = x.shape
    D = C // n_head
    h = op.layer_norm(x, weight=p[f"ln1_w{i}"], bias=p[f"ln1_b{i}"])
    q, k, v = op.chunk(h @ p[f"attn_w{i}"], 3, axis=-1)
    q, k, v = (op.transpose(op.reshape(t, (B, T, n_head, D)), (0, 2, 1, 3)) for t in (q, k, v))
    attn = op.attention(q, k, v, causal=True, zigzag=zigzag)
    attn = op.reshape(op.transpose(attn, (0, 2, 1, 3)), (B, T, C))
    x = keep(x + attn @ p[f"proj_w{i}"])
    h = op.layer_norm(x, weight=p[f"ln2_w{i}"], bias=p[f"ln2_b{i}"])
    return keep(x + op.gelu(h @ p[f"fc_w{i}"]) @ p[f"out_w{i}"])


def gpt_loss(
    p, tokens, targets, n_head: int, n_layer: int, zigzag: int | None = None,
    residual: dist.ShardSpec | None = None,
):  # fmt: skip
    """Mean next-token cross-entropy of ``tokens [B, T]``. ``zigzag = n``: tokens and
    targets stored in zig-zag order over ``n`` ranks (``[:, dist.zigzag_order(T, n)]``),
    so the positions are looked up at their true places and attention masks by them;
    the mean over tokens does not depend on their order. ``residual``: the residual
    stream's layout (sequence parallelism: the sequence split over tp as well)."""
    T = tokens.shape[1]
    if zigzag is None:
        positions = p["wpe"][:T]
    else:  # the rows of the true positions, in stored order
        positions = op.take(p["wpe"], dist.zigzag_order(T, zigzag), axis=0)
    x = op.take(p["wte"], tokens, axis=0) + positions
    if residual is not None:
        x = dist.shard(x, residual)
    for i in range(n_layer):
        x = gpt_block(p, x, i, n_head, zigzag, residual)
    with op.fp8_matmuls(False):  # the output head stays bf16 under --precision fp8
        logits = op.layer_norm(x) @ op.transpose(p["wte"], (1, 0))
    return op.cross_entropy(logits, targets)


def torch_loss(p, tokens, targets, n_head: int, n_layer: int) -> torch.Tensor:
    """The same model, written independently with torch.nn.functional."""
    B, T = tokens.shape
    C = p["wte"].shape[1]
    x = p["wte"][tokens] + p["wpe"][:T]
    for i in range(n_layer):
        h = F.layer_norm(x, (C,), p[f"ln1_w{i}"], p[f"ln1_b{i}"])
        q, k, v = (h @ p[f"attn_w{i}"]).split(C, dim=-1)
        q, k, v = (t.view(B, T, n_head, C // n_head).transpose(1, 2) for t in (q, k, v))
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + attn.transpose(1, 2).reshape(B, T, C) @ p[f"proj_w{i}"]
        h = F.layer_norm(x, (C,), p[f"ln2_w{i}"], p[f"ln2_b{i}"])
        x = x + F.gelu(h @ p[f"fc_w{i}"]) @ p[f"out_w{i}"]
    logits = F.layer_norm(x, (C,)) @ p["wte"].T
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def init_params(
    vocab: int, seq: int, dim: int, n_layer: int, seed: int = 0
) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)

    def randn(*shape: int, scale: float) -> torch.Tensor:
        return scale * torch.randn(shape, generator=g)

    p = {"wte": randn(vocab, dim, scale=0.5), "wpe": randn(seq, dim, scale=0.1)}
    for i in range(n_layer):
        p |= {
            f"ln1_w{i}": torch.ones(dim), f"ln1_b{i}": torch.zeros(dim),
            f"attn_w{i}": randn(dim, 3 * dim, scale=dim**-0.5), f"proj_w{i}": randn(dim, dim, scale=dim**-0.5),
            f"ln2_w{i}": torch.ones(dim), f"ln2_b{i}": torch.zeros(dim),
            f"fc_w{i}": randn(dim, 4 * dim, scale=dim**-0.5), f"out_w{i}": randn(4 * dim, dim, scale=(4 * dim) ** -0.5),
        }  # fmt: skip
    return p


def megatron_layout(
    params: dict[str, torch.Tensor], vocab_parallel: bool = False
) -> dict[str, dist.ShardSpec | None]:
    """Megatron layout over tp: qkv and fc by columns, proj and out by rows; with
    ``vocab_parallel`` the tied embedding by rows too (its vocabulary split: the lookup
    and the cross-entropy over the logits all-reduce small results, never the table)."""
    columns = dist.ShardSpec(partition=(1,), mesh_axes=("tp",))
    rows = dist.ShardSpec(partition=(0,), mesh_axes=("tp",))
    by_rows = ("proj_w", "out_w", "wte") if vocab_parallel else ("proj_w", "out_w")
    return {
        k: columns if k.startswith(("attn_w", "fc_w")) else rows if k.startswith(by_rows) else None
        for k in params
    }


def residual_layout(cp: int, tp: int, pipelined: bool = False) -> dist.ShardSpec:
    """Sequence parallelism (Megatron-LM's ``--sequence-parallel``): the residual stream
    ``[B, T, C]`` with the batch over dp and the sequence over cp and tp, so norms and
    residual adds run on ``T / (cp tp)`` tokens per rank, and the sharding passes gather
    the sequence over tp before the column-parallel matmuls and reduce-scatter it after
    the row-parallel ones (instead of all-reducing). A pipelined step traces one dp
    rank's microbatch: its batch dim is not split again."""
    axes = (("cp",) if cp > 1 else ()) + (("tp",) if tp > 1 else ())
    batch = () if pipelined else ("dp",)
    partition = (*(0 for _ in batch), *(1 for _ in axes))
    return dist.ShardSpec(partition=partition, mesh_axes=(*batch, *axes))


def make_step(
    mesh: dist.Mesh, params: dict[str, torch.Tensor], args: argparse.Namespace
) -> graph.TrainingStep:
    cp = getattr(args, "cp", 1)
    sequence = dist.ShardSpec(
        partition=(0, 1), mesh_axes=("dp", "cp")
    )  # batch over dp, sequence over cp
    zigzag = cp if cp > 1 and getattr(args, "zigzag", True) else None  # batch in zig-zag order
    pipelined = getattr(args, "pp", 1) > 1
    sp = getattr(args, "sequence_parallel", False)
    residual = residual_layout(cp, args.tp, pipelined) if sp else None

    @graph.training_step(
        optimizer=optim.AdamW(lr=training_options.learning_rate(args), weight_decay=0.0),
        mesh=mesh, param_shardings=megatron_layout(params, getattr(args, "vocab_parallel", False)),
        batch_shardings=(sequence, sequence) if cp > 1 else None,
        **training_options.step_options(args),
    )  # fmt: skip
    def step(p, tokens, targets):
        loss = gpt_loss(p, tokens, targets, args.heads, args.layers, zigzag, residual)
        return graph.backward(loss), {"loss": loss}

    return step


def is_ring_shift(pairs: tuple[tuple[int, int], ...], ranks: int) -> bool:
    """Whether a collective permute's (source, target) pairs pass every rank's block to
    the next round a ring of ``ranks`` (ring attention's k/v step); other permutes
    reorder the sequence."""
    return set(pairs) == {(i, (i + 1) % ranks) for i in range(ranks)}


def resume_reference(
    reference: dict[str, torch.Tensor], optimizer: torch.optim.Optimizer, saved: dict
) -> None:
    """The torch loop's weights and AdamW state from a resumed training state."""
    with torch.no_grad():
        for name, value in reference.items():
            value.copy_(saved["params"][name].double())
            optimizer.state[value] = {
                "step": torch.tensor(float(saved["opt_state"]["step"])),
                "exp_avg": saved["opt_state"]["m"][name].double().clone(),
                "exp_avg_sq": saved["opt_state"]["v"][name].double().clone(),
            }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--dp", type=int, default=2)
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument(
        "--batch", type=int, default=None,
        help="sequences per step (default: 4, or dp x microbatches if that is larger)",
    )  # fmt: skip
    parser.add_argument("--seq", type=int, default=8)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=64)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument(
        "--vocab-parallel",
        action="store_true",
        help="split the tied embedding's vocabulary over tp",
    )
    parser.add_argument(
        "--cp", type=int, default=1, help="context parallelism: the sequence split over cp ranks"
    )
    parser.add_argument(
        "--cp-method", default="ring", choices=("ring", "all_gather", "auto"),
        help="how attention runs with --cp: ring attention, all-gathered k/v, or the cost model's pick",
    )  # fmt: skip
    parser.add_argument(
        "--no-zigzag", dest="zigzag", action="store_false",
        help="with --cp: keep the batch in natural order (the ring then moves q, k, v into the "
        "zig-zag layout and the results back)",
    )  # fmt: skip
    parser.add_argument(
        "--micro-batch", type=int, default=None,
        help="sequences per microbatch and data-parallel rank (Megatron-LM's --micro-batch-size): "
        "the batch is cut into batch / (dp x micro-batch) microbatches, the pipeline's with --pp "
        "(instead of --microbatches), else gradient-accumulation steps",
    )  # fmt: skip
    parser.add_argument(
        "--sequence-parallel", action="store_true",
        help="the residual stream's sequence split over tp too (Megatron-LM's sequence parallelism)",
    )  # fmt: skip
    training_options.add_arguments(parser)
    training_options.add_checkpoint_arguments(parser, log_every=10)
    args = parser.parse_args(argv)
    # with --save, SIGTERM / SIGUSR1 save at the next step boundary and stop the run
    preemption = Preemption().install() if args.save else None
    try:
        with contextlib.ExitStack() as settings:  # schedule options for this run's programs
            return {"records": run(args, parser, settings, preemption)}
    finally:
        if preemption is not None:
            preemption.uninstall()


def run(
    args: argparse.Namespace,
    parser: argparse.ArgumentParser,
    settings: contextlib.ExitStack,
    preemption: Preemption | None = None,
) -> list[dict[str, Any]]:
    """Trains up to step ``args.steps`` (``args.steps`` more with ``--resume``), each step
    checked against torch; returns each step's ``{"step", "loss"}``."""

    processes = int(os.environ.get("WORLD_SIZE", "0"))
    rank0 = int(os.environ.get("RANK", "0")) == 0

    def error(message: str) -> None:
        """An argument error, printed once (by rank 0) however many ranks run the script:
        the other ranks give rank 0 time to print it and exit first (the launcher then
        stops them)."""
        if rank0:
            parser.error(message)
        time.sleep(10)
        raise SystemExit(2)

    if processes and processes != args.pp * args.dp * args.cp * args.tp:
        error(
            f"{processes} processes for a {args.pp} x {args.dp} x {args.cp} x {args.tp} mesh (pp x dp x cp x tp)"
        )
    if args.cp > 1 and (args.pp > 1 or args.seq % args.cp):
        error(f"--cp {args.cp} needs --pp 1 and a --seq ({args.seq}) it divides")
    zigzag = args.cp > 1 and args.zigzag
    if zigzag and args.seq % (2 * args.cp):
        error(
            f"--cp {args.cp} stores the sequence in {2 * args.cp} zig-zag chunks: "
            f"--seq ({args.seq}) must divide by {2 * args.cp} (or pass --no-zigzag)"
        )
    rounds = args.accumulate
    args.accumulate = rounds or 1
    if rounds is not None and args.micro_batch is not None and args.pp == 1:
        error(
            "--accumulate and --micro-batch both set the accumulation rounds without --pp: pass one"
        )
    if rounds is not None and rounds < 1:
        error(f"--accumulate must be at least 1, found {rounds}")
    if (
        args.lr_schedule != "constant"
        and args.warmup > args.steps
        and args.lr_schedule != "linear_warmup"
    ):
        error(f"--warmup {args.warmup} is longer than --steps {args.steps}")
    if args.micro_batch is not None:
        if args.micro_batch < 1:
            error(f"--micro-batch must be at least 1, found {args.micro_batch}")
        if args.batch is None:
            args.batch = max(4, args.dp * args.micro_batch)
        if args.batch % (args.dp * args.micro_batch):
            error(
                f"--batch {args.batch} does not split into microbatches of {args.micro_batch} "
                f"over {args.dp} data-parallel ranks"
            )
        count = args.batch // (args.dp * args.micro_batch)
        if args.pp > 1:
            args.microbatches = count
        else:
            args.accumulate = count
    # rows per step split this many ways
    splits = args.dp * args.accumulate * (args.microbatches if args.pp > 1 else 1)
    if args.batch is None:
        args.batch = max(4, splits)
    if args.batch % splits:
        what = (
            f"{args.dp} data-parallel ranks"
            + (f" x {args.microbatches} microbatches" if args.pp > 1 else "")
            + (f" x {args.accumulate} accumulation rounds" if args.accumulate > 1 else "")
        )
        error(f"--batch {args.batch} does not split evenly over {what}")
    if args.pp > 1:
        mesh = dist.Mesh(axes=["pp", "dp", "tp"], shape=(args.pp, args.dp, args.tp))
        schedule.pipeline_microbatches(args.microbatches, kind=args.schedule, virtual=args.virtual)
    elif args.cp > 1:
        mesh = dist.Mesh(axes=["dp", "cp", "tp"], shape=(args.dp, args.cp, args.tp))
        settings.enter_context(schedule.options(context_parallel=args.cp_method))
    else:
        mesh = dist.Mesh(axes=["dp", "tp"], shape=(args.dp, args.tp))
    params = init_params(args.vocab, args.seq, args.dim, args.layers)
    reference = {k: v.double().clone().requires_grad_() for k, v in params.items()}
    step = make_step(mesh, params, args)
    state = step.init(params)  # virtual mesh: steps update `params` in place; processes: shards

    g = torch.Generator().manual_seed(1)
    stream = torch.randint(0, args.vocab, (args.batch, args.seq + 1), generator=g)
    tokens, targets = stream[:, :-1], stream[:, 1:]  # natural order (the torch loop's)
    batch = (tokens, targets)
    if zigzag:  # stored in zig-zag order over cp, as Megatron-LM's get_batch_on_this_cp_rank
        order = torch.from_numpy(dist.zigzag_order(args.seq, args.cp))
        batch = (tokens[:, order], targets[:, order])

    torch_update = training_options.TorchUpdate(reference, args)
    torch_optimizer = torch_update.optimizer
    manager = None
    if args.save:
        manager = CheckpointManager(
            args.save,
            every=args.checkpoint_every,
            keep_last=args.keep_last,
            async_save=args.async_save,
        )
    last = args.steps
    if args.resume:  # as before: --steps more steps
        step.restore(state, checkpoint_policy.resolve(args.resume))
        resume_reference(reference, torch_optimizer, step.state_dict(state))
        last = state.step + args.steps
        if rank0:
            print(f"resumed from {args.resume} at step {state.step}")
    elif manager is not None and manager.restore(step, state) is not None:
        resume_reference(reference, torch_optimizer, step.state_dict(state))
        if rank0:
            print(f"resumed from step {state.step} ({args.save})")
    first = state.step
    tolerance = LOSS_RTOL if args.precision == "f32" else LOSS_RTOL_MIXED
    check = LossCheck(last, tolerance, every=args.log_every, show=rank0, first=first)
    start = time.perf_counter()
    records: list[dict[str, Any]] = []
    for i in range(first, last):
        loss = step(state, *batch)["loss"]
        torch_update.zero_grad()
        expected = torch_loss(reference, tokens, targets, args.heads, args.layers)
        expected.backward()
        torch_update.update(lambda half: torch_loss(half, tokens, targets, args.heads, args.layers))
        check.add(i, float(loss), expected.item())
        records.append({"step": i + 1, "loss": float(loss)})
        if manager is not None and manager.due(state.step) and i + 1 < last:
            manager.save(step, state)  # every rank writes its own pieces
        stop = preemption.requested() if preemption is not None and i + 1 < last else None
        if stop is not None and manager is not None:  # the ranks agree: save and stop
            where = manager.save(step, state)
            manager.wait()
            preemption.saved()  # type: ignore[union-attr]
            if rank0:
                print(
                    f"preempted by {stop.name} after step {state.step}: saved {where} "
                    f"(run again with --save {args.save} to resume)",
                    flush=True,
                )
            return records
    if manager is not None and records:
        where = manager.save(step, state)
        manager.wait()
        if rank0:
            print(f"saved step {state.step} to {where}")
    if rank0 and args.pp > 1:
        pipeline = step.pipeline().compiled(state, batch)
        print(
            f"mesh pp {args.pp} x dp {args.dp} x tp {args.tp}, {args.schedule} schedule, "
            f"{args.microbatches} microbatches, {len(pipeline.stages)} stages (cut before forward ops "
            f"{pipeline.cuts}), {args.steps} steps in {time.perf_counter() - start:.1f} s"
        )
    elif rank0:
        lowered = step.lower(state, *batch)
        collectives = lowered.collectives()
        kinds = sorted({f"{c.kind}[{','.join(c.mesh_axes)}]" for c in collectives})
        stats = lowered.memory()
        memory = stats.model_states
        shape = (
            f"dp {args.dp} x cp {args.cp} x tp {args.tp}"
            if args.cp > 1
            else f"{args.dp} x {args.tp}"
        )
        print(
            f"mesh {shape}, ZeRO-{args.zero}, remat {args.remat}, {args.precision}, {args.steps} steps in {time.perf_counter() - start:.1f} s; collectives: {', '.join(kinds) or 'none'}"
        )
        if args.cp > 1:
            permutes = [
                c for c in collectives if c.kind == "collective_permute" and c.mesh_axes == ("cp",)
            ]
            shifts = sum(is_ring_shift(c.pairs, args.cp) for c in permutes)
            print(
                f"sequence over cp in {'zig-zag' if zigzag else 'natural'} order: "
                f"{len(permutes)} collective permutes over cp, {shifts} ring shifts "
                f"(rank i to i + 1) and {len(permutes) - shifts} relayouts"
            )
        print(
            f"per-rank bytes: params {memory.params}, grads {memory.grads}, optimizer state {memory.optimizer_state}, peak {stats.peak_bytes}"
        )
    if records:
        check.finish()
    elif rank0:
        print(f"nothing to run: already at step {first} of {last}")
    return records


if __name__ == "__main__":
    main()
