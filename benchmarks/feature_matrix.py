"""Every option of ``graph.training_step`` on every layout, held to a torch loop.

Each cell trains the Llama-style model of ``examples/llama.py`` (RMSNorm, RoPE,
grouped-query attention, SwiGLU) for three AdamW steps with one option on, on one
layout of the virtual mesh, and compares every step's loss and the final parameters with
an independent torch loop implementing the same option (float64 steps: losses and
parameters within ``TOL_F64``; bf16/fp16 steps, f32 masters: losses within
``TOL_MIXED`` relative, as the compute dtype rounds every op). A cell either matches
(✔ and the worst deviation), or is refused when the step is built with an error naming
both features (the reason is printed), or FAILS.

    python benchmarks/feature_matrix.py                  # the whole table (5 minutes on 2 CPU cores)
    python benchmarks/feature_matrix.py --pairwise       # the covering subset the tests run
    python benchmarks/feature_matrix.py --options bf16,clip --layouts "pp2 1f1b"

Kernels: the reference executor unless ``TESSERA_KERNELS`` says otherwise (the options
do not change the kernels; the Triton interpreter would make the table hours long).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

import llama
import train_moe

from tessera import TesseraError, dist, graph, optim, schedule

CONFIG = llama.LlamaConfig()
STEPS = 3
BATCH = 8
LR = 1e-2
CLIP = 0.05  # small enough that every step clips
WARMUP = 2  # the "all" option's warmup_cosine schedule: 2 warmup steps of STEPS
TOL_F64 = 1e-9  # float64 step vs float64 torch: losses and parameters, absolute
TOL_MIXED = 3e-2  # bf16/fp16 compute (f32 masters) vs torch in the same precision: losses, relative


@dataclass(frozen=True)
class Layout:
    """A mesh and how the step uses it."""

    axes: dict[str, int] = field(default_factory=dict)
    schedule: str | None = None  # pipeline schedule (a pp axis)
    microbatches: int = 2
    virtual: int = 1
    context_parallel: str | None = None  # "ring" | "all_gather" (a cp axis)
    sequence_parallel: bool = False
    moe: bool = False  # the mixture-of-experts model of examples/train_moe.py, experts over ep
    batch: int = BATCH  # sequences per step


LAYOUTS: dict[str, Layout] = {
    "1 device": Layout(),
    "dp2": Layout({"dp": 2}),
    "tp2": Layout({"tp": 2}),
    "dp2 x tp2": Layout({"dp": 2, "tp": 2}),
    "dp2 x tp2 +SP": Layout({"dp": 2, "tp": 2}, sequence_parallel=True),
    "cp2 ring": Layout({"cp": 2}, context_parallel="ring"),
    "dp2 x cp2 all-gather": Layout({"dp": 2, "cp": 2}, context_parallel="all_gather"),
    "pp2 gpipe": Layout({"pp": 2}, schedule="gpipe"),
    "pp2 x dp2 1f1b": Layout({"pp": 2, "dp": 2}, schedule="1f1b"),
    "pp2 interleaved": Layout({"pp": 2}, schedule="interleaved", microbatches=2, virtual=2),
    "pp2 x tp2 zb-h1": Layout({"pp": 2, "tp": 2}, schedule="zb-h1"),
    "pp2 x dp2 x tp2 1f1b": Layout({"pp": 2, "dp": 2, "tp": 2}, schedule="1f1b"),
    "dp2 x ep2 MoE": Layout({"dp": 2, "ep": 2}, moe=True),
    "pp2 x dp2 x ep2 MoE 1f1b": Layout(
        {"pp": 2, "dp": 2, "ep": 2}, schedule="1f1b", moe=True, batch=16
    ),
}

# the MoE model (examples/train_moe.py): 4 SwiGLU experts, top-2, capacity factor 1.25,
# router losses; its batch rows split over dp x ep, the experts over ep
MOE = argparse.Namespace(
    seq=8, dim=32, hidden=32, heads=2, layers=2, vocab=64, experts=4, top_k=2,
    capacity_factor=1.25, shared_expert=False, precision="f32",
)  # fmt: skip

# option name -> graph.training_step keywords (save/restore: see run_cell)
OPTIONS: dict[str, dict[str, Any]] = {
    "baseline": {},
    "zero=1": {"zero": 1},
    "zero=2": {"zero": 2},
    "zero=3": {"zero": 3},
    "bf16": {"precision": "bf16"},
    "fp16": {"precision": "fp16"},
    "clip": {"clip_grad_norm": CLIP},
    "accumulate=2": {"accumulate": 2},
    "remat": {"remat": True},
    "deterministic": {"numerics": "deterministic"},
    "save/restore": {},
    # everything at once (ZeRO-2 where the mesh has dp): the seeds' LLM configuration
    "all": {"precision": "bf16", "clip_grad_norm": CLIP, "accumulate": 2, "remat": True,
            "numerics": "deterministic", "lr": "warmup_cosine"},
}  # fmt: skip
ALL_ZERO = 2  # the "all" option's ZeRO stage on meshes with a dp axis

# the covering subset CI runs: every option and every layout at least once, the
# pipelined layouts with the options that span stages (precision, clipping, ZeRO)
PAIRWISE: list[tuple[str, str]] = [
    ("1 device", "bf16"),
    ("1 device", "fp16"),
    ("dp2", "zero=3"),
    ("tp2", "remat"),
    ("dp2 x tp2", "accumulate=2"),
    ("dp2 x tp2 +SP", "clip"),
    ("cp2 ring", "baseline"),
    ("dp2 x cp2 all-gather", "zero=2"),
    ("pp2 gpipe", "fp16"),
    ("pp2 x dp2 1f1b", "zero=1"),
    ("pp2 x dp2 1f1b", "zero=3"),
    ("pp2 interleaved", "clip"),
    ("pp2 x tp2 zb-h1", "bf16"),
    ("pp2 x dp2 x tp2 1f1b", "all"),
    ("pp2 x dp2 x tp2 1f1b", "save/restore"),
    ("dp2 x tp2", "deterministic"),
    ("dp2 x ep2 MoE", "accumulate=2"),
    ("pp2 x dp2 x ep2 MoE 1f1b", "clip"),
]


@dataclass
class Cell:
    """The outcome of one option on one layout."""

    status: str  # "ok" | "refused" | "FAIL"
    deviation: float = 0.0  # worst |tessera - torch| (relative for mixed precision losses)
    tolerance: float = 0.0
    reason: str = ""
    seconds: float = 0.0
    losses: list[float] = field(default_factory=list)

    def text(self) -> str:
        if self.status == "ok":
            return f"✔ {self.deviation:.0e}"
        if self.status == "refused":
            return f"refused: {self.why()}"
        return "FAIL"

    def why(self) -> str:
        """A refusal's reason in a few words (the error is listed below the table)."""
        if "shards over the data-parallel axis" in self.reason and "mesh has axes" in self.reason:
            return "no dp axis"
        if "zero=3" in self.reason and "pipeline axis" in self.reason:
            return "ZeRO-3 with pp"
        return "see below"


