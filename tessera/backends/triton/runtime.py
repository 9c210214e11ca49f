"""Runs tile kernels as a schedule ``KernelRunner`` (:class:`TritonKernels`).

Each kernel's Triton source is compiled once (:mod:`.compiled_kernel`, cached on disk by
content hash). CUDA tensors run the compiled kernel; CPU tensors run it in Triton's
interpreter (the same source, numpy semantics), which is how every kernel is checked on
machines without a GPU. On a GPU each kernel's block sizes are autotuned at its first
call (:mod:`.autotune`); the interpreter always runs the default configuration.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from xdsl.dialects.builtin import ModuleOp

from tessera.backends.reference import index_check
from tessera.backends.schedule_runner import (
    BoundKernel,
    Buffers,
    KernelContext,
    compile_block,
)
from tessera.backends.triton import autotune as autotune_module
from tessera.backends.triton.compiled_kernel import (  # re-exported: runtime.load_source, ...
    CompiledKernel,
    cache_dir,
    load_source,
    patch_interpreter_bf16,
)
from tessera.codegen.kernels import pointer_constants, position_axes
from tessera.errors import ExecutionError
from tessera.ir import schedule, tile
from tessera.ir.abstract import AbstractTensor
from tessera.opdefs import op_def
from tessera.perf.compute_cost import runs_as_view, runs_on_host


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
        self.autotune = autotune_module.enabled() if autotune is None else autotune
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
                self.tuned[key] = autotune_module.tune(kernel, list(args))
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


__all__ = [
    "CompiledKernel",
    "TritonKernels",
    "cache_dir",
    "load_source",
    "patch_interpreter_bf16",
]
