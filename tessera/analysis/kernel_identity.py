"""Structural identity of scheduled kernels: which ``schedule.kernel`` ops compute the same
thing, whatever their name and position in the program.

Two kernels are *structurally identical* when their bodies have the same ops in the same
order, with the same operand wiring, result types, properties and attributes, and the
same input types. Identical layers of a model produce identical kernels (the matmul of
layer 3 and of layer 17), so ``lower-schedule-to-tile`` lowers each class once and the
runtime compiles and autotunes one Triton kernel per class.
"""

from __future__ import annotations

from collections.abc import Hashable

from xdsl.ir import Block, SSAValue

from tessera.ir import schedule


def structural_key(kernel: schedule.KernelOp) -> Hashable:
    """A hashable value equal for exactly the structurally identical kernels.

    Values are numbered in definition order (block arguments, then op results), so
    SSA names and name hints do not matter; attributes are compared as values."""
    numbers: dict[SSAValue, int] = {}

    def number_block(block: Block) -> tuple[Hashable, ...]:
        for arg in block.args:
            numbers[arg] = len(numbers)
        return tuple(arg.type for arg in block.args)

    parts: list[Hashable] = [number_block(kernel.body.block)]
    for op in kernel.body.walk():
        operands = tuple(numbers.get(v, -1) for v in op.operands)
        for result in op.results:
            numbers[result] = len(numbers)
        parts.append(
            (
                op.name,
                operands,
                tuple(r.type for r in op.results),
                tuple(sorted(op.properties.items())),
                tuple(sorted(op.attributes.items())),
                tuple(number_block(b) for r in op.regions for b in r.blocks),
            )
        )
    return tuple(parts)


__all__ = ["structural_key"]
