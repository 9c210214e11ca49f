"""Evaluates the graph ops of a kernel body at an index of a tile *space*.

A kernel iterates a :class:`Space`: a global shape, and for each of its dims the index a
program works on, as a tile value (a scalar, or a block along one of the space's block
axes). :meth:`Evaluator.at` computes a graph value at an index of its own shape by
walking back through the body (index passing, as Inductor's loop bodies do):

- an elementwise op evaluates its operands at the broadcast-adjusted index and applies
  its :class:`~tessera.opdefs.Pointwise` tile code (float math in f32, like Triton kernels);
- a layout op maps the index with its :class:`~tessera.opdefs.IndexMap` tile code
  (transpose permutes it, slice scales and shifts it, reshape goes through the flat
  offset, all_slice adds this rank's offset, gather loads the indices, concat selects
  among its operands); a splat constant's index map gives its scalar;
- a kernel input or a non-splat constant is loaded from its pointer, masked to the space;
- a value the kernel computed otherwise (a matmul accumulator, a row reduction) is
  taken from :attr:`Evaluator.bound`.

Results are memoised per (value, index), so a value used twice is computed once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from xdsl.dialects.builtin import TensorType
from xdsl.ir import Operation, SSAValue

from tessera.errors import IRError
from tessera.ir.tile import compute_element, strides
from tessera.ir.tile_builder import TileBuilder, Value, broadcast_shape, shape
from tessera.opdefs import IndexMap, Pointwise, lookup
from tessera.opdefs.registry import Index


def dims_of(value: SSAValue) -> tuple[int, ...]:
    assert isinstance(value.type, TensorType)
    return tuple(value.type.get_shape())


@dataclass
class Space:
    """What one program iterates: ``shape``'s index as tile values, and the lanes in range."""

    shape: tuple[int, ...]
    index: Index
    block: tuple[int, ...]
    axis_masks: list[Value | None]  # per block axis: lanes inside the space (None: all)
    linear: Value | None = None  # the flat offset of ``index`` in a contiguous ``shape``

    def mask_for(self, b: TileBuilder, block: tuple[int, ...]) -> Value | None:
        """The mask of the block axes a value of block shape ``block`` varies along."""
        mask = None
        for axis, axis_mask in enumerate(self.axis_masks):
            if axis_mask is not None and block and block[axis] > 1:
                mask = b.and_(mask, axis_mask)
        return mask


@dataclass
class Evaluator:
    """Computes graph values of one kernel body at indices of a space."""

    b: TileBuilder
    space: Space
    pointers: dict[SSAValue, Value]  # kernel inputs and non-splat constants -> pointer args
    positions: dict[tuple[str, ...], Value] = field(
        default_factory=dict
    )  # all_slice axes -> rank index
    bound: dict[SSAValue, Value] = field(default_factory=dict)
    _memo: dict[tuple[SSAValue, tuple[int, ...]], Value] = field(default_factory=dict)

    def full_index(self, value: SSAValue) -> Index:
        """The space's index as an index of ``value``, whose dims align right with the space's."""
        dims = dims_of(value)
        offset = len(self.space.shape) - len(dims)
        if offset < 0:
            raise IRError(
                f"a value of shape {dims} does not fit the kernel's space {self.space.shape}"
            )
        return tuple(
            None if size == 1 else self.space.index[offset + d] for d, size in enumerate(dims)
        )

    def offsets(self, dims: Sequence[int], index: Index) -> Value:
        """Element offsets of ``index`` in a contiguous tensor of shape ``dims``."""
        if (
            tuple(dims) == self.space.shape
            and index == self.space.index
            and self.space.linear is not None
        ):
            return self.space.linear
        total: Value | None = None
        for component, stride, size in zip(index, strides(dims), dims, strict=True):
            if component is None or size == 1:
                continue
            term = component if stride == 1 else self.b.mul(component, self.b.index(stride))
            total = term if total is None else self.b.add(total, term)
        return total if total is not None else self.b.index(0)

    def load(self, value: SSAValue, index: Index) -> Value:
        """Loads a kernel input (or constant) at ``index`` and converts it to its compute type."""
        offsets = self.offsets(dims_of(value), index)
        loaded = self.b.load(
            self.pointers[value], offsets, self.space.mask_for(self.b, shape(offsets))
        )
        assert isinstance(value.type, TensorType)
        return self.b.convert(loaded, compute_element(value.type.element_type))

    def store(
        self, ptr: Value, value: SSAValue, computed: Value, index: Index | None = None
    ) -> None:
        """Stores ``computed`` (``value`` at ``index``, the space's by default) to ``ptr``."""
        index = self.full_index(value) if index is None else index
        offsets = self.offsets(dims_of(value), index)
        assert isinstance(value.type, TensorType)
        out = self.b.convert(computed, value.type.element_type)
        target = broadcast_shape(shape(offsets), shape(out))
        offsets = self.b.broadcast(offsets, target)
        self.b.store(ptr, offsets, out, self.space.mask_for(self.b, target))

    # --- evaluation ------------------------------------------------------------------------

    def at(self, value: SSAValue, index: Index) -> Value:
        """``value`` at ``index`` (one entry per dim of ``value``), in its compute type."""
        if value in self.bound:
            return self.bound[value]
        key = (value, tuple(id(c) for c in index))
        if key not in self._memo:
            self._memo[key] = self._compute(value, index)
        return self._memo[key]

    def at_broadcast(self, operand: SSAValue, out_dims: Sequence[int], index: Index) -> Value:
        """``operand`` at the ``index`` of a result of shape ``out_dims`` it broadcasts to
        (numpy rules: dims align right; size 1 repeats)."""
        operand_dims = dims_of(operand)
        offset = len(out_dims) - len(operand_dims)
        inner = tuple(None if size == 1 else index[offset + d] for d, size in enumerate(operand_dims))
        return self.at(operand, inner)

    def _compute(self, value: SSAValue, index: Index) -> Value:
        """An op's value from its tile code: a pointwise op's from its operands at the
        broadcast index, a layout op's (index map) from the operand index it maps to."""
        if value in self.pointers:
            return self.load(value, index)
        op = value.owner
        found = lookup(op) if isinstance(op, Operation) else None
        if found is not None and isinstance(found.tile, Pointwise):
            out_dims = dims_of(value)
            return found.tile.fn(self.b, op, [self.at_broadcast(v, out_dims, index) for v in op.operands])
        if found is not None and isinstance(found.tile, IndexMap):
            return found.tile.fn(self, op, value, index)
        raise IRError(f"cannot generate code for {getattr(op, 'name', value)} here")
