"""The ``tile`` dialect: one kernel at Triton's level of abstraction.

``lower-schedule-to-tile`` turns each ``schedule.kernel`` into a ``tile.kernel``: a
function over pointers and scalars that one *program* of a launch grid runs. Values are
scalars (``i32``, ``f32``, ...) or blocks (``tensor<64x32xf32>``, power-of-two sizes).
Arithmetic and math use the upstream ``arith`` and ``math`` dialects on scalars and
blocks; loops are ``scf.for`` with loop-carried values. The dialect itself adds what
Triton adds::

    tile.kernel @k(%x: !tile.ptr<f32>, %y: !tile.ptr<f32>) grid [4, 1, 1] warps 4 stages 1 {
      %pid = tile.program_id 0 : i32
      %r = tile.arange : tensor<256xi32>
      %base = arith.muli %pid, %c256 : i32
      %b = tile.splat %base : i32 -> tensor<256xi32>
      %offsets = arith.addi %b, %r : tensor<256xi32>
      %m = tile.cmp "lt" %offsets, %nb : tensor<256xi32> -> tensor<256xi1>
      %v = tile.load %x[%offsets] mask %m : !tile.ptr<f32>, tensor<256xi32>, tensor<256xi1> -> tensor<256xf32>
      tile.store %y[%offsets], %v mask %m : !tile.ptr<f32>, tensor<256xi32>, tensor<256xf32>, tensor<256xi1>
      tile.return
    }

- ``tile.kernel``: a symbol with pointer and scalar arguments and its launch: ``grid``
  (three program counts, within CUDA's limits), ``warps`` (1 to 32, a power of two) and
  ``stages`` (software-pipelining depth).
- ``tile.program_id``: the program's index along grid axis 0, 1 or 2.
- ``tile.arange``: ``[0, 1, ..., n-1]`` as a 1-D ``i32`` block (``n`` a power of two).
- ``tile.trans``: the transpose of a 2-D block.
- ``tile.splat`` / ``tile.broadcast`` / ``tile.expand_dims``: shape changes (scalar to
  block; size-1 dims to n; a new size-1 dim).
- ``tile.load`` / ``tile.store``: element ``offsets`` from a pointer, with an optional
  ``i1`` mask of the offsets' shape; a masked-off lane loads 0 and stores nothing.
- ``tile.dot``: ``acc + a @ b`` on 2-D blocks, accumulated in ``f32`` (``f64`` for f64
  operands, the operands' type for integers).
- ``tile.reduce``: a reduction (one of ``reduction_kinds.TILE_KINDS``) along one
  ``axis`` (a 1-D block reduces to a scalar).
- ``tile.cmp`` / ``tile.select`` / ``tile.convert``: comparison, choice and element type
  conversion on scalars and blocks (xDSL's ``arith`` versions take scalars only).
- ``tile.philox``: Philox-4x32-10 random bits (``triton.language.philox``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from xdsl.dialects import arith, math, scf
from xdsl.dialects.builtin import (
    I32,
    AnyFloat,
    DenseArrayBase,
    Float64Type,
    FunctionType,
    IndexType,
    IntegerAttr,
    IntegerType,
    StringAttr,
    TensorType,
    f32,
    f64,
    i32,
    i64,
)
from xdsl.ir import (
    Attribute,
    Block,
    Dialect,
    ParametrizedAttribute,
    Region,
    SSAValue,
    TypeAttribute,
)
from xdsl.irdl import (
    AnyAttr,
    BaseAttr,
    IRDLOperation,
    VarConstraint,
    irdl_attr_definition,
    irdl_op_definition,
    operand_def,
    opt_operand_def,
    param_def,
    prop_def,
    region_def,
    result_def,
    traits_def,
)
from xdsl.parser import AttrParser, Parser
from xdsl.printer import Printer
from xdsl.traits import HasParent, IsolatedFromAbove, IsTerminator, Pure, SymbolOpInterface
from xdsl.utils.exceptions import VerifyException

from tessera.ir.limits import MAX_GRID
from tessera.ir.reduction_kinds import TILE_KINDS

NUM_WARPS = (1, 2, 4, 8, 16, 32)  # warps per program: up to 1024 threads, as CUDA allows

# ops of the upstream dialects a tile kernel may contain
UPSTREAM_DIALECTS = ("arith", "math", "scf")


@irdl_attr_definition
class PointerType(ParametrizedAttribute, TypeAttribute):
    """A pointer to global memory holding elements of ``element_type``."""

    name = "tile.ptr"
    element_type: Attribute = param_def(Attribute)

    def __init__(self, element_type: Attribute):
        super().__init__(element_type)

    def print_parameters(self, printer: Printer) -> None:
        printer.print_string("<")
        printer.print_attribute(self.element_type)
        printer.print_string(">")

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> tuple[Attribute]:
        parser.parse_punctuation("<")
        element_type = parser.parse_type()
        parser.parse_punctuation(">")
        return (element_type,)


def element_type(t: Attribute) -> Attribute:
    """The element type of a block type, or the type itself for a scalar."""
    return t.element_type if isinstance(t, TensorType) else t


def block_shape(t: Attribute) -> tuple[int, ...]:
    """A block type's shape; ``()`` for a scalar."""
    return tuple(t.get_shape()) if isinstance(t, TensorType) else ()


