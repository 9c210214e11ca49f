"""Train a small Mixtral-like model with Tessera on a dp x ep mesh, and check it against torch.

    python examples/train_moe.py                       # virtual 2 x 2 mesh (dp x ep), 20 steps
    python examples/train_moe.py --tp 2                # dp x ep x tp = 2 x 2 x 2
    python examples/train_moe.py --dropless            # capacity = tokens per group: nothing dropped
    python examples/train_moe.py --shared-expert       # plus a shared expert (DeepSeek/Qwen style)
    tessera run -n 4 examples/train_moe.py --steps 3   # one process per rank (gloo)
    python examples/train_moe.py --pp 2 --microbatches 2 --batch 16 --precision bf16 --clip 1.0 \
        --zero 1 --remat nothing --accumulate 2 --lr-schedule warmup_cosine --warmup 2
                                                       # pp x dp x ep = 2 x 2 x 2, every option

The model: token embedding plus learned positions, ``--layers`` pre-RMSNorm blocks of
causal attention and a mixture-of-experts MLP (``--experts`` SwiGLU experts, top-``k``
routing by a softmax router renormalised over the chosen experts, Mixtral's), a final
norm and a tied output projection. The loss is the next-token cross-entropy plus the
Switch load-balancing loss and the router z-loss. Each sequence is a routing group with
``ceil(T * k * capacity_factor / E)`` slots per expert (the lower expert index wins a
tie of scores; choices over capacity are dropped: first choices first, then earlier
tokens). With ``--shared-expert`` every token also goes through a
shared SwiGLU expert (``op.moe_block``: its matmuls run while the combine all-to-all is
in flight). Sequences are split over ``dp x ep``, the experts'
weights ``[E, ...]`` over ``ep`` (and their hidden dim over ``tp``): the sharding passes
insert the dispatch and combine all-to-alls over ep and their transposes in the
backward. Each step's loss is compared with a float64 torch loop that routes the same
way (token by token, a counter per expert; where its top k and the f32 program's
differ only by near-ties of scores, ``TIE_TOL``, as the program did), trained with
torch.optim.AdamW. The training options of ``examples/_training_options.py``
(``--precision``, ``--clip``, ``--zero``, ``--remat`` for each layer, a
``graph.checkpoint`` block, ``--accumulate``, ``--deterministic``, ``--lr-schedule``)
combine with each other and with ``--pp`` (the pipeline splits the batch over dp and
into microbatches, each stage's rows over ep); the torch loop implements each (clipping,
``LambdaLR``, GradScaler's overflow skip) and, as the router losses are per microbatch,
averages the losses of the step's microbatches. The program returns its expert choices
(for the near-tie rule) only unpipelined and unaccumulated; bf16/fp16 programs count
score differences up to ``TIE_TOL_MIXED`` as ties, fp8 programs (the router kept in bf16)
up to ``TIE_TOL_FP8``.
"""

from __future__ import annotations

import argparse
import math
import os
import time

import _training_options as training_options
import torch
import torch.nn.functional as F
from _report import LossCheck

from tessera import dist, graph, op, optim, schedule

LOSS_RTOL = 2e-4  # f32 program vs float64 torch, per step
LOSS_RTOL_MIXED = 5e-2  # bf16/fp16 program vs float64 torch
AUX, Z = 0.01, 0.001  # weights of the load-balancing loss and the z-loss
RMS_EPS = 1e-6  # op.rms_norm's default; the torch loop must use the same
# Router scores closer than this are a tie to the f32 program: its scores differ from the
# float64 loop's by ~1e-7 (f32 rounding) to ~1e-6 (its parameters' drift over many
# steps), so where the loop's top k and the program's differ only by such near-ties the
# loop routes as the program did (an ordered choice whose every score is within
# TIE_TOL of the loop's top-k scores, rank by rank); any other difference is a mismatch.
TIE_TOL = 1e-5
TIE_TOL_MIXED = 2e-2  # bf16/fp16 programs: scores rounded to 8/11 mantissa bits
TIE_TOL_FP8 = 1e-1  # fp8 programs: the router's input comes through e4m3 matmuls (3 bits)


def swiglu(x, w1, w3, w2):
    return (op.silu(x @ w1) * (x @ w3)) @ w2


