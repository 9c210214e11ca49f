"""The ``graph`` dialect: tensor-level ops with value semantics.

Each op class defines the op as IR: its operands, its properties and its ``shape_rule``
(from :mod:`tessera.ir.shape_rules`), which the verifier and the tracer share. What the
compiler knows beyond that (sharding rule, linearity, VJP, torch reference, tile code,
fusion class) is its op definition in :mod:`tessera.opdefs`. Every op prints in one
legible custom form::

    %y = graph.matmul %x, %w : tensor<16x64xf32>, tensor<64x256xf32> -> tensor<16x256xf32>
    %s = graph.sum %y {axes = [1], keepdims = false} : tensor<16x256xf32> -> tensor<16xf32>
    %g = graph.gelu %y {approximate = tanh} : tensor<16x256xf32>

A single type after ``:`` means every operand and the result have that type.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import numpy as np
from xdsl.dialects.builtin import (
    ArrayAttr,
    BoolAttr,
    DenseArrayBase,
    DenseIntOrFPElementsAttr,
    FloatAttr,
    IntegerAttr,
    IntegerType,
    ModuleOp,
    StringAttr,
    SymbolRefAttr,
    TensorType,
    UnitAttr,
)
from xdsl.dialects.func import FuncOp, ReturnOp
from xdsl.ir import Attribute, Dialect, Operation, SSAValue
from xdsl.irdl import (
    IRDLOperation,
    irdl_op_definition,
    operand_def,
    opt_prop_def,
    prop_def,
    result_def,
    traits_def,
    var_operand_def,
    var_result_def,
)
from xdsl.parser import Parser, UnresolvedOperand
from xdsl.printer import Printer
from xdsl.traits import Pure, SymbolOpInterface
from xdsl.utils.exceptions import VerifyException

from tessera.dtypes import DType
from tessera.errors import ShapeError, TesseraError
from tessera.ir import shape_rules
from tessera.ir.abstract import AbstractTensor
from tessera.ir.attr_values import parse_properties, print_properties, to_attr, to_python
from tessera.ir.attribute_set import AttributeMap
from tessera.ir.limits import MAX_MESH_DEVICES
from tessera.ir.located_error import LocatedPassFailure
from tessera.ir.sharding import Sharding, ShardingAttr
from tessera.topology import load_topology

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
        return {
            name: to_python(self.properties[name])
            for name in self._property_names()
            if name in self.properties  # an optional property may be absent
        }

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
        """Property names, those declared by base classes first."""
        return list(_property_names(cls))

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
        print_properties(printer, self.properties, self._property_names())
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
        properties = parse_properties(parser)
        attributes = parser.parse_optional_attr_dict_with_keyword()
        parser.parse_punctuation(":")
        operand_types, result_types = _parse_signature(parser, len(operands))
        values = [
            parser.resolve_operand(o, t) for o, t in zip(operands, operand_types, strict=True)
        ]
        return cls.create(
            operands=values,
            result_types=result_types,
            properties=properties,
            attributes=attributes.data if attributes else {},
        )


def _parse_signature(parser: Parser, num_operands: int) -> tuple[list[Attribute], list[Attribute]]:
    """Parses ``T`` or ``T1, T2 -> R`` or ``T -> (R1, R2)`` or ``-> R``."""
    types: list[Attribute] = []
    start = parser.pos  # errors point at the signature, not at the token after it
    if parser.parse_optional_punctuation("->") is None:
        types = parser.parse_comma_separated_list(parser.Delimiter.NONE, parser.parse_type)
        if parser.parse_optional_punctuation("->") is None:
            if len(types) != 1:
                parser.raise_error(
                    f"expected one type shared by operands and result, or "
                    f"'operand types -> result type', found {len(types)} types",
                    start,
                )
            return types * num_operands, types
    if parser.parse_optional_punctuation("(") is not None:
        results: list[Attribute] = []  # `-> ()`: a split into no pieces
        if parser.parse_optional_punctuation(")") is None:
            results = parser.parse_comma_separated_list(parser.Delimiter.NONE, parser.parse_type)
            parser.parse_punctuation(")")
    else:
        results = [parser.parse_type()]
    if len(types) != num_operands:
        parser.raise_error(f"expected {num_operands} operand types, found {len(types)}", start)
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
NegOp = _unary("neg", shape_rules.negate, "-x")
AbsOp = _unary("abs", shape_rules.unary, "|x|")
ReluOp = _unary("relu", shape_rules.unary, "max(x, 0)")
ExpOp = _unary("exp", shape_rules.float_unary, "e^x")
LogOp = _unary("log", shape_rules.float_unary, "natural logarithm")
TanhOp = _unary("tanh", shape_rules.float_unary, "hyperbolic tangent")
SqrtOp = _unary("sqrt", shape_rules.float_unary, "square root")
RsqrtOp = _unary("rsqrt", shape_rules.float_unary, "1 / sqrt(x)")
SiluOp = _unary("silu", shape_rules.float_unary, "x * sigmoid(x)")
SigmoidOp = _unary("sigmoid", shape_rules.float_unary, "1 / (1 + e^-x)")
ErfOp = _unary("erf", shape_rules.float_unary, "the error function")
CosOp = _unary("cos", shape_rules.float_unary, "cosine (radians)")
SinOp = _unary("sin", shape_rules.float_unary, "sine (radians)")
StopGradientOp = _unary(
    "stop_gradient", shape_rules.unary, "x, through which no gradient flows (jax.lax.stop_gradient)"
)

AddOp = _binary("add", shape_rules.binary, "lhs + rhs (numpy broadcasting; or on bools)")
SubOp = _binary("sub", shape_rules.subtract, "lhs - rhs (numpy broadcasting)")
MulOp = _binary("mul", shape_rules.binary, "lhs * rhs (numpy broadcasting; and on bools)")
DivOp = _binary("div", shape_rules.float_binary, "lhs / rhs (numpy broadcasting)")
PowOp = _binary(
    "pow", shape_rules.power, "lhs ** rhs (numpy broadcasting; integers give integers)"
)
MaximumOp = _binary("maximum", shape_rules.binary, "elementwise max (numpy broadcasting)")
MinimumOp = _binary("minimum", shape_rules.binary, "elementwise min (numpy broadcasting)")


@irdl_op_definition
class MatmulOp(BinaryGraphOp):
    """``[..., m, k] @ [..., k, n] -> [..., m, n]``; batch dims broadcast. ``fp8`` (optional,
    ``e4m3`` or ``e5m2``): both operands hold values of that fp8 format exactly (quantised,
    not rescaled), so a generated kernel may multiply them in fp8 (f32 accumulation)."""

    name = "graph.matmul"
    fp8 = opt_prop_def(StringAttr)
    shape_rule = staticmethod(shape_rules.matmul)


@irdl_op_definition
class GeluOp(UnaryGraphOp):
    """GELU, exact (``approximate = none``) or with the tanh approximation."""

    name = "graph.gelu"
    approximate = prop_def(StringAttr)
    shape_rule = staticmethod(shape_rules.gelu)


@irdl_op_definition
class Fp8QuantizeOp(BinaryGraphOp):
    """``lhs`` quantised to fp8 with the scalar scale ``rhs`` and dequantised:
    ``fp8(clamp(lhs / rhs, ±max)) * rhs``, rounded to nearest even, ``format`` e4m3 (max
    448) or e5m2 (max 57344). Its gradient passes straight through to ``lhs``."""

    name = "graph.fp8_quantize"
    format = prop_def(StringAttr)
    shape_rule = staticmethod(shape_rules.fp8_quantize)


@irdl_op_definition
class Fp8GradOp(UnaryGraphOp):
    """``x``, whose cotangent is quantised to fp8 ``format`` with the per-tensor scale
    amax / max (current scaling): the backward of an fp8 matmul's result."""

    name = "graph.fp8_grad"
    format = prop_def(StringAttr)
    shape_rule = staticmethod(shape_rules.fp8_grad)


