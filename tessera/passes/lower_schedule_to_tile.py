"""``lower-schedule-to-tile``: a ``tile.kernel`` for every distinct ``schedule.kernel``.

Each scheduled kernel is lowered by its class (``codegen.kernels``): pointwise,
row reduction, matmul with epilogue, or flash attention. Structurally identical kernels
(:func:`tessera.analysis.kernel_identity.structural_key`: same ops, wiring, shapes,
dtypes and attributes, wherever they are in the program, e.g. the same matmul in every
layer) are lowered once: the first one's tile kernel is appended to the module under its
name, and every other one gets a ``schedule.tile_kernel = @first`` attribute naming it (a
kernel whose name another symbol of the module has, a function's or another function's
kernel's, gets its tile kernel under a fresh name, ``@name_1``, given the same way).
The schedule keeps its graph bodies, which remain the reference the generated kernels
are tested against. Block sizes are the options (the runtime autotunes them on a GPU);
dead index arithmetic is removed. A kernel that only reshapes or slices a contiguous
block (``perf.compute_cost.runs_as_view``) gets no tile kernel: the runtime makes it a
torch view of its input; nor does a kernel of an op without tile code
(``runs_on_host``: MoE routing), which the runtime runs by its references.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp, StringAttr, SymbolRefAttr
from xdsl.passes import ModulePass
from xdsl.transforms.dead_code_elimination import region_dce
from xdsl.utils.exceptions import PassFailedException

from tessera.analysis.kernel_identity import structural_key
from tessera.codegen.kernels import BlockConfig, lower_kernel
from tessera.errors import TesseraError
from tessera.ir import schedule, tile
from tessera.ir.limits import MAX_GRID
from tessera.ir.located_error import LocatedPassFailure
from tessera.perf.compute_cost import runs_as_view, runs_on_host


@dataclass(frozen=True)
class LowerScheduleToTilePass(ModulePass):
    """Lowers every distinct schedule.kernel to a tile.kernel (pointwise, reduction,
    matmul, attention); identical kernels share one."""

    name = "lower-schedule-to-tile"
    block: int = BlockConfig.block
    row_elements: int = BlockConfig.row_elements
    block_m: int = BlockConfig.block_m
    block_n: int = BlockConfig.block_n
    block_k: int = BlockConfig.block_k
    num_warps: int = BlockConfig.num_warps

    def __post_init__(self) -> None:
        for option in ("block", "row_elements", "block_m", "block_n", "block_k"):
            if getattr(self, option) < 1:
                raise ValueError(f"{option} must be positive, found {getattr(self, option)}")
        if self.num_warps not in tile.NUM_WARPS:
            raise ValueError(f"num_warps must be one of {tile.NUM_WARPS}, found {self.num_warps}")

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        config = BlockConfig(
            block=self.block,
            row_elements=self.row_elements,
            block_m=self.block_m,
            block_n=self.block_n,
            block_k=self.block_k,
            num_warps=self.num_warps,
        )
        existing = {k.kernel_name for k in op.ops if isinstance(k, tile.KernelOp)}
        symbols = {
            s.data for o in op.ops if isinstance(s := o.get_attr_or_prop("sym_name"), StringAttr)
        }
        lowered_as: dict[Hashable, str] = {}  # structural key -> its tile kernel's name
        for function in list(op.ops):
            for kernel in function.walk():
                if not isinstance(kernel, schedule.KernelOp):
                    continue
                if kernel.tile_kernel_name in existing or runs_as_view(kernel) or runs_on_host(kernel):
                    continue  # lowered by an earlier run, a torch view or a host kernel
                key = structural_key(kernel)
                if key in lowered_as:
                    shared = SymbolRefAttr(lowered_as[key])
                    kernel.attributes[schedule.TILE_KERNEL] = shared
                    continue
                lowered = _lower(kernel, config)
                name = _unused_symbol(kernel.kernel_name, symbols)
                if name != kernel.kernel_name:  # the name is a function's, or another kernel's
                    kernel.attributes[schedule.TILE_KERNEL] = SymbolRefAttr(name)
                    lowered.properties["sym_name"] = StringAttr(name)
                symbols.add(name)
                lowered_as[key] = name
                op.body.block.add_op(lowered)


def _unused_symbol(name: str, symbols: set[str]) -> str:
    """``name``, or ``name_<n>`` with the least ``n`` that names no symbol yet."""
    suffix = 0
    candidate = name
    while candidate in symbols:
        suffix += 1
        candidate = f"{name}_{suffix}"
    return candidate


def _lower(kernel: schedule.KernelOp, config: BlockConfig) -> tile.KernelOp:
    try:
        lowered = lower_kernel(kernel, config)
    except TesseraError as error:
        message = str(error)
        if not message.startswith(f"@{kernel.kernel_name}"):
            message = f"@{kernel.kernel_name}: {message}"
        raise PassFailedException(f"lower-schedule-to-tile: {message}") from None
    grid = list(lowered.grid_size)
    if any(g > limit for g, limit in zip(grid, MAX_GRID, strict=True)):
        advice = "; larger blocks need fewer programs" if grid[0] > MAX_GRID[0] else ""
        raise LocatedPassFailure(
            kernel,
            f"lower-schedule-to-tile: @{kernel.kernel_name} needs a grid of {grid} programs, "
            f"more than CUDA's limits {list(MAX_GRID)}{advice}",
        )
    region_dce(lowered.body)
    return lowered
