"""Compiler diagnostics in the ``FILE:LINE:COL: error: MESSAGE`` form of MLIR tools.

xDSL reports parse errors with a span but verifier errors only with a printout of the
whole module. As ``mlir-opt`` does, :class:`LocatingParser` gives every op it parses a
``FileLineColLoc`` of where the op starts, so a verifier error can name its op's line.
"""

from __future__ import annotations

import dataclasses

from xdsl.context import Context
from xdsl.dialects.builtin import FileLineColLoc, IntAttr, ModuleOp, StringAttr, UnknownLoc
from xdsl.ir import Operation
from xdsl.parser import Parser
from xdsl.utils.exceptions import DiagnosticException, MultipleSpansParseError, ParseError
from xdsl.utils.lexer import Span


class LocatingParser(Parser):
    """An MLIR parser that records where each op starts as the op's location.

    ``line_offset`` is the line of the input where this text starts (for pieces of a
    file split by ``--split-input-file``).
    """

    def __init__(self, ctx: Context, text: str | bytes, name: str, line_offset: int = 0) -> None:
        super().__init__(ctx, text, name)
        self.line_offset = line_offset

    def parse_operation(self) -> Operation:
        start = dataclasses.replace(self._current_token.span, line_offset=self.line_offset)
        op = super().parse_operation()
        if isinstance(op.location, UnknownLoc):  # an explicit `loc(...)` wins
            file, line, col = start.get_location()
            op.location = FileLineColLoc(StringAttr(file), IntAttr(line), IntAttr(col))
        return op


def format_parse_error(error: ParseError) -> str:
    """``FILE:LINE:COL: error: MESSAGE``, then the source line with the span underlined."""
    lines = [_with_context(error.span, "error", error.msg.strip())]
    if isinstance(error, MultipleSpansParseError):
        lines += [_with_context(span, "note", note or "") for span, note in error.refs]
    return "\n".join(lines)


def _with_context(span: Span, kind: str, msg: str) -> str:
    location, *context = span.print_with_context().rstrip("\n").split("\n")
    return "\n".join([f"{location}: {kind}: {msg}", *context])


def format_verify_error(error: DiagnosticException, module: ModuleOp, file: str) -> str:
    """``FILE:LINE:COL: error: MESSAGE`` at the op that fails to verify.

    The exception does not say which op raised it, so the ops are verified again, inner
    ops first as xDSL does, and the first failure is reported (``error`` itself, at
    ``FILE:1:1``, if none is found: a pass failed). Ops created by passes have no
    location of their own; they are reported at their nearest located ancestor.
    """
    for op in module.walk(region_first=True):
        try:
            op.verify(verify_nested_ops=False)
        except DiagnosticException as failure:
            message = str(failure)
            if not message.startswith(op.name):
                message = f"{op.name}: {message}"
            return f"{_location(op, file)}: error: {message}"
    return f"{file}:1:1: error: {error}"


def _location(op: Operation | None, file: str) -> str:
    while op is not None:
        if isinstance(loc := op.location, FileLineColLoc):
            return f"{loc.filename.data}:{loc.line.data}:{loc.column.data}"
        op = op.parent_op()
    return f"{file}:1:1"
