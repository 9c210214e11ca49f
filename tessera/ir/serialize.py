"""A compact binary form of a module, for the on-disk program cache.

Printing a module is cheap but parsing it back is not (xDSL's parser reads about 30,000
ops a second): a 32-layer training step's tile-stage module takes longer to parse than to
compile. :func:`dumps` records each op as its name, operand numbers, result types,
properties, attributes, name hints and regions, with every distinct attribute stored
once; :func:`loads` rebuilds the ops with ``Operation.create`` (no parsing; the module
was verified before it was stored).

Loading runs no code from the data: the unpickler imports nothing and resolves a name
only from an explicit table of exact classes (the attributes of the dialects a Tessera
module holds, the few enums and helpers they hold, a few builtins and ``immutabledict``);
ops are named and looked up in Tessera's dialects. Any other name is refused
(:class:`SerializeError`) before anything is called. The program cache also reads only
files whose HMAC under the user's key verifies (:mod:`tessera.program_cache`).
"""

from __future__ import annotations

import functools
import io
import pickle
from typing import Any

from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Attribute, Block, Operation, Region, SSAValue

from tessera.errors import TesseraError

FORMAT = 1
_ALLOWED_BUILTINS = ("tuple", "list", "dict", "frozenset", "set", "int", "float", "str", "bytes")


class SerializeError(TesseraError):
    """A module that cannot be stored, or data that is not a stored module."""


class _Encoder:
    def __init__(self) -> None:
        self.numbers: dict[SSAValue, int] = {}
        self.attributes: dict[Attribute, int] = {}
        self.by_id: dict[int, int] = {}
        self.table: list[Attribute] = []

    def attribute(self, attr: Attribute) -> int:
        # by identity first (hashing an attribute hashes all its parameters); the module
        # keeps every attribute alive while it is stored, so ids are not reused
        index = self.by_id.get(id(attr))
        if index is None:
            index = self.attributes.get(attr)
            if index is None:
                index = self.attributes[attr] = len(self.table)
                self.table.append(attr)
            self.by_id[id(attr)] = index
        return index

    def define(self, value: SSAValue) -> str | None:
        self.numbers[value] = len(self.numbers)
        return value.name_hint

    def block(self, block: Block) -> tuple[Any, ...]:
        args = tuple((self.attribute(a.type), self.define(a)) for a in block.args)
        return args, tuple(self.op(op) for op in block.ops)

    def op(self, op: Operation) -> tuple[Any, ...]:
        if op.successors:
            raise SerializeError(f"{op.name}: ops with successors are not stored")
        try:
            operands = tuple(self.numbers[v] for v in op.operands)
        except KeyError:
            raise SerializeError(f"{op.name}: an operand is used before it is defined") from None
        # regions first, then results: the order loads() numbers values in
        regions = tuple(tuple(self.block(b) for b in region.blocks) for region in op.regions)
        results = tuple((self.attribute(r.type), self.define(r)) for r in op.results)
        return (
            op.name,
            operands,
            results,
            tuple((k, self.attribute(v)) for k, v in op.properties.items()),
            tuple((k, self.attribute(v)) for k, v in op.attributes.items()),
            self.attribute(op.location) if op.location is not None else -1,
            regions,
        )


def dumps(module: ModuleOp) -> bytes:
    """``module`` as bytes (see the module docstring)."""
    encoder = _Encoder()
    body = tuple(encoder.block(b) for b in module.body.blocks)
    record = (FORMAT, encoder.table, module.attributes, body)
    try:
        return pickle.dumps(record, protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, TypeError, AttributeError, RecursionError) as error:
        raise SerializeError(f"the module cannot be stored: {error}") from None


def _dialects() -> tuple[Any, ...]:
    from xdsl.dialects.builtin import Builtin
    from xdsl.dialects.func import Func

    from tessera.ir.graph import Graph
    from tessera.ir.schedule import Schedule
    from tessera.ir.tile import TILE_DIALECTS

    return (Builtin, Func, Graph, Schedule, *TILE_DIALECTS)


@functools.cache
def _op_classes() -> dict[str, type[Operation]]:
    """Op name -> class, for every dialect a Tessera module holds."""
    return {op.name: op for d in _dialects() for op in d.operations}


@functools.cache
def _allowed_classes() -> dict[tuple[str, str], Any]:
    """(module, name) -> the object, for every global a stored module may name: exactly
    these, looked up (nothing is imported by name)."""
    import builtins

    import immutabledict
    from xdsl.dialects.builtin import BytesAttr, DenseArrayBase, Signedness

    allowed: list[Any] = [immutabledict.immutabledict, BytesAttr, DenseArrayBase, Signedness]
    for dialect in _dialects():
        for attr in dialect.attributes:
            allowed.append(attr)
            enum = getattr(attr, "enum_type", None)  # an enum attribute's Python enum
            if isinstance(enum, type):
                allowed.append(enum)
    table = {(c.__module__, c.__qualname__): c for c in allowed}
    table.update({("builtins", n): getattr(builtins, n) for n in _ALLOWED_BUILTINS})
    return table


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        found = _allowed_classes().get((module, name))
        if found is None:
            raise SerializeError(f"stored data names {module}.{name}, which a module never holds")
        return found


class _Decoder:
    def __init__(self, table: list[Attribute]) -> None:
        self.table = table
        self.values: list[SSAValue] = []

    def block(self, record: tuple[Any, ...]) -> Block:
        args, ops = record
        block = Block(arg_types=[self.table[t] for t, _ in args])
        for arg, (_, hint) in zip(block.args, args, strict=True):
            arg.name_hint = hint
            self.values.append(arg)
        block.add_ops(self.op(op) for op in ops)
        return block

    def op(self, record: tuple[Any, ...]) -> Operation:
        name, operands, results, properties, attributes, location, regions = record
        table = self.table
        cls = _op_classes().get(name)
        if cls is None:
            raise SerializeError(f"stored module holds an unknown op {name}")
        op = cls.create(
            operands=[self.values[i] for i in operands],
            result_types=[table[t] for t, _ in results],
            properties={k: table[v] for k, v in properties},
            attributes={k: table[v] for k, v in attributes},
            regions=[Region([self.block(b) for b in blocks]) for blocks in regions],
        )
        if location >= 0:
            op.location = table[location]
        for result, (_, hint) in zip(op.results, results, strict=True):
            result.name_hint = hint
            self.values.append(result)
        return op


def loads(data: bytes) -> ModuleOp:
    """The module :func:`dumps` stored in ``data``."""
    try:
        record = _Unpickler(io.BytesIO(data)).load()
        version, table, attributes, body = record
    except SerializeError:
        raise
    except Exception as error:  # truncated or foreign data: not a stored module
        raise SerializeError(f"not a stored module: {type(error).__name__}: {error}") from None
    if version != FORMAT:
        raise SerializeError(f"stored module format {version}, expected {FORMAT}")
    decoder = _Decoder(table)
    module = ModuleOp(Region([decoder.block(b) for b in body]))
    module.attributes.update(attributes)
    return module


__all__ = ["SerializeError", "dumps", "loads"]