@irdl_op_definition
class Fp8GradDelayedOp(GraphOp):
    """``input``, whose cotangent is quantised to fp8 ``format`` with the scalar ``scale``
    (delayed scaling: from an amax history); the cotangent's amax is the cotangent of the
    scalar ``probe`` (how the backward's amax reaches the history)."""

    name = "graph.fp8_grad_delayed"
    input = operand_def(TensorType)
    scale = operand_def(TensorType)
    probe = operand_def(TensorType)
    result = result_def(TensorType)
    format = prop_def(StringAttr)
    shape_rule = staticmethod(shape_rules.fp8_grad_delayed)


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
class RandomBitsOp(GraphOp):
    """Philox-4x32-10 random bits, elementwise (numpy broadcasting of its operands)::

        %bits = graph.random_bits %k0, %k1, %counter {stream = 0}
            : tensor<i32>, tensor<i32>, tensor<4x8xi32> -> tensor<4x8xi32>

    Each element is the first 32-bit word of Philox-4x32-10 of the counter
    ``(counter, stream, 0, 0)`` under the key ``(k0, k1)`` (bit patterns of uint32), as
    ``triton.language.randint(seed=k1 << 32 | k0, offset=counter)`` for stream 0. Pure:
    the same operands give the same bits (``tessera.random`` passes each element's
    index in the global array as its counter, so that a shard's bits do not depend on
    the mesh)."""

    name = "graph.random_bits"
    key0 = operand_def(TensorType)
    key1 = operand_def(TensorType)
    counter = operand_def(TensorType)
    result = result_def(TensorType)
    stream = prop_def(IntegerAttr)
    shape_rule = staticmethod(shape_rules.random_bits)


@irdl_op_definition
class IotaOp(GraphOp):
    """Indices along ``dimension``, broadcast over the other dims (``jax.lax.iota``,
    StableHLO's ``iota``)::

        %i = graph.iota {dimension = 1} : tensor<4x8xi64>           # i[r, c] = c
        %j = graph.iota %s {dimension = 0} : tensor<i32>, tensor<8xi32>  # j[c] = s + c

    The optional i32 scalar ``start`` is the global index of the first element along
    ``dimension`` (``shard-partition`` gives a rank's slice its own start). Nothing is
    stored: a kernel computes the indices from its program's position, where a dense
    ``arange`` constant would be copied into every kernel that reads it."""

    name = "graph.iota"
    start = var_operand_def(TensorType)
    result = result_def(TensorType)
    dimension = prop_def(IntegerAttr)
    shape_rule = staticmethod(shape_rules.iota)

    def rule_attrs(self) -> dict[str, Any]:
        result = AbstractTensor.from_xdsl(self.result.type)
        return {"dimension": self.attrs()["dimension"], "shape": result.shape, "dtype": result.dtype}


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
        blob = _nonfinite_blob(self.value)
        if blob is None:
            printer.print_attribute(self.value)
        else:  # xDSL reads its own hex-float spelling of inf/nan back as an integer
            printer.print_string(f'dense<"0x{blob}"> : ')
            printer.print_attribute(self.value.get_type())

    @classmethod
    def parse(cls, parser: Parser) -> ConstantOp:
        attributes = parser.parse_optional_attr_dict_with_keyword()
        start = parser.pos
        value = parser.parse_attribute()
        if not isinstance(value, DenseIntOrFPElementsAttr):
            parser.raise_error(f"expected a dense elements attribute, found {value}", start)
        return cls.create(
            result_types=[value.get_type()],
            properties={"value": value},
            attributes=attributes.data if attributes else {},
        )


def _nonfinite_blob(value: DenseIntOrFPElementsAttr) -> str | None:
    """The little-endian hex blob of a float constant holding inf or nan, else None."""
    aval = AbstractTensor.from_xdsl(value.get_type())
    values = value.get_values()
    if not aval.dtype.is_float or all(math.isfinite(v) for v in values):
        return None
    if aval.dtype == DType.bf16:  # bf16 is the top half of an f32 (inf/nan are exact)
        bits = np.array(values, dtype=np.float32).view(np.uint32)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        raw = (
            np.where(np.isnan(np.array(values, np.float32)), 0x7FC0, rounded)
            .astype("<u2")
            .tobytes()
        )
    else:
        width = {DType.f16: "<f2", DType.f64: "<f8"}.get(aval.dtype, "<f4")
        raw = np.array(values, dtype=width).tobytes()
    return raw.hex().upper()


# --- reductions and normalisations ------------------------------------------------------------


class ReductionOp(UnaryGraphOp):
    """A reduction over ``axes`` by its ``KIND`` (a key of ``reduction_kinds.KINDS``)."""

    KIND: ClassVar[str]
    axes = prop_def(DenseArrayBase)
    keepdims = prop_def(BoolAttr)
    shape_rule = staticmethod(shape_rules.reduce)


@irdl_op_definition
class SumOp(ReductionOp):
    """Sum over ``axes``, in the operand's dtype (not bool)."""

    name = "graph.sum"
    KIND: ClassVar[str] = "sum"
    shape_rule = staticmethod(shape_rules.sum_reduce)


@irdl_op_definition
class MeanOp(ReductionOp):
    """Mean over ``axes`` (floating point)."""

    name = "graph.mean"
    KIND: ClassVar[str] = "mean"
    shape_rule = staticmethod(shape_rules.float_reduce)


@irdl_op_definition
class MaxOp(ReductionOp):
    """Maximum over ``axes``."""

    name = "graph.max"
    KIND: ClassVar[str] = "max"
    shape_rule = staticmethod(shape_rules.extremum_reduce)


