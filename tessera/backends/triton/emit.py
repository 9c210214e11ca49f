"""``emit-triton``: Triton source for a ``tile.kernel``, one line per op from a table.

Every SSA value becomes a Python name (its name hint when it has one, else ``v<N>``);
each op is looked up in :data:`EXPRESSIONS` (ops that define a value) or handled as a
statement (``tile.store``, ``scf.for``, ``tile.return``). Block sizes are literals: a
tile kernel is specialised to its shapes and block configuration, so the source needs no
``tl.constexpr`` parameters. ``tessera-opt -t triton`` prints the source of every kernel
in a module.
"""

from __future__ import annotations

import keyword
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import IO

from xdsl.context import Context
from xdsl.dialects import arith, scf
from xdsl.dialects import math as mathd
from xdsl.dialects.builtin import (
    BFloat16Type,
    DenseIntOrFPElementsAttr,
    Float8E4M3FNType,
    Float8E5M2Type,
    Float16Type,
    Float32Type,
    Float64Type,
    FloatAttr,
    IntegerAttr,
    IntegerType,
    ModuleOp,
)
from xdsl.ir import Attribute, Block, Operation, SSAValue
from xdsl.targets import Target

from tessera.errors import IRError
from tessera.ir import tile
from tessera.ir.reduction_kinds import KINDS

HEADER = "import triton\nimport triton.language as tl\n"

_INTEGER_DTYPES = {1: "tl.int1", 8: "tl.int8", 16: "tl.int16", 32: "tl.int32", 64: "tl.int64"}


def triton_dtype(t: Attribute) -> str:
    """The ``tl`` dtype of a scalar type or of a block's elements."""
    element = tile.element_type(t)
    if isinstance(element, IntegerType):
        return _INTEGER_DTYPES[element.width.data]
    names = {
        Float32Type: "tl.float32",
        BFloat16Type: "tl.bfloat16",
        Float16Type: "tl.float16",
        Float64Type: "tl.float64",
        Float8E4M3FNType: "tl.float8e4nv",  # torch.float8_e4m3fn
        Float8E5M2Type: "tl.float8e5",  # torch.float8_e5m2
    }
    for cls, name in names.items():
        if isinstance(element, cls):
            return name
    raise IRError(f"emit-triton: no Triton dtype for {t}")


class _Names:
    """Python names for SSA values, unique within one kernel."""

    def __init__(self) -> None:
        self.names: dict[SSAValue, str] = {}
        # the names the source itself uses, and Python keywords
        self.taken: set[str] = {"tl", "triton", "range", "float", *keyword.kwlist}

    def define(self, value: SSAValue) -> str:
        hint = re.sub(r"\W", "_", value.name_hint or "") or "v"
        base = hint if not hint[0].isdigit() else f"v{hint}"
        name, n = base, 0
        while name in self.taken:
            n += 1
            name = f"{base}_{n}"
        self.taken.add(name)
        self.names[value] = name
        return name

    def alias(self, value: SSAValue, text: str) -> None:
        self.names[value] = text

    def __getitem__(self, value: SSAValue) -> str:
        return self.names[value]


def _literal(value: float | int, t: Attribute) -> str:
    element = tile.element_type(t)
    if isinstance(element, IntegerType) and element.width.data == 1:
        return str(bool(value))  # Triton reads ``1`` as int32, ``True`` as int1
    if isinstance(element, IntegerType):
        return str(int(value))
    if math.isnan(value):
        return 'float("nan")'
    if math.isinf(value):
        return 'float("inf")' if value > 0 else 'float("-inf")'
    return repr(float(value))


def _constant(op: arith.ConstantOp) -> str:
    attr = op.value
    t = op.result.type
    if isinstance(attr, DenseIntOrFPElementsAttr):
        values = attr.get_values()
        if len(set(values)) != 1:
            raise IRError("emit-triton: only splat block constants are supported")
        return f"tl.full({tile.block_shape(t)}, {_literal(values[0], t)}, {triton_dtype(t)})"
    assert isinstance(attr, IntegerAttr | FloatAttr)
    if _typed_scalar(op):
        return f"tl.full((), {_literal(attr.value.data, t)}, {triton_dtype(t)})"
    return _literal(attr.value.data, t)


def _typed_scalar(op: arith.ConstantOp) -> bool:
    """Whether a scalar constant needs its type spelled out: converted ones, and f64 ones
    (Triton reads a float literal as f32)."""
    return isinstance(op.result.type, Float64Type) or any(
        isinstance(u.operation, tile.ConvertOp) for u in op.result.uses
    )


def _binary(symbol: str) -> Callable[[Operation, Sequence[str]], str]:
    return lambda op, a: f"{a[0]} {symbol} {a[1]}"


def _select(op: Operation, a: Sequence[str]) -> str:
    """``tl.where``, its condition compared with zero unless it is already ``i1``."""
    element = tile.element_type(op.operands[0].type)
    cond = a[0] if isinstance(element, IntegerType) and element.width.data == 1 else f"{a[0]} != 0"
    return f"tl.where({cond}, {a[1]}, {a[2]})"


