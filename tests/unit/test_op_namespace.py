"""``tessera.op`` exports every public function its modules define (nothing is left out
of the package's namespace by a missing ``__all__`` entry)."""

from __future__ import annotations

import tessera.op.composites as composites
import tessera.op.primitives as primitives
from tessera import op


def test_every_public_function_is_exported() -> None:
    for module in (primitives, composites):
        defined = {
            name
            for name, value in vars(module).items()
            if not name.startswith("_")
            and callable(value)
            and getattr(value, "__module__", None) == module.__name__
        }
        missing = sorted(name for name in defined if not hasattr(op, name))
        assert not missing, f"{module.__name__} defines {missing}, which tessera.op lacks"
        for name in defined:
            assert getattr(op, name) is getattr(module, name)
