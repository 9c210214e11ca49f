"""The op table: one :class:`OpDef` per graph op, declared by the op's family module.

An :class:`OpDef` holds everything the compiler needs to know about an op beyond its
dialect definition (syntax, verification and shape rule stay on the IRDL class in
:mod:`tessera.ir.graph`):

- ``sharding``: its factor rule (:mod:`tessera.ir.sharding_rules`), or for a collective or
  a sharding constraint the :class:`LayoutTransition` it makes;
- ``partial``: which operands may stay partial through it (:data:`PartialRule`), or
  :data:`NOT_LINEAR`;
- ``vjp``: its reverse-mode rule (see :data:`VjpRule`);
- ``reference``: its semantics on CPU torch tensors, ``fn(op, *tensors)``
  (:func:`on_operands` makes one of a plain torch function, :func:`bound` one that reads
  the op's attributes once; :func:`bind_reference` gives the function of the tensors
  alone that launch plans call; a collective's also has per-rank group semantics,
  ``tessera.opdefs.collective.CollectiveReference``);
- ``tile``: how a kernel computes it (:class:`Pointwise`, :class:`IndexMap`,
  :class:`RowReduction`, or a dedicated :class:`Kernel` class), or why none does;
- ``fusion``: its class for kernel grouping (:class:`Fusion`);
- ``partition``: how a rank computes it when its operands' layouts split a factor it
  reduces internally (a :class:`Partition`: softmax's axis, a gathered axis), or, by
  default, :data:`LOCAL`: every rank computes the op on its local operands.

A field that does not apply to an op is a :class:`NotApplicable` with the reason, never
a missing value: :func:`register` rejects ``None``.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Final, Protocol

from xdsl.ir import Operation, SSAValue

from tessera.errors import ExecutionError, IRError
from tessera.ir import graph
from tessera.ir.abstract import AbstractTensor
from tessera.ir.grad_builder import GradBuilder
from tessera.ir.sharding import MeshLike, Sharding
from tessera.ir.sharding_rules import Rule, ShardingRule

if TYPE_CHECKING:
    from tessera.ir.tile_builder import TileBuilder

Index = tuple[SSAValue | None, ...]  # per dim of a value: its index, or None where it is 0


class TileSpace(Protocol):
    """What tile code reads of the space a kernel iterates (``codegen.evaluate.Space``)."""

    @property
    def index(self) -> Index: ...


class TileEvaluator(Protocol):
    """What tile code reads of the evaluator that runs it (``codegen.evaluate.Evaluator``,
    above this package): its builder, its space, this rank's positions along mesh axes,
    and the values of the kernel body at an index."""

    @property
    def b(self) -> TileBuilder: ...

    @property
    def space(self) -> TileSpace: ...

    @property
    def positions(self) -> dict[tuple[str, ...], SSAValue]: ...

    def at(self, value: SSAValue, index: Index) -> SSAValue: ...

    def at_broadcast(
        self, operand: SSAValue, out_dims: Sequence[int], index: Index
    ) -> SSAValue: ...

    def offsets(self, dims: Sequence[int], index: Index) -> SSAValue: ...


class Fusion(enum.Enum):
    """How an op is grouped into kernels (``lower-graph-to-schedule``)."""

    ELEMENTWISE = "elementwise"  # joins its producer's kernel as an epilogue (or chain)
    REDUCTION = "reduction"  # a row reduction that drops (or keeps as 1) the reduced axes
    NORMALIZATION = "normalization"  # a row reduction whose result keeps the operand's shape
    LOSS = "loss"  # a row reduction to one loss per row (cross-entropy)
    MATMUL = "matmul"  # starts a matmul kernel (reads layout ops in place), takes epilogues
    ATTENTION = "attention"  # a flash-attention kernel of its own (forward or backward)
    LAYOUT = "layout"  # maps indices (read in place by its users, else a kernel of its own)
    CONSTANT = "constant"  # joins no kernel: each kernel using it gets a copy
    COLLECTIVE = "collective"  # communicates: a schedule.start / schedule.wait pair
    CONSTRAINT = "constraint"  # a sharding constraint: gone after insert-collectives
    HOST = "host"  # a kernel of its own that runs the op's reference (MoE routing's
    # integer bookkeeping, top-k): no generated code yet

    @property
    def reduces_rows(self) -> bool:
        """Whether the op is lowered by the row-reduction kernel."""
        return self in (Fusion.REDUCTION, Fusion.NORMALIZATION, Fusion.LOSS)


@dataclass(frozen=True)
class NotApplicable:
    """A field that does not apply to an op, with the reason."""

    reason: str


NOT_LINEAR: Final = NotApplicable("not linear in any operand: partial operands are reduced first")

# Partial values through linear ops: "all" (every operand partial over the same axes,
# as in add) or a tuple of operand indices of which exactly one may be partial.
PartialRule = str | tuple[int, ...]

Cotangents = list[SSAValue | None]
VjpRule = Callable[[GradBuilder, Any, Cotangents], Cotangents]
"""``rule(b, op, cotangents) -> operand cotangents``: one cotangent per result of ``op``
(None where no gradient flows) to one per operand (None for operands without one, such
as integer indices). Rules build the backward ops with ``b``."""

Reference = Callable[..., Any]  # fn(op, *torch tensors) -> tensor or tuple of tensors


Position = Callable[[Sequence[str]], int]  # a rank's index along mesh axes (major first)


@dataclass(frozen=True)
class RankReference:
    """The reference of an op whose value differs per rank (``graph.axis_index``):
    ``at(op, position)`` is its function of the operand tensors on the rank whose index
    along mesh axes is ``position(axes)``. There is no rank in the global view: called
    like another op's reference, it raises ExecutionError."""

    at: Callable[[Any, Position], Callable[..., Any]]

    def __call__(self, op: graph.GraphOp, *operands: Any) -> Any:
        raise ExecutionError(
            f"{op.name} has a value per rank: it runs only in a partitioned (per-rank) program"
        )


