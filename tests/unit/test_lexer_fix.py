"""The linear string-literal pattern (``tessera.ir.lexer_fix``) accepts exactly what
xDSL's accepts, and fails an unterminated literal in linear time."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from tessera.ir.lexer_fix import STRING_LITERAL

XDSL_PATTERN = re.compile(r'"(?:[^"\\\n\v\f]+|\\(?:["nt\\]|[0-9A-Fa-f]{2}))*"')
ALPHABET = st.sampled_from(['"', "\\", "a", "n", "t", "0", "F", "g", "\n", " ", "é"])


@given(st.lists(ALPHABET, max_size=14).map("".join))
def test_the_same_matches_as_xdsl(text: str) -> None:
    for candidate in (text, '"' + text, '"' + text + '"'):
        old, new = XDSL_PATTERN.match(candidate), STRING_LITERAL.match(candidate)
        assert (old and old.group()) == (new and new.group())


def test_an_unterminated_literal_fails() -> None:
    # xDSL's pattern never returns on these (26 characters took ~3 s, each one doubling it)
    for length in (40, 100_000):
        assert STRING_LITERAL.match('"' + "a" * length + "\n") is None