@irdl_op_definition
class MinOp(ReductionOp):
    """Minimum over ``axes``."""

    name = "graph.min"
    KIND: ClassVar[str] = "min"
    shape_rule = staticmethod(shape_rules.extremum_reduce)


@irdl_op_definition
class ProdOp(ReductionOp):
    """Product over ``axes``, in the operand's dtype (not bool)."""

    name = "graph.prod"
    KIND: ClassVar[str] = "prod"
    shape_rule = staticmethod(shape_rules.prod_reduce)


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


# --- attention --------------------------------------------------------------------------------


@irdl_op_definition
class AttentionOp(GraphOp):
    """Scaled dot-product attention and its per-row log-sum-exp::

        %o, %lse = graph.attention %q, %k, %v {causal = true, scale = 0.125}
            : tensor<2x4x64x16xf32>, tensor<2x4x64x16xf32>, tensor<2x4x64x16xf32>
            -> (tensor<2x4x64x16xf32>, tensor<2x4x64xf32>)

    ``o = softmax(scale · q kᵀ) v`` over the keys, ``lse = logsumexp(scale · q kᵀ)``
    (f32; f64 for f64 inputs), both never materialising the ``[Tq, Tk]`` scores. With
    ``causal``, query ``i`` sees key ``j`` iff ``q0 + i >= k0 + j``, where the optional
    i32 scalar operands ``q0, k0`` (``positions``) are the global positions of the
    first query and key (0 without them): a block of a longer sequence, as context
    parallelism computes. With ``zigzag = n`` the sequences of q and of k, v are stored
    in zig-zag order over ``n`` ranks (:mod:`tessera.ir.zigzag`) and the mask compares
    their true positions. A row that sees no key gives 0 and an lse of -inf. k and v may
    have fewer heads than q (grouped-query attention, heads in dim -3).

    Masks: with ``segments = true`` the operands after q, k, v start with the query and
    key segment ids (i32 ``[batch, Tq]``, ``[batch, Tk]``, batch: q's dims before the
    heads; a key padding mask is ids no query has): query ``i`` sees key ``j`` only if
    their ids are equal. ``window = w`` hides keys with ``|q0 + i - k0 - j| >= w`` (it
    takes the positions as causal does); ``softcap = c`` makes the scores ``c · tanh(s /
    c)`` before masking."""

    name = "graph.attention"
    q = operand_def(TensorType)
    k = operand_def(TensorType)
    v = operand_def(TensorType)
    extra = var_operand_def(TensorType)  # [q_segment_ids, kv_segment_ids], [q0, k0]
    output = result_def(TensorType)
    lse = result_def(TensorType)
    causal = prop_def(BoolAttr)
    scale = prop_def(FloatAttr)
    zigzag = opt_prop_def(IntegerAttr)
    window = opt_prop_def(IntegerAttr)
    softcap = opt_prop_def(FloatAttr)
    segments = opt_prop_def(BoolAttr)
    shape_rule = staticmethod(shape_rules.attention)

    @property
    def segment_ids(self) -> tuple[SSAValue, ...]:
        """``(q_segment_ids, kv_segment_ids)``, or ``()``."""
        return attention_segment_ids(self, 3)

    @property
    def positions(self) -> tuple[SSAValue, ...]:
        """``(q0, k0)``, or ``()``."""
        return attention_positions(self, 3)


@irdl_op_definition
class AttentionBackwardOp(GraphOp):
    """The gradients of :class:`AttentionOp` (FlashAttention-2's backward)::

        %dq, %dk, %dv = graph.attention_backward %q, %k, %v, %do, %lse, %delta
            {causal = true, scale = 0.125} : ... -> (q's type, k's type, v's type)

    from the output's cotangent ``do``, the forward's ``lse`` and ``delta =
    rowsum(do * o)`` (``[..., Tq]``, the lse's dtype); the probabilities are recomputed
    block by block from ``lse``. The segment ids, positions and properties as the
    forward's."""

    name = "graph.attention_backward"
    q = operand_def(TensorType)
    k = operand_def(TensorType)
    v = operand_def(TensorType)
    do = operand_def(TensorType)
    lse = operand_def(TensorType)
    delta = operand_def(TensorType)
    extra = var_operand_def(TensorType)  # [q_segment_ids, kv_segment_ids], [q0, k0]
    dq = result_def(TensorType)
    dk = result_def(TensorType)
    dv = result_def(TensorType)
    causal = prop_def(BoolAttr)
    scale = prop_def(FloatAttr)
    zigzag = opt_prop_def(IntegerAttr)
    window = opt_prop_def(IntegerAttr)
    softcap = opt_prop_def(FloatAttr)
    segments = opt_prop_def(BoolAttr)
    shape_rule = staticmethod(shape_rules.attention_backward)

    @property
    def segment_ids(self) -> tuple[SSAValue, ...]:
        """``(q_segment_ids, kv_segment_ids)``, or ``()``."""
        return attention_segment_ids(self, 6)

    @property
    def positions(self) -> tuple[SSAValue, ...]:
        """``(q0, k0)``, or ``()``."""
        return attention_positions(self, 6)


def attention_segment_ids(op: GraphOp, first: int) -> tuple[SSAValue, ...]:
    """The segment-id operands of an attention op whose fixed operands are ``first``."""
    return tuple(op.operands[first : first + 2]) if op.attrs().get("segments") else ()


def attention_positions(op: GraphOp, first: int) -> tuple[SSAValue, ...]:
    """The position operands (after the segment ids) of an attention op."""
    return tuple(op.operands[first + 2 * bool(op.attrs().get("segments")) :])


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
        rank = AbstractTensor.from_xdsl(self.input.type).rank
        shapes = [AbstractTensor.from_xdsl(r.type).shape for r in self.results]
        for index, shape in enumerate(shapes):
            if 0 <= axis < rank and len(shape) != rank:  # a bad axis: the rule reports it
                raise ShapeError(
                    f"expected results of rank {rank} like the operand, found result "
                    f"{index} of type {self.results[index].type}"
                )
        return {"axis": axis, "sizes": [s[axis] if 0 <= axis < len(s) else 0 for s in shapes]}


@irdl_op_definition
class GatherOp(GraphOp):
    """``take(input, indices, axis)``; an embedding lookup is ``gather`` on axis 0."""

    name = "graph.gather"
    input = operand_def(TensorType)
    indices = operand_def(TensorType)
    result = result_def(TensorType)
    axis = prop_def(IntegerAttr)
    shape_rule = staticmethod(shape_rules.gather)


@irdl_op_definition
class DynamicUpdateSliceOp(GraphOp):
    """``input`` with ``update`` written at ``start`` (an i32 scalar, clamped so the
    update fits) along ``axis``: a KV cache's write (``jax.lax.dynamic_update_slice``)."""

    name = "graph.dynamic_update_slice"
    input = operand_def(TensorType)
    update = operand_def(TensorType)
    start = operand_def(TensorType)
    result = result_def(TensorType)
    axis = prop_def(IntegerAttr)
    shape_rule = staticmethod(shape_rules.dynamic_update_slice)