@dataclass(frozen=True)
class LayoutTransition:
    """The layout a collective or a sharding constraint leaves, from its operand's."""

    fn: Callable[[Any, Sharding], Sharding]


@dataclass(frozen=True)
class Pointwise:
    """An elementwise op's tile code: ``fn(b, op, operands at the index) -> value``."""

    fn: Callable[[TileBuilder, Any, Sequence[SSAValue]], SSAValue]


@dataclass(frozen=True)
class IndexMap:
    """A layout op's tile code: ``fn(ev, op, result, index) -> value`` evaluates its
    operand at the index that ``index`` maps to."""

    fn: Callable[[TileEvaluator, Any, SSAValue, Index], SSAValue]


@dataclass(frozen=True)
class RankIndexMap(IndexMap):
    """An index map that reads this rank's position along the op's ``axes``
    (``TileEvaluator.positions``: the kernel takes it as an ``i32`` argument)."""


@dataclass(frozen=True)
class RowReduction:
    """A row reduction's tile code, for the row kernel (``codegen.kernels.lower_reduction``):
    ``fn(ev, op, x, mask, width) -> value`` with ``x`` the operand's block of rows."""

    fn: Callable[[TileEvaluator, Any, SSAValue, SSAValue | None, int], SSAValue]


@dataclass(frozen=True)
class Kernel:
    """An op lowered by a dedicated kernel class of ``codegen.kernels`` (``name``)."""

    name: str


@dataclass(frozen=True)
class Partition:
    """An op's per-rank form for ``shard-partition``, when the layouts of its operands
    split a factor it reduces internally (a ``STATISTIC`` factor, a gathered axis):
    ``fn(b, op, layouts, mesh) -> value or None``. ``b`` builds ops before ``op``, whose
    operands are already local (per-rank types); ``layouts`` are the operands' global
    shardings. The value replaces the op's result and takes its sharding annotation;
    None keeps the op (nothing it reduces is split)."""

    fn: Callable[[GradBuilder, Any, Sequence[Sharding], MeshLike], SSAValue | None]


LOCAL: Final = NotApplicable("every rank computes the op on its local operands")


Tile = Pointwise | IndexMap | RankIndexMap | RowReduction | Kernel | NotApplicable


@dataclass(frozen=True)
class OpDef:
    """Everything the compiler knows about one graph op (see the module docstring)."""

    op_type: type[graph.GraphOp]
    sharding: Rule | LayoutTransition
    partial: PartialRule | NotApplicable
    vjp: VjpRule
    reference: Reference
    tile: Tile
    fusion: Fusion
    partition: Partition | NotApplicable = LOCAL

    @property
    def shape_rule(self) -> Callable[..., Any]:
        """The op's shape rule (declared on its IRDL class)."""
        return self.op_type.shape_rule

    @property
    def linear(self) -> bool:
        """Whether a partial operand may stay partial through the op."""
        return not isinstance(self.partial, NotApplicable)