def block_type(element: Attribute, shape: Sequence[int]) -> Attribute:
    """The block type of ``shape`` (the scalar type itself when ``shape`` is empty)."""
    return TensorType(element, list(shape)) if shape else element


def is_float(value: SSAValue) -> bool:
    """Whether a tile value (scalar or block) has a float element type."""
    return isinstance(element_type(value.type), AnyFloat)


def compute_element(element: Attribute) -> Attribute:
    """Kernels compute f64 in f64, other floats in f32, and keep integers and booleans
    as they are."""
    if isinstance(element, AnyFloat):
        return f64 if isinstance(element, Float64Type) else f32
    return element


def strides(dims: Sequence[int]) -> list[int]:
    """Row-major (contiguous) strides in elements."""
    out, running = [], 1
    for size in reversed(dims):
        out.append(running)
        running *= size
    return out[::-1]


def _is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _check_block(what: str, t: Attribute) -> None:
    for size in block_shape(t):
        if not _is_power_of_two(size):
            raise VerifyException(f"{what}: block sizes must be powers of two, found {t}")


def _check_integer(what: str, t: Attribute) -> None:
    if not isinstance(element_type(t), IntegerType | IndexType):
        raise VerifyException(f"{what}: expected integer offsets, found {t}")


def _check_mask(what: str, mask: SSAValue | None, offsets: SSAValue) -> None:
    if mask is None:
        return
    if element_type(mask.type) != IntegerType(1) or block_shape(mask.type) != block_shape(
        offsets.type
    ):
        raise VerifyException(
            f"{what}: expected an i1 mask shaped like the offsets {offsets.type}, found {mask.type}"
        )


# --- kernel --------------------------------------------------------------------------------