@graph.checkpoint
def moe_layer(p, x, i: int, args, capacity: int):
    """Decoder layer ``i``: causal attention, then the mixture of experts; returns the new
    ``x``, the layer's router losses and its expert choices ``[B, T, k]``."""
    B, T, C = x.shape
    h = op.rms_norm(x, eps=RMS_EPS)
    q, k, v = op.chunk(h @ p[f"attn_w{i}"], 3, axis=-1)
    q, k, v = (
        op.transpose(op.reshape(t, (B, T, args.heads, C // args.heads)), (0, 2, 1, 3))
        for t in (q, k, v)
    )
    attn = op.reshape(op.transpose(op.attention(q, k, v, causal=True), (0, 2, 1, 3)), (B, T, C))
    x = x + attn @ p[f"proj_w{i}"]
    h = op.rms_norm(x, eps=RMS_EPS)
    with op.fp8_matmuls(False):  # the router (gating) stays bf16 under --precision fp8
        logits = h @ p[f"router_w{i}"]
    weights, experts, scores = op.router(logits, k=args.top_k)
    routing = op.route(experts, args.experts, capacity)
    routed = [p[f"w1_{i}"], p[f"w3_{i}"], p[f"w2_{i}"]]  # [E, C, H], [E, C, H], [E, H, C]
    shared = [p[f"s1_{i}"], p[f"s3_{i}"], p[f"s2_{i}"]] if args.shared_expert else None
    x = x + op.moe_block(
        h,
        routing,
        weights,
        experts=lambda xe, w=routed: swiglu(xe, *w),  # xe: [B, E, capacity, C]
        shared=(lambda t, w=shared: swiglu(t, *w)) if shared else None,
    )
    aux = AUX * op.load_balancing_loss(scores, experts) + Z * op.router_z_loss(logits)
    return x, aux, experts


def moe_loss(p, tokens, targets, args, choices=None):
    """Next-token cross-entropy plus the router losses of every layer (each layer's
    expert choices ``[B, T, k]`` appended to the list ``choices`` if given)."""
    T = tokens.shape[1]
    capacity = op.expert_capacity(T, args.experts, args.top_k, args.capacity_factor)
    x = op.take(p["wte"], tokens, axis=0) + p["wpe"][:T]
    aux = 0.0
    for i in range(args.layers):
        x, layer_aux, experts = moe_layer(p, x, i, args, capacity)
        aux = aux + layer_aux
        if choices is not None:
            choices.append(experts)
    logits = op.rms_norm(x, eps=RMS_EPS) @ op.transpose(p["wte"], (1, 0))
    return op.cross_entropy(logits, targets) + aux


def torch_loss(p, tokens, targets, args, program_choices=None) -> torch.Tensor:
    """The same model in torch, routing each group token by token. With
    ``program_choices`` (the program's choices of every layer) a token whose top k
    differs from the program's only by near-ties (``TIE_TOL``) routes as the program's;
    a larger difference raises ``SystemExit``."""
    B, T = tokens.shape
    C = p["wte"].shape[1]
    E, K = args.experts, args.top_k
    capacity = (
        T if args.capacity_factor is None else min(T, math.ceil(T * K * args.capacity_factor / E))
    )

    def rms(t: torch.Tensor) -> torch.Tensor:
        return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + RMS_EPS)

    x = p["wte"][tokens] + p["wpe"][:T]
    aux = 0.0
    for i in range(args.layers):
        h = rms(x)
        q, k, v = (h @ p[f"attn_w{i}"]).split(C, dim=-1)
        q, k, v = (t.view(B, T, args.heads, C // args.heads).transpose(1, 2) for t in (q, k, v))
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + attn.transpose(1, 2).reshape(B, T, C) @ p[f"proj_w{i}"]
        h = rms(x)
        logits = h @ p[f"router_w{i}"]
        scores = torch.softmax(logits, -1)
        # the K highest, the lower expert index first among equal scores (graph.top_k's
        # rule; torch.topk's order among ties is unspecified)
        top, chosen = (t[..., :K] for t in torch.sort(scores, dim=-1, descending=True, stable=True))
        if program_choices is not None:
            theirs = program_choices[i].long()
            precision = getattr(args, "precision", "f32")
            tolerance = {"f32": TIE_TOL, "fp8": TIE_TOL_FP8}.get(precision, TIE_TOL_MIXED)
            near = (scores.detach().gather(-1, theirs) - top.detach()).abs() <= tolerance
            differ = (theirs != chosen).any(-1)
            if (differ & ~near.all(-1)).any():
                b, t = (differ & ~near.all(-1)).nonzero()[0].tolist()
                raise SystemExit(
                    f"routing MISMATCH in layer {i}, sequence {b}, token {t}: the program "
                    f"chose experts {theirs[b, t].tolist()}, the top {K} are "
                    f"{chosen[b, t].tolist()} (scores {scores[b, t].tolist()})"
                )
            chosen = torch.where(differ[..., None], theirs, chosen)
            top = scores.gather(-1, chosen)
        weights = top / top.sum(-1, keepdim=True)
        rows = []
        for b in range(B):
            count = [0] * E
            out = [torch.zeros(C, dtype=x.dtype) for _ in range(T)]
            for j in range(K):
                for t in range(T):
                    e = int(chosen[b, t, j])
                    if count[e] < capacity:
                        count[e] += 1
                        y = (F.silu(h[b, t] @ p[f"w1_{i}"][e]) * (h[b, t] @ p[f"w3_{i}"][e])) @ p[
                            f"w2_{i}"
                        ][e]
                        out[t] = out[t] + weights[b, t, j] * y
            rows.append(torch.stack(out))
        x = x + torch.stack(rows)
        if args.shared_expert:
            x = x + (F.silu(h @ p[f"s1_{i}"]) * (h @ p[f"s3_{i}"])) @ p[f"s2_{i}"]
        fraction = F.one_hot(chosen, E).to(x.dtype).mean((0, 1, 2))
        balance = E * (fraction * scores.mean((0, 1))).sum()
        aux = aux + AUX * balance + Z * (torch.logsumexp(logits, -1) ** 2).mean()
    logits = rms(x) @ p["wte"].T
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)) + aux


def microbatch_rows(args: argparse.Namespace, chunks: int, pipelined: bool) -> list[torch.Tensor]:
    """The batch rows of each microbatch whose loss (the router losses are per
    microbatch) the step averages: pipelined, contiguous blocks (dp rank, accumulation
    round, microbatch); accumulated, chunk j of every dp rank's rows; else all rows."""
    rows = torch.arange(args.batch)
    if pipelined:
        return list(rows.reshape(chunks, -1))
    k = args.accumulate
    per_rank = rows.reshape(args.dp, k, -1)  # [dp, k, rows]
    return [per_rank[:, j].reshape(-1) for j in range(k)]


def init_params(args: argparse.Namespace, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    C, E, H = args.dim, args.experts, args.hidden

    def randn(*shape: int, scale: float) -> torch.Tensor:
        return scale * torch.randn(shape, generator=g)

    p = {"wte": randn(args.vocab, C, scale=0.5), "wpe": randn(args.seq, C, scale=0.1)}
    for i in range(args.layers):
        p |= {
            f"attn_w{i}": randn(C, 3 * C, scale=C**-0.5), f"proj_w{i}": randn(C, C, scale=C**-0.5),
            f"router_w{i}": randn(C, E, scale=C**-0.5),
            f"w1_{i}": randn(E, C, H, scale=C**-0.5), f"w3_{i}": randn(E, C, H, scale=C**-0.5),
            f"w2_{i}": randn(E, H, C, scale=H**-0.5),
        }  # fmt: skip
        if args.shared_expert:
            p |= {
                f"s1_{i}": randn(C, H, scale=C**-0.5), f"s3_{i}": randn(C, H, scale=C**-0.5),
                f"s2_{i}": randn(H, C, scale=H**-0.5),
            }  # fmt: skip
    return p


def expert_layout(params: dict[str, torch.Tensor]) -> dict[str, dist.ShardSpec | None]:
    """Experts split over ep; inside an expert, w1 and w3 by columns and w2 by rows over tp."""
    columns = dist.ShardSpec(partition=(0, 2), mesh_axes=("ep", "tp"))
    rows = dist.ShardSpec(partition=(0, 1), mesh_axes=("ep", "tp"))
    return {
        k: columns if k.startswith(("w1_", "w3_")) else rows if k.startswith("w2_") else None
        for k in params
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--dp", type=int, default=2)
    parser.add_argument("--ep", type=int, default=2)
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=8)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=32, help="each expert's hidden width")
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=64)
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--capacity-factor", type=float, default=1.25)
    parser.add_argument("--dropless", action="store_true", help="capacity = tokens per group")
    parser.add_argument("--shared-expert", action="store_true", help="plus a shared expert")
    parser.add_argument("--lr", type=float, default=3e-3)
    training_options.add_arguments(parser)
    args = parser.parse_args(argv)
    if args.dropless:
        args.capacity_factor = None
    args.accumulate = args.accumulate or 1

    processes = int(os.environ.get("WORLD_SIZE", "0"))
    rank0 = int(os.environ.get("RANK", "0")) == 0
    ranks = args.pp * args.dp * args.ep * args.tp
    if processes and processes != ranks:
        parser.error(
            f"{processes} processes for a {args.pp} x {args.dp} x {args.ep} x {args.tp} mesh "
            f"(pp x dp x ep x tp)"
        )
    training_options.check(args, parser.error)
    pipelined = args.pp > 1
    chunks = args.dp * args.accumulate * (args.microbatches if pipelined else 1)
    if args.batch % (chunks * (args.ep if pipelined else 1)) or args.batch % (args.dp * args.ep):
        parser.error(
            f"--batch {args.batch} does not split over {args.dp} x {args.ep} (dp x ep) ranks"
            + (f" x {args.microbatches} microbatches" if pipelined else "")
            + (f" x {args.accumulate} accumulation rounds" if args.accumulate > 1 else "")
        )
    if pipelined:
        mesh = dist.Mesh(axes=["pp", "dp", "ep", "tp"], shape=(args.pp, args.dp, args.ep, args.tp))
        schedule.pipeline_microbatches(args.microbatches, kind=args.schedule, virtual=args.virtual)
    else:
        mesh = dist.Mesh(axes=["dp", "ep", "tp"], shape=(args.dp, args.ep, args.tp))
    params = init_params(args)
    reference = {k: v.double().clone().requires_grad_() for k, v in params.items()}
    # the program's expert choices (for the loop's near-tie rule) come back for the whole
    # batch only from one unaccumulated, unpipelined program
    with_choices = not pipelined and args.accumulate == 1

    @graph.training_step(
        optimizer=optim.AdamW(lr=training_options.learning_rate(args), weight_decay=0.0),
        mesh=mesh, param_shardings=expert_layout(params),
        batch_shardings=dist.ShardSpec(partition=(0,), mesh_axes=(("dp", "ep"),)),
        **training_options.step_options(args),
    )  # fmt: skip
    def step(p, tokens, targets):
        choices = []
        loss = moe_loss(p, tokens, targets, args, choices)
        metrics = {"loss": loss, "choices": choices} if with_choices else {"loss": loss}
        return graph.backward(loss), metrics

    state = step.init(params)
    g = torch.Generator().manual_seed(1)
    stream = torch.randint(0, args.vocab, (args.batch, args.seq + 1), generator=g)
    tokens, targets = stream[:, :-1], stream[:, 1:]
    groups = microbatch_rows(args, chunks, pipelined)
    torch_update = training_options.TorchUpdate(reference, args)
    tolerance = LOSS_RTOL if args.precision == "f32" else LOSS_RTOL_MIXED
    check = LossCheck(args.steps, tolerance, every=5, show=rank0)
    start = time.perf_counter()
    for i in range(args.steps):
        metrics = step(state, tokens, targets)  # every rank holds the values
        choices = metrics.get("choices")
        torch_update.zero_grad()

        def loop_loss(weights, choices=choices):  # the mean of the microbatches' losses
            parts = [torch_loss(weights, tokens[r], targets[r], args, choices) for r in groups]
            return sum(parts) / len(parts)

        expected = loop_loss(reference)
        expected.backward()
        torch_update.update(lambda half: loop_loss(half, None))
        check.add(i, float(metrics["loss"]), expected.item())
    if rank0 and pipelined:
        compiled = step.pipeline().compiled(state, (tokens, targets))
        print(
            f"mesh pp {args.pp} x dp {args.dp} x ep {args.ep} x tp {args.tp}, {args.schedule} "
            f"schedule, {args.microbatches} microbatches, {len(compiled.stages)} stages, "
            f"{args.steps} steps in {time.perf_counter() - start:.1f} s"
        )
    elif rank0:
        lowered = step.lower(state, tokens, targets)
        kinds = sorted({f"{c.kind}[{','.join(c.mesh_axes)}]" for c in lowered.collectives()})
        a2a = sum(c.nbytes for c in lowered.collectives() if c.kind == "all_to_all")
        print(
            f"mesh dp {args.dp} x ep {args.ep} x tp {args.tp}, {args.experts} experts, top-{args.top_k}, "
            f"{args.steps} steps in {time.perf_counter() - start:.1f} s; collectives: {', '.join(kinds)}"
        )
        print(f"all-to-all bytes per rank per step: {a2a}")
    check.finish()


if __name__ == "__main__":
    main()
