"""Block configurations per kernel class, chosen by timing on a GPU (issue 5, item 3).

The first time a schedule kernel runs on a CUDA device, :func:`tune` lowers it with every
configuration of its class's small space (:func:`config_space`), compiles each distinct
source, times it with ``triton.testing.do_bench`` on the call's own arguments and keeps
the fastest. Configurations that fail to compile or launch (too much shared memory, too
many registers) are skipped. The choice is cached per (source of the kernel lowered with
the default configuration, its function renamed, argument types, device name): in memory,
and on disk as ``autotune/<sha256>.json`` under the cache root (the chosen block configuration),
so a kernel of the same shapes is tuned once per machine, whatever its name, and every
rank of a job and every later process reads the choice instead of tuning again. A file
that does not hold a valid configuration is ignored (and overwritten by the next tuning). Under Triton's interpreter (CPU tensors) nothing
is tuned: the runtime runs the tile kernel lowered with the default
:class:`~tessera.codegen.kernels.BlockConfig`.

Set ``TESSERA_AUTOTUNE=0`` to run the default configuration on the GPU as well.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xdsl.transforms.dead_code_elimination import region_dce

from tessera import environment
from tessera.backends.triton.compiled_kernel import CompiledKernel
from tessera.cache_location import cache_directory
from tessera.codegen.kernels import DEFAULT, BlockConfig, kernel_class, lower_kernel, next_pow2
from tessera.errors import TesseraError
from tessera.ir import graph, schedule, tile
from tessera.ir.abstract import AbstractTensor

# (block_m, block_n, block_k, num_warps, num_stages): Triton's matmul tutorial configs for
# Hopper/Ampere, plus the 8-warp 128x128 and 256x128 tiles that suit bf16 on H100.
MATMUL_TILES = (
    (128, 256, 64, 8, 3),
    (256, 128, 64, 8, 3),
    (128, 128, 64, 8, 4),
    (128, 128, 64, 4, 4),
    (128, 128, 32, 4, 4),
    (64, 256, 32, 4, 4),
    (64, 128, 64, 4, 4),
    (128, 64, 32, 4, 4),
    (64, 64, 32, 4, 5),
    (64, 32, 32, 2, 5),
)
POINTWISE_BLOCKS = (512, 1024, 2048, 4096, 8192)
ATTENTION_BLOCKS = (64, 128)
ATTENTION_BACKWARD_BLOCKS = (32, 64, 128)
WARPS = (2, 4, 8, 16)
POINTWISE_PER_THREAD = (4, 16)  # elements per thread of the pointwise configs tried
REDUCTION_PER_THREAD = (2, 64)  # elements per thread of the reduction configs tried
ROWS_PER_PROGRAM = (1, 2, 4, 8, 16)
MAX_REDUCTION_BLOCK = 16384  # rows x row-block elements, unless one row is larger
SHARED_MEMORY = 232448  # bytes per block (H100 opt-in); the device's own value when known


def _element_bytes(value: Any) -> int:
    return AbstractTensor.from_xdsl(value.type).dtype.itemsize


def _reduced_width(kernel: schedule.KernelOp) -> int:
    from tessera.codegen.kernels import reduced_axes, row_reduction

    op = row_reduction(kernel)
    full = AbstractTensor.from_xdsl(op.operands[0].type).shape
    return math.prod(full[d] for d in reduced_axes(op))


def _warps(elements: int, per_thread: tuple[int, int]) -> list[int]:
    """The warp counts giving each thread between ``per_thread`` elements of a block (the
    fewest or the most warps when none does)."""
    low, high = per_thread
    fitting = [w for w in WARPS if low <= elements // (32 * w) <= high]
    if fitting:
        return fitting
    return [WARPS[0]] if elements // (32 * WARPS[0]) < low else [WARPS[-1]]


def config_space(
    kernel: schedule.KernelOp, shared_memory: int = SHARED_MEMORY
) -> list[BlockConfig]:
    """The configurations tried for ``kernel``, by its class (the default is not among them;
    :func:`candidates` adds it)."""
    kind = kernel_class(kernel)
    if kind == "matmul":
        op = next(o for o in kernel.body.block.ops if isinstance(o, graph.MatmulOp))
        size = _element_bytes(op.operands[0])
        return [
            BlockConfig(block_m=m, block_n=n, block_k=k, num_warps=w, num_stages=s)
            for m, n, k, w, s in MATMUL_TILES
            if s * (m * k + k * n) * size <= shared_memory
        ]
    if kind == "pointwise":
        return [
            BlockConfig(block=block, num_warps=w)
            for block in POINTWISE_BLOCKS
            for w in _warps(block, POINTWISE_PER_THREAD)
        ]
    if kind == "reduction":
        row = next_pow2(_reduced_width(kernel))
        out = []
        for rows in ROWS_PER_PROGRAM:
            elements = rows * row
            if rows > 1 and elements > MAX_REDUCTION_BLOCK:
                break
            out += [
                BlockConfig(row_elements=elements, num_warps=w)
                for w in _warps(elements, REDUCTION_PER_THREAD)
            ]
        return out
    if kind == "attention":
        return [
            BlockConfig(block_m=m, block_n=n, num_warps=w, num_stages=s)
            for m in ATTENTION_BLOCKS
            for n in ATTENTION_BLOCKS
            for w in (4, 8)
            for s in (2, 3)
        ]
    if kind == "attention_backward":  # dk, dv and dq accumulators: smaller blocks
        return [
            BlockConfig(block_m=m, block_n=n, num_warps=w, num_stages=s)
            for m in ATTENTION_BACKWARD_BLOCKS
            for n in ATTENTION_BACKWARD_BLOCKS
            for w in (4, 8)
            for s in (1, 2)
        ]
    raise TesseraError(f"no configuration space for kernel class {kind!r}")


def lower(kernel: schedule.KernelOp, config: BlockConfig = DEFAULT) -> tile.KernelOp:
    """``kernel``'s tile kernel with ``config`` (as ``lower-schedule-to-tile`` builds it)."""
    lowered = lower_kernel(kernel, config)
    region_dce(lowered.body)
    return lowered


