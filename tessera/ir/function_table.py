"""The functions a program calls: ``graph.region`` bodies and their derivatives.

A traced program is one ``func.func`` plus, for every distinct region it calls, one
private ``func.func`` that each ``graph.call`` of the region names. While a function is
traced its block is not in a module yet, so the tracer registers the block's table here
(:func:`register`); afterwards the table is the module itself. Passes and VJP rules ask
:func:`table_of` for the table of the op they rewrite, whichever it is.
"""

from __future__ import annotations

import weakref

from xdsl.dialects.builtin import ModuleOp, StringAttr
from xdsl.dialects.func import FuncOp
from xdsl.ir import Block, Operation

from tessera.errors import IRError


class FunctionTable:
    """Functions by name: a module's top-level ``func.func`` ops, or a trace's list."""

    def __init__(self, module: ModuleOp | None = None, reserved: frozenset[str] = frozenset()):
        self.module = module
        self.reserved = reserved  # names taken outside the table (the traced function's)
        self.functions: dict[str, FuncOp] = {}
        if module is not None:
            self.functions = {
                op.sym_name.data: op for op in module.ops if isinstance(op, FuncOp)
            }
        self.derived: dict[tuple[str, str], str] = {}  # (callee, what) -> derived name

    def get(self, name: str) -> FuncOp:
        function = self.functions.get(name)
        if function is None:
            raise IRError(f"no function @{name} among the program's functions")
        return function

    def __contains__(self, name: str) -> bool:
        return name in self.functions

    def unique_name(self, base: str) -> str:
        """``base``, or ``base_<n>`` for the first n making it unused."""
        name, n = base, 0
        while name in self.functions or name in self.reserved:
            n += 1
            name = f"{base}_{n}"
        return name

    def add(self, function: FuncOp) -> str:
        """Adds ``function`` (renamed when its name is taken) and returns its name."""
        name = self.unique_name(function.sym_name.data)
        function.sym_name = StringAttr(name)
        self.functions[name] = function
        if self.module is not None:
            self.module.body.block.add_op(function)
        return name


_traced: weakref.WeakKeyDictionary[Block, FunctionTable] = weakref.WeakKeyDictionary()
_of_module: weakref.WeakKeyDictionary[ModuleOp, FunctionTable] = weakref.WeakKeyDictionary()


def register(block: Block, table: FunctionTable) -> None:
    """Makes ``table`` the function table of the ops of ``block`` (a traced body)."""
    _traced[block] = table


def table_of(op: Operation) -> FunctionTable:
    """The function table of ``op``'s program: its traced block's, else its module's."""
    block = op.parent_block()
    while block is not None:
        table = _traced.get(block)
        if table is not None:
            return table
        parent = block.parent_op()
        if isinstance(parent, ModuleOp):
            table = _of_module.get(parent)
            if table is None or len(table.functions) != _count_functions(parent):
                table = _of_module[parent] = FunctionTable(parent)
            return table
        block = parent.parent_block() if parent is not None else None
    raise IRError(f"{op.name} is in no module and no traced function")


def _count_functions(module: ModuleOp) -> int:
    return sum(1 for op in module.ops if isinstance(op, FuncOp))
