"""``dce``: dead-code elimination, by xDSL's region liveness analysis.

An op is live if it has effects (terminators, symbols such as ``func.func``, ops that are
not ``Pure``) or if a live op uses one of its results; every other op is erased. Graph
ops are ``Pure``, so a graph op whose results do not reach a ``func.return`` goes away.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass
from xdsl.transforms.dead_code_elimination import region_dce


@dataclass(frozen=True)
class DCEPass(ModulePass):
    """Erases pure ops whose results are never used by a live op."""

    name = "dce"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        region_dce(op.body)
