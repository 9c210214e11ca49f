"""``cse``: common-subexpression elimination, by xDSL's CSE driver.

Graph ops are ``Pure``, so an op is replaced by an earlier op in scope with the same name,
operands, properties, attributes and result types: ``graph.sum %x {axes = [1]}`` twice
becomes one op, but not when the axes differ. Ops left without uses are erased.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass
from xdsl.transforms.common_subexpression_elimination import cse


@dataclass(frozen=True)
class CSEPass(ModulePass):
    """Merges pure ops with equal operands, properties and types into the first one."""

    name = "cse"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        cse(op)