def batches(layout: Layout) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(STEPS):
        stream = torch.randint(0, CONFIG.vocab, (layout.batch, CONFIG.seq + 1), generator=g)
        out.append((stream[:, :-1], stream[:, 1:]))
    return out


def make_step(
    layout: Layout, options: dict[str, Any], params: dict[str, torch.Tensor]
) -> graph.TrainingStep:
    """The training step of ``options`` on ``layout`` (raises when it refuses them)."""
    mesh = dist.mesh(layout.axes) if layout.axes else None
    axes = layout.axes
    cp = axes.get("cp", 1)
    batch_spec = None
    if cp > 1:
        if "dp" in axes:  # rows over dp, the sequence over cp
            spec = dist.ShardSpec(partition=(0, 1), mesh_axes=("dp", "cp"))
        else:
            spec = dist.ShardSpec(partition=(1,), mesh_axes=("cp",))
        batch_spec = (spec, spec)
    sp = None
    if layout.sequence_parallel:
        sp = dist.ShardSpec(partition=(0, 1), mesh_axes=("dp", "tp")) if "dp" in axes else dist.ShardSpec(
            partition=(1,), mesh_axes=("tp",))  # fmt: skip
    zigzag = cp if layout.context_parallel == "ring" else None
    options = {"remat": False, **options}
    lr: Any = LR
    if options.pop("lr", None) == "warmup_cosine":
        lr = optim.schedules.warmup_cosine(LR, WARMUP, STEPS, LR / 10)
        if "dp" in axes:
            options["zero"] = ALL_ZERO

    param_shardings = llama.megatron_layout(params) if "tp" in axes else None
    if layout.moe:
        experts = dist.ShardSpec(partition=(0,), mesh_axes=("ep",))
        param_shardings = {
            k: experts if k.startswith(("w1_", "w2_", "w3_")) else None for k in params
        }
        rows = dist.ShardSpec(partition=(0,), mesh_axes=(("dp", "ep"),))
        batch_spec = (rows, rows)

    @graph.training_step(
        optimizer=optim.AdamW(lr=lr, weight_decay=0.0), mesh=mesh,
        param_shardings=param_shardings, batch_shardings=batch_spec, **options,
    )  # fmt: skip
    def step(p, tokens, targets):
        if layout.moe:
            loss = train_moe.moe_loss(p, tokens, targets, MOE)
        else:
            loss = llama.loss(p, tokens, targets, CONFIG, zigzag=zigzag, sequence_parallel=sp)
        return graph.backward(loss), {"loss": loss}

    return step


