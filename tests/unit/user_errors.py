"""A shared check for error tests: the error names the problem and the user's line."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tessera import jit


def raised_at_line(
    call: Callable[[], Any], error: type[Exception], words: str, test_file: str, mark: str
) -> str:
    """Runs ``call()``, expects ``error`` with ``words`` in its message, and that the
    message points at the line of ``test_file`` ending ``# <- mark``; returns the message."""
    with pytest.raises(error) as info:
        call()
    message = str(info.value)
    assert words in message, message
    source = Path(test_file).read_text().splitlines()
    (line,) = [i for i, text in enumerate(source, 1) if text.endswith(f"# <- {mark}")]
    assert f"{test_file}:{line}" in message, message
    return message


def raised_at_marked_line(
    fn: Callable[..., Any], error: type[Exception], words: str, test_file: str, mark: str
) -> str:
    """:func:`raised_at_line` of ``jit(fn)`` run on a ``[2, 3]`` f32 array."""
    return raised_at_line(
        lambda: jit(fn)(np.zeros((2, 3), np.float32)), error, words, test_file, mark
    )
