"""Array operations for traced code, with numpy / array-API names.

``tessera.op`` is the library users call inside ``@ts.jit`` functions:

- :mod:`tessera.op.primitives`: one function per graph op (elementwise math, matmul,
  reductions, norms, layout, indexing, constants), with numpy's promotion rules;
- :mod:`tessera.op.composites`: functions built from the primitives at trace time
  (``einsum``, ``logsumexp``, ``var``, ``stack``, ...), which need no graph op, rule or
  kernel of their own;
- :mod:`tessera.op.moe`: mixture-of-experts routing, dispatch, combine and router losses;
- :mod:`tessera.op.dropout`: dropout, its mask drawn with :mod:`tessera.random`.
"""

from tessera.op.composites import *  # noqa: F403
from tessera.op.composites import __all__ as _composites
from tessera.op.dropout import *  # noqa: F403
from tessera.op.dropout import __all__ as _dropout
from tessera.op.moe import *  # noqa: F403
from tessera.op.moe import __all__ as _moe
from tessera.op.primitives import *  # noqa: F403
from tessera.op.primitives import __all__ as _primitives

__all__ = [*_primitives, *_composites, *_moe, *_dropout]