@irdl_op_definition
class KernelOp(IRDLOperation):
    """One generated kernel: its arguments are pointers and scalars; ``grid`` programs run it."""

    name = "tile.kernel"
    sym_name = prop_def(StringAttr)
    function_type = prop_def(FunctionType)
    grid = prop_def(DenseArrayBase)
    num_warps = prop_def(IntegerAttr)
    num_stages = prop_def(IntegerAttr)
    body = region_def("single_block")
    traits = traits_def(IsolatedFromAbove(), SymbolOpInterface())

    @staticmethod
    def get(
        kernel_name: str,
        arg_types: Sequence[Attribute],
        grid: Sequence[int],
        num_warps: int = 4,
        num_stages: int = 1,
    ) -> KernelOp:
        """An empty kernel (its body has the arguments and no ops yet)."""
        return KernelOp.create(
            properties={
                "sym_name": StringAttr(kernel_name),
                "function_type": FunctionType.from_lists(list(arg_types), []),
                "grid": DenseArrayBase.from_list(i64, list(grid)),
                "num_warps": IntegerAttr(num_warps, i64),
                "num_stages": IntegerAttr(num_stages, i64),
            },
            regions=[Region(Block(arg_types=list(arg_types)))],
        )

    @property
    def kernel_name(self) -> str:
        return self.sym_name.data

    @property
    def grid_size(self) -> tuple[int, ...]:
        return tuple(self.grid.get_values())  # type: ignore[arg-type]

    def verify_(self) -> None:
        what = f"tile.kernel @{self.kernel_name}"
        grid = self.grid_size
        if len(grid) != 3 or any(g < 0 for g in grid):  # 0 programs: an empty tensor
            raise VerifyException(
                f"{what}: expected a grid of three non-negative counts, found {list(grid)}"
            )
        if any(g > limit for g, limit in zip(grid, MAX_GRID, strict=True)):
            raise VerifyException(
                f"{what}: expected at most {list(MAX_GRID)} programs (CUDA's grid limits), "
                f"found {list(grid)}"
            )
        warps, stages = self.num_warps.value.data, self.num_stages.value.data
        if warps not in NUM_WARPS:
            raise VerifyException(f"{what}: warps must be one of {NUM_WARPS}, found {warps}")
        if stages < 1:
            raise VerifyException(f"{what}: stages must be positive, found {stages}")
        args = [a.type for a in self.body.block.args]
        if args != list(self.function_type.inputs.data):
            raise VerifyException(f"{what}: block arguments do not match the signature")
        for t in args:
            if not isinstance(t, PointerType | IntegerType | AnyFloat):
                raise VerifyException(f"{what}: arguments must be pointers or scalars, found {t}")
        last = self.body.block.last_op
        if not isinstance(last, ReturnOp):
            raise VerifyException(f"{what}: the body must end with tile.return")
        for inner in self.body.walk():
            dialect = inner.name.split(".")[0]
            if dialect not in ("tile", *UPSTREAM_DIALECTS):
                raise VerifyException(f"{what}: {inner.name} cannot appear in a tile kernel")

    def print(self, printer: Printer) -> None:
        printer.print_string(f" @{self.kernel_name}(")
        for i, arg in enumerate(self.body.block.args):
            printer.print_string(", " if i else "")
            printer.print_block_argument(arg)
        grid = ", ".join(map(str, self.grid_size))
        printer.print_string(
            f") grid [{grid}] warps {self.num_warps.value.data} stages {self.num_stages.value.data}"
        )
        printer.print_op_attributes(self.attributes, print_keyword=True)
        printer.print_string(" ")
        printer.print_region(self.body, print_entry_block_args=False)

    @classmethod
    def parse(cls, parser: Parser) -> KernelOp:
        kernel_name = parser.parse_symbol_name().data
        args = parser.parse_comma_separated_list(
            parser.Delimiter.PAREN, lambda: parser.parse_argument(expect_type=True)
        )

        def keyword_int(keyword: str) -> int:
            parser.parse_keyword(keyword)
            return parser.parse_integer(allow_boolean=False)

        parser.parse_keyword("grid")
        grid = parser.parse_comma_separated_list(
            parser.Delimiter.SQUARE, lambda: parser.parse_integer(allow_boolean=False)
        )
        num_warps, num_stages = keyword_int("warps"), keyword_int("stages")
        attributes = parser.parse_optional_attr_dict_with_keyword()
        body = parser.parse_region(args)
        op = cls.create(
            properties={
                "sym_name": StringAttr(kernel_name),
                "function_type": FunctionType.from_lists([a.type for a in args], []),
                "grid": DenseArrayBase.from_list(i64, grid),
                "num_warps": IntegerAttr(num_warps, i64),
                "num_stages": IntegerAttr(num_stages, i64),
            },
            attributes=attributes.data if attributes else {},
            regions=[body],
        )
        return op


@irdl_op_definition
class ReturnOp(IRDLOperation):
    """Ends a tile kernel."""

    name = "tile.return"
    traits = traits_def(IsTerminator(), HasParent(KernelOp))
    assembly_format = "attr-dict"


