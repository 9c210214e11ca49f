"""Compiles tile kernels' Triton source and runs them as a schedule ``KernelRunner``.

Source is written once per content hash under the cache directory
(``triton/`` under ``TESSERA_CACHE_DIR``, default ``~/.cache/tessera``) and imported from there,
because ``triton.jit`` reads a kernel's source from its file; a cached file is compared
with the source before it is imported, and rewritten when it differs. CUDA tensors run the
compiled kernel; CPU tensors run it in Triton's interpreter (the same source, numpy
semantics), which is how every kernel is checked on machines without a GPU. On a GPU
each kernel's block sizes are autotuned at its first call (:mod:`.autotune`); the
interpreter always runs the default configuration.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

if not torch.cuda.is_available():  # Triton's interpreter must be chosen before triton is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

from xdsl.dialects.builtin import ModuleOp

from tessera.backends.reference import index_check
from tessera.backends.schedule_runner import (
    BoundKernel,
    Buffers,
    KernelContext,
    compile_block,
)
from tessera.backends.triton.emit import emit_kernel
from tessera.cache_location import cache_directory
from tessera.codegen.kernels import pointer_constants, position_axes
from tessera.errors import ExecutionError
from tessera.ir import schedule, tile
from tessera.ir.abstract import AbstractTensor
from tessera.ops import op_def
from tessera.perf.compute_cost import runs_as_view, runs_on_host


def cache_dir() -> Path:
    """Where kernel sources are written: ``triton/`` under the cache root."""
    return cache_directory("triton")


_MODULES: dict[str, Any] = {}


def load_source(name: str, source: str) -> Any:
    """The ``triton.jit`` function ``name`` defined by ``source`` (cached by content hash)."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:24]
    if digest not in _MODULES:
        directory = cache_dir()
        path = directory / f"{name}_{digest}.py"
        if not _holds(path, source):  # missing, or not what its name promises: rewrite
            temporary = path.with_suffix(f".{os.getpid()}.tmp")
            temporary.write_text(source, encoding="utf-8")
            temporary.replace(path)
        spec = importlib.util.spec_from_file_location(f"tessera_triton_{digest}", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _MODULES[digest] = module
    return getattr(_MODULES[digest], name)


def _holds(path: Path, source: str) -> bool:
    """Whether the cached file holds exactly ``source`` (the import runs the file, so a
    file changed after it was written must never be imported)."""
    try:
        return path.read_bytes() == source.encode()
    except OSError:
        return False


@dataclass
class CompiledKernel:
    """A tile kernel's source, compiled function and launch parameters."""

    name: str
    source: str
    grid: tuple[int, ...]
    num_warps: int
    num_stages: int
    positions: list[tuple[str, ...]]
    function: Any = None

    @staticmethod
    def from_tile(kernel: tile.KernelOp, source: str | None = None) -> CompiledKernel:
        """The kernel to launch; ``source`` is its Triton source when already emitted."""
        positions = kernel.attributes.get("positions")
        return CompiledKernel(
            kernel.kernel_name,
            emit_kernel(kernel) if source is None else source,
            kernel.grid_size,
            kernel.num_warps.value.data,
            kernel.num_stages.value.data,
            [tuple(a.data for a in group) for group in positions.data] if positions else [],  # type: ignore[union-attr]
        )

    def launch(self, args: Sequence[Any]) -> None:
        """Runs the kernel on ``args`` (tensors and ints), compiled on CUDA, else
        interpreted; a grid without programs (an empty output) launches nothing."""
        if 0 in self.grid:
            return
        if self.function is None:
            self.function = load_source(self.name, self.source)
        on_gpu = any(isinstance(a, torch.Tensor) and a.is_cuda for a in args)
        if on_gpu:
            self.function[self.grid](*args, num_warps=self.num_warps, num_stages=self.num_stages)
            return
        import triton.language as tl

        if (
            type(self.function).__name__ != "InterpretedFunction"
            or type(tl.sum).__name__ != "InterpretedFunction"
        ):
            raise ExecutionError(
                f"@{self.name}: CPU tensors need Triton's interpreter, but triton was imported "
                "without TRITON_INTERPRET=1 (import tessera before anything that imports triton, "
                "or set TRITON_INTERPRET=1)"
            )
        patch_interpreter_bf16()
        with np.errstate(all="ignore"):  # masked-off lanes compute on zeros, as on a GPU
            self.function[self.grid](*args)


def patch_interpreter_bf16() -> None:
    """Two bf16 bugs of Triton's interpreter (3.6-3.9): ``tl.dot`` multiplies bf16 blocks
    as their raw uint16 bits (we convert them to f32 first, as the GPU's bf16 MMA is
    exact), and f32 -> bf16 conversion truncates (we round to nearest even, as GPUs do)."""
    from triton import language as tl
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    if getattr(builder.create_dot, "_tessera_bf16", False):
        return
    original = builder.create_dot

    def create_dot(self: Any, a: Any, b: Any, d: Any, *args: Any) -> Any:
        def widen(x: Any) -> Any:
            if x.dtype.scalar == tl.bfloat16:
                data = interpreter._convert_float(x.data, tl.bfloat16, tl.float32, None).view(
                    np.float32
                )
                return interpreter.TensorHandle(data, tl.float32)
            return x

        return original(self, widen(a), widen(b), d, *args)

    create_dot._tessera_bf16 = True  # type: ignore[attr-defined]
    builder.create_dot = create_dot

    # f32 -> bf16 conversions truncate in the interpreter; the GPU rounds to nearest even
    cast = builder.cast_impl

    def cast_impl(self: Any, src: Any, dst_type: Any) -> Any:
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            f32 = np.ascontiguousarray(src.data, dtype=np.float32)
            bits = f32.view(np.uint32).astype(np.uint64)
            rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
            data = np.where(np.isnan(f32), np.uint16(0x7FC0), rounded).astype(np.uint16)
            return interpreter.TensorHandle(data, dst_type.scalar)
        return cast(self, src, dst_type)

    builder.cast_impl = cast_impl


def _torch_dtype(t: Any) -> torch.dtype:
    return AbstractTensor.from_xdsl(t).dtype.to_torch()


class TritonKernels:
    """A ``KernelRunner`` running each schedule kernel's tile kernel from one module.

    CPU tensors run the module's tile kernel (lowered with the pass's block configuration,
    the default one unless options were given) in Triton's interpreter. CUDA tensors run
    the configuration :mod:`~tessera.backends.triton.autotune` chose for the kernel on that
    device, tuned at its first call (``autotune=False`` or ``TESSERA_AUTOTUNE=0``: the
    module's tile kernel, compiled). A kernel that only reshapes or slices a contiguous
    block runs as a torch view, without a launch.
    """

    def __init__(
        self,
        module: ModuleOp,
        autotune: bool | None = None,
        sources: Mapping[str, str] | None = None,
    ):
        from tessera.backends.triton import autotune as tuning

        self.tiles = {op.kernel_name: op for op in module.walk() if isinstance(op, tile.KernelOp)}
        self.sources = dict(sources or {})  # kernel -> its Triton source, when known
        # schedule kernel -> its tile kernel (identical kernels share one); the kernels
        # run may come from the schedule stage's module, which does not name them
        self.tile_names = {
            op.kernel_name: op.tile_kernel_name
            for op in module.walk()
            if isinstance(op, schedule.KernelOp)
        }
        self.compiled: dict[str, CompiledKernel] = {}
        self.constants: dict[tuple[str, str], list[torch.Tensor]] = {}
        self.signatures: dict[
            str, tuple[list[tuple[tuple[int, ...], torch.dtype]], list[tuple[str, ...]]]
        ] = {}
        self.autotune = tuning.enabled() if autotune is None else autotune
        self.tuned: dict[tuple[str, str], Any] = {}  # (kernel, device) -> autotune.Tuning
        self.views: dict[str, bool] = {}  # kernel -> whether it runs as a torch view

    uses_buffers = True  # launched kernels write outputs into the buffers plans offer

    def kernel(self, name: str) -> CompiledKernel:
        """The module's tile kernel ``name`` (the interpreter's, and the untuned GPU's)."""
        if name not in self.compiled:
            if name not in self.tiles:
                raise ExecutionError(f"no tile kernel @{name}: run lower-schedule-to-tile first")
            self.compiled[name] = CompiledKernel.from_tile(self.tiles[name], self.sources.get(name))
        return self.compiled[name]

    def tile_name(self, kernel: schedule.KernelOp) -> str:
        """The tile kernel implementing ``kernel`` (identical kernels share one)."""
        return self.tile_names.get(kernel.kernel_name, kernel.tile_kernel_name)

    def _constants(self, kernel: schedule.KernelOp, device: torch.device) -> list[torch.Tensor]:
        key = (self.tile_name(kernel), str(device))
        if key not in self.constants:
            self.constants[key] = [
                op_def(c).reference(c).contiguous().to(device) for c in pointer_constants(kernel)
            ]
        return self.constants[key]

    def _signature(
        self, kernel: schedule.KernelOp
    ) -> tuple[list[tuple[tuple[int, ...], torch.dtype]], list[tuple[str, ...]]]:
        """The output shapes and dtypes of ``kernel``'s tile kernel and the axes of its
        rank positions (reading types is slow: once per tile kernel)."""
        name = self.tile_name(kernel)
        if name not in self.signatures:
            results = [(tuple(r.type.get_shape()), _torch_dtype(r.type)) for r in kernel.results]  # type: ignore[attr-defined]
            self.signatures[name] = (results, position_axes(kernel))
        return self.signatures[name]

    def prepare(
        self, kernel: schedule.KernelOp, inputs: Sequence[torch.Tensor], context: KernelContext
    ) -> tuple[CompiledKernel, list[Any], list[torch.Tensor]]:
        """The compiled kernel to launch, its arguments and the (new) output tensors; on
        CUDA with autotuning, the first call of a kernel tunes it on these arguments."""
        device = inputs[0].device if inputs else _device_without_inputs()
        results, groups = self._signature(kernel)
        outputs = [torch.empty(shape, dtype=dtype, device=device) for shape, dtype in results]
        positions = [context.position(axes)[0] for axes in groups]
        args = [
            *(x.contiguous() for x in inputs),
            *outputs,
            *self._constants(kernel, device),
            *positions,
        ]
        return self._compiled(kernel, device, args), args, outputs

    def _compiled(
        self, kernel: schedule.KernelOp, device: torch.device, args: Sequence[Any]
    ) -> CompiledKernel:
        """The kernel to launch on ``device``: tuned on ``args`` at its first CUDA call
        when autotuning, else the module's tile kernel."""
        name = self.tile_name(kernel)
        if device.type == "cuda" and self.autotune:
            key = (name, str(device))
            if key not in self.tuned:
                from tessera.backends.triton import autotune

                self.tuned[key] = autotune.tune(kernel, list(args))
            return self.tuned[key].compiled
        return self.kernel(name)

    def bind(
        self,
        kernel: schedule.KernelOp,
        context: KernelContext,
        device: torch.device,
        outputs: Buffers = None,
    ) -> BoundKernel:
        """``kernel`` for one rank on ``device``, everything read from the IR once: its
        shared compiled kernel, output shapes and dtypes, constants and rank positions;
        a view kernel as its torch view calls. Outputs given a buffer are written there
        (the same tensor every call), the others allocated per call. Kernels reading
        gather indices or cross-entropy labels first check their range (a generated
        kernel would read out of bounds). A kernel whose outputs are all empty launches
        nothing: it returns its (empty) outputs."""
        if self._is_view(kernel):  # no launch: a view of the (contiguous) input, or
            # a host kernel (its ops' references)
            view = compile_block(kernel.body.block, context, kernel.kernel_name)
            return lambda *inputs: view(*(x.contiguous() for x in inputs))
        results, groups = self._signature(kernel)
        if all(0 in shape for shape, _ in results):
            empty_outputs = [
                torch.empty(shape, dtype=dtype, device=device) for shape, dtype in results
            ]
            return lambda *inputs: list(empty_outputs)
        constants = self._constants(kernel, device)
        positions = [context.position(axes)[0] for axes in groups]
        check = index_check(kernel.body.block)
        compiled: CompiledKernel | None = None
        if device.type != "cuda" or not self.autotune:
            compiled = self.kernel(self.tile_name(kernel))
        empty = torch.empty
        buffers = list(outputs) if outputs is not None else [None] * len(results)
        if len(buffers) != len(results):
            raise ExecutionError(
                f"@{kernel.kernel_name}: {len(buffers)} output buffers for {len(results)} outputs"
            )
        fixed = buffers if all(b is not None for b in buffers) else None

        def run(*inputs: torch.Tensor) -> list[torch.Tensor]:
            nonlocal compiled
            if check is not None:
                check(inputs)
            outputs = fixed or [
                empty(shape, dtype=dtype, device=device) if buffer is None else buffer
                for (shape, dtype), buffer in zip(results, buffers, strict=True)
            ]
            args = [*(x.contiguous() for x in inputs), *outputs, *constants, *positions]
            if compiled is None:  # CUDA with autotuning: tuned at the first call
                compiled = self._compiled(kernel, device, args)
            compiled.launch(args)
            return outputs

        return run

    def _is_view(self, kernel: schedule.KernelOp) -> bool:
        name = self.tile_name(kernel)
        if name not in self.views:
            self.views[name] = runs_as_view(kernel) or runs_on_host(kernel)
        return self.views[name]

    def __call__(
        self, kernel: schedule.KernelOp, inputs: Sequence[torch.Tensor], context: KernelContext
    ) -> list[torch.Tensor]:
        """Runs ``kernel`` once (binding it first)."""
        device = inputs[0].device if inputs else _device_without_inputs()
        return list(self.bind(kernel, context, device)(*inputs))


def _device_without_inputs() -> torch.device:
    """Where a kernel without inputs (a constant) runs: the GPU when Triton compiles for
    one (not interpreted), else the CPU."""
    interpreted = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    return (
        torch.device("cuda")
        if torch.cuda.is_available() and not interpreted
        else torch.device("cpu")
    )
