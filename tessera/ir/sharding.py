"""Shardings: how a global tensor is laid out over a mesh.

A :class:`Sharding` lists, per tensor dim, the mesh axes that split it (major to minor),
plus the mesh axes over which the value is *partial* — each rank holds a term of a
reduction (one of :data:`~tessera.ir.reduction_kinds.KINDS`) not yet performed. This is the information of MLIR's ``shard``
dialect, of DTensor's Shard / Replicate / Partial placements and of JAX's PartitionSpec.

In the IR it is ``#graph.sharding<@mesh, [[dp], []], partial = sum[tp]>``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from math import prod
from typing import Protocol

from xdsl.dialects import func
from xdsl.dialects.builtin import ArrayAttr, DictionaryAttr, StringAttr, SymbolRefAttr
from xdsl.ir import BlockArgument, Operation, ParametrizedAttribute, SSAValue
from xdsl.irdl import irdl_attr_definition, param_def
from xdsl.parser import AttrParser
from xdsl.printer import Printer
from xdsl.utils.exceptions import VerifyException

from tessera.errors import ShardingError
from tessera.ir.reduction_kinds import KINDS, NAMES


class MeshLike(Protocol):
    axis_names: tuple[str, ...]

    def axis_size(self, axis: str) -> int: ...


@dataclass(frozen=True)
class AxisSizes:
    """Named mesh axes and their sizes: all a sharding check or a cost reads of a mesh."""

    sizes: tuple[tuple[str, int], ...]

    @property
    def axis_names(self) -> tuple[str, ...]:
        return tuple(a for a, _ in self.sizes)

    def axis_size(self, axis: str) -> int:
        return dict(self.sizes)[axis]


@dataclass(frozen=True)
class Sharding:
    """Per-dim split axes and partial axes (each with its reduction kind)."""

    dims: tuple[tuple[str, ...], ...]
    partial: tuple[tuple[str, str], ...] = ()  # (mesh axis, reduction kind)

    def __eq__(self, other: object) -> bool:
        # the generated equality, without building tuples (the passes compare often)
        if self is other:
            return True
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self.dims == other.dims and self.partial == other.partial  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        # the generated hash, cached: shardings key the sharding passes' memos
        found = self.__dict__.get("_hash")
        if found is None:
            found = hash((self.dims, self.partial))
            object.__setattr__(self, "_hash", found)
        return found

    def __reduce__(self) -> tuple[type[Sharding], tuple[object, ...]]:
        return (Sharding, (self.dims, self.partial))  # without the cached hash

    @staticmethod
    def replicated(rank: int) -> Sharding:
        return Sharding(((),) * rank)

    @property
    def rank(self) -> int:
        return len(self.dims)

    @property
    def split_axes(self) -> tuple[str, ...]:
        return tuple(a for dim in self.dims for a in dim)

    @property
    def partial_axes(self) -> tuple[str, ...]:
        return tuple(a for a, _ in self.partial)

    @property
    def is_replicated(self) -> bool:
        return not self.split_axes and not self.partial

    def shards(self, mesh: MeshLike, dim: int) -> int:
        """How many pieces dim ``dim`` is split into."""
        return prod(mesh.axis_size(a) for a in self.dims[dim])

    def local_shape(self, mesh: MeshLike, shape: Sequence[int]) -> tuple[int, ...]:
        return tuple(size // self.shards(mesh, d) for d, size in enumerate(shape))

    def validate(self, mesh: MeshLike, shape: Sequence[int], name: str = "tensor") -> None:
        """Raises ShardingError naming the tensor, dim and axis when this doesn't fit."""
        if len(self.dims) != len(shape):
            raise ShardingError(
                f"{name}: sharding has {len(self.dims)} dims but the tensor has rank "
                f"{len(shape)} (shape {list(shape)})"
            )
        seen: set[str] = set()
        for axis in (*self.split_axes, *self.partial_axes):
            if axis not in mesh.axis_names:
                raise ShardingError(
                    f"{name}: unknown mesh axis {axis!r}; the mesh has axes {list(mesh.axis_names)}"
                )
            if axis in seen:
                raise ShardingError(f"{name}: mesh axis {axis!r} is used more than once")
            seen.add(axis)
        for _, kind in self.partial:
            if kind not in KINDS:
                raise ShardingError(
                    f"{name}: partial reduction kind must be one of {NAMES}, found {kind!r}"
                )
        for dim, size in enumerate(shape):
            pieces = self.shards(mesh, dim)
            if size % pieces:
                axes = " × ".join(f"{a}={mesh.axis_size(a)}" for a in self.dims[dim])
                raise ShardingError(
                    f"{name}: dim {dim} of size {size} is not divisible by mesh axes {axes} "
                    f"({pieces} shards)"
                )

    def __str__(self) -> str:
        dims = ", ".join("[" + ", ".join(d) + "]" for d in self.dims)
        text = f"[{dims}]"
        if self.partial:
            text += ", partial = " + _partial_text(self.partial)
        return text