# --- indices and shapes ----------------------------------------------------------------


@irdl_op_definition
class ProgramIdOp(IRDLOperation):
    """This program's index along grid ``axis``."""

    name = "tile.program_id"
    traits = traits_def(Pure())
    axis = prop_def(IntegerAttr[I32])
    result = result_def(i32)
    assembly_format = "$axis attr-dict `:` type($result)"

    def __init__(self, axis: int):
        super().__init__(properties={"axis": IntegerAttr(axis, i32)}, result_types=[i32])

    def verify_(self) -> None:
        if self.axis.value.data not in (0, 1, 2):
            raise VerifyException(
                f"tile.program_id: axis must be 0, 1 or 2, found {self.axis.value.data}"
            )


@irdl_op_definition
class ArangeOp(IRDLOperation):
    """``[0, 1, ..., n-1]``; ``n`` is the result's (power-of-two) size."""

    name = "tile.arange"
    traits = traits_def(Pure())
    result = result_def(TensorType)
    assembly_format = "attr-dict `:` type($result)"

    def __init__(self, size: int):
        super().__init__(result_types=[TensorType(i32, [size])])

    def verify_(self) -> None:
        t = self.result.type
        if len(block_shape(t)) != 1 or element_type(t) != i32:
            raise VerifyException(f"tile.arange: expected a 1-D i32 block, found {t}")
        _check_block("tile.arange", t)


@irdl_op_definition
class SplatOp(IRDLOperation):
    """A block with every element equal to the scalar ``input``."""

    name = "tile.splat"
    traits = traits_def(Pure())
    input = operand_def()
    result = result_def(TensorType)
    assembly_format = "$input attr-dict `:` type($input) `->` type($result)"

    def __init__(self, value: SSAValue, shape: Sequence[int]):
        super().__init__(operands=[value], result_types=[TensorType(value.type, list(shape))])

    def verify_(self) -> None:
        if (
            isinstance(self.input.type, TensorType)
            or element_type(self.result.type) != self.input.type
        ):
            raise VerifyException(
                f"tile.splat: expected a scalar of the result's element type, found {self.input.type}"
            )
        _check_block("tile.splat", self.result.type)


@irdl_op_definition
class BroadcastOp(IRDLOperation):
    """Repeats the size-1 dims of ``input`` to the result's sizes (same rank)."""

    name = "tile.broadcast"
    traits = traits_def(Pure())
    input = operand_def(TensorType)
    result = result_def(TensorType)
    assembly_format = "$input attr-dict `:` type($input) `->` type($result)"

    def __init__(self, value: SSAValue, shape: Sequence[int]):
        super().__init__(
            operands=[value], result_types=[TensorType(element_type(value.type), list(shape))]
        )

    def verify_(self) -> None:
        src, dst = block_shape(self.input.type), block_shape(self.result.type)
        same_element = element_type(self.input.type) == element_type(self.result.type)
        if (
            not same_element
            or len(src) != len(dst)
            or any(s not in (1, d) for s, d in zip(src, dst, strict=True))
        ):
            raise VerifyException(
                f"tile.broadcast: cannot broadcast {self.input.type} to {self.result.type}"
            )


@irdl_op_definition
class ExpandDimsOp(IRDLOperation):
    """Inserts a size-1 dim at ``axis``."""

    name = "tile.expand_dims"
    traits = traits_def(Pure())
    input = operand_def(TensorType)
    axis = prop_def(IntegerAttr[I32])
    result = result_def(TensorType)
    assembly_format = "$input `,` $axis attr-dict `:` type($input) `->` type($result)"

    def __init__(self, value: SSAValue, axis: int):
        shape = list(block_shape(value.type))
        shape.insert(axis, 1)
        super().__init__(
            operands=[value],
            properties={"axis": IntegerAttr(axis, i32)},
            result_types=[TensorType(element_type(value.type), shape)],
        )

    def verify_(self) -> None:
        shape = list(block_shape(self.input.type))
        axis = self.axis.value.data
        if not 0 <= axis <= len(shape):
            raise VerifyException(
                f"tile.expand_dims: axis {axis} out of range for {self.input.type}"
            )
        shape.insert(axis, 1)
        want = TensorType(element_type(self.input.type), shape)
        if self.result.type != want:
            raise VerifyException(
                f"tile.expand_dims: expected result {want}, found {self.result.type}"
            )


