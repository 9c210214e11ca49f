"""``dce``: dead-code elimination, by xDSL's region liveness analysis.

An op is live if it has effects (terminators, symbols such as ``func.func``, ops that are
not ``Pure``) or if a live op uses one of its results; every other op is erased. Graph
ops are ``Pure``, so a graph op whose results do not reach a ``func.return`` goes away.
Then, as MLIR's ``remove-dead-values``, an argument a private function never reads is
dropped from it and from every ``graph.call`` of it (a region's backward takes every
operand of its forward call, and under ZeRO-3 each is gathered again for it: a bias the
backward never reads would be gathered for nothing), and the ops that made only such
operands go in turn. Last, as MLIR's ``symbol-dce``, a private function no call reaches
any more (a region whose calls autodiff replaced by calls of its derivative) is erased.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import ArrayAttr, ModuleOp
from xdsl.passes import ModulePass
from xdsl.transforms.dead_code_elimination import region_dce

from tessera.ir import graph, schedule
from tessera.ir.manual import is_manual


@dataclass(frozen=True)
class DCEPass(ModulePass):
    """Erases pure ops whose results are never used by a live op."""

    name = "dce"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        region_dce(op.body)
        while _drop_unread_arguments(op):
            region_dce(op.body)
        _erase_uncalled(op)


def _drop_unread_arguments(module: ModuleOp) -> bool:
    """Drops the arguments private functions do not read, from the functions and from
    their calls; only functions every reference to which is a ``graph.call`` (a scan's
    step keeps its signature: its operands are carries and stacks), not manual ones
    (``dist.shard_map`` bodies: their specs are per argument). Whether any was dropped."""
    calls: dict[str, list[graph.CallOp]] = {}
    pinned: set[str] = set()
    for o in module.walk():
        callee = o.properties.get("callee")
        if callee is None:
            continue
        name = callee.root_reference.data  # type: ignore[attr-defined]
        if isinstance(o, graph.CallOp):
            calls.setdefault(name, []).append(o)
        else:
            pinned.add(name)
    dropped = False
    for function in list(module.ops):
        if not isinstance(function, func.FuncOp) or function.sym_name.data in pinned:
            continue
        if function.sym_visibility is None or function.sym_visibility.data != "private":
            continue
        if is_manual(function) or not function.body.blocks:
            continue
        block = function.body.block
        unread = [i for i, arg in enumerate(block.args) if not arg.uses]
        if not unread:
            continue
        kept = [i for i in range(len(block.args)) if i not in unread]
        for index in reversed(unread):
            block.erase_arg(block.args[index])
        if function.arg_attrs is not None:
            function.arg_attrs = ArrayAttr([function.arg_attrs.data[i] for i in kept])
        function.update_function_type()
        for call in calls.get(function.sym_name.data, []):
            call.operands = [call.operands[i] for i in kept]
        dropped = True
    return dropped


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
