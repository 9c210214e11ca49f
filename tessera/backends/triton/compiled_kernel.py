"""A tile kernel's Triton source, compiled once and launched (compiled on CUDA, else
interpreted).

Source is written once per content hash under the cache directory (``triton/`` under
``TESSERA_CACHE_DIR``, default ``~/.cache/tessera``) and imported from there, because
``triton.jit`` reads a kernel's source from its file; a cached file is compared with the
source before it is imported, and rewritten when it differs. Both the runtime
(:mod:`.runtime`) and the autotuner (:mod:`.autotune`) launch :class:`CompiledKernel`.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

if not torch.cuda.is_available():  # Triton's interpreter must be chosen before triton is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

from tessera.backends.triton.emit import emit_kernel
from tessera.cache_location import cache_directory
from tessera.errors import ExecutionError
from tessera.ir import tile


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


__all__ = ["CompiledKernel", "cache_dir", "load_source", "patch_interpreter_bf16"]
