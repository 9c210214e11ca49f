"""The ``graph`` dialect: tensor-level ops with value semantics.

Each op class is the op's entry in Tessera's op table: its operands, its properties
and its ``shape_rule`` (from :mod:`tessera.ir.shape_rules`), which the verifier and the
tracer share. Every op prints in one legible custom form::

    %y = graph.matmul %x, %w : tensor<16x64xf32>, tensor<64x256xf32> -> tensor<16x256xf32>
    %s = graph.sum %y {axes = [1], keepdims = false} : tensor<16x256xf32> -> tensor<16xf32>
    %g = graph.gelu %y {approximate = tanh} : tensor<16x256xf32>

A single type after ``:`` means every operand and the result have that type.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from xdsl.dialects.builtin import (
    BoolAttr,
    DenseArrayBase,
    DenseIntOrFPElementsAttr,
    FloatAttr,
    IntegerAttr,
    StringAttr,
    TensorType,
)
from xdsl.ir import Attribute, Dialect, SSAValue
from xdsl.irdl import (
    IRDLOperation,
    irdl_op_definition,
    operand_def,
    prop_def,
    result_def,
    traits_def,
    var_operand_def,
    var_result_def,
)
from xdsl.parser import Parser, UnresolvedOperand
from xdsl.printer import Printer
from xdsl.traits import Pure
from xdsl.utils.exceptions import VerifyException

from tessera.errors import TesseraError
from tessera.ir import shape_rules
from tessera.ir.abstract import AbstractTensor
from tessera.ir.attr_values import parse_value, print_value, to_attr, to_python

ShapeRule = Callable[..., AbstractTensor | tuple[AbstractTensor, ...]]


class GraphOp(IRDLOperation):
    """Base of all graph ops: rule-based verification and the shared custom syntax."""

    traits = traits_def(Pure())

    @staticmethod
    def shape_rule(*operands: AbstractTensor, **attrs: Any) -> Any:
        """The op's rule from :mod:`tessera.ir.shape_rules`; each op class sets it."""
        raise NotImplementedError

    # --- the op as a table entry --------------------------------------------------

    def attrs(self) -> dict[str, Any]:
        """The op's properties as Python values, in declaration order."""
        return {name: to_python(self.properties[name]) for name in self._property_names()}

    def rule_attrs(self) -> dict[str, Any]:
        """The keyword arguments of :attr:`shape_rule` (defaults to :meth:`attrs`)."""
        return self.attrs()

    @classmethod
    def infer(cls, *operands: AbstractTensor, **attrs: Any) -> tuple[AbstractTensor, ...]:
        """Result types for operands and attributes; raises ShapeError if they don't fit."""
        results = cls.shape_rule(*operands, **attrs)
        return results if isinstance(results, tuple) else (results,)

    @classmethod
    def _property_names(cls) -> list[str]:
        return list(cls.get_irdl_definition().properties)

    def verify_(self) -> None:
        try:
            operands = [AbstractTensor.from_xdsl(v.type) for v in self.operands]
            found = [AbstractTensor.from_xdsl(r.type) for r in self.results]
            expected = self.infer(*operands, **self.rule_attrs())
        except TesseraError as error:
            raise VerifyException(f"{self.name}: {error}") from None
        if len(expected) != len(found):
            raise VerifyException(
                f"{self.name}: expected {len(expected)} results, found {len(found)}"
            )
        for index, (want, got) in enumerate(zip(expected, found, strict=True)):
            if want != got:
                raise VerifyException(
                    f"{self.name}: result {index} type mismatch: expected {want}, found {got}"
                )

    # --- custom syntax ------------------------------------------------------------------

    def print(self, printer: Printer) -> None:
        if self.operands:
            printer.print_string(" ")
            printer.print_list(self.operands, printer.print_operand)
        names = [n for n in self._property_names() if n in self.properties]
        if names:
            printer.print_string(" {")
            for i, name in enumerate(names):
                printer.print_string(f"{', ' if i else ''}{name} = ")
                print_value(printer, self.properties[name])
            printer.print_string("}")
        printer.print_op_attributes(self.attributes, print_keyword=True)
        printer.print_string(" : ")
        types = [v.type for v in self.operands]
        result_types = [r.type for r in self.results]
        if types and len(result_types) == 1 and all(t == result_types[0] for t in types):
            printer.print_attribute(result_types[0])
            return
        if types:
            printer.print_list(types, printer.print_attribute)
            printer.print_string(" -> ")
        if len(result_types) == 1:
            printer.print_attribute(result_types[0])
        else:
            printer.print_string("(")
            printer.print_list(result_types, printer.print_attribute)
            printer.print_string(")")

    @classmethod
    def parse(cls, parser: Parser) -> GraphOp:
        operands: list[UnresolvedOperand] = []
        if (first := parser.parse_optional_unresolved_operand()) is not None:
            operands.append(first)
            while parser.parse_optional_punctuation(",") is not None:
                operands.append(parser.parse_unresolved_operand())
        properties: dict[str, Attribute] = {}
        if parser.parse_optional_punctuation("{") is not None:

            def parse_property() -> None:
                name = parser.parse_identifier(" for a property name")
                parser.parse_punctuation("=")
                properties[name] = parse_value(parser)

            parser.parse_comma_separated_list(parser.Delimiter.NONE, parse_property)
            parser.parse_punctuation("}")
        attributes = parser.parse_optional_attr_dict_with_keyword()
        parser.parse_punctuation(":")
        operand_types, result_types = _parse_signature(parser, len(operands))
        values = [parser.resolve_operand(o, t) for o, t in zip(operands, operand_types, strict=True)]
        return cls.create(
            operands=values,
            result_types=result_types,
            properties=properties,
            attributes=attributes.data if attributes else {},
        )


