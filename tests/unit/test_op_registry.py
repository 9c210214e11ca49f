"""The op table (``tessera.opdefs``) is complete: every graph op declares every field.

A field that does not apply is a named :class:`~tessera.opdefs.NotApplicable` (with its
reason), never left out: ``register`` rejects a missing or None field.
"""

from __future__ import annotations

from dataclasses import MISSING, fields

import pytest
from xdsl.irdl import irdl_op_definition

from tessera.errors import IRError
from tessera.ir import graph
from tessera.ir.graph import Graph
from tessera.ir.sharding_rules import elementwise
from tessera.opdefs import (
    LOCAL,
    NOT_LINEAR,
    Fusion,
    IndexMap,
    Kernel,
    LayoutTransition,
    NotApplicable,
    OpDef,
    Partition,
    Pointwise,
    RankIndexMap,
    RankReference,
    RowReduction,
    op_def,
    register,
    registered,
)
from tessera.opdefs.collective import CollectiveReference, on_group

# Ops of the dialect that compute nothing, so have no op definition, and why.
STRUCTURAL = {
    graph.MeshOp: "a module-level symbol naming the device mesh; it has no value",
    graph.CallOp: "a call of a region: every pass handles it through its callee",
    graph.ScanOp: "a loop over a region's steps: every pass handles it through its callee",
}

FIELDS = [f.name for f in fields(OpDef) if f.name != "op_type"]
REQUIRED = [f.name for f in fields(OpDef) if f.name != "op_type" and f.default is MISSING]
COMPLETE = dict(
    sharding=elementwise,
    partial=NOT_LINEAR,
    vjp=lambda b, op, cts: [None],
    reference=lambda op, x: x,
    tile=NotApplicable("a probe"),
    fusion=Fusion.ELEMENTWISE,
)


@irdl_op_definition
class ProbeOp(graph.UnaryGraphOp):
    """An op outside the dialect, for registering."""

    name = "graph.probe"


def test_every_graph_op_has_a_definition() -> None:
    ops = {op for op in Graph.operations if op not in STRUCTURAL}
    assert ops == set(registered()), {o.name for o in ops ^ set(registered())}


@pytest.mark.parametrize(
    "op_type", sorted(registered(), key=lambda t: t.name), ids=lambda t: t.name
)
def test_every_field_is_set(op_type: type[graph.GraphOp]) -> None:
    definition = op_def(op_type)
    assert definition.op_type is op_type
    for name in FIELDS:
        assert getattr(definition, name) is not None, f"{op_type.name}: {name} is None"
    assert callable(definition.vjp) and callable(definition.reference)
    assert isinstance(definition.sharding, LayoutTransition) or callable(definition.sharding)
    assert isinstance(definition.partial, NotApplicable | str | tuple)
    assert isinstance(definition.tile, Pointwise | IndexMap | RowReduction | Kernel | NotApplicable)
    assert isinstance(definition.fusion, Fusion)
    assert definition.shape_rule is op_type.shape_rule


@pytest.mark.parametrize(
    "op_type", sorted(registered(), key=lambda t: t.name), ids=lambda t: t.name
)
def test_fusion_matches_tile_code(op_type: type[graph.GraphOp]) -> None:
    """Elementwise ops have pointwise tile code, row reductions row code, layout ops and
    constants an index map; collectives and constraints never reach a kernel."""
    definition = op_def(op_type)
    expected = {
        Fusion.ELEMENTWISE: Pointwise,
        Fusion.REDUCTION: RowReduction,
        Fusion.NORMALIZATION: RowReduction,
        Fusion.LOSS: RowReduction,
        Fusion.MATMUL: Kernel,
        Fusion.ATTENTION: Kernel,
        Fusion.LAYOUT: IndexMap,
        Fusion.CONSTANT: IndexMap,
        Fusion.COLLECTIVE: NotApplicable,
        Fusion.CONSTRAINT: NotApplicable,
        Fusion.HOST: NotApplicable,
    }[definition.fusion]
    assert isinstance(definition.tile, expected), f"{op_type.name}: {definition.tile}"
    communicates = definition.fusion in (Fusion.COLLECTIVE, Fusion.CONSTRAINT)
    assert not communicates or isinstance(definition.sharding, LayoutTransition)


@pytest.mark.parametrize("op_type", graph.COLLECTIVE_OPS, ids=lambda t: t.name)
def test_collectives_have_group_semantics(op_type: type[graph.GraphOp]) -> None:
    """A collective's reference is the identity on the global value and has per-rank
    group semantics (what the virtual mesh computes)."""
    reference = op_def(op_type).reference
    assert isinstance(reference, CollectiveReference) and callable(on_group(op_type))


def test_elementwise_ops_have_tile_code_and_reference() -> None:
    elementwise_ops = [t for t, d in registered().items() if d.fusion is Fusion.ELEMENTWISE]
    assert graph.ExpOp in elementwise_ops and graph.AddOp in elementwise_ops
    for op_type in elementwise_ops:
        definition = op_def(op_type)
        assert isinstance(definition.tile, Pointwise) and callable(definition.tile.fn), op_type.name
        assert callable(definition.reference), op_type.name


@pytest.mark.parametrize("field", REQUIRED)
def test_register_rejects_an_omitted_field(field: str) -> None:
    given = {k: v for k, v in COMPLETE.items() if k != field}
    with pytest.raises(TypeError, match=field):
        register(ProbeOp, **given)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=field):
        register(ProbeOp, **given, **{field: None})  # type: ignore[arg-type]
    assert ProbeOp not in registered()


def test_partition_defaults_to_local_and_rejects_none() -> None:
    """Most ops compute their local slice like the global op (LOCAL); a Partition is
    declared where a split factor needs a per-rank rewrite; None is never a value."""
    assert [f for f in FIELDS if f != "partition"] == REQUIRED
    with pytest.raises(TypeError, match="partition"):
        register(ProbeOp, **COMPLETE, partition=None)  # type: ignore[arg-type]
    assert ProbeOp not in registered()
    assert op_def(graph.AddOp).partition is LOCAL
    expanded = {t for t, d in registered().items() if isinstance(d.partition, Partition)}
    assert {graph.GatherOp, graph.CrossEntropyOp, graph.SoftmaxOp, graph.LayerNormOp} <= expanded


def test_per_rank_ops_read_the_rank_position() -> None:
    """axis_index and all_slice depend on the rank: their tile code reads its position
    (a kernel argument); axis_index has no value without a rank."""
    for op_type in (graph.AxisIndexOp, graph.AllSliceOp):
        assert isinstance(op_def(op_type).tile, RankIndexMap), op_type.name
    assert isinstance(op_def(graph.AxisIndexOp).reference, RankReference)


def test_register_rejects_a_second_definition() -> None:
    with pytest.raises(ValueError, match=r"graph\.neg is registered twice"):
        register(graph.NegOp, **COMPLETE)  # type: ignore[arg-type]


def test_a_missing_definition_names_the_op() -> None:
    with pytest.raises(IRError, match=r"graph\.mesh has no op definition"):
        op_def(graph.MeshOp)
    with pytest.raises(IRError, match=r"graph\.probe has no op definition"):
        op_def(ProbeOp)
