"""``lower-schedule-to-tile``: a ``tile.kernel`` for every ``schedule.kernel``.

Each scheduled kernel is lowered by its class (``codegen.kernels``): pointwise,
row reduction, matmul with epilogue, or flash attention. The tile kernels are appended
to the module under the schedule kernels' names; the schedule keeps its graph bodies,
which remain the reference the generated kernels are tested against. Block sizes are
the options (the runtime autotunes them on a GPU); dead index arithmetic is removed.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass
from xdsl.transforms.dead_code_elimination import region_dce
from xdsl.utils.exceptions import PassFailedException

from tessera.codegen.kernels import BlockConfig, lower_kernel
from tessera.errors import TesseraError
from tessera.ir import schedule, tile


@dataclass(frozen=True)
class LowerScheduleToTilePass(ModulePass):
    """Lowers every schedule.kernel to a tile.kernel (pointwise, reduction, matmul, attention)."""

    name = "lower-schedule-to-tile"
    block: int = BlockConfig.block
    row_elements: int = BlockConfig.row_elements
    block_m: int = BlockConfig.block_m
    block_n: int = BlockConfig.block_n
    block_k: int = BlockConfig.block_k
    num_warps: int = BlockConfig.num_warps

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        config = BlockConfig(
            block=self.block,
            row_elements=self.row_elements,
            block_m=self.block_m,
            block_n=self.block_n,
            block_k=self.block_k,
            num_warps=self.num_warps,
        )
        existing = {k.kernel_name for k in op.walk() if isinstance(k, tile.KernelOp)}
        kernels = [
            k
            for k in op.walk()
            if isinstance(k, schedule.KernelOp) and k.kernel_name not in existing
        ]
        for kernel in kernels:
            try:
                lowered = lower_kernel(kernel, config)
            except TesseraError as error:
                message = str(error)
                if not message.startswith(f"@{kernel.kernel_name}"):
                    message = f"@{kernel.kernel_name}: {message}"
                raise PassFailedException(f"lower-schedule-to-tile: {message}") from None
            region_dce(lowered.body)
            op.body.block.add_op(lowered)