def _parse_signature(parser: Parser, num_operands: int) -> tuple[list[Attribute], list[Attribute]]:
    """Parses ``T`` or ``T1, T2 -> R`` or ``T -> (R1, R2)`` or ``-> R``."""
    types: list[Attribute] = []
    if parser.parse_optional_punctuation("->") is None:
        types = parser.parse_comma_separated_list(parser.Delimiter.NONE, parser.parse_type)
        if parser.parse_optional_punctuation("->") is None:
            if len(types) != 1:
                parser.raise_error(
                    f"expected one type shared by operands and result, or "
                    f"'operand types -> result type', found {len(types)} types"
                )
            return types * num_operands, types
    if parser.parse_optional_punctuation("(") is not None:
        results = parser.parse_comma_separated_list(parser.Delimiter.NONE, parser.parse_type)
        parser.parse_punctuation(")")
    else:
        results = [parser.parse_type()]
    if len(types) != num_operands:
        parser.raise_error(f"expected {num_operands} operand types, found {len(types)}")
    return types, results


# --- op families ------------------------------------------------------------------------


class UnaryGraphOp(GraphOp):
    input = operand_def(TensorType)
    result = result_def(TensorType)


class BinaryGraphOp(GraphOp):
    lhs = operand_def(TensorType)
    rhs = operand_def(TensorType)
    result = result_def(TensorType)


def _unary(op_name: str, rule: ShapeRule, doc: str) -> type[UnaryGraphOp]:
    cls = type(
        op_name.title().replace("_", "") + "Op",
        (UnaryGraphOp,),
        {"name": f"graph.{op_name}", "shape_rule": staticmethod(rule), "__doc__": doc},
    )
    return irdl_op_definition(cls)


def _binary(op_name: str, rule: ShapeRule, doc: str) -> type[BinaryGraphOp]:
    cls = type(
        op_name.title().replace("_", "") + "Op",
        (BinaryGraphOp,),
        {"name": f"graph.{op_name}", "shape_rule": staticmethod(rule), "__doc__": doc},
    )
    return irdl_op_definition(cls)


# Elementwise ops without properties: one line each.
NegOp = _unary("neg", shape_rules.unary, "-x")
AbsOp = _unary("abs", shape_rules.unary, "|x|")
ReluOp = _unary("relu", shape_rules.unary, "max(x, 0)")
ExpOp = _unary("exp", shape_rules.float_unary, "e^x")
LogOp = _unary("log", shape_rules.float_unary, "natural logarithm")
TanhOp = _unary("tanh", shape_rules.float_unary, "hyperbolic tangent")
SqrtOp = _unary("sqrt", shape_rules.float_unary, "square root")
RsqrtOp = _unary("rsqrt", shape_rules.float_unary, "1 / sqrt(x)")
SiluOp = _unary("silu", shape_rules.float_unary, "x * sigmoid(x)")
SigmoidOp = _unary("sigmoid", shape_rules.float_unary, "1 / (1 + e^-x)")

AddOp = _binary("add", shape_rules.binary, "lhs + rhs (numpy broadcasting)")
SubOp = _binary("sub", shape_rules.binary, "lhs - rhs (numpy broadcasting)")
MulOp = _binary("mul", shape_rules.binary, "lhs * rhs (numpy broadcasting)")
DivOp = _binary("div", shape_rules.float_binary, "lhs / rhs (numpy broadcasting)")
PowOp = _binary("pow", shape_rules.float_binary, "lhs ** rhs (numpy broadcasting)")
MaximumOp = _binary("maximum", shape_rules.binary, "elementwise max (numpy broadcasting)")
MinimumOp = _binary("minimum", shape_rules.binary, "elementwise min (numpy broadcasting)")
MatmulOp = _binary(
    "matmul", shape_rules.matmul, "[..., m, k] @ [..., k, n] -> [..., m, n]; batch dims broadcast"
)