def init_params(layout: Layout, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    if layout.moe:
        return {k: v.to(dtype) for k, v in train_moe.init_params(MOE).items()}
    return llama.init_params(CONFIG, dtype=dtype)


def microbatch_rows(layout: Layout, accumulate: int) -> list[torch.Tensor]:
    """The batch rows of each microbatch the step computes a loss of (what matters for
    the MoE model's router losses, which are per microbatch): pipelined, contiguous
    blocks (dp rank, accumulation round, microbatch); accumulated, chunk j of every dp
    rank's rows (``tessera.training.accumulation``); else the whole batch."""
    rows, dp = torch.arange(layout.batch), layout.axes.get("dp", 1)
    if layout.schedule:
        return list(rows.reshape(dp * accumulate * layout.microbatches, -1))
    per_rank = rows.reshape(dp, accumulate, -1)
    return [per_rank[:, j].reshape(-1) for j in range(accumulate)]


def torch_loss(
    layout: Layout, p: dict[str, torch.Tensor], tokens: torch.Tensor, targets: torch.Tensor
) -> torch.Tensor:
    if layout.moe:
        return train_moe.torch_loss(p, tokens, targets, MOE)
    return llama.torch_loss(p, tokens, targets, CONFIG)


def stored(layout: Layout, tokens: torch.Tensor) -> torch.Tensor:
    """A batch leaf as the layout's data loader stores it (zig-zag for the ring)."""
    if layout.context_parallel == "ring":
        return tokens[:, dist.zigzag_order(tokens.shape[1], layout.axes["cp"])]
    return tokens


def options_context(layout: Layout) -> Any:
    kwargs: dict[str, Any] = {}
    if layout.schedule:
        kwargs |= {"pipeline_microbatches": layout.microbatches, "pipeline_schedule": layout.schedule,
                   "pipeline_virtual": layout.virtual}  # fmt: skip
    if layout.context_parallel:
        kwargs["context_parallel"] = layout.context_parallel
    return schedule.options(**kwargs)


def run_tessera(
    layout: Layout, option: str, params: dict[str, torch.Tensor]
) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Per-step losses and the final parameters of the Tessera step."""
    options = OPTIONS[option]
    step = make_step(layout, options, params)
    state = step.init(params)
    losses = []
    with options_context(layout), tempfile.TemporaryDirectory() as scratch:
        for index, (tokens, targets) in enumerate(batches(layout)):
            if option == "save/restore" and index == 1:  # resume from a checkpoint in a new state
                step.save(state, Path(scratch) / "ckpt")
                fresh = {k: torch.zeros_like(v) for k, v in params.items()}
                state = step.restore(step.init(fresh), Path(scratch) / "ckpt")
            metrics = step(state, stored(layout, tokens), stored(layout, targets))
            losses.append(float(metrics["loss"]))
        return losses, dict(step.gather(state).params)


def run_torch(
    option: str, params: dict[str, torch.Tensor], layout: Layout
) -> tuple[list[float], dict[str, torch.Tensor]]:
    """The same training with torch: autograd, ``clip_grad_norm_``, ``torch.optim.AdamW``,
    dynamic loss scaling as ``GradScaler`` (the loss's cotangent is the scale in the loss's
    dtype; a step with a non-finite gradient is skipped and the scale halved)."""
    options = OPTIONS[option]
    precision = options.get("precision")
    compute = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float64)
    masters = {k: v.detach().clone().requires_grad_() for k, v in params.items()}
    adam = torch.optim.AdamW(masters.values(), lr=LR, weight_decay=0.0)
    if options.get("lr") == "warmup_cosine":  # LambdaLR with the closed form
        floor = 0.1

        def factor(t: int) -> float:
            if t < WARMUP:
                return (t + 1) / WARMUP
            if t >= STEPS:
                return floor
            return floor + 0.5 * (1 - floor) * (
                1 + math.cos(math.pi * (t - WARMUP) / (STEPS - WARMUP))
            )

        schedule_ = torch.optim.lr_scheduler.LambdaLR(adam, factor)
    else:
        schedule_ = None
    scale = 2.0**16 if precision == "fp16" else None
    groups = microbatch_rows(layout, options.get("accumulate", 1))
    losses = []
    for tokens, targets in batches(layout):
        adam.zero_grad()
        total = 0.0
        for rows in groups:  # mean of equal-sized microbatches' losses
            cast = {k: v.to(compute) for k, v in masters.items()}
            loss = torch_loss(layout, cast, tokens[rows], targets[rows]) / len(groups)
            seed = torch.tensor(scale if scale else 1.0).to(loss.dtype)
            loss.backward(seed)
            total += float(loss.detach())
        losses.append(total)
        grads = [v.grad for v in masters.values()]
        if scale:
            for g in grads:
                g.div_(scale)
            if not all(bool(torch.isfinite(g).all()) for g in grads):
                scale *= 0.5
                continue
        if "clip_grad_norm" in options:
            torch.nn.utils.clip_grad_norm_(list(masters.values()), options["clip_grad_norm"])
        adam.step()
        if schedule_ is not None:
            schedule_.step()
    return losses, {k: v.detach() for k, v in masters.items()}


def run_cell(layout_name: str, option: str) -> Cell:
    layout = LAYOUTS[layout_name]
    mixed = "precision" in OPTIONS[option]
    dtype = torch.float32 if mixed else torch.float64
    params = init_params(layout, dtype)
    start = time.perf_counter()
    try:
        losses, final = run_tessera(layout, option, {k: v.clone() for k, v in params.items()})
    except TesseraError as error:
        return Cell(
            "refused", reason=str(error).splitlines()[0], seconds=time.perf_counter() - start
        )
    except Exception as error:  # a traceback from inside is a failure of its own
        return Cell(
            "FAIL", reason=f"{type(error).__name__}: {error}", seconds=time.perf_counter() - start
        )
    seconds = time.perf_counter() - start
    ref_losses, ref_params = run_torch(
        option, {k: v.double() if not mixed else v for k, v in params.items()}, layout
    )
    if mixed:
        deviation = max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses, strict=True))
        tolerance = TOL_MIXED
    else:
        deviation = max(
            max(abs(a - b) for a, b in zip(losses, ref_losses, strict=True)),
            max(float((final[k].double() - ref_params[k]).abs().max()) for k in ref_params),
        )
        tolerance = TOL_F64
    ok = math.isfinite(deviation) and deviation <= tolerance
    return Cell("ok" if ok else "FAIL", deviation, tolerance, "" if ok else f"deviation {deviation:.2e} > {tolerance:.0e}",
                seconds, losses)  # fmt: skip


def table(cells: dict[tuple[str, str], Cell], layouts: list[str], options: list[str]) -> str:
    """A markdown table: layouts down, options across; refusals and failures listed below."""
    lines = ["| layout | " + " | ".join(options) + " |", "|---" * (len(options) + 1) + "|"]
    for layout in layouts:
        row = [cells[layout, o].text() if (layout, o) in cells else "" for o in options]
        lines.append(f"| {layout} | " + " | ".join(row) + " |")
    reasons: dict[str, list[str]] = {}  # each distinct error, and where
    for (layout, option), cell in cells.items():
        if cell.status != "ok":
            reasons.setdefault(f"{cell.status}: {cell.reason}", []).append(f"{layout} × {option}")
    notes = [f"- {', '.join(where)}: {reason}" for reason, where in reasons.items()]
    return "\n".join(lines + (["", *notes] if notes else []))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--pairwise", action="store_true", help="only the covering subset the tests run"
    )
    parser.add_argument(
        "--options", default=None, help="comma-separated option names (default: all)"
    )
    parser.add_argument(
        "--layouts", default=None, help="comma-separated layout names (default: all)"
    )
    args = parser.parse_args(argv)
    os.environ.setdefault("TESSERA_KERNELS", "reference")
    options = args.options.split(",") if args.options else list(OPTIONS)
    layouts = args.layouts.split(",") if args.layouts else list(LAYOUTS)
    todo = PAIRWISE if args.pairwise else [(layout, o) for layout in layouts for o in options]
    cells: dict[tuple[str, str], Cell] = {}
    for index, (layout, option) in enumerate(todo, 1):
        print(f"[{index}/{len(todo)}] {layout} × {option} …", end=" ", flush=True)
        cell = cells[layout, option] = run_cell(layout, option)
        print(
            f"{cell.text()} ({cell.seconds:.0f} s){' ' + cell.reason if cell.reason else ''}",
            flush=True,
        )
    shown_layouts = [layout for layout in LAYOUTS if any(k[0] == layout for k in cells)]
    shown_options = [o for o in OPTIONS if any(k[1] == o for k in cells)]
    print()
    print(table(cells, shown_layouts, shown_options))
    return 1 if any(c.status == "FAIL" for c in cells.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
