"""A set of xDSL attributes (or tuples of them) that tests membership cheaply.

Hashing an xDSL attribute hashes its parameters recursively, which costs more than many
checks of it. Modules the compiler builds share attribute objects (types and shardings
are built once per value, ``tessera.ir.abstract``, ``tessera.ir.sharding``), so an
:class:`AttributeSet` looks an entry up by the identity of its objects first and by
value (hashing) only on a miss; parsed modules, whose equal attributes are distinct
objects, cost one hash per entry, as a plain set would.
"""

from __future__ import annotations

from collections.abc import Hashable


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
