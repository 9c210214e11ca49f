"""A linear string-literal pattern for xDSL's MLIR lexer.

xDSL 0.74 matches a string literal with ``"(?:[^"\\\\\\n\\v\\f]+|\\\\...)*"``: a repeated
group around a repeated class. On an unterminated literal the regex engine tries every
way of splitting the characters between the two repetitions, so 26 characters take
seconds and 40 never finish. The same language, one character per repetition, fails in
linear time. :func:`install` replaces the pattern (idempotent); Tessera installs it when
its IR package is imported, so every parser it uses (``tessera-opt`` included) has it.
"""

from __future__ import annotations

import re

from xdsl.utils.mlir_lexer import MLIRLexer

STRING_LITERAL = re.compile(r'"(?:[^"\\\n\v\f]|\\(?:["nt\\]|[0-9A-Fa-f]{2}))*"')


def install() -> None:
    MLIRLexer._unescaped_characters_regex = STRING_LITERAL  # type: ignore[misc]


__all__ = ["STRING_LITERAL", "install"]