@irdl_op_definition
class TransOp(IRDLOperation):
    """The transpose of a 2-D block (``MxN -> NxM``)."""

    name = "tile.trans"
    traits = traits_def(Pure())
    input = operand_def(TensorType)
    result = result_def(TensorType)
    assembly_format = "$input attr-dict `:` type($input) `->` type($result)"

    def __init__(self, value: SSAValue):
        rows, cols = block_shape(value.type)
        super().__init__(
            operands=[value], result_types=[TensorType(element_type(value.type), [cols, rows])]
        )

    def verify_(self) -> None:
        shape = block_shape(self.input.type)
        if len(shape) != 2:
            raise VerifyException(f"tile.trans: expected a 2-D block, found {self.input.type}")
        want = TensorType(element_type(self.input.type), [shape[1], shape[0]])
        if self.result.type != want:
            raise VerifyException(f"tile.trans: expected result {want}, found {self.result.type}")


# --- memory --------------------------------------------------------------------------------


@irdl_op_definition
class LoadOp(IRDLOperation):
    """Loads ``ptr[offsets]`` (a scalar or a block); masked-off lanes read 0."""

    name = "tile.load"
    traits = traits_def(Pure())
    ptr = operand_def(PointerType)
    offsets = operand_def()
    mask = opt_operand_def()
    result = result_def()
    assembly_format = (
        "$ptr `[` $offsets `]` (`mask` $mask^)? attr-dict `:` type($ptr) `,` type($offsets) "
        "(`,` type($mask)^)? `->` type($result)"
    )

    def __init__(self, ptr: SSAValue, offsets: SSAValue, mask: SSAValue | None = None):
        assert isinstance(ptr.type, PointerType)
        shape = block_shape(offsets.type)
        super().__init__(
            operands=[ptr, offsets, mask],
            result_types=[block_type(ptr.type.element_type, shape)],
        )

    def verify_(self) -> None:
        _check_integer("tile.load", self.offsets.type)
        _check_mask("tile.load", self.mask, self.offsets)
        assert isinstance(self.ptr.type, PointerType)
        want = block_type(self.ptr.type.element_type, block_shape(self.offsets.type))
        if self.result.type != want:
            raise VerifyException(f"tile.load: expected result {want}, found {self.result.type}")


@irdl_op_definition
class StoreOp(IRDLOperation):
    """Stores ``value`` to ``ptr[offsets]`` where the mask is set."""

    name = "tile.store"
    ptr = operand_def(PointerType)
    offsets = operand_def()
    value = operand_def()
    mask = opt_operand_def()
    assembly_format = (
        "$ptr `[` $offsets `]` `,` $value (`mask` $mask^)? attr-dict `:` type($ptr) `,` "
        "type($offsets) `,` type($value) (`,` type($mask)^)?"
    )

    def __init__(
        self, ptr: SSAValue, offsets: SSAValue, value: SSAValue, mask: SSAValue | None = None
    ):
        super().__init__(operands=[ptr, offsets, value, mask])

    def verify_(self) -> None:
        _check_integer("tile.store", self.offsets.type)
        _check_mask("tile.store", self.mask, self.offsets)
        assert isinstance(self.ptr.type, PointerType)
        want = block_type(self.ptr.type.element_type, block_shape(self.offsets.type))
        if self.value.type != want:
            raise VerifyException(
                f"tile.store: expected a value of type {want}, found {self.value.type}"
            )


# --- compute -------------------------------------------------------------------------------


