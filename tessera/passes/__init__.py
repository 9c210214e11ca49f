"""Tessera's passes, registered lazily by flag (the flag is the pass's ``name``).

Each pass lives in ``tessera/passes/<flag with underscores>.py``; importing a pass
module happens only when its flag is asked for.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from xdsl.passes import ModulePass

# flag -> (module, class name)
_PASSES: dict[str, tuple[str, str]] = {}


def get_all_passes() -> dict[str, Callable[[], type[ModulePass]]]:
    """Factories of every Tessera pass, keyed by flag."""

    def factory(module: str, cls: str) -> Callable[[], type[ModulePass]]:
        return lambda: getattr(importlib.import_module(module), cls)

    return {flag: factory(module, cls) for flag, (module, cls) in _PASSES.items()}
