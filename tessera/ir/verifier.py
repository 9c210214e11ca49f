"""Verification of a whole module, as Tessera requires it.

xDSL's ``module.verify()`` runs each op's verifier. Tessera adds four checks that are
about the module rather than one op, each one walk of the module:

1. dominance (:mod:`tessera.ir.dominance`) and addressable sizes (:mod:`tessera.ir.limits`),
   first, since op verifiers and passes assume them;
2. xDSL's verification of every op;
3. shardings against their meshes (:mod:`tessera.ir.sharding_verifier`), which reads
   the types the op verifiers have checked;
4. the specs of manual (``dist.shard_map``) functions and their calls
   (:mod:`tessera.ir.manual`).

Failures of 1, 3 and 4 raise :class:`~tessera.ir.located_error.LocatedVerifyException`, which
names the op at fault.
"""

from __future__ import annotations

from xdsl.dialects.builtin import ModuleOp

from tessera.ir.dominance import check_dominance
from tessera.ir.limits import check_sizes
from tessera.ir.manual import check_manual
from tessera.ir.sharding_verifier import check_shardings


def verify_module(module: ModuleOp) -> None:
    """Raises a ``VerifyException`` if ``module`` is not valid Tessera IR."""
    check_dominance(module)
    check_sizes(module)
    module.verify()
    check_shardings(module)
    check_manual(module)
