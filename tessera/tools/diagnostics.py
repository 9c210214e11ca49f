"""Compiler diagnostics in the ``FILE:LINE:COL: error: MESSAGE`` form of MLIR tools.

xDSL reports parse errors with a span but verifier errors only with a printout of the
whole module. As ``mlir-opt`` does, :class:`LocatingParser` gives every op it parses a
``FileLineColLoc`` of where the op starts, so a verifier error can name its op's line.
It also turns what xDSL's attribute constructors raise on values they cannot hold
(``ValueError``, ``OverflowError``, ``MemoryError``, ``VerifyException``) into a parse
error at the op, and nesting deeper than Python's stack into a parse error where the
parser stopped.
"""

from __future__ import annotations

import dataclasses

from xdsl.context import Context
from xdsl.dialects.builtin import FileLineColLoc, IntAttr, ModuleOp, StringAttr, UnknownLoc
from xdsl.ir import Operation
from xdsl.parser import Parser
from xdsl.utils.exceptions import (
    DiagnosticException,
    MultipleSpansParseError,
    ParseError,
    VerifyException,
)
from xdsl.utils.lexer import Span

from tessera.ir.located_error import LocatedPassFailure, LocatedVerifyException


class LocatingParser(Parser):
    """An MLIR parser that records where each op starts as the op's location.

    ``line_offset`` is the line of the input where this text starts (for pieces of a
    file split by ``--split-input-file``). Lines are counted from the previous op's start
    (xDSL's ``Span.get_location`` counts from the top of the file: quadratic in the
    number of ops).
    """

    def __init__(self, ctx: Context, text: str | bytes, name: str, line_offset: int = 0) -> None:
        super().__init__(ctx, text, name)
        self.line_offset = line_offset
        self._counted = (0, 1)  # (position, its line in the text)

    def parse_module(self, allow_implicit_module: bool = True) -> ModuleOp:
        try:
            return super().parse_module(allow_implicit_module)
        except RecursionError:  # the stack has unwound: the parser's position is kept
            raise ParseError(self._here(), "the input nests too deeply to parse") from None
        except _UNBUILDABLE as error:  # outside any op (an attribute alias)
            raise _located(self._here(), error) from None

    def _here(self) -> Span:
        return dataclasses.replace(self._current_token.span, line_offset=self.line_offset)

    def parse_operation(self) -> Operation:
        start = self._here()
        try:
            op = super().parse_operation()
        except _UNBUILDABLE as error:
            raise _located(start, error) from None
        if isinstance(op.location, UnknownLoc):  # an explicit `loc(...)` wins
            line, column = self._line_and_column(start)
            op.location = FileLineColLoc(
                StringAttr(start.input.name), IntAttr(line), IntAttr(column)
            )
        return op

    def _line_and_column(self, span: Span) -> tuple[int, int]:
        """The 1-based line (with ``line_offset``) and column where ``span`` starts."""
        source, position = span.input, span.start
        counted_position, line = self._counted
        if position < counted_position:  # not in textual order: count from the top
            counted_position, line = 0, 1
        line += source.content.count(source.newline, counted_position, position)
        self._counted = (position, line)
        return line + self.line_offset, position - source.get_start_of_line(position) + 1


CONTEXT_WIDTH = 160  # characters of a long source line shown around an error

# what attribute and op constructors raise on values they cannot hold
_UNBUILDABLE = (ValueError, OverflowError, MemoryError, VerifyException)


class SpannedVerifyException(VerifyException):
    """An attribute that does not verify as it is parsed, at ``span`` of the input
    (a verifier error, as ``--verify-diagnostics`` expects, that knows its place)."""

    def __init__(self, span: Span, message: str) -> None:
        super().__init__(message)
        self.span = span


def _located(span: Span, error: BaseException) -> Exception:
    """The parse error (or, for a verifier's complaint, the spanned verifier error) at
    ``span`` for an exception raised while building an attribute or op."""
    if isinstance(error, VerifyException):
        return SpannedVerifyException(span, str(error))
    if isinstance(error, MemoryError | OverflowError):
        return ParseError(span, "a size or number here is too large to represent")
    text = str(error).strip().strip("'\"").strip()
    return ParseError(span, f"invalid value: {text.splitlines()[0] if text else type(error).__name__}")


def format_spanned_error(error: SpannedVerifyException) -> str:
    """``FILE:LINE:COL: error: MESSAGE`` and the source line of a verifier error raised
    while parsing."""
    return _with_context(error.span, "error", str(error).strip())


def format_parse_error(error: ParseError) -> str:
    """``FILE:LINE:COL: error: MESSAGE``, then the source line with the span underlined."""
    lines = [_with_context(error.span, "error", error.msg.strip())]
    if isinstance(error, MultipleSpansParseError):
        lines += [_with_context(span, "note", note or "") for span, note in error.refs]
    return "\n".join(lines)


def _with_context(span: Span, kind: str, msg: str) -> str:
    location, *context = span.print_with_context().rstrip("\n").split("\n")
    if len(context) == 2 and len(context[0]) > CONTEXT_WIDTH:  # the line, then the caret
        column = len(context[1]) - len(context[1].lstrip())
        start = max(0, min(column - CONTEXT_WIDTH // 2, len(context[0]) - CONTEXT_WIDTH))
        line, caret = (c[start : start + CONTEXT_WIDTH] for c in context)
        context = ["..." + line + "...", "   " + caret]
    return "\n".join([f"{location}: {kind}: {msg}", *context])


def format_verify_error(error: DiagnosticException, module: ModuleOp, file: str) -> str:
    """``FILE:LINE:COL: error: MESSAGE`` at the op that fails to verify.

    A :class:`LocatedVerifyException` or :class:`LocatedPassFailure` names its op. Otherwise the exception does not
    say which op raised it, so the ops are verified again, inner ops first as xDSL does,
    and the first failure is reported (``error`` itself, at ``FILE:1:1``, if none is
    found: a pass failed). Ops created by passes have no location of their own; they
    are reported at their nearest located ancestor.
    """
    if isinstance(error, LocatedVerifyException | LocatedPassFailure):
        return f"{_location(error.op, file)}: error: {error}"
    for op in module.walk(region_first=True):
        try:
            op.verify(verify_nested_ops=False)
        except DiagnosticException as failure:
            message = str(failure)
            if not message.startswith(op.name):
                message = f"{op.name}: {message}"
            return f"{_location(op, file)}: error: {message}"
    return f"{file}:1:1: error: {error}"


def format_op_error(op: Operation, file: str, message: str) -> str:
    """``FILE:LINE:COL: error: MESSAGE`` at ``op`` (or its nearest located ancestor)."""
    return f"{_location(op, file)}: error: {message}"


def _location(op: Operation | None, file: str) -> str:
    while op is not None:
        if isinstance(loc := op.location, FileLineColLoc):
            return f"{loc.filename.data}:{loc.line.data}:{loc.column.data}"
        op = op.parent_op()
    return f"{file}:1:1"
