"""Op properties as Python values, and their compact textual form.

Graph ops keep their parameters (axes, eps, predicate...) as xDSL properties. Shape
rules and kernels want plain Python values, and the custom syntax prints them without
type noise: ``{axes = [1], keepdims = true, eps = 1.0e-05, approximate = tanh}``;
lists of names (mesh axes) print as ``[tp, dp]``, lists of int lists (a
collective_permute's source-target pairs) as ``[[0, 1], [1, 0]]``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from xdsl.dialects.builtin import (
    ArrayAttr,
    BoolAttr,
    DenseArrayBase,
    FloatAttr,
    IntegerAttr,
    IntegerType,
    StringAttr,
    f64,
    i64,
)
from xdsl.ir import Attribute
from xdsl.parser import Parser
from xdsl.printer import Printer

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_$.]*")


def to_attr(value: Any) -> Attribute:
    """Python value -> property attribute (bool, int, float, str, a sequence of ints, of
    strs or of int sequences)."""
    if isinstance(value, Attribute):
        return value
    if isinstance(value, bool):
        return BoolAttr.from_bool(value)
    if isinstance(value, int):
        return IntegerAttr(value, i64)
    if isinstance(value, float):
        return FloatAttr(value, f64)
    if isinstance(value, str):
        return StringAttr(value)
    if isinstance(value, Sequence) and all(isinstance(v, int) for v in value):
        return DenseArrayBase.from_list(i64, [int(v) for v in value])
    if isinstance(value, Sequence) and all(isinstance(v, str) for v in value):
        return ArrayAttr([StringAttr(v) for v in value])
    if isinstance(value, Sequence) and all(
        isinstance(v, Sequence) and not isinstance(v, str) and all(isinstance(i, int) for i in v)
        for v in value
    ):
        return ArrayAttr([DenseArrayBase.from_list(i64, [int(i) for i in v]) for v in value])
    raise TypeError(f"cannot store {value!r} as an op property")


def to_python(attr: Attribute) -> Any:
    """Property attribute -> Python value; other attributes are returned unchanged."""
    if isinstance(attr, IntegerAttr):
        if isinstance(attr.type, IntegerType) and attr.type.width.data == 1:
            return attr.value.data != 0
        return attr.value.data
    if isinstance(attr, FloatAttr):
        return attr.value.data
    if isinstance(attr, StringAttr):
        return attr.data
    if isinstance(attr, DenseArrayBase):
        return tuple(int(v) for v in attr.get_values())
    if isinstance(attr, ArrayAttr) and all(isinstance(a, StringAttr) for a in attr.data):
        return tuple(a.data for a in attr.data)
    if isinstance(attr, ArrayAttr) and all(isinstance(a, DenseArrayBase) for a in attr.data):
        return tuple(tuple(int(v) for v in a.get_values()) for a in attr.data)
    return attr


def _float_text(value: float) -> str:
    text = repr(float(value))
    if "e" in text and "." not in text.split("e")[0]:
        mantissa, exponent = text.split("e")
        text = f"{mantissa}.0e{exponent}"
    return text


def print_value(printer: Printer, attr: Attribute) -> None:
    """Prints a property in compact form (see the module docstring)."""
    value = to_python(attr)
    if isinstance(value, bool):
        printer.print_string("true" if value else "false")
    elif isinstance(value, int):
        printer.print_string(str(value))
    elif isinstance(value, float):
        printer.print_string(_float_text(value))
    elif isinstance(value, str):
        if _IDENTIFIER.fullmatch(value) and value not in ("true", "false"):
            printer.print_string(value)
        else:
            printer.print_string_literal(value)
    elif isinstance(value, tuple) and value and all(isinstance(v, tuple) for v in value):
        printer.print_string("[" + ", ".join(f"[{', '.join(map(str, v))}]" for v in value) + "]")
    elif isinstance(value, tuple) and all(
        isinstance(v, int) or _IDENTIFIER.fullmatch(v) for v in value
    ):
        printer.print_string("[" + ", ".join(str(v) for v in value) + "]")
    else:
        printer.print_attribute(attr)


def parse_value(parser: Parser) -> Attribute:
    """Parses a property printed by :func:`print_value`."""
    if parser.parse_optional_punctuation("[") is not None:
        if parser.parse_optional_punctuation("]") is not None:
            return DenseArrayBase.from_list(i64, [])
        if parser.parse_optional_punctuation("[") is not None:  # a list of int lists
            lists = [_parse_int_list_rest(parser)]
            while parser.parse_optional_punctuation(",") is not None:
                parser.parse_punctuation("[")
                lists.append(_parse_int_list_rest(parser))
            parser.parse_punctuation("]")
            return ArrayAttr([DenseArrayBase.from_list(i64, v) for v in lists])
        if (name := parser.parse_optional_identifier()) is not None:  # a list of names
            names = [name]
            while parser.parse_optional_punctuation(",") is not None:
                names.append(parser.parse_identifier(" in a list of names"))
            parser.parse_punctuation("]")
            return ArrayAttr([StringAttr(n) for n in names])
        values = parser.parse_comma_separated_list(
            parser.Delimiter.NONE, lambda: parser.parse_integer(context_msg=" in an integer list")
        )
        parser.parse_punctuation("]")
        return DenseArrayBase.from_list(i64, values)
    boolean = parser.parse_optional_boolean()
    if boolean is not None:
        return BoolAttr.from_bool(boolean)
    number = parser.parse_optional_number()
    if number is not None:
        return to_attr(number)
    text = parser.parse_optional_str_literal()
    if text is None:
        text = parser.parse_optional_identifier()
    if text is not None:
        return StringAttr(text)
    return parser.parse_attribute()


def _parse_int_list_rest(parser: Parser) -> list[int]:
    """The ints of an int list whose ``[`` is parsed, and its ``]``."""
    if parser.parse_optional_punctuation("]") is not None:
        return []
    values = parser.parse_comma_separated_list(
        parser.Delimiter.NONE, lambda: parser.parse_integer(context_msg=" in an integer list")
    )
    parser.parse_punctuation("]")
    return values


def print_properties(
    printer: Printer, properties: Mapping[str, Attribute], names: Sequence[str]
) -> None:
    """Prints `` {name = value, ...}`` for those of ``names`` that are present."""
    present = [n for n in names if n in properties]
    if present:
        printer.print_string(" {")
        for i, name in enumerate(present):
            printer.print_string(f"{', ' if i else ''}{name} = ")
            print_value(printer, properties[name])
        printer.print_string("}")


def parse_properties(parser: Parser) -> dict[str, Attribute]:
    """Parses an optional ``{name = value, ...}`` printed by :func:`print_properties`."""
    properties: dict[str, Attribute] = {}
    if parser.parse_optional_punctuation("{") is not None:

        def parse_property() -> None:
            name = parser.parse_identifier(" for a property name")
            parser.parse_punctuation("=")
            properties[name] = parse_value(parser)

        parser.parse_comma_separated_list(parser.Delimiter.NONE, parse_property)
        parser.parse_punctuation("}")
    return properties