# --- mixture of experts ------------------------------------------------------------------------


@irdl_op_definition
class TopKOp(GraphOp):
    """The ``k`` largest entries along the last dim, largest first, and their indices::

        %v, %i = graph.top_k %x {k = 2} : tensor<4x8xf32> -> (tensor<4x2xf32>, tensor<4x2xi32>)

    Equal values come in index order: the lower index wins a tie (``torch.topk``'s
    order among ties is unspecified)."""

    name = "graph.top_k"
    input = operand_def(TensorType)
    values = result_def(TensorType)
    indices = result_def(TensorType)
    k = prop_def(IntegerAttr)
    shape_rule = staticmethod(shape_rules.top_k)


@irdl_op_definition
class MoeRouteOp(GraphOp):
    """Assigns each token's expert choices to slots of a static capacity (Switch/GShard)::

        %slots, %sources = graph.moe_route %choices {experts = 8, capacity = 4}
            : tensor<2x16x2xi32> -> (tensor<2x16x2xi32>, tensor<2x8x4xi32>)

    Per group ``g``, choices are served first choice first (all tokens' ``j = 0``, then
    ``j = 1``, ...), tokens in order; a choice takes its expert's next free position, or
    is dropped when ``capacity`` are taken. ``slots[g, t, j] = e * capacity + position``
    (-1 if dropped), ``sources[g, e, c] = t * K + j`` (-1 for an empty slot)."""

    name = "graph.moe_route"
    choices = operand_def(TensorType)
    slots = result_def(TensorType)
    sources = result_def(TensorType)
    experts = prop_def(IntegerAttr)
    capacity = prop_def(IntegerAttr)
    shape_rule = staticmethod(shape_rules.moe_route)


@irdl_op_definition
class MoeDispatchOp(GraphOp):
    """Gathers tokens into their experts' slots (zeros in empty slots)::

        %xe = graph.moe_dispatch %x, %slots, %sources
            : tensor<2x16x32xf32>, tensor<2x16x2xi32>, tensor<2x8x4xi32> -> tensor<2x8x4x32xf32>

    ``x [G, T, H]``: slot ``(e, c)`` holds token ``sources // K``; ``x [G, T, K, H]``
    (one row per choice, a combine's cotangent): the row ``sources``. The transpose
    of :class:`MoeCombineOp`."""

    name = "graph.moe_dispatch"
    input = operand_def(TensorType)
    slots = operand_def(TensorType)
    sources = operand_def(TensorType)
    result = result_def(TensorType)
    shape_rule = staticmethod(shape_rules.moe_dispatch)


@irdl_op_definition
class MoeCombineOp(GraphOp):
    """Gathers each choice's row back from its expert's slot (zeros when dropped)::

        %yc = graph.moe_combine %ye, %slots, %sources
            : tensor<2x8x4x32xf32>, tensor<2x16x2xi32>, tensor<2x8x4xi32> -> tensor<2x16x2x32xf32>
    """

    name = "graph.moe_combine"
    input = operand_def(TensorType)
    slots = operand_def(TensorType)
    sources = operand_def(TensorType)
    result = result_def(TensorType)
    shape_rule = staticmethod(shape_rules.moe_combine)


# --- sharding: meshes, constraints and collectives ---------------------------------------
# Before shard-partition, types are global and a collective is a layout transition: the
# global value is unchanged, only how it lies over the mesh (its sharding) changes.


PARTITIONED = "graph.partitioned"  # unit attribute of a func.func with per-rank types
MANUAL = "graph.manual"  # unit attribute of a dist.shard_map body (see tessera.ir.manual)
RESULT_SHARDINGS = "graph.result_shardings"  # a graph.call's constraints on its results
# on a region variant (shard-propagate): the results it returns partial, as its calls' constraints say
PARTIAL_RESULTS = "graph.partial_results"
DONATED = "graph.donated"  # unit argument attribute: the program may reuse its buffer


def is_graph_function(function: FuncOp, pass_name: str) -> bool:
    """Whether ``function`` is what the graph passes rewrite: a body of graph ops and
    its return. A body without graph ops (a scheduled function) is not; one that mixes
    graph ops with others is an error at the first other op."""
    if not function.body.blocks:
        return False
    ops = list(function.body.block.ops)
    foreign = next((o for o in ops if not isinstance(o, GraphOp | ReturnOp)), None)
    if foreign is None:
        return True
    if any(isinstance(o, GraphOp) for o in ops):
        raise LocatedPassFailure(
            foreign,
            f"{pass_name}: @{function.sym_name.data}: expected only graph ops and func.return "
            f"in a function to rewrite, found {foreign.name}",
        )
    return False


class CollectiveOp(UnaryGraphOp):
    """Base of collectives over the mesh ``axes``."""

    axes = prop_def(ArrayAttr)

    def rule_attrs(self) -> dict[str, Any]:
        return {**self.attrs(), "group_size": self.group_size()}

    def group_size(self) -> int | None:
        """Ranks per group in a partitioned function (looked up in the module's
        ``graph.mesh``); None in the global view."""
        return _group_size(self, self.attrs()["axes"])


def _group_size(op: GraphOp, axes: Sequence[str]) -> int | None:
    """The number of ranks along mesh ``axes`` when ``op`` is in a partitioned function
    (looked up in the module's ``graph.mesh``); None in the global view. Raises
    VerifyException for a missing mesh or an axis it does not have."""
    function = op.parent_op()
    while function is not None and not isinstance(function, FuncOp):
        function = function.parent_op()
    if function is None or PARTITIONED not in function.attributes:
        return None
    module = function.parent_op()  # meshes are symbols at the module's top level:
    # look there only, not through every function (this runs for every collective)
    top_level = module.regions[0].block.ops if module and module.regions else ()
    meshes = [o for o in top_level if isinstance(o, MeshOp)]
    if len(meshes) != 1:
        raise VerifyException(f"{op.name}: a partitioned function needs exactly one graph.mesh")
    sizes = dict(meshes[0].axes)
    unknown = [a for a in axes if a not in sizes]
    if unknown:
        raise VerifyException(f"{op.name}: unknown mesh axes {unknown}; the mesh has {list(sizes)}")
    return math.prod(sizes[a] for a in axes)


@irdl_op_definition
class AllReduceOp(CollectiveOp):
    """Resolves a value that is partial over ``axes`` by a ``kind`` reduction."""

    name = "graph.all_reduce"
    kind = prop_def(StringAttr)
    shape_rule = staticmethod(shape_rules.all_reduce)