def _partial_text(partial: Sequence[tuple[str, str]]) -> str:
    groups: dict[str, list[str]] = {}
    for axis, kind in partial:
        groups.setdefault(kind, []).append(axis)
    return " ".join(f"{kind}[{', '.join(axes)}]" for kind, axes in groups.items())


@irdl_attr_definition
class ShardingAttr(ParametrizedAttribute):
    """``#graph.sharding<@mesh, [[dp], []], partial = sum[tp]>``."""

    name = "graph.sharding"

    mesh: SymbolRefAttr = param_def()
    dims: ArrayAttr[ArrayAttr[StringAttr]] = param_def()
    partial_axes: ArrayAttr[StringAttr] = param_def()
    partial_kinds: ArrayAttr[StringAttr] = param_def()

    @staticmethod
    def get(mesh: str, sharding: Sharding) -> ShardingAttr:
        return _sharding_attr(mesh, sharding)

    @property
    def mesh_name(self) -> str:
        return self.mesh.root_reference.data

    def __getstate__(self) -> dict[str, object]:
        # the parameters, without the kept Sharding (see ``sharding``)
        return {k: v for k, v in self.__dict__.items() if k != "_sharding_value"}

    @property
    def sharding(self) -> Sharding:
        # kept on the instance: hashing an attribute (for the cache) walks its parameters
        found = self.__dict__.get("_sharding_value")
        if found is None:
            found = _sharding_of(self)
            object.__setattr__(self, "_sharding_value", found)
        return found

    def _sharding(self) -> Sharding:
        return Sharding(
            tuple(tuple(a.data for a in dim) for dim in self.dims),
            tuple(
                (a.data, k.data) for a, k in zip(self.partial_axes, self.partial_kinds, strict=True)
            ),
        )

    def verify(self) -> None:
        if len(self.partial_axes) != len(self.partial_kinds):
            raise VerifyException("partial axes and reduction kinds differ in number")
        for kind in self.partial_kinds:
            if kind.data not in KINDS:
                raise VerifyException(
                    f"partial reduction kind must be one of {NAMES}, found {kind.data!r}"
                )

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> list:
        with parser.in_angle_brackets():
            mesh = parser.parse_attribute()
            if not isinstance(mesh, SymbolRefAttr):
                parser.raise_error(f"expected a mesh symbol like @mesh, found {mesh}")
            parser.parse_punctuation(",")

            def parse_axes() -> ArrayAttr[StringAttr]:
                return ArrayAttr(
                    parser.parse_comma_separated_list(
                        parser.Delimiter.SQUARE, lambda: StringAttr(parser.parse_identifier())
                    )
                )

            dims = parser.parse_comma_separated_list(parser.Delimiter.SQUARE, parse_axes)
            axes: list[StringAttr] = []
            kinds: list[StringAttr] = []
            if parser.parse_optional_punctuation(",") is not None:
                parser.parse_keyword("partial")
                parser.parse_punctuation("=")
                while (kind := parser.parse_optional_identifier()) is not None:
                    if kind not in KINDS:
                        parser.raise_error(
                            f"partial reduction kind must be one of {NAMES}, found {kind!r}"
                        )
                    group = parse_axes()
                    axes.extend(group.data)
                    kinds.extend([StringAttr(kind)] * len(group.data))
                if not axes:
                    parser.raise_error("expected partial axes like sum[tp]")
        return [mesh, ArrayAttr(dims), ArrayAttr(axes), ArrayAttr(kinds)]

    def print_parameters(self, printer: Printer) -> None:
        printer.print_string(f"<@{self.mesh_name}, {self.sharding}>")