@irdl_op_definition
class DotOp(IRDLOperation):
    """``acc + a @ b`` for ``a: MxK``, ``b: KxN`` blocks of one element type; ``acc: MxN``
    of f32, f64 for f64 operands, or the operands' type for integers."""

    name = "tile.dot"
    traits = traits_def(Pure())
    a = operand_def(TensorType)
    b = operand_def(TensorType)
    T: ClassVar = VarConstraint("T", BaseAttr(TensorType))
    acc = operand_def(T)
    result = result_def(T)
    assembly_format = "$a `,` $b `,` $acc attr-dict `:` type($a) `,` type($b) `->` type($result)"

    def __init__(self, a: SSAValue, b: SSAValue, acc: SSAValue):
        super().__init__(operands=[a, b, acc], result_types=[acc.type])

    def verify_(self) -> None:
        a, b, acc = (block_shape(v.type) for v in (self.a, self.b, self.acc))
        if len(a) != 2 or len(b) != 2 or a[1] != b[0] or acc != (a[0], b[1]):
            raise VerifyException(
                f"tile.dot: expected MxK, KxN and MxN blocks, found {self.a.type}, {self.b.type}, {self.acc.type}"
            )
        if element_type(self.a.type) != element_type(self.b.type):
            raise VerifyException(
                f"tile.dot: operand element types differ: {self.a.type}, {self.b.type}"
            )
        if min(a + b) < 16:
            raise VerifyException(
                f"tile.dot: every block dim must be at least 16, found {a} and {b}"
            )
        operands = element_type(self.a.type)
        integral = isinstance(operands, IntegerType)
        if self.acc.type != self.result.type or (
            element_type(self.acc.type) != operands
            if integral
            else not isinstance(element_type(self.acc.type), AnyFloat)
        ):
            raise VerifyException(
                f"tile.dot: expected a float accumulator (for integer operands, one of their "
                f"type), found {self.acc.type}"
            )


@irdl_op_definition
class ReduceOp(IRDLOperation):
    """Reduces ``input`` along ``axis`` with ``kind`` (one of ``TILE_KINDS``: a mean is
    a sum, then a division)."""

    name = "tile.reduce"
    traits = traits_def(Pure())
    input = operand_def(TensorType)
    kind = prop_def(StringAttr)
    axis = prop_def(IntegerAttr[I32])
    result = result_def()
    assembly_format = "$kind $input `,` $axis attr-dict `:` type($input) `->` type($result)"

    def __init__(self, value: SSAValue, kind: str, axis: int):
        shape = list(block_shape(value.type))
        del shape[axis]
        super().__init__(
            operands=[value],
            properties={"kind": StringAttr(kind), "axis": IntegerAttr(axis, i32)},
            result_types=[block_type(element_type(value.type), shape)],
        )

    def verify_(self) -> None:
        if self.kind.data not in TILE_KINDS:
            raise VerifyException(
                f"tile.reduce: unknown kind {self.kind.data!r}; expected one of {TILE_KINDS}"
            )
        shape = list(block_shape(self.input.type))
        axis = self.axis.value.data
        if not 0 <= axis < len(shape):
            raise VerifyException(f"tile.reduce: axis {axis} out of range for {self.input.type}")
        del shape[axis]
        want = block_type(element_type(self.input.type), shape)
        if self.result.type != want:
            raise VerifyException(f"tile.reduce: expected result {want}, found {self.result.type}")


# --- comparisons, selection and conversion on blocks ------------------------------------
# (xDSL's arith.cmpi, cmpf, select and integer casts accept scalars only)

CMP_PREDICATES = ("eq", "ne", "lt", "le", "gt", "ge")