@irdl_op_definition
class AllGatherOp(CollectiveOp):
    """Makes ``dim``, split over ``axes``, whole on every rank."""

    name = "graph.all_gather"
    dim = prop_def(IntegerAttr)
    shape_rule = staticmethod(shape_rules.all_gather)


@irdl_op_definition
class AllSliceOp(CollectiveOp):
    """Splits ``dim`` over ``axes``: every rank keeps its slice (no communication)."""

    name = "graph.all_slice"
    dim = prop_def(IntegerAttr)
    shape_rule = staticmethod(shape_rules.all_slice)


@irdl_op_definition
class ReduceScatterOp(CollectiveOp):
    """Resolves a value partial over ``axes`` into a split of ``dim`` over them."""

    name = "graph.reduce_scatter"
    dim = prop_def(IntegerAttr)
    kind = prop_def(StringAttr)
    shape_rule = staticmethod(shape_rules.reduce_scatter)


@irdl_op_definition
class AllToAllOp(CollectiveOp):
    """Moves the split over ``axes`` from ``concat_dim`` to ``split_dim``."""

    name = "graph.all_to_all"
    split_dim = prop_def(IntegerAttr)
    concat_dim = prop_def(IntegerAttr)
    shape_rule = staticmethod(shape_rules.all_to_all)


@irdl_op_definition
class BroadcastOp(CollectiveOp):
    """Every rank along ``axes`` takes the value of the rank at index ``src``."""

    name = "graph.broadcast"
    src = prop_def(IntegerAttr)
    shape_rule = staticmethod(shape_rules.broadcast)


WaitOp = _unary(
    "wait",
    shape_rules.unary,
    "x, at the point where a dist.*_async handle's .wait() was called: the identity. When x "
    "is the result of a communicating collective, lower-graph-to-schedule places that "
    "collective's schedule.wait here (marked schedule.user_wait, which overlap-comm keeps), "
    "so the wait is where the user put it, not at the result's first use",
)


@irdl_op_definition
class AxisIndexOp(GraphOp):
    """This rank's linear position along the mesh ``axes`` (major first), as an i32
    scalar: ``graph.axis_index {axes = [tp]} : tensor<i32>`` is 0 to 3 on a tp = 4 axis
    (``jax.lax.axis_index``, the shard dialect's ``process_multi_index``). A per-rank
    value: it exists only in a partitioned function (shard-partition makes it, for the
    offset of a rank's slice)."""

    name = "graph.axis_index"
    result = result_def(TensorType)
    axes = prop_def(ArrayAttr)
    shape_rule = staticmethod(shape_rules.axis_index)

    def rule_attrs(self) -> dict[str, Any]:
        axes = self.attrs()["axes"]
        return {"axes": axes, "group_size": _group_size(self, axes)}

    def verify_(self) -> None:
        super().verify_()
        if self.rule_attrs()["group_size"] is None:
            raise VerifyException(
                f"{self.name}: a rank's position exists only in a partitioned (per-rank) "
                f"function; this one has no {PARTITIONED} attribute"
            )


@irdl_op_definition
class CollectivePermuteOp(CollectiveOp):
    """Sends each ``[source, target]`` pair's source value to its target (positions in
    every group over ``axes``, as XLA's ``source_target_pairs``); a rank that is no
    target receives zeros. It moves blocks between ranks, so it has per-rank semantics
    only: it appears in partitioned functions (``shard-partition`` makes it)."""

    name = "graph.collective_permute"
    pairs = prop_def(Attribute)  # [[source, target], ...]; an empty list is ``[]``
    shape_rule = staticmethod(shape_rules.collective_permute)

    def rule_attrs(self) -> dict[str, Any]:
        group_size = self.group_size()
        if group_size is None:
            raise VerifyException(
                f"{self.name}: moves blocks between ranks, so it belongs in a partitioned "
                f"function ({PARTITIONED}); found in a global one"
            )
        try:
            pairs = self.source_target_pairs()
        except VerifyException as error:
            raise VerifyException(f"{self.name}: {error}") from None
        return {**self.attrs(), "pairs": pairs, "group_size": group_size}

    def source_target_pairs(self) -> tuple[tuple[int, int], ...]:
        """The pairs as ``(source, target)`` positions."""
        return permute_pairs(self.properties["pairs"])


def permute_pairs(attr: Attribute) -> tuple[tuple[int, int], ...]:
    """A ``pairs`` property as ``(source, target)`` tuples (``[]`` parses as no pairs)."""
    value = to_python(attr)
    if not isinstance(value, tuple) or not all(
        isinstance(p, tuple) and len(p) == 2 for p in value
    ):
        raise VerifyException(
            f"expected [source, target] pairs like [[0, 1], [1, 0]], found {shape_rules.pairs_text(value)}"
        )
    return tuple((int(s), int(t)) for s, t in value)


@irdl_op_definition
class ShardOp(UnaryGraphOp):
    """A sharding constraint (``dist.shard``): the value must have ``sharding`` here."""

    name = "graph.shard"
    sharding = prop_def(ShardingAttr)

    @staticmethod
    def shape_rule(x: AbstractTensor, sharding: Any = None) -> AbstractTensor:
        """A constraint leaves the value's type as is (its sharding is checked against
        the mesh by the sharding passes)."""
        return x


class ConstrainedResults:
    """``graph.result_shardings`` on a region call (``graph.call``, ``graph.scan``): per
    result a ``#graph.sharding`` it is constrained to, as a ``graph.shard`` of it would
    (``canonicalize`` folds such constraints into the call), or ``unit`` (open). A scan
    constrains only its stacked results, each with dim 0 (the steps) whole."""

    def result_constraint_attrs(self) -> list[ShardingAttr | None]:
        """Per result, the ``#graph.sharding`` of ``graph.result_shardings`` (None: open)."""
        attr = self.attributes.get(RESULT_SHARDINGS)
        if not isinstance(attr, ArrayAttr):
            return [None] * len(self.results)
        return [a if isinstance(a, ShardingAttr) else None for a in attr.data]

    def result_constraints(self) -> list[Sharding | None]:
        """Per result, the layout ``graph.result_shardings`` constrains it to (None: open)."""
        return [a.sharding if a is not None else None for a in self.result_constraint_attrs()]

    def set_result_constraints(self, constraints: Sequence[ShardingAttr | None]) -> None:
        """Sets ``graph.result_shardings`` (removed when no result is constrained)."""
        if all(c is None for c in constraints):
            self.attributes.pop(RESULT_SHARDINGS, None)
            return
        self.attributes[RESULT_SHARDINGS] = ArrayAttr(
            [c if c is not None else UnitAttr() for c in constraints]
        )

    def _verify_result_constraints(self) -> None:
        attr = self.attributes.get(RESULT_SHARDINGS)
        if attr is None:
            return
        if not isinstance(attr, ArrayAttr) or len(attr.data) != len(self.results):
            raise VerifyException(
                f"{self.name} @{self.callee_name}: {RESULT_SHARDINGS} needs one "
                f"#graph.sharding or unit per result ({len(self.results)}), found {attr}"
            )
        for index, (entry, result) in enumerate(zip(attr.data, self.results, strict=True)):
            if isinstance(entry, UnitAttr):
                continue
            if not isinstance(entry, ShardingAttr):
                raise VerifyException(
                    f"{self.name} @{self.callee_name}: {RESULT_SHARDINGS} entry #{index} must "
                    f"be a #graph.sharding or unit, found {entry}"
                )
            rank = AbstractTensor.from_xdsl(result.type).rank
            if len(entry.dims.data) != rank:
                raise VerifyException(
                    f"{self.name} @{self.callee_name}: {RESULT_SHARDINGS} entry #{index} "
                    f"has {len(entry.dims.data)} dims for a result of rank {rank}"
                )
        if isinstance(self, ScanOp):
            for index, entry in enumerate(attr.data):
                if isinstance(entry, ShardingAttr) and not scan_constrainable(
                    self, index, entry.sharding
                ):
                    raise VerifyException(
                        f"{self.name} @{self.callee_name}: {RESULT_SHARDINGS} entry #{index} "
                        f"must be unit (a carry) or keep dim 0 whole (a stacked result), "
                        f"found {entry}"
                    )