def _call(function: str) -> Callable[[Operation, Sequence[str]], str]:
    return lambda op, a: f"{function}({', '.join(a)})"


def _nan_propagating(function: str) -> Callable[[Operation, Sequence[str]], str]:
    """arith.maximumf / minimumf propagate NaN; tl.maximum / minimum drop it by default."""
    return lambda op, a: f"{function}({', '.join(a)}, propagate_nan=tl.PropagateNan.ALL)"


def _load(op: tile.LoadOp, a: Sequence[str]) -> str:
    if op.mask is None:
        return f"tl.load({a[0]} + {a[1]})"
    return f"tl.load({a[0]} + {a[1]}, mask={a[2]}, other=0)"


def _dot(op: tile.DotOp, a: Sequence[str]) -> str:
    """``tl.dot``: f32 operands in IEEE precision (not TF32); f64 operands (tl.dot accepts
    them from Triton 3.6 on: FMA on NVIDIA GPUs, no f64 tensor cores) too; fp8 operands
    (``tl.float8e4nv``, ``tl.float8e5``) on fp8 tensor cores, into the f32 accumulator. Integer
    operands (tl.dot takes int8 only) multiply and sum a 3-D broadcast, exactly."""
    if isinstance(tile.element_type(op.a.type), IntegerType):
        return f"{a[2]} + tl.sum({a[0]}[:, :, None] * {a[1]}[None, :, :], axis=1)"
    ieee = isinstance(tile.element_type(op.a.type), Float32Type | Float64Type)
    return f"tl.dot({a[0]}, {a[1]}, {a[2]}" + (', input_precision="ieee")' if ieee else ")")


_CMP = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}


def _reduce(op: tile.ReduceOp, a: Sequence[str]) -> str:
    """Triton's reduction function of the kind, else ``tl.reduce`` with its combine
    function (:func:`_combine_functions`)."""
    kind, axis = KINDS[op.kind.data], op.axis.value.data
    if kind.triton_reduce is not None:
        return f"{kind.triton_reduce}({a[0]}, axis={axis})"
    return f"tl.reduce({a[0]}, {axis}, {_combine_name(kind.name)})"


def _combine_name(kind: str) -> str:
    return f"_tessera_combine_{kind}"


def _combine_functions(kernel: tile.KernelOp) -> list[str]:
    """The source lines of the ``@triton.jit`` combine function of each kind the kernel
    reduces by with ``tl.reduce``."""
    kinds = sorted(
        {op.kind.data for op in kernel.walk() if isinstance(op, tile.ReduceOp)}
        - {k for k, kind in KINDS.items() if kind.triton_reduce is not None}
    )
    lines = []
    for k in kinds:
        lines += ["@triton.jit", f"def {_combine_name(k)}(a, b):"]
        lines += [f"    return {KINDS[k].triton_combine}", "", ""]
    return lines


_PHILOX = "_tessera_philox"


def _philox_function(kernel: tile.KernelOp) -> list[str]:
    """The source lines of the ``@triton.jit`` Philox helper (``tl.philox`` on the key's
    words as one 64-bit seed, ``k1 << 32 | k0``), if the kernel uses ``tile.philox``."""
    if not any(isinstance(op, tile.PhiloxOp) for op in kernel.walk()):
        return []
    return [
        "@triton.jit",
        f"def {_PHILOX}(k0, k1, c0, c1):",
        "    lo = tl.to_tensor(k0).to(tl.uint32, bitcast=True).to(tl.uint64)",
        "    hi = tl.to_tensor(k1).to(tl.uint32, bitcast=True).to(tl.uint64)",
        "    c0 = tl.to_tensor(c0)",
        "    zero = c0 * 0",
        "    r, _, _, _ = tl.philox((hi << 32) | lo, c0, tl.to_tensor(c1) + zero, zero, zero)",
        "    return r.to(tl.int32, bitcast=True)",
        "",
        "",
    ]


