"""Parsing and checking einsum equations (``"bij,bjk->bik"``).

The grammar (lark, LALR) accepts terms of letters and at most one ``...`` each, separated
by commas, and an optional ``->`` output term; spaces are ignored. :func:`parse` gives
an :class:`Equation` whose indices remember where they stand in the text, and
:func:`resolve` checks it against the operands' shapes: both point at the offending
character with a caret in their error messages::

    einsum: index 'k' has size 4 in operand 1 but size 3 in operand 0
      ik,kj->ij
         ^

An index is a letter (case-sensitive); ``...`` stands for broadcast batch dims (aligned
right across operands, as numpy broadcasts). Without ``->`` the output is, as in numpy,
the ``...`` dims followed by the letters that appear exactly once, in alphabetical order.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

from lark import Lark, Token, Tree
from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken

from tessera.errors import ShapeError, TraceError

_GRAMMAR = r"""
start: inputs (ARROW term)?
inputs: term (COMMA term)*
term: (LETTER | ELLIPSIS)*

ARROW: "->"
COMMA: ","
ELLIPSIS: "..."
LETTER: /[a-zA-Z]/
%ignore " "
"""

# An index label: a letter, or ("...", k) for the k-th ellipsis dim counted from the right.
Label = str | tuple[str, int]


@functools.cache
def _parser() -> Lark:
    return Lark(_GRAMMAR, parser="lalr")


@dataclass(frozen=True)
class Term:
    """One operand's (or the output's) indices and where they stand in the equation."""

    letters: tuple[str, ...]  # "..." for the ellipsis
    positions: tuple[int, ...]  # offset of each in the equation text
    start: int  # where the term begins (for empty terms and rank errors)

    @property
    def has_ellipsis(self) -> bool:
        return "..." in self.letters

    @property
    def named(self) -> int:
        """How many letters (dims other than the ellipsis's) the term names."""
        return len(self.letters) - self.letters.count("...")


@dataclass(frozen=True)
class Equation:
    text: str
    inputs: tuple[Term, ...]
    output: Term | None  # None: implicit output

    def error(self, kind: type[Exception], message: str, position: int) -> Exception:
        """``kind`` with ``message``, the equation and a caret under ``position``."""
        return kind(f"einsum: {message}\n  {self.text}\n  {' ' * position}^")


@dataclass(frozen=True)
class Resolved:
    """An equation checked against operand shapes: labels per operand and the output."""

    inputs: tuple[tuple[Label, ...], ...]  # one label per operand dim
    output: tuple[Label, ...]
    sizes: dict[Label, int]  # each label's size (ellipsis dims: the broadcast size)


def _term(tree: Tree, start: int) -> Term:
    tokens = [t for t in tree.children if isinstance(t, Token)]
    return Term(tuple(str(t) for t in tokens), tuple(t.start_pos or 0 for t in tokens), start)


def parse(equation: str) -> Equation:
    """Parses ``equation``; a TraceError with a caret for a syntax error or an output
    index that repeats or is in no input (shape checks are :func:`resolve`'s)."""
    if not isinstance(equation, str):
        raise TraceError(f"einsum: expected an equation string, found {equation!r}")
    try:
        tree = _parser().parse(equation)
    except UnexpectedInput as error:
        if isinstance(error, UnexpectedCharacters):
            position = error.pos_in_stream
            what = f"unexpected character {equation[position]!r}"
        elif isinstance(error, UnexpectedToken) and error.token.type != "$END":
            position, what = error.token.start_pos or 0, f"unexpected {str(error.token)!r}"
        else:  # the equation ends too early
            position, what = len(equation), "unexpected end of the equation"
        expected = "letters a-z, A-Z, '...', ',' and one '->'"
        raise Equation(equation, (), None).error(
            TraceError, f"{what} (an equation has {expected})", position
        ) from None
    inputs_tree = tree.children[0]
    terms, start = [], 0
    for child in inputs_tree.children:
        if isinstance(child, Token):  # a comma: the next term starts after it
            start = child.end_pos or 0
        else:
            terms.append(_term(child, start))
    output = None
    if len(tree.children) > 1:
        arrow, out_tree = tree.children[1], tree.children[2]
        output = _term(out_tree, arrow.end_pos or 0)
    parsed = Equation(equation, tuple(terms), output)
    for term in (*terms, *([output] if output else [])):
        dots = [
            p for letter, p in zip(term.letters, term.positions, strict=True) if letter == "..."
        ]
        if len(dots) > 1:
            raise parsed.error(TraceError, "a term can have only one '...'", dots[1])
    if output is not None:
        known = {letter for term in terms for letter in term.letters}
        seen: set[str] = set()
        for letter, position in zip(output.letters, output.positions, strict=True):
            if letter in seen:
                raise parsed.error(
                    TraceError, f"output index {letter!r} appears more than once", position
                )
            seen.add(letter)
            if letter != "..." and letter not in known:
                raise parsed.error(
                    TraceError, f"output index {letter!r} does not appear in any input", position
                )
    return parsed


def _labels(term: Term, ellipsis_rank: int) -> tuple[Label, ...]:
    labels: list[Label] = []
    for letter in term.letters:
        if letter == "...":
            labels += [("...", k) for k in reversed(range(ellipsis_rank))]
        else:
            labels.append(letter)
    return tuple(labels)


def resolve(parsed: Equation, shapes: Sequence[tuple[int, ...]]) -> Resolved:
    """Labels each operand dim; a ShapeError with a caret when the operand count, a
    term's rank or an index's sizes do not fit the operands."""
    terms = parsed.inputs
    if len(shapes) != len(terms):
        if len(shapes) < len(terms):
            position = terms[len(shapes)].start
        else:
            position = parsed.output.start - 2 if parsed.output else len(parsed.text)
        raise parsed.error(
            ShapeError,
            f"the equation has {len(terms)} input terms but {len(shapes)} operands were given",
            position,
        )
    inputs: list[tuple[Label, ...]] = []
    sizes: dict[Label, int] = {}
    where: dict[str, tuple[int, int]] = {}  # letter -> (operand, position) of its first size
    ellipsis_shapes: list[tuple[int, ...]] = []
    for number, (term, shape) in enumerate(zip(terms, shapes, strict=True)):
        rank = len(shape)
        if rank < term.named or (rank != term.named and not term.has_ellipsis):
            raise parsed.error(
                ShapeError,
                f"term {number} names {term.named} dims{' and ...' if term.has_ellipsis else ''}"
                f" but operand {number} has rank {rank} (shape {list(shape)})",
                term.start if not term.positions else term.positions[0],
            )
        labels = _labels(term, rank - term.named)
        dim = 0
        for letter, position in zip(term.letters, term.positions, strict=True):
            if letter == "...":
                ellipsis_shapes.append(tuple(shape[dim : dim + rank - term.named]))
                dim += rank - term.named
                continue
            if letter in sizes and sizes[letter] != shape[dim]:
                first, _ = where[letter]
                raise parsed.error(
                    ShapeError,
                    f"index {letter!r} has size {shape[dim]} in operand {number} but size "
                    f"{sizes[letter]} in operand {first}",
                    position,
                )
            sizes.setdefault(letter, shape[dim])
            where.setdefault(letter, (number, position))
            dim += 1
        inputs.append(labels)
    ellipsis_rank = max((len(s) for s in ellipsis_shapes), default=0)
    for k in range(ellipsis_rank):  # k-th dim from the right: broadcast sizes
        found = {s[len(s) - 1 - k] for s in ellipsis_shapes if k < len(s)}
        if len(found - {1}) > 1:
            term = next(t for t in terms if t.has_ellipsis)
            raise parsed.error(
                ShapeError,
                f"the '...' dims of the operands do not broadcast: "
                f"{' and '.join(str(list(s)) for s in ellipsis_shapes)}",
                term.positions[term.letters.index("...")],
            )
        sizes[("...", k)] = max(found)
    if parsed.output is not None:
        output = _labels(parsed.output, ellipsis_rank)
    else:
        counts: dict[str, int] = {}
        for term in terms:
            for letter in term.letters:
                counts[letter] = counts.get(letter, 0) + 1
        once = sorted(letter for letter, n in counts.items() if n == 1 and letter != "...")
        output = tuple(("...", k) for k in reversed(range(ellipsis_rank))) + tuple(once)
    return Resolved(tuple(inputs), output, sizes)


__all__ = ["Equation", "Label", "Resolved", "Term", "parse", "resolve"]
