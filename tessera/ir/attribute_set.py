"""A set of xDSL attributes (or tuples of them) that tests membership cheaply, and a
bounded map keyed by such tuples that looks keys up as cheaply.

Hashing an xDSL attribute hashes its parameters recursively, which costs more than many
checks of it. Modules the compiler builds share attribute objects (types and shardings
are built once per value, ``tessera.ir.abstract``, ``tessera.ir.sharding``), so an
:class:`AttributeSet` looks an entry up by the identity of its objects first and by
value (hashing) only on a miss; parsed modules, whose equal attributes are distinct
objects, cost one hash per entry, as a plain set would.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Generic, TypeVar

Value = TypeVar("Value")


class AttributeSet:
    """Entries are attributes or tuples of attributes and plain values."""

    def __init__(self) -> None:
        self._by_identity: dict[tuple[int, ...], Hashable] = {}  # keeps entries alive
        self._by_value: set[Hashable] = set()

    @staticmethod
    def _identity(entry: Hashable) -> tuple[int, ...]:
        return tuple(map(id, entry)) if isinstance(entry, tuple) else (id(entry),)

    def __contains__(self, entry: Hashable) -> bool:
        identity = self._identity(entry)
        if identity in self._by_identity:
            return True
        if entry in self._by_value:
            self._by_identity[identity] = entry
            return True
        return False

    def add(self, entry: Hashable) -> None:
        self._by_identity[self._identity(entry)] = entry
        self._by_value.add(entry)


class AttributeMap(Generic[Value]):
    """A dict keyed by tuples of attributes and plain values, looked up like an
    :class:`AttributeSet`; it holds at most ``size`` keys (it starts afresh when full)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._by_identity: dict[tuple[int, ...], tuple[tuple[Hashable, ...], Value]] = {}
        self._by_value: dict[tuple[Hashable, ...], Value] = {}

    def get(self, key: tuple[Hashable, ...]) -> Value | None:
        identity = tuple(map(id, key))
        found = self._by_identity.get(identity)
        if found is not None:
            return found[1]
        value = self._by_value.get(key)
        if value is not None:
            self._remember(identity, key, value)
        return value

    def __setitem__(self, key: tuple[Hashable, ...], value: Value) -> None:
        self._by_value[key] = value
        self._remember(tuple(map(id, key)), key, value)

    def _remember(self, identity: tuple[int, ...], key: tuple[Hashable, ...], value: Value) -> None:
        if len(self._by_identity) >= self.size or len(self._by_value) > self.size:
            self._by_identity.clear()
            self._by_value = {key: value}
        self._by_identity[identity] = (key, value)  # (the key keeps its items alive)
