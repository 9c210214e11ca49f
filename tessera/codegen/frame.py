"""A tile kernel being built (:class:`Frame`) and what every kernel class shares: block
sizes (:class:`BlockConfig`), the kernel's signature and index arithmetic.

The tile kernel's arguments are the schedule kernel's inputs, then its outputs (all as
pointers to contiguous tensors), then pointers to the body's non-splat constants (the
runtime materialises them, see :func:`pointer_constants`), then one ``i32`` per axis
group of an ``all_slice`` or an ``axis_index``: this rank's index in the group
(``positions`` attribute).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from xdsl.dialects.builtin import (
    ArrayAttr,
    DenseArrayBase,
    IntegerAttr,
    StringAttr,
    TensorType,
    i32,
    i64,
)
from xdsl.ir import SSAValue

from tessera.codegen.evaluate import Evaluator, Space
from tessera.ir import graph, schedule, tile
from tessera.ir.dense import is_splat
from tessera.ir.tile import strides
from tessera.ir.tile_builder import TileBuilder, Value
from tessera.opdefs import RankIndexMap, lookup


@dataclass(frozen=True)
class BlockConfig:
    """Block sizes and launch parameters of one kernel (autotuned on a GPU)."""

    block: int = 1024  # pointwise: elements per program
    row_elements: int = 4096  # row reductions: rows x row-block elements per program
    block_m: int = 32
    block_n: int = 32
    block_k: int = 32
    group_m: int = 8
    num_warps: int = 4
    num_stages: int = 1


DEFAULT = BlockConfig()


def next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def pointer_constants(kernel: schedule.KernelOp) -> list[graph.ConstantOp]:
    """The body's constants passed by pointer: non-splat ones and matmul operands."""
    out = []
    for op in kernel.body.block.ops:
        if isinstance(op, graph.ConstantOp):
            splat = is_splat(op.value)
            by_matmul = any(isinstance(u.operation, graph.MatmulOp) for u in op.result.uses)
            if not splat or by_matmul:
                out.append(op)
    return out


def position_axes(kernel: schedule.KernelOp) -> list[tuple[str, ...]]:
    """The mesh-axis groups whose rank index the kernel needs (those of its ops whose
    tile code is a :class:`~tessera.opdefs.RankIndexMap`: all_slice, axis_index)."""
    axes: list[tuple[str, ...]] = []
    for op in kernel.body.block.ops:
        found = lookup(op)
        if found is not None and isinstance(found.tile, RankIndexMap):
            group = tuple(op.attrs()["axes"])  # type: ignore[attr-defined]
            if group not in axes:
                axes.append(group)
    return axes


def yielded(kernel: schedule.KernelOp) -> list[SSAValue]:
    last = kernel.body.block.last_op
    assert isinstance(last, schedule.YieldOp)
    return list(last.values)


@dataclass
class Frame:
    """A tile kernel being built: its builder and its arguments by role."""

    kernel: tile.KernelOp
    b: TileBuilder
    pointers: dict[SSAValue, Value]  # kernel inputs and constants
    outputs: list[Value]
    positions: dict[tuple[str, ...], Value]

    def evaluator(self, space: Space) -> Evaluator:
        return Evaluator(self.b, space, dict(self.pointers), dict(self.positions))

    def finish(self, grid: Sequence[int], config: BlockConfig) -> tile.KernelOp:
        self.b.return_()
        self.kernel.properties["grid"] = DenseArrayBase.from_list(i64, list(grid))
        self.kernel.properties["num_warps"] = IntegerAttr(config.num_warps, i64)
        self.kernel.properties["num_stages"] = IntegerAttr(config.num_stages, i64)
        return self.kernel


def _pointer(t: TensorType) -> tile.PointerType:
    return tile.PointerType(t.element_type)


def new_frame(kernel: schedule.KernelOp) -> Frame:
    """An empty tile kernel with the schedule kernel's signature (see the module docstring)."""
    inputs = list(kernel.body.block.args)
    outputs = yielded(kernel)
    constants = [c.result for c in pointer_constants(kernel)]
    groups = position_axes(kernel)
    arg_types = [
        *(_pointer(v.type) for v in inputs),  # type: ignore[arg-type]
        *(_pointer(v.type) for v in outputs),  # type: ignore[arg-type]
        *(_pointer(v.type) for v in constants),  # type: ignore[arg-type]
        *(i32 for _ in groups),
    ]
    out = tile.KernelOp.get(kernel.kernel_name, arg_types, [1, 1, 1])
    if groups:
        out.attributes["positions"] = ArrayAttr(
            [ArrayAttr([StringAttr(a) for a in g]) for g in groups]
        )
    args = list(out.body.block.args)
    names = [f"in{i}" for i in range(len(inputs))] + [f"out{i}" for i in range(len(outputs))]
    names += [f"const{i}" for i in range(len(constants))] + [f"rank_{'_'.join(g)}" for g in groups]
    for arg, name in zip(args, names, strict=True):
        arg.name_hint = name
    n_in, n_out, n_const = len(inputs), len(outputs), len(constants)
    pointers = dict(
        zip(
            inputs + constants,
            args[:n_in] + args[n_in + n_out : n_in + n_out + n_const],
            strict=True,
        )
    )
    return Frame(
        out,
        TileBuilder(out.body.block),
        pointers,
        args[n_in : n_in + n_out],
        dict(zip(groups, args[n_in + n_out + n_const :], strict=True)),
    )


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def batch_offset(
    b: TileBuilder, dims: Sequence[int], batch_index: Sequence[Value | None]
) -> Value | None:
    """The offset of this program's batch in a contiguous ``dims`` whose batch dims (all
    but the last two) align right with ``batch_index``; None when there is none."""
    total: Value | None = None
    batch = dims[:-2]
    for d, (size, stride) in enumerate(zip(batch, strides(dims)[: len(batch)], strict=True)):
        component = batch_index[len(batch_index) - len(batch) + d]
        if size == 1 or component is None:
            continue
        term = b.mul(component, b.index(stride))
        total = term if total is None else b.add(total, term)
    return total