@irdl_op_definition
class GeluOp(UnaryGraphOp):
    """GELU, exact (``approximate = none``) or with the tanh approximation."""

    name = "graph.gelu"
    approximate = prop_def(StringAttr)
    shape_rule = staticmethod(shape_rules.gelu)


@irdl_op_definition
class CompareOp(BinaryGraphOp):
    """Elementwise comparison giving i1: ``predicate`` is eq, ne, lt, le, gt or ge."""

    name = "graph.compare"
    predicate = prop_def(StringAttr)
    shape_rule = staticmethod(shape_rules.compare)


@irdl_op_definition
class SelectOp(GraphOp):
    """``cond ? on_true : on_false`` elementwise, with broadcasting (numpy ``where``)."""

    name = "graph.select"
    cond = operand_def(TensorType)
    on_true = operand_def(TensorType)
    on_false = operand_def(TensorType)
    result = result_def(TensorType)
    shape_rule = staticmethod(shape_rules.select)


@irdl_op_definition
class CastOp(UnaryGraphOp):
    """Converts the element type; the target type is the result type."""

    name = "graph.cast"
    shape_rule = staticmethod(shape_rules.cast)

    def rule_attrs(self) -> dict[str, Any]:
        return {"dtype": AbstractTensor.from_xdsl(self.result.type).dtype}


@irdl_op_definition
class ConstantOp(GraphOp):
    """A constant tensor (``full`` is a splat constant): ``graph.constant dense<1.0> : T``."""

    name = "graph.constant"
    value = prop_def(DenseIntOrFPElementsAttr)
    result = result_def(TensorType)

    @staticmethod
    def shape_rule(value: DenseIntOrFPElementsAttr) -> AbstractTensor:
        """A constant's type is its value's type."""
        return AbstractTensor.from_xdsl(value.get_type())

    def rule_attrs(self) -> dict[str, Any]:
        return {"value": self.value}

    def print(self, printer: Printer) -> None:
        printer.print_op_attributes(self.attributes, print_keyword=True)
        printer.print_string(" ")
        printer.print_attribute(self.value)

    @classmethod
    def parse(cls, parser: Parser) -> ConstantOp:
        attributes = parser.parse_optional_attr_dict_with_keyword()
        value = parser.parse_attribute()
        if not isinstance(value, DenseIntOrFPElementsAttr):
            parser.raise_error(f"expected a dense elements attribute, found {value}")
        return cls.create(
            result_types=[value.get_type()],
            properties={"value": value},
            attributes=attributes.data if attributes else {},
        )


# --- reductions and normalisations ------------------------------------------------------------


class ReductionOp(UnaryGraphOp):
    axes = prop_def(DenseArrayBase)
    keepdims = prop_def(BoolAttr)
    shape_rule = staticmethod(shape_rules.reduce)


@irdl_op_definition
class SumOp(ReductionOp):
    """Sum over ``axes``."""

    name = "graph.sum"


@irdl_op_definition
class MeanOp(ReductionOp):
    """Mean over ``axes`` (floating point)."""

    name = "graph.mean"
    shape_rule = staticmethod(shape_rules.float_reduce)


@irdl_op_definition
class MaxOp(ReductionOp):
    """Maximum over ``axes``."""

    name = "graph.max"


@irdl_op_definition
class MinOp(ReductionOp):
    """Minimum over ``axes``."""

    name = "graph.min"


@irdl_op_definition
class SoftmaxOp(UnaryGraphOp):
    """``exp(x - max) / sum(exp(x - max))`` along ``axis``."""

    name = "graph.softmax"
    axis = prop_def(IntegerAttr)
    shape_rule = staticmethod(shape_rules.softmax)


@irdl_op_definition
class LogSoftmaxOp(UnaryGraphOp):
    """``x - logsumexp(x)`` along ``axis``."""

    name = "graph.log_softmax"
    axis = prop_def(IntegerAttr)
    shape_rule = staticmethod(shape_rules.softmax)


@irdl_op_definition
class LayerNormOp(UnaryGraphOp):
    """``(x - mean) / sqrt(var + eps)`` over ``axes`` (biased variance, no affine)."""

    name = "graph.layer_norm"
    axes = prop_def(DenseArrayBase)
    eps = prop_def(FloatAttr)
    shape_rule = staticmethod(shape_rules.normalization)


@irdl_op_definition
class RmsNormOp(UnaryGraphOp):
    """``x / sqrt(mean(x^2) + eps)`` over ``axes`` (no affine)."""

    name = "graph.rms_norm"
    axes = prop_def(DenseArrayBase)
    eps = prop_def(FloatAttr)
    shape_rule = staticmethod(shape_rules.normalization)