def _signature(kernel: tile.KernelOp) -> str:
    return ", ".join(str(a.type) for a in kernel.body.block.args)


def tuning_key(kernel: schedule.KernelOp, device_name: str) -> tuple[str, str, str]:
    """The cache key: default-config source with the function renamed (identical kernels
    of two programs share it), argument types (the source does not hold the pointers'
    element types) and device."""
    default = lower(kernel)
    source = CompiledKernel.from_tile(default).source
    source = source.replace(f"def {default.kernel_name}(", "def kernel(", 1)
    return source, _signature(default), device_name


def candidates(
    kernel: schedule.KernelOp, shared_memory: int = SHARED_MEMORY
) -> list[tuple[BlockConfig, CompiledKernel]]:
    """The default configuration and ``kernel``'s space, one per distinct compiled kernel
    (block sizes are clamped to the shapes, so many configurations coincide)."""
    out: list[tuple[BlockConfig, CompiledKernel]] = []
    seen: set[tuple[str, int, int, tuple[int, ...]]] = set()
    for config in [DEFAULT, *config_space(kernel, shared_memory)]:
        try:
            compiled = CompiledKernel.from_tile(lower(kernel, config))
        except TesseraError:
            continue
        key = (compiled.source, compiled.num_warps, compiled.num_stages, compiled.grid)
        if key not in seen:
            seen.add(key)
            out.append((config, compiled))
    return out


@dataclass
class Tuning:
    """One kernel's tuning: the chosen configuration and what every candidate measured."""

    name: str
    config: BlockConfig
    compiled: CompiledKernel
    timings: list[tuple[BlockConfig, float]] = field(default_factory=list)  # ms, fastest first
    failed: list[tuple[BlockConfig, str]] = field(default_factory=list)
    seconds: float = 0.0  # wall time spent tuning (compiling and timing)


_CHOICES: dict[tuple[str, str, str], Tuning] = {}


def enabled() -> bool:
    return environment.autotune()


def cached(kernel: schedule.KernelOp, device_name: str) -> Tuning | None:
    return _CHOICES.get(tuning_key(kernel, device_name))


def _choice_path(key: tuple[str, str, str]) -> Path:
    digest = hashlib.sha256("\0".join(key).encode()).hexdigest()
    return cache_directory("autotune") / f"{digest}.json"