def scan_constrainable(scan: ScanOp, index: int, sharding: Sharding) -> bool:
    """Whether ``scan``'s result ``index`` may be constrained to ``sharding``: a
    stacked result (not a carry) whose constraint keeps dim 0 whole."""
    return index >= scan.carry_count and sharding.dims[:1] == ((),)


@irdl_op_definition
class CallOp(ConstrainedResults, GraphOp):
    """A call of an outlined region (``graph.region``): ``func.func @callee`` of the same
    module computes the results from the operands, and every call of one callee runs
    that one function (compiled once, whatever the number of calls)::

        %y, %r = graph.call @layer(%x, %w) : (tensor<8x64xf32>, tensor<64x64xf32>) -> (tensor<8x64xf32>, tensor<8x64xf32>)

    A call may constrain the layouts of its results, as a ``graph.shard`` of each would
    (``canonicalize`` folds such constraints into the call): ``graph.result_shardings``
    holds one ``#graph.sharding`` (constrained) or ``unit`` (open) per result::

        %y, %r = graph.call @layer(%x, %w) attributes {graph.result_shardings = [#graph.sharding<@mesh, [[dp], []]>, unit]} : ...
    """

    name = "graph.call"
    callee = prop_def(SymbolRefAttr)
    args = var_operand_def(TensorType)
    res = var_result_def(TensorType)

    @staticmethod
    def get(callee: str, operands: Sequence[SSAValue], result_types: Sequence[Attribute]) -> CallOp:
        return CallOp.create(
            operands=list(operands),
            result_types=list(result_types),
            properties={"callee": SymbolRefAttr(callee)},
        )

    @property
    def callee_name(self) -> str:
        return self.callee.root_reference.data

    def callee_function(self) -> FuncOp | None:
        """The called ``func.func``, found among the enclosing module's symbols (None
        while the call is not in a module yet, or when the module lacks it)."""
        parent = self.parent_op()
        while parent is not None and not isinstance(parent, ModuleOp):
            parent = parent.parent_op()
        if parent is None:
            return None
        return function_named(parent, self.callee_name)

    def verify_(self) -> None:
        self._verify_result_constraints()
        function = self.callee_function()
        if function is None:
            if self.parent_op() is not None and _in_module(self):
                raise VerifyException(f"graph.call: no function @{self.callee_name} in the module")
            return
        if MANUAL in function.attributes and not _in_partitioned(self):
            return  # global values in, global values out: tessera.ir.manual checks them
        inputs, outputs = function.function_type.inputs.data, function.function_type.outputs.data
        operands = tuple(v.type for v in self.operands)
        results = tuple(r.type for r in self.results)
        if operands != tuple(inputs):
            raise VerifyException(
                f"graph.call @{self.callee_name}: operand types {_types(operands)} do not match "
                f"the function's arguments {_types(inputs)}"
            )
        if results != tuple(outputs):
            raise VerifyException(
                f"graph.call @{self.callee_name}: result types {_types(results)} do not match "
                f"the function's results {_types(outputs)}"
            )

    def print(self, printer: Printer) -> None:
        print_call_like(self, printer, {})

    @classmethod
    def parse(cls, parser: Parser) -> CallOp:
        callee, values, results, _, attributes = parse_call_like(parser)
        op = CallOp.get(callee, values, results)
        op.attributes.update(attributes)
        return op


def _types(types: Sequence[Attribute]) -> str:
    """Types as the IR prints them: ``(tensor<4xf32>, tensor<3x4xf32>)``."""
    return "(" + ", ".join(str(AbstractTensor.from_xdsl(t).to_xdsl()) for t in types) + ")"


def scan_slice(value_type: Attribute) -> Attribute:
    """The type of one step's slice of a stacked (scanned) operand: dim 0 dropped."""
    t = AbstractTensor.from_xdsl(value_type)
    return t.with_shape(t.shape[1:]).to_xdsl()


def scan_stack(value_type: Attribute, length: int) -> Attribute:
    """The type of ``length`` stacked values of ``value_type`` (a new dim 0)."""
    t = AbstractTensor.from_xdsl(value_type)
    return t.with_shape((length, *t.shape)).to_xdsl()


def verify_scan(op: Operation, function: FuncOp | None, length: int, carries: int) -> None:
    """The checks of a scan (``graph.scan``, ``schedule.scan``) against its body: the
    carries have the body's carry types in and out, each other operand stacks
    ``length`` of the body's slice arguments, each other result ``length`` of the body's
    per-step results."""
    name = f"{op.name} @{op.callee.root_reference.data}"  # type: ignore[attr-defined]
    if length < 1:
        raise VerifyException(f"{name}: length must be positive, found {length}")
    operands = [v.type for v in op.operands]
    results = [r.type for r in op.results]
    if not 0 <= carries <= min(len(operands), len(results)):
        raise VerifyException(f"{name}: {carries} carries for {len(operands)} operands")
    if function is None:
        return
    inputs, outputs = function.function_type.inputs.data, function.function_type.outputs.data
    expected_operands = [*inputs[:carries], *(scan_stack(t, length) for t in inputs[carries:])]
    expected_results = [*outputs[:carries], *(scan_stack(t, length) for t in outputs[carries:])]
    if list(inputs[:carries]) != list(outputs[:carries]):
        raise VerifyException(
            f"{name}: the body's carries change type: {_types(inputs[:carries])} in, "
            f"{_types(outputs[:carries])} out"
        )
    if operands != expected_operands:
        raise VerifyException(
            f"{name}: operand types {_types(operands)} do not match the body's "
            f"{_types(expected_operands)}"
        )
    if results != expected_results:
        raise VerifyException(
            f"{name}: result types {_types(results)} do not match the body's "
            f"{_types(expected_results)}"
        )