# op -> the Python expression of its (single) result, from the names of its operands
EXPRESSIONS: dict[type[Operation], Callable[..., str]] = {
    arith.ConstantOp: lambda op, a: _constant(op),
    arith.AddfOp: _binary("+"), arith.AddiOp: _binary("+"),
    arith.SubfOp: _binary("-"), arith.SubiOp: _binary("-"),
    arith.MulfOp: _binary("*"), arith.MuliOp: _binary("*"),
    arith.DivfOp: _binary("/"), arith.DivSIOp: _binary("//"), arith.RemSIOp: _binary("%"),
    arith.AndIOp: _binary("&"), arith.OrIOp: _binary("|"), arith.XOrIOp: _binary("^"),
    arith.MaximumfOp: _nan_propagating("tl.maximum"),
    arith.MinimumfOp: _nan_propagating("tl.minimum"),
    arith.MaxSIOp: _call("tl.maximum"), arith.MinSIOp: _call("tl.minimum"),
    arith.NegfOp: lambda op, a: f"-{a[0]}",
    mathd.ExpOp: _call("tl.exp"), mathd.LogOp: _call("tl.log"), mathd.SqrtOp: _call("tl.sqrt"),
    mathd.RsqrtOp: _call("tl.rsqrt"), mathd.AbsFOp: _call("tl.abs"), mathd.ErfOp: _call("tl.erf"),
    mathd.CosOp: _call("tl.cos"), mathd.SinOp: _call("tl.sin"),
    mathd.TanhOp: lambda op, a: f"2 * tl.sigmoid(2 * {a[0]}) - 1",
    tile.ProgramIdOp: lambda op, a: f"tl.program_id({op.axis.value.data})",
    tile.ArangeOp: lambda op, a: f"tl.arange(0, {tile.block_shape(op.result.type)[0]})",
    tile.SplatOp: lambda op, a: f"tl.full({tile.block_shape(op.result.type)}, {a[0]}, {triton_dtype(op.result.type)})",
    tile.BroadcastOp: lambda op, a: f"tl.broadcast_to({a[0]}, {tile.block_shape(op.result.type)})",
    tile.ExpandDimsOp: lambda op, a: f"tl.expand_dims({a[0]}, {op.axis.value.data})",
    tile.TransOp: _call("tl.trans"),
    tile.LoadOp: _load,
    tile.DotOp: _dot,
    tile.ReduceOp: _reduce,
    tile.CmpOp: lambda op, a: f"{a[0]} {_CMP[op.predicate.data]} {a[1]}",
    tile.SelectOp: _select,
    tile.ConvertOp: lambda op, a: f"{a[0]}.to({triton_dtype(op.result.type)})",
    tile.PhiloxOp: _call(_PHILOX),
}  # fmt: skip


def _emit_block(block: Block, names: _Names, lines: list[str], indent: str) -> None:
    for op in block.ops:
        args = [names[v] for v in op.operands]
        if isinstance(op, tile.StoreOp):
            mask = f", mask={args[3]}" if op.mask is not None else ""
            lines.append(f"{indent}tl.store({args[0]} + {args[1]}, {args[2]}{mask})")
        elif isinstance(op, scf.ForOp):
            body = op.body.block
            carried = [names.define(a) for a in body.args[1:]]
            for name, init in zip(carried, args[3:], strict=True):
                lines.append(f"{indent}{name} = {init}")
            induction = names.define(body.args[0])
            lines.append(f"{indent}for {induction} in range({args[0]}, {args[1]}, {args[2]}):")
            before = len(lines)
            _emit_block(body, names, lines, indent + "    ")
            if len(lines) == before:  # a body without statements
                lines.append(f"{indent}    pass")
            for result, name in zip(op.results, carried, strict=True):
                lines.append(f"{indent}{names.define(result)} = {name}")
        elif isinstance(op, scf.YieldOp):
            carried = [names[a] for a in block.args[1:]]
            if carried:
                lines.append(f"{indent}{', '.join(carried)} = {', '.join(args)}")
        elif isinstance(op, tile.ReturnOp):
            return
        elif (
            isinstance(op, arith.ConstantOp)
            and not tile.block_shape(op.result.type)
            and not _typed_scalar(op)
        ):
            names.alias(op.result, _constant(op))  # scalar constants are written inline
        else:
            expression = EXPRESSIONS.get(type(op))
            if expression is None or len(op.results) != 1:
                raise IRError(f"emit-triton: no Triton source for {op.name}", op)
            text = expression(op, args)
            lines.append(f"{indent}{names.define(op.results[0])} = {text}")


def emit_kernel(kernel: tile.KernelOp) -> str:
    """The Triton source (a module with imports and one ``@triton.jit`` function). The
    kernel's name becomes the function's name, so it must be a plain identifier: text
    from the IR never reaches the source otherwise."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", kernel.kernel_name) or keyword.iskeyword(
        kernel.kernel_name
    ):
        raise IRError(
            f"emit-triton: kernel name {kernel.kernel_name!r} is not a valid function name "
            "(letters, digits and underscores, not starting with a digit)",
            kernel,
        )
    names = _Names()
    block = kernel.body.block
    params = [names.define(a) for a in block.args]
    lines = [HEADER, "", *_combine_functions(kernel), *_philox_function(kernel), "@triton.jit"]
    lines.append(f"def {kernel.kernel_name}({', '.join(params)}):")
    _emit_block(block, names, lines, "    ")
    if lines[-1].endswith(":"):
        lines.append("    pass")
    return "\n".join(lines) + "\n"


def emit_module(module: ModuleOp) -> dict[str, str]:
    """The source of every tile kernel in ``module``, by kernel name."""
    return {
        op.kernel_name: emit_kernel(op) for op in module.walk() if isinstance(op, tile.KernelOp)
    }


@dataclass(frozen=True)
class TritonTarget(Target):
    """``tessera-opt -t triton``: prints the Triton source of every tile kernel."""

    name = "triton"

    def emit(self, ctx: Context, module: ModuleOp, output: IO[str]) -> None:
        sources = emit_module(module)
        if not sources:
            raise IRError(
                "emit-triton: the module has no tile.kernel; run lower-schedule-to-tile first"
            )
        for name, source in sources.items():
            output.write(f"# --- kernel @{name}\n{source}\n")