def _load_choice(kernel: schedule.KernelOp, key: tuple[str, str, str]) -> Tuning | None:
    """The tuning stored on disk for ``key``, when the file holds a valid configuration."""
    path = _choice_path(key)
    try:
        stored = json.loads(path.read_text(encoding="utf-8"))
        fields = stored["config"]
        names = {f.name for f in dataclasses.fields(BlockConfig)}
        if set(fields) != names or not all(
            type(v) is int and 1 <= v <= 1 << 20 for v in fields.values()
        ):
            return None
        config = BlockConfig(**fields)
        compiled = CompiledKernel.from_tile(lower(kernel, config))
    except (OSError, ValueError, KeyError, TypeError, TesseraError):
        return None
    return Tuning(kernel.kernel_name, config, compiled, seconds=0.0)


def _store_choice(key: tuple[str, str, str], tuning: Tuning) -> None:
    path = _choice_path(key)
    record = {
        "config": dataclasses.asdict(tuning.config),
        "device": key[2],
        "timings_ms": [[dataclasses.asdict(c), ms] for c, ms in tuning.timings],
    }
    try:
        temporary = path.with_suffix(f".{os.getpid()}.tmp")
        temporary.write_text(json.dumps(record), encoding="utf-8")
        temporary.replace(path)
    except OSError:  # a read-only cache only costs tuning again
        pass


def clear_cache() -> None:
    _CHOICES.clear()


def time_ms(
    compiled: CompiledKernel, args: Sequence[Any], warmup: int = 10, rep: int = 40
) -> float:
    """Median time of one launch of ``compiled`` on ``args`` (``triton.testing.do_bench``;
    the first launch compiles and is not timed)."""
    from triton.testing import do_bench

    return float(
        do_bench(lambda: compiled.launch(args), warmup=warmup, rep=rep, return_mode="median")
    )


def _device(args: Sequence[Any]) -> Any:
    import torch

    return next(a.device for a in args if isinstance(a, torch.Tensor) and a.is_cuda)


def tune(kernel: schedule.KernelOp, args: Sequence[Any]) -> Tuning:
    """The fastest of ``kernel``'s candidates on ``args`` (on their CUDA device), cached.

    ``args`` are the tile kernel's arguments: inputs, outputs (overwritten by every
    candidate), constants and rank positions; they are the same for every configuration.
    """
    import torch

    device = _device(args)
    properties = torch.cuda.get_device_properties(device)
    shared = getattr(properties, "shared_memory_per_block_optin", 0) or SHARED_MEMORY
    with torch.cuda.device(device):
        return choose(kernel, properties.name, lambda c: time_ms(c, args), shared)


def choose(
    kernel: schedule.KernelOp,
    device_name: str,
    measure: Callable[[CompiledKernel], float],
    shared_memory: int = SHARED_MEMORY,
) -> Tuning:
    """The candidate of ``kernel`` that ``measure`` (ms; raising when it cannot compile or
    run) finds fastest, remembered per :func:`tuning_key`."""
    key = tuning_key(kernel, device_name)
    if key in _CHOICES:
        return _CHOICES[key]
    stored = _load_choice(kernel, key)
    if stored is not None:
        _CHOICES[key] = stored
        return stored
    start = time.perf_counter()
    timings: list[tuple[BlockConfig, float]] = []
    failed: list[tuple[BlockConfig, str]] = []
    best: tuple[float, BlockConfig, CompiledKernel] | None = None
    for config, compiled in candidates(kernel, shared_memory):
        try:
            ms = measure(compiled)
        except Exception as error:  # compile or launch failure: skip this configuration
            failed.append((config, f"{type(error).__name__}: {str(error)[:200]}"))
            continue
        timings.append((config, ms))
        if best is None or ms < best[0]:
            best = (ms, config, compiled)
    if best is None:
        reasons = "; ".join(f"{c}: {e}" for c, e in failed)
        raise TesseraError(f"@{kernel.kernel_name}: no configuration compiled ({reasons})")
    timings.sort(key=lambda t: t[1])
    tuning = Tuning(
        kernel.kernel_name, best[1], best[2], timings, failed, time.perf_counter() - start
    )
    _CHOICES[key] = tuning
    _store_choice(key, tuning)
    return tuning