def print_call_like(op: Operation, printer: Printer, properties: dict[str, Any]) -> None:
    """``@callee(%a, %b) {props} attributes {...} : (types) -> (types)``."""
    printer.print_string(f" @{op.callee.root_reference.data}(")  # type: ignore[attr-defined]
    printer.print_list(op.operands, printer.print_operand)
    printer.print_string(")")
    if properties:
        text = ", ".join(f"{k} = {str(v).lower() if isinstance(v, bool) else v}" for k, v in properties.items())
        printer.print_string(f" {{{text}}}")
    printer.print_op_attributes(op.attributes, print_keyword=True)
    printer.print_string(" : (")
    printer.print_list([v.type for v in op.operands], printer.print_attribute)
    printer.print_string(") -> (")
    printer.print_list([r.type for r in op.results], printer.print_attribute)
    printer.print_string(")")


def parse_call_like(
    parser: Parser,
) -> tuple[str, list[SSAValue], list[Attribute], dict[str, Any], dict[str, Attribute]]:
    """The callee, operands, result types, properties and attributes of
    :func:`print_call_like`'s syntax."""
    callee = parser.parse_symbol_name().data
    operands = parser.parse_comma_separated_list(
        parser.Delimiter.PAREN, parser.parse_unresolved_operand
    )
    properties: dict[str, Any] = {}
    if parser.parse_optional_punctuation("{") is not None:
        while True:
            key = parser.parse_identifier()
            parser.parse_punctuation("=")
            if (number := parser.parse_optional_integer()) is not None:
                properties[key] = number
            else:
                properties[key] = parser.parse_boolean()
            if parser.parse_optional_punctuation(",") is None:
                break
        parser.parse_punctuation("}")
    attributes = parser.parse_optional_attr_dict_with_keyword()
    parser.parse_punctuation(":")
    types = parser.parse_comma_separated_list(parser.Delimiter.PAREN, parser.parse_type)
    parser.parse_punctuation("->")
    results = parser.parse_comma_separated_list(parser.Delimiter.PAREN, parser.parse_type)
    if len(types) != len(operands):
        parser.raise_error(f"expected {len(operands)} operand types, found {len(types)}")
    values = [parser.resolve_operand(o, t) for o, t in zip(operands, types, strict=True)]
    return callee, values, results, properties, dict(attributes.data) if attributes else {}


class ScanLike:
    """What ``graph.scan`` and ``schedule.scan`` share: their properties, as Python
    values, and their syntax."""

    @staticmethod
    def properties_of(
        callee: str, length: int, carries: int, reverse: bool
    ) -> dict[str, Attribute]:
        return {
            "callee": SymbolRefAttr(callee),
            "length": IntegerAttr(length, 64),
            "carries": IntegerAttr(carries, 64),
            "reverse": BoolAttr(reverse, IntegerType(1)),
        }

    @property
    def callee_name(self) -> str:
        return self.callee.root_reference.data  # type: ignore[attr-defined]

    @property
    def steps(self) -> int:
        return self.length.value.data  # type: ignore[attr-defined]

    @property
    def carry_count(self) -> int:
        return self.carries.value.data  # type: ignore[attr-defined]

    @property
    def reversed(self) -> bool:
        return bool(self.reverse.value.data)  # type: ignore[attr-defined]

    def verify_scan(self) -> None:
        function = CallOp.callee_function(self)  # type: ignore[arg-type]
        if function is None and _in_module(self):  # type: ignore[arg-type]
            raise VerifyException(f"{self.name}: no function @{self.callee_name} in the module")  # type: ignore[attr-defined]
        verify_scan(self, function, self.steps, self.carry_count)  # type: ignore[arg-type]

    def print(self, printer: Printer) -> None:
        properties = {"carries": self.carry_count, "length": self.steps, "reverse": self.reversed}
        print_call_like(self, printer, properties)  # type: ignore[arg-type]

    @classmethod
    def parse(cls, parser: Parser) -> Any:
        callee, values, results, properties, attributes = parse_call_like(parser)
        op = cls.create(  # type: ignore[attr-defined]
            operands=values,
            result_types=results,
            properties=cls.properties_of(
                callee, properties.get("length", 1), properties.get("carries", 0),
                bool(properties.get("reverse", False)),
            ),
        )  # fmt: skip
        op.attributes.update(attributes)
        return op


@irdl_op_definition
class ScanOp(ConstrainedResults, ScanLike, GraphOp):
    """A loop over ``length`` steps of a region (``graph.scan``): ``@callee(carries,
    slices) -> (carries, per-step results)``. The first ``carries`` operands are the
    initial carries, each other operand stacks the steps' slices on dim 0; the results
    are the final carries and the steps' other results stacked on dim 0. ``reverse``
    runs the steps from the last (a scan's backward)::

        %h, %ys = graph.scan @layer(%x, %w) {carries = 1, length = 4, reverse = false} : (tensor<8x16xf32>, tensor<4x16x16xf32>) -> (tensor<8x16xf32>, tensor<4x8x16xf32>)
    """

    name = "graph.scan"
    callee = prop_def(SymbolRefAttr)
    length = prop_def(IntegerAttr)
    carries = prop_def(IntegerAttr)
    reverse = prop_def(BoolAttr)
    args = var_operand_def(TensorType)
    res = var_result_def(TensorType)

    @staticmethod
    def get(
        callee: str,
        operands: Sequence[SSAValue],
        result_types: Sequence[Attribute],
        length: int,
        carries: int,
        reverse: bool = False,
    ) -> ScanOp:
        return ScanOp.create(
            operands=list(operands),
            result_types=list(result_types),
            properties=ScanLike.properties_of(callee, length, carries, reverse),
        )

    def callee_function(self) -> FuncOp | None:
        return CallOp.callee_function(self)  # type: ignore[arg-type]

    def verify_(self) -> None:
        self._verify_result_constraints()
        self.verify_scan()


def _in_partitioned(op: Operation) -> bool:
    parent = op.parent_op()
    while parent is not None and not isinstance(parent, FuncOp):
        parent = parent.parent_op()
    return parent is not None and PARTITIONED in parent.attributes


def _in_module(op: Operation) -> bool:
    parent = op.parent_op()
    while parent is not None:
        if isinstance(parent, ModuleOp):
            return True
        parent = parent.parent_op()
    return False


def function_named(module: ModuleOp, name: str) -> FuncOp | None:
    """The ``func.func @name`` at the top level of ``module``, or None."""
    for op in module.ops:
        if isinstance(op, FuncOp) and op.sym_name.data == name:
            return op
    return None