@irdl_op_definition
class CmpOp(IRDLOperation):
    """Elementwise comparison of two integer or float values of one type, giving ``i1``."""

    name = "tile.cmp"
    traits = traits_def(Pure())
    predicate = prop_def(StringAttr)
    T: ClassVar = VarConstraint("T", AnyAttr())
    lhs = operand_def(T)
    rhs = operand_def(T)
    result = result_def()
    assembly_format = "$predicate $lhs `,` $rhs attr-dict `:` type($lhs) `->` type($result)"

    def __init__(self, predicate: str, lhs: SSAValue, rhs: SSAValue):
        super().__init__(
            operands=[lhs, rhs],
            properties={"predicate": StringAttr(predicate)},
            result_types=[block_type(IntegerType(1), block_shape(lhs.type))],
        )

    def verify_(self) -> None:
        if self.predicate.data not in CMP_PREDICATES:
            raise VerifyException(
                f"tile.cmp: unknown predicate {self.predicate.data!r}; expected one of {', '.join(CMP_PREDICATES)}"
            )
        if self.lhs.type != self.rhs.type:
            raise VerifyException(
                f"tile.cmp: operand types differ: {self.lhs.type} and {self.rhs.type}"
            )
        want = block_type(IntegerType(1), block_shape(self.lhs.type))
        if self.result.type != want:
            raise VerifyException(f"tile.cmp: expected result {want}, found {self.result.type}")


@irdl_op_definition
class SelectOp(IRDLOperation):
    """``cond ? on_true : on_false`` elementwise (all three of one shape)."""

    name = "tile.select"
    traits = traits_def(Pure())
    cond = operand_def()
    T: ClassVar = VarConstraint("T", AnyAttr())
    on_true = operand_def(T)
    on_false = operand_def(T)
    result = result_def(T)
    assembly_format = "$cond `,` $on_true `,` $on_false attr-dict `:` type($cond) `,` type($result)"

    def __init__(self, cond: SSAValue, on_true: SSAValue, on_false: SSAValue):
        super().__init__(operands=[cond, on_true, on_false], result_types=[on_true.type])

    def verify_(self) -> None:
        want = block_type(IntegerType(1), block_shape(self.result.type))
        if self.cond.type != want:
            raise VerifyException(
                f"tile.select: expected a condition of type {want}, found {self.cond.type}"
            )


@irdl_op_definition
class ConvertOp(IRDLOperation):
    """Converts each element to the result's element type (as C casts; floats round to nearest even)."""

    name = "tile.convert"
    traits = traits_def(Pure())
    input = operand_def()
    result = result_def()
    assembly_format = "$input attr-dict `:` type($input) `->` type($result)"

    def __init__(self, value: SSAValue, element: Attribute):
        super().__init__(
            operands=[value], result_types=[block_type(element, block_shape(value.type))]
        )

    def verify_(self) -> None:
        if block_shape(self.input.type) != block_shape(self.result.type):
            raise VerifyException(
                f"tile.convert: shapes differ: {self.input.type} and {self.result.type}"
            )


@irdl_op_definition
class PhiloxOp(IRDLOperation):
    """Philox-4x32-10: the first word of the counter ``(c0, c1, 0, 0)`` under the key
    ``(k0, k1)``, on ``i32`` bit patterns of ``uint32`` (all four of one shape)::

        %r = tile.philox %k0, %k1, %c0, %c1 : tensor<64xi32>
    """

    name = "tile.philox"
    traits = traits_def(Pure())
    T: ClassVar = VarConstraint("T", AnyAttr())
    key0 = operand_def(T)
    key1 = operand_def(T)
    counter0 = operand_def(T)
    counter1 = operand_def(T)
    result = result_def(T)
    assembly_format = "$key0 `,` $key1 `,` $counter0 `,` $counter1 attr-dict `:` type($result)"

    def __init__(self, key0: SSAValue, key1: SSAValue, counter0: SSAValue, counter1: SSAValue):
        super().__init__(operands=[key0, key1, counter0, counter1], result_types=[counter0.type])

    def verify_(self) -> None:
        if element_type(self.result.type) != i32:
            raise VerifyException(f"tile.philox: expected i32 values, found {self.result.type}")


Tile = Dialect(
    "tile",
    [
        KernelOp, ReturnOp, ProgramIdOp, ArangeOp, SplatOp, BroadcastOp, ExpandDimsOp,
        TransOp, LoadOp, StoreOp, DotOp, ReduceOp, CmpOp, SelectOp, ConvertOp, PhiloxOp,
    ],
    [PointerType],
)  # fmt: skip

# the dialects a tile kernel is written in (register them all to parse one)
TILE_DIALECTS = (Tile, arith.Arith, math.Math, scf.Scf)