_REGISTRY: dict[type[graph.GraphOp], OpDef] = {}
_FIELDS = tuple(f.name for f in fields(OpDef) if f.name != "op_type")


def register(
    *op_types: type[graph.GraphOp],
    sharding: Rule | LayoutTransition,
    partial: PartialRule | NotApplicable,
    vjp: VjpRule,
    reference: Reference,
    tile: Tile,
    fusion: Fusion,
    partition: Partition | NotApplicable = LOCAL,
) -> None:
    """Declares the :class:`OpDef` of ``op_types`` (every field but ``partition``, which
    most ops leave :data:`LOCAL`, is required)."""
    given = dict(
        sharding=sharding,
        partial=partial,
        vjp=vjp,
        reference=reference,
        tile=tile,
        fusion=fusion,
        partition=partition,
    )
    unset = [name for name in _FIELDS if given[name] is None]
    names = ", ".join(t.name for t in op_types)
    if unset:
        raise TypeError(f"register({names}): {unset} must be set (NotApplicable if they do not apply)")
    for op_type in op_types:
        if op_type in _REGISTRY:
            raise ValueError(f"{op_type.name} is registered twice")
        _REGISTRY[op_type] = OpDef(op_type, **given)  # type: ignore[arg-type]


OpOrType = Operation | type[Operation]


def op_def(op: OpOrType) -> OpDef:
    """The :class:`OpDef` of an op or op class; raises IRError naming it when there is none."""
    found = lookup(op)
    if found is None:
        op_type = op if isinstance(op, type) else type(op)
        raise IRError(f"{getattr(op_type, 'name', op_type.__name__)} has no op definition")
    return found


def lookup(op: OpOrType) -> OpDef | None:
    """The :class:`OpDef` of an op or op class, or None for one without a definition."""
    return _REGISTRY.get(op if isinstance(op, type) else type(op))  # type: ignore[arg-type]


def registered() -> dict[type[graph.GraphOp], OpDef]:
    """Every registered op definition, by op class."""
    return dict(_REGISTRY)


def fusion_of(op: OpOrType) -> Fusion | None:
    """The fusion class of ``op``, or None for an op that is not a registered graph op."""
    found = lookup(op)
    return found.fusion if found is not None else None


def has_sharding_rule(op: OpOrType) -> bool:
    """Whether ``op`` has a factor sharding rule (collectives and constraints have not)."""
    found = lookup(op)
    return found is not None and not isinstance(found.sharding, LayoutTransition)


def sharding_rule(
    op: Operation,
    operands: Sequence[AbstractTensor] | None = None,
    results: Sequence[AbstractTensor] | None = None,
) -> ShardingRule:
    """The sharding rule of a graph op instance, for its operand and result types or
    the (global) types given."""
    found = lookup(op)
    if found is None or isinstance(found.sharding, LayoutTransition):
        raise KeyError(f"no sharding rule for {op.name}")
    if operands is None:
        operands = [AbstractTensor.from_xdsl(v.type) for v in op.operands]
    if results is None:
        results = [AbstractTensor.from_xdsl(r.type) for r in op.results]
    return found.sharding(list(operands), list(results), op.attrs())  # type: ignore[attr-defined]


def on_operands(fn: Callable[..., Any]) -> Reference:
    """A reference that applies ``fn`` to the operands alone (no attributes needed)."""

    def reference(op: graph.GraphOp, *operands: Any) -> Any:
        return fn(*operands)

    reference.__doc__ = f"``{getattr(fn, '__name__', fn)}`` of the operands."
    reference.bind = lambda op: fn  # type: ignore[attr-defined]
    return reference


def bound(prepare: Callable[[Any], Callable[..., Any]]) -> Reference:
    """A reference made of ``prepare(op)``, which reads what it needs of the op (its
    attributes, result types) once and returns a function of the operand tensors."""

    def reference(op: graph.GraphOp, *operands: Any) -> Any:
        return prepare(op)(*operands)

    reference.__doc__ = prepare.__doc__
    reference.bind = prepare  # type: ignore[attr-defined]
    return reference


def bind_reference(op: Operation) -> Callable[..., Any]:
    """``op``'s reference as a function of its operand tensors alone: what a compiled
    launch plan calls, reading no IR per call (references made by :func:`on_operands`
    or :func:`bound`; others get the op as a bound first argument)."""
    reference = op_def(op).reference
    prepare = getattr(reference, "bind", None)
    return prepare(op) if prepare is not None else functools.partial(reference, op)