def called_functions(module: ModuleOp) -> set[str]:
    """The names of the functions some ``graph.call`` or ``graph.scan`` of ``module`` calls."""
    return {op.callee_name for op in module.walk() if isinstance(op, CallOp | ScanOp)}


@irdl_op_definition
class MeshOp(IRDLOperation):
    """A device mesh symbol: ``graph.mesh @mesh axes = [dp = 2, tp = 4]``, with the
    machine it runs on when the mesh names one (``topology = "gb200_nvl72"``: the text
    :func:`~tessera.topology.load_topology` reads, a preset name or JSON)."""

    name = "graph.mesh"
    sym_name = prop_def(StringAttr)
    axis_names = prop_def(ArrayAttr)
    axis_sizes = prop_def(DenseArrayBase)
    topology = opt_prop_def(StringAttr)
    traits = traits_def(SymbolOpInterface())

    @staticmethod
    def get(name: str, axes: Sequence[tuple[str, int]], topology: str | None = None) -> MeshOp:
        properties: dict[str, Attribute] = {
            "sym_name": StringAttr(name),
            "axis_names": ArrayAttr([StringAttr(a) for a, _ in axes]),
            "axis_sizes": to_attr([int(s) for _, s in axes]),
        }
        if topology is not None:
            properties["topology"] = StringAttr(topology)
        return MeshOp.create(properties=properties)

    @property
    def axes(self) -> list[tuple[str, int]]:
        names = [a.data for a in self.axis_names.data]
        return list(zip(names, to_python(self.axis_sizes), strict=True))

    def verify_(self) -> None:
        names = (
            [a for a, _ in self.axes]
            if len(self.axis_names.data) == len(to_python(self.axis_sizes))
            else None
        )
        if names is None:
            raise VerifyException("graph.mesh: expected one size per axis name")
        if not names or len(set(names)) != len(names):
            raise VerifyException(f"graph.mesh: expected distinct axis names, found {names}")
        for axis, size in self.axes:
            if not axis.isidentifier():
                raise VerifyException(f"graph.mesh: axis names are identifiers, found {axis!r}")
            if size < 1:
                raise VerifyException(
                    f"graph.mesh: axis {axis} must have a positive size, found {size}"
                )
        devices = math.prod(size for _, size in self.axes)
        if devices > MAX_MESH_DEVICES:
            raise VerifyException(
                f"graph.mesh: {devices} devices are more than the {MAX_MESH_DEVICES} (2**20) "
                f"a mesh may have"
            )
        if self.topology is not None:
            try:
                load_topology(self.topology.data)
            except TesseraError as error:
                raise VerifyException(f"graph.mesh: bad topology: {error}") from None

    def print(self, printer: Printer) -> None:
        axes = ", ".join(f"{a} = {s}" for a, s in self.axes)
        printer.print_string(f" @{self.sym_name.data} axes = [{axes}]")
        if self.topology is not None:
            printer.print_string(" topology = ")
            printer.print_string_literal(self.topology.data)

    @classmethod
    def parse(cls, parser: Parser) -> MeshOp:
        name = parser.parse_symbol_name().data
        parser.parse_keyword("axes")
        parser.parse_punctuation("=")

        def parse_axis() -> tuple[str, int]:
            axis = parser.parse_identifier(" for a mesh axis name")
            parser.parse_punctuation("=")
            return axis, parser.parse_integer(context_msg=" for a mesh axis size")

        axes = parser.parse_comma_separated_list(parser.Delimiter.SQUARE, parse_axis)
        topology = None
        if parser.parse_optional_keyword("topology") is not None:
            parser.parse_punctuation("=")
            topology = parser.parse_str_literal(" for the mesh's topology")
        return cls.get(name, axes, topology)


COLLECTIVE_OPS: tuple[type[GraphOp], ...] = (
    AllReduceOp, AllGatherOp, AllSliceOp, ReduceScatterOp, AllToAllOp, BroadcastOp,
    CollectivePermuteOp,
)  # fmt: skip


PER_RANK_OPS: tuple[type[GraphOp], ...] = (AxisIndexOp, WaitOp)  # ops of per-rank code


GRAPH_OPS: tuple[type[GraphOp], ...] = (
    NegOp, AbsOp, ReluOp, ExpOp, LogOp, TanhOp, SqrtOp, RsqrtOp, SiluOp, SigmoidOp, ErfOp,
    CosOp, SinOp, StopGradientOp, GeluOp,
    AddOp, SubOp, MulOp, DivOp, PowOp, MaximumOp, MinimumOp, MatmulOp, CompareOp, SelectOp,
    CastOp, Fp8QuantizeOp, Fp8GradOp, Fp8GradDelayedOp, RandomBitsOp, IotaOp, ConstantOp, SumOp, MeanOp, MaxOp, MinOp, ProdOp, SoftmaxOp, LogSoftmaxOp,
    LayerNormOp, RmsNormOp, CrossEntropyOp, AttentionOp, AttentionBackwardOp, ReshapeOp, BroadcastToOp,
    TransposeOp, SliceOp, ConcatOp, SplitOp, GatherOp, DynamicUpdateSliceOp, TopKOp, MoeRouteOp, MoeDispatchOp,
    MoeCombineOp,
)  # fmt: skip

def _verify_once_per_signature(cls: type[GraphOp]) -> None:
    """Makes ``cls.verify_`` (xDSL's checks of types and properties, then the shape rule)
    run once per distinct signature: both read only the operand and result types and
    the properties, and the ops of identical layers share signatures, so a module of
    many layers costs as many checks as one layer."""
    verify = cls.verify_
    verified: AttributeMap[bool] = AttributeMap(1 << 16)

    def verify_(self: GraphOp) -> None:
        key = (
            *(v.type for v in self.operands),
            None,  # operands end
            *(r.type for r in self.results),
            None,  # results end
            *(part for item in self.properties.items() for part in item),
        )
        if verified.get(key):
            return
        verify(self)
        verified[key] = True

    cls.verify_ = verify_  # type: ignore[method-assign]


for _op in GRAPH_OPS:  # not collectives nor axis_index (they read the module's mesh)
    if _op is not ConstantOp:  # its value is not in the signature
        _verify_once_per_signature(_op)

Graph = Dialect(
    "graph",
    [*GRAPH_OPS, *COLLECTIVE_OPS, *PER_RANK_OPS, ShardOp, CallOp, ScanOp, MeshOp],
    [ShardingAttr],
)


@functools.lru_cache(maxsize=1024)
def _property_names(op_type: type[GraphOp]) -> tuple[str, ...]:
    """``GraphOp._property_names`` (cached: an op class's properties are fixed)."""
    names = list(op_type.get_irdl_definition().properties)
    mro = list(reversed(op_type.__mro__))
    return tuple(sorted(names, key=lambda n: next(i for i, k in enumerate(mro) if n in vars(k))))


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
