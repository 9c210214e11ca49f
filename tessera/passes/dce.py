"""``dce``: dead-code elimination, by xDSL's region liveness analysis.

An op is live if it has effects (terminators, symbols such as ``func.func``, ops that are
not ``Pure``) or if a live op uses one of its results; every other op is erased. Graph
ops are ``Pure``, so a graph op whose results do not reach a ``func.return`` goes away.
Then, as MLIR's ``symbol-dce``, a private function no call reaches any more (a region
whose calls autodiff replaced by calls of its derivative) is erased.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass
from xdsl.transforms.dead_code_elimination import region_dce

from tessera.ir import graph, schedule


@dataclass(frozen=True)
class DCEPass(ModulePass):
    """Erases pure ops whose results are never used by a live op."""

    name = "dce"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        region_dce(op.body)
        _erase_uncalled(op)


def _erase_uncalled(module: ModuleOp) -> None:
    """Erases the private functions no call or scan names."""
    while True:
        called = {
            o.callee.root_reference.data
            for o in module.walk()
            if isinstance(o, graph.CallOp | graph.ScanOp | func.CallOp | schedule.ScanOp)
        }
        dead = [
            o
            for o in module.ops
            if isinstance(o, func.FuncOp)
            and o.sym_visibility is not None
            and o.sym_visibility.data == "private"
            and o.sym_name.data not in called
        ]
        if not dead:
            return
        for function in dead:
            module.body.block.erase_op(function)
