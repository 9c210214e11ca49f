"""Pytrees: nested tuples, lists, dicts and namedtuples of leaves (as in JAX).

``flatten`` returns the leaves and a hashable ``TreeDef``; ``unflatten`` rebuilds the
structure. ``None`` is an empty node, as in JAX.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TreeDef:
    """The structure of a pytree: a node kind, its metadata and its children."""

    kind: str  # "leaf", "none", "tuple", "list", "dict" or "namedtuple"
    meta: Any = None  # dict keys, or the namedtuple class
    children: tuple[TreeDef, ...] = ()

    @property
    def num_leaves(self) -> int:
        if self.kind == "leaf":
            return 1
        return sum(child.num_leaves for child in self.children)


LEAF = TreeDef("leaf")


def flatten(tree: Any) -> tuple[list[Any], TreeDef]:
    leaves: list[Any] = []
    return leaves, _flatten(tree, leaves)


def _flatten(tree: Any, leaves: list[Any]) -> TreeDef:
    if tree is None:
        return TreeDef("none")
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):
        children = tuple(_flatten(v, leaves) for v in tree)
        return TreeDef("namedtuple", type(tree), children)
    if isinstance(tree, (tuple, list)):
        children = tuple(_flatten(v, leaves) for v in tree)
        return TreeDef(type(tree).__name__, None, children)
    if isinstance(tree, dict):
        keys = tuple(tree)
        return TreeDef("dict", keys, tuple(_flatten(tree[k], leaves) for k in keys))
    leaves.append(tree)
    return LEAF


def unflatten(treedef: TreeDef, leaves: list[Any]) -> Any:
    iterator = iter(leaves)
    result = _unflatten(treedef, iterator)
    if next(iterator, _END) is not _END:
        raise ValueError("too many leaves for the tree structure")
    return result


_END = object()


def _unflatten(treedef: TreeDef, leaves: Any) -> Any:
    if treedef.kind == "leaf":
        return next(leaves)
    if treedef.kind == "none":
        return None
    children = [_unflatten(child, leaves) for child in treedef.children]
    if treedef.kind == "namedtuple":
        return treedef.meta(*children)
    if treedef.kind == "tuple":
        return tuple(children)
    if treedef.kind == "list":
        return children
    return dict(zip(treedef.meta, children, strict=True))
