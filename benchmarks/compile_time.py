"""Compile time of a GPT-like training step (or its forward), stage by stage, at model depth.

The step is ``benchmarks/comm_volume.py``'s: pre-LN transformer layers (attention and
MLP, Megatron tensor parallelism), a mean-square loss, ``graph.backward`` and AdamW, on a
dp × tp = 2 × 2 virtual mesh. For each layer count the script traces the step, then
times each compile stage (``tessera.driver.STAGES``) in order on a copy of the previous
stage and, with ``--stages ... triton``, the emission of every kernel's Triton source.
It prints seconds and op counts per stage, the schedule's launched kernels (``kernels``;
a ``views`` kernel only re-views a buffer: no code, no launch), the distinct Triton
kernels and launched kernels per layer. Nothing runs. ``--forward`` compiles the forward alone.

    python benchmarks/compile_time.py                          # every stage, 1-32 layers
    python benchmarks/compile_time.py --layers 2 4 --stages graph sharded
    python benchmarks/compile_time.py --torch-compile          # adds torch.compile's first call
    python benchmarks/compile_time.py --second-process         # cold and warm program cache
    python benchmarks/compile_time.py --regions --layers 8 64  # each layer a graph.region call
    python benchmarks/compile_time.py --regions --calls --layers 8 64  # ... kept as calls
    python benchmarks/compile_time.py --scan --layers 8 64     # stacked layers, one graph.scan
    python benchmarks/compile_time.py --model llama3-405b --regions --layers 126 --dims 2 1024 0 0

Every stage's time should grow linearly with the layer count (issue 17). With
``--second-process`` each layer count is compiled by two fresh processes sharing an
empty program cache (``tessera.program_cache``): the first compiles and stores every
stage, the second traces the same program and reads what a call needs (the tile stage,
which holds the schedule and its kernels, and their Triton source); both totals are
printed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
import comm_volume

import tessera as ts
from tessera import dist, graph, optim
from tessera.driver import STAGES
from tessera.perf.compute_cost import runs_as_view

STEPS = [*STAGES[1:], "triton"]
LAYER_PARAMS = ("wq", "wk", "wv", "wo", "w1", "w2", "ln1_w", "ln1_b", "ln2_w", "ln2_b")


def _program(
    layers: int, heads: int, forward: bool, regions: bool = False, scan_layers: bool = True
) -> Any:
    """The jitted forward (batch over dp, Megatron layouts over tp) or the training step;
    with ``regions`` each layer is a call of one ``graph.region`` (which the training step
    stacks and rolls into one scan unless ``scan_layers`` is False)."""
    mesh = dist.mesh({"dp": 2, "tp": 2})
    if not forward:
        return comm_volume.training_step(
            mesh, 0, layers, heads, True, regions, scan_layers=scan_layers
        )
    batch_spec, layout = comm_volume.layouts(mesh, True)
    layer = graph.region(comm_volume.transformer_layer) if regions else comm_volume.transformer_layer

    def model(p: dict[str, Any], x: Any) -> Any:
        for i in range(layers):
            x = layer(x, {n: p[f"{n}{i}"] for n in layout}, heads)
        return x

    specs = {f"{n}{i}": spec for i in range(layers) for n, spec in layout.items()}
    return ts.jit(model, mesh=mesh, in_shardings=(specs, batch_spec), kernels="reference")


LLAMA3_405B = {"vocab": 128256, "dim": 16384, "heads": 128, "kv_heads": 8, "ffn": 53248}


def llama_405b_step(
    layers: int, seq: int, regions: bool, scan: bool = False, scan_layers: bool = True
) -> tuple[Any, tuple[Any, ...]]:
    """Llama-3-405B's training step at real width (``examples/llama.py``: GQA, SwiGLU,
    RoPE; AdamW, ZeRO-1) on a dp × tp = 2 × 8 mesh, Megatron layouts with a
    vocabulary-parallel head, and its arguments as meta tensors (shapes only, nothing
    allocated): the step and the arguments of its ``lower``."""
    sys.path.insert(0, str(Path(__file__).parents[1] / "examples"))
    import llama

    config = llama.LlamaConfig(layers=layers, seq=seq, theta=500000.0, eps=1e-5, **LLAMA3_405B)
    kv = config.kv_heads * config.head_dim
    shapes = {"embed": (config.vocab, config.dim), "final_norm": (config.dim,)}
    for i in range(layers):
        shapes |= {
            f"attn_norm{i}": (config.dim,), f"wq{i}": (config.dim, config.dim),
            f"wk{i}": (config.dim, kv), f"wv{i}": (config.dim, kv),
            f"wo{i}": (config.dim, config.dim), f"mlp_norm{i}": (config.dim,),
            f"w_gate{i}": (config.dim, config.ffn), f"w_up{i}": (config.dim, config.ffn),
            f"w_down{i}": (config.ffn, config.dim),
        }  # fmt: skip
    shapes["head"] = (config.dim, config.vocab)
    params = {k: torch.empty(v, device="meta", dtype=torch.bfloat16) for k, v in shapes.items()}
    mesh = dist.mesh({"dp": 2, "tp": 8})
    layouts = llama.megatron_layout(params)
    layouts["head"] = dist.ShardSpec(partition=(1,), mesh_axes=("tp",))  # vocabulary-parallel
    if scan:  # the layer parameters stacked: their layouts keep dim 0 whole
        params = llama.stacked_params(params, config)
        layouts = {
            k: None if spec is None else (
                dist.ShardSpec(partition=tuple(d + 1 for d in spec.partition), mesh_axes=spec.mesh_axes)
                if k in llama.LAYER_PARAMS else spec
            )
            for k, spec in llama.megatron_layout(params).items()
        } | {"head": layouts["head"]}  # fmt: skip

    def step(p: Any, tokens: Any, targets: Any) -> Any:
        loss = llama.loss(p, tokens, targets, config, regions=regions, scan=scan)
        return graph.backward(loss), {"loss": loss}

    train = graph.training_step(
        step, optimizer=optim.AdamW(lr=1e-4), mesh=mesh, param_shardings=layouts, zero=1,
        kernels="reference", scan_layers=scan_layers,
    )  # fmt: skip
    tokens = torch.empty(2, seq, dtype=torch.int64, device="meta")
    return train, (train.init(params), tokens, tokens)


def torch_layer(x: torch.Tensor, p: dict[str, torch.Tensor], heads: int) -> torch.Tensor:
    """``comm_volume.transformer_layer`` in torch (the torch.compile baseline)."""
    batch, seq, dim = x.shape
    f = torch.nn.functional

    def split_heads(t: torch.Tensor) -> torch.Tensor:
        return t.reshape(batch, seq, heads, dim // heads).transpose(1, 2)

    h = f.layer_norm(x, (dim,), p["ln1_w"], p["ln1_b"])
    q, k, v = (split_heads(h @ p[name]) for name in ("wq", "wk", "wv"))
    attention = f.scaled_dot_product_attention(q, k, v, is_causal=True)
    x = x + attention.transpose(1, 2).reshape(batch, seq, dim) @ p["wo"]
    h = f.layer_norm(x, (dim,), p["ln2_w"], p["ln2_b"])
    return x + f.gelu(h @ p["w1"], approximate="tanh") @ p["w2"]


def measure(
    layers: int,
    steps: list[str],
    dims: tuple[int, int, int, int],
    forward: bool,
    regions: bool = False,
    model: str = "gpt",
    scan: bool = False,
    scan_layers: bool = True,
) -> dict[str, float]:
    """Seconds and op counts of each compile stage for one layer count."""
    batch, seq, dim, heads = dims
    if model == "llama3-405b":
        program, arguments = llama_405b_step(layers, seq, regions, scan, scan_layers)
    elif scan:  # stacked parameters, one graph.scan over the layers
        shapes = comm_volume.layer_params(dim, layers, materialize=False)
        params = comm_volume.stacked({k: torch.empty(v.shape) for k, v in shapes.items()}, layers)
        program = comm_volume.scan_training_step(dist.mesh({"dp": 2, "tp": 2}), 0, heads)
        arguments = (program.init(params), torch.empty(batch, seq, dim))
    else:
        shapes = comm_volume.layer_params(dim, layers, materialize=False)
        params = {k: torch.empty(v.shape) for k, v in shapes.items()}
        program = _program(layers, heads, forward, regions, scan_layers)
        x = torch.empty(batch, seq, dim)
        # allocating AdamW's moments: not part of the compile
        arguments = (params if forward else program.init(params), x)
    began = start = time.perf_counter()
    lowered = program.lower(*arguments)
    row: dict[str, float] = {"trace s": time.perf_counter() - began}
    last = steps[-1] if steps[-1] != "triton" else "tile"
    for stage in STAGES[1 : STAGES.index(last) + 1]:
        if stage in steps or stage == last:  # earlier stages: compiled on the way if needed
            began = time.perf_counter()
            module = lowered.module_at(stage)
            row[f"{stage} s"] = time.perf_counter() - began
            row[f"{stage} ops"] = sum(1 for _ in module.walk())
    if "triton" in steps:
        began = time.perf_counter()
        sources = lowered.triton_source()
        row["triton s"] = time.perf_counter() - began
        row["distinct kernels"] = len(set(sources.values()))
    compiled = time.perf_counter() - start  # every stage, shown or not; not the printing
    if "schedule" in steps:
        row["schedule KB"] = len(lowered.as_text("schedule")) / 1024
        kernels = [o for o in lowered.module_at("schedule").walk() if o.name == "schedule.kernel"]
        views = sum(1 for k in kernels if runs_as_view(k))  # no code, no launch
        row["kernels"] = len(kernels) - views
        row["views"] = views
        row["kernels/layer"] = (len(kernels) - views) / layers
        row["peak MiB"] = lowered.memory().peak_bytes / 2**20  # per rank: plan-memory's plan
    row["total s"] = compiled
    return row


def torch_compile_seconds(layers: int, dims: tuple[int, int, int, int]) -> float | None:
    """torch.compile's first call of the same model's forward, backward and AdamW step on
    one device (None where torch.compile does not work on this machine)."""
    batch, seq, dim, heads = dims
    try:
        params = {
            k: v.clone().requires_grad_(True)
            for k, v in comm_volume.layer_params(dim, layers, materialize=True).items()
        }
        optimizer = torch.optim.AdamW(params.values(), lr=1e-3)

        def step(x: torch.Tensor) -> torch.Tensor:
            for i in range(layers):
                x = torch_layer(x, {n: params[f"{n}{i}"] for n in LAYER_PARAMS}, heads)
            loss = x.square().mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            return loss

        compiled = torch.compile(step)
        began = time.perf_counter()
        compiled(torch.randn(batch, seq, dim))
        return time.perf_counter() - began
    except Exception as error:  # any failure means "not available here"
        print(f"torch.compile unavailable: {type(error).__name__}: {error}", file=sys.stderr)
        return None


RUN_NEEDS = ["tile", "triton"]  # what a Triton call reads (and its layouts, a few bytes)


def second_process(layers: int, args: argparse.Namespace) -> dict[str, float]:
    """Seconds until two fresh processes sharing one program cache have what a call
    needs (the tile stage: schedule and tile kernels; the Triton source): the first
    compiles and stores, the second traces and reads."""
    row = {}
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "TESSERA_CACHE_DIR": cache, "TESSERA_PROGRAM_CACHE": "1"}
        for which in ("first process s", "second process s"):
            command = [sys.executable, __file__, "--layers", str(layers), "--json"]
            command += ["--stages", *RUN_NEEDS, "--dims", *map(str, args.dims)]
            command += ["--forward"] if args.forward else []
            command += ["--regions"] if args.regions else []
            command += ["--calls"] if args.calls else []
            command += ["--model", args.model] + (["--scan"] if args.scan else [])
            done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
            row[which] = json.loads(done.stdout.splitlines()[-1])["total s"]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    parser.add_argument("--stages", nargs="+", default=STEPS)
    parser.add_argument("--repeat", type=int, default=1, help="median of this many runs")
    parser.add_argument("--forward", action="store_true", help="the forward alone")
    parser.add_argument(
        "--regions", action="store_true", help="each layer a call of one graph.region"
    )
    parser.add_argument(
        "--calls",
        action="store_true",
        help="with --regions: the training step keeps each layer a call (scan_layers=False) "
        "instead of stacking the layers and rolling them into one graph.scan",
    )
    parser.add_argument(
        "--scan", action="store_true", help="stacked parameters, the layers one graph.scan"
    )
    parser.add_argument(
        "--model",
        choices=["gpt", "llama3-405b"],
        default="gpt",
        help="llama3-405b: Llama-3-405B's step at real width on dp × tp = 2 × 8, meta tensors "
        "(--dims sets only T)",
    )
    parser.add_argument("--torch-compile", action="store_true")
    parser.add_argument("--second-process", action="store_true", help="cold and warm cache")
    parser.add_argument("--json", action="store_true", help="one JSON row per layer count")
    parser.add_argument(
        "--dims", type=int, nargs=4, default=[4, 64, 256, 4], metavar=("B", "T", "C", "HEADS")
    )
    args = parser.parse_args()
    unknown = [s for s in args.stages if s not in STEPS]
    if unknown:
        parser.error(f"unknown stages {unknown}; stages: {', '.join(STEPS)}")
    steps = sorted(args.stages, key=STEPS.index)
    if not args.json:  # measure compiling, not reading a warm cache
        os.environ["TESSERA_PROGRAM_CACHE"] = "0"
    dims = tuple(args.dims)
    rows = []
    for layers in args.layers:
        runs = [
            measure(
                layers,
                steps,
                dims,
                args.forward,
                args.regions,
                args.model,
                args.scan,
                not args.calls,
            )
            for _ in range(args.repeat)
        ]
        row = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        if args.json:
            print(json.dumps(row))
            continue
        if args.second_process:
            row |= second_process(layers, args)
        if args.torch_compile:
            seconds = torch_compile_seconds(layers, dims)
            if seconds is not None:
                row["torch.compile s"] = seconds
        rows.append((layers, row))
    if args.json:
        return
    columns = list(dict.fromkeys(c for _, row in rows for c in row))
    what = "forward" if args.forward else "training step"
    layers_as = (
        "one graph.scan"
        if args.scan
        else "graph.region calls" + (", kept as calls" if args.calls else ", stacked: one graph.scan")
        if args.regions
        else "unrolled layers"
    )
    if args.model == "llama3-405b":
        print(
            f"Llama-3-405B training step ({layers_as}), dp × tp = 2 × 8, batch 2, "
            f"T = {dims[1]}, AdamW + ZeRO-1, meta tensors, median of {args.repeat}"
        )
    else:
        print(
            f"GPT-like {what} ({layers_as}), dp × tp = 2 × 2, (B, T, C, heads) = {dims}, "
            f"median of {args.repeat}"
        )
    print("| layers | " + " | ".join(columns) + " |")
    print("|---:|" + "---:|" * len(columns))
    for layers, row in rows:
        cells = []
        for c in columns:
            value = row.get(c)
            if value is None:
                cells.append("–")
            elif c.endswith(" s") or c in ("kernels/layer", "schedule KB", "peak MiB"):
                cells.append(f"{value:.2f}" if c.endswith(" s") else f"{value:.1f}")
            else:
                cells.append(f"{int(value)}")
        print(f"| {layers} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