# --- where shardings live in the IR ----------------------------------------------------------

SHARDING_KEY = "graph.sharding"


@lru_cache(maxsize=65536)
def _sharding_attr(mesh: str, sharding: Sharding) -> ShardingAttr:
    """The attribute (cached: attributes are immutable and slow to build and verify)."""
    return ShardingAttr(
        SymbolRefAttr(mesh),
        ArrayAttr([ArrayAttr([StringAttr(a) for a in dim]) for dim in sharding.dims]),
        ArrayAttr([StringAttr(a) for a, _ in sharding.partial]),
        ArrayAttr([StringAttr(k) for _, k in sharding.partial]),
    )


@lru_cache(maxsize=65536)
def _sharding_of(attr: ShardingAttr) -> Sharding:
    return attr._sharding()


def op_shardings(op: Operation) -> list[Sharding] | None:
    """The shardings an op's results carry (``graph.sharding``), or None."""
    attr = op.attributes.get(SHARDING_KEY)
    if attr is None:
        return None
    attrs = attr.data if isinstance(attr, ArrayAttr) else (attr,)
    return [a.sharding for a in attrs if isinstance(a, ShardingAttr)]


def set_op_shardings(op: Operation, mesh: str, shardings: Sequence[Sharding]) -> None:
    attrs = [ShardingAttr.get(mesh, s) for s in shardings]
    op.attributes[SHARDING_KEY] = attrs[0] if len(attrs) == 1 else ArrayAttr(attrs)


def arg_sharding(function: func.FuncOp, index: int) -> Sharding | None:
    if function.arg_attrs is None:
        return None
    attr = function.arg_attrs.data[index].data.get(SHARDING_KEY)
    return attr.sharding if isinstance(attr, ShardingAttr) else None


def annotated_sharding(function: func.FuncOp, value: SSAValue) -> Sharding | None:
    """``value``'s annotation (its argument's or its producer's ``graph.sharding``), or
    None without one."""
    if isinstance(value, BlockArgument):
        return arg_sharding(function, value.index)
    annotated = op_shardings(value.owner)  # type: ignore[arg-type]
    return annotated[value.index] if annotated else None  # type: ignore[attr-defined]


def value_sharding(function: func.FuncOp, value: SSAValue) -> Sharding:
    """How ``value`` of ``function`` lies over the mesh: its argument's or its producer's
    annotation, replicated without one."""
    found = annotated_sharding(function, value)
    if found is not None:
        return found
    return Sharding.replicated(len(value.type.get_shape()))  # type: ignore[attr-defined]


def set_arg_sharding(function: func.FuncOp, index: int, mesh: str, sharding: Sharding) -> None:
    set_arg_shardings(function, mesh, {index: sharding})


def set_arg_shardings(function: func.FuncOp, mesh: str, shardings: dict[int, Sharding]) -> None:
    """Sets the ``graph.sharding`` of the arguments ``shardings`` names (by index), in one
    update of the function's argument attributes."""
    count = len(function.args)
    current = function.arg_attrs.data if function.arg_attrs else [DictionaryAttr({})] * count
    updated = list(current)
    changed = False
    for index, sharding in shardings.items():
        attr = ShardingAttr.get(mesh, sharding)
        if current[index].data.get(SHARDING_KEY) is attr:
            continue
        updated[index] = DictionaryAttr({**current[index].data, SHARDING_KEY: attr})
        changed = True
    if changed or function.arg_attrs is None:
        function.arg_attrs = ArrayAttr(updated)