@irdl_op_definition
class CrossEntropyOp(GraphOp):
    """Softmax cross-entropy of ``logits [..., C]`` and integer ``labels [...]``."""

    name = "graph.cross_entropy"
    logits = operand_def(TensorType)
    labels = operand_def(TensorType)
    result = result_def(TensorType)
    reduction = prop_def(StringAttr)
    shape_rule = staticmethod(shape_rules.cross_entropy)


# --- layout ----------------------------------------------------------------------------------


@irdl_op_definition
class ReshapeOp(UnaryGraphOp):
    """Row-major reshape; the target shape is the result type's."""

    name = "graph.reshape"
    shape_rule = staticmethod(shape_rules.reshape)

    def rule_attrs(self) -> dict[str, Any]:
        return {"shape": AbstractTensor.from_xdsl(self.result.type).shape}


@irdl_op_definition
class BroadcastToOp(UnaryGraphOp):
    """Numpy ``broadcast_to``; the target shape is the result type's."""

    name = "graph.broadcast_to"
    shape_rule = staticmethod(shape_rules.broadcast_to)

    def rule_attrs(self) -> dict[str, Any]:
        return {"shape": AbstractTensor.from_xdsl(self.result.type).shape}


@irdl_op_definition
class TransposeOp(UnaryGraphOp):
    """Permutes dimensions: result dim i is operand dim ``perm[i]``."""

    name = "graph.transpose"
    perm = prop_def(DenseArrayBase)
    shape_rule = staticmethod(shape_rules.transpose)


@irdl_op_definition
class SliceOp(UnaryGraphOp):
    """``x[starts:limits:strides]`` with static bounds and positive strides."""

    name = "graph.slice"
    starts = prop_def(DenseArrayBase)
    limits = prop_def(DenseArrayBase)
    strides = prop_def(DenseArrayBase)
    shape_rule = staticmethod(shape_rules.slice_)


@irdl_op_definition
class ConcatOp(GraphOp):
    """Concatenates its operands along ``axis``."""

    name = "graph.concat"
    inputs = var_operand_def(TensorType)
    result = result_def(TensorType)
    axis = prop_def(IntegerAttr)
    shape_rule = staticmethod(shape_rules.concat)


@irdl_op_definition
class SplitOp(GraphOp):
    """Splits ``input`` along ``axis`` into pieces sized as the result types say."""

    name = "graph.split"
    input = operand_def(TensorType)
    outputs = var_result_def(TensorType)
    axis = prop_def(IntegerAttr)
    shape_rule = staticmethod(shape_rules.split)

    def rule_attrs(self) -> dict[str, Any]:
        axis = self.attrs()["axis"]
        sizes = [AbstractTensor.from_xdsl(r.type).shape for r in self.results]
        if any(len(shape) <= axis for shape in sizes):
            return {"axis": axis, "sizes": [-1]}  # rank mismatch: let the rule report it
        return {"axis": axis, "sizes": [shape[axis] for shape in sizes]}


@irdl_op_definition
class GatherOp(GraphOp):
    """``take(input, indices, axis)``; an embedding lookup is ``gather`` on axis 0."""

    name = "graph.gather"
    input = operand_def(TensorType)
    indices = operand_def(TensorType)
    result = result_def(TensorType)
    axis = prop_def(IntegerAttr)
    shape_rule = staticmethod(shape_rules.gather)


GRAPH_OPS: tuple[type[GraphOp], ...] = (
    NegOp, AbsOp, ReluOp, ExpOp, LogOp, TanhOp, SqrtOp, RsqrtOp, SiluOp, SigmoidOp, GeluOp,
    AddOp, SubOp, MulOp, DivOp, PowOp, MaximumOp, MinimumOp, MatmulOp, CompareOp, SelectOp,
    CastOp, ConstantOp, SumOp, MeanOp, MaxOp, MinOp, SoftmaxOp, LogSoftmaxOp, LayerNormOp,
    RmsNormOp, CrossEntropyOp, ReshapeOp, BroadcastToOp, TransposeOp, SliceOp, ConcatOp,
    SplitOp, GatherOp,
)  # fmt: skip

Graph = Dialect("graph", list(GRAPH_OPS), [])


def build(op_type: type[GraphOp], operands: Sequence[SSAValue], **attrs: Any) -> GraphOp:
    """Creates a verified-by-rule op: result types come from the op's shape rule.

    ``attrs`` are the rule's keyword arguments; those that are op properties are stored,
    the rest (a reshape's shape, a cast's dtype) live in the result types.
    """
    abstract = [AbstractTensor.from_xdsl(v.type) for v in operands]
    results = op_type.infer(*abstract, **attrs)
    names = op_type._property_names()
    return op_type.create(
        operands=list(operands),
        result_types=[r.to_xdsl() for r in results],
        properties={k: to_attr(v) for k, v in attrs.items() if k in names},
    )
