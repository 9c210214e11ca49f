"""Layer stacks: a training step whose layers are region calls keeps their parameters
stacked, so that its program holds one layer whatever the depth.

A step written with ``graph.region`` layers, ``for p in layers: x = layer(p, x)``, is one
``graph.call`` per layer, but its program still takes every layer's parameters and
optimizer state as separate arguments, and every compile stage and the Schedule IR
handle each of them. So, as MaxText's ``scan_layers`` and a ``jax.lax.scan`` over
stacked layers do by hand, the step keeps each group of like parameters (every layer's
``wq``) in one stack:

1. :func:`find` traces the step's forward once (its ``graph.backward`` only records the
   loss, as a pipelined step's does) and finds the chains of region calls
   (:func:`tessera.frontend.roll_regions.region_chains`) whose operands at one position
   are distinct parameters of one dtype, layout and weight-decay flag: each such position
   is a group, in layer order.
2. The state keeps each group as one tensor of the layers stacked on dim 0 (and the
   optimizer state likewise); the leaves of ``TrainState.params`` and ``.opt_state`` are
   views into it (:func:`stacked_storage`), so reading, saving and restoring the state
   see the layers as before. The step's program takes the stacks.
3. The program hands the step's function each layer's slice of the stacks
   (:meth:`LayerStacks.unstacked`); ``graph.backward`` rolls the chain into one
   ``graph.scan`` over the stacks before it differentiates, and the optimizer updates the
   stacks (:meth:`LayerStacks.restacked` gives it their gradients).

Under ``tessera run`` (a process per rank) the stacks are this rank's shards of them
(:func:`stacked_shards`). Pipelined steps keep their layers separate for now.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from xdsl.ir import SSAValue

from tessera import op
from tessera.dist.shard_spec import ShardSpec
from tessera.dist.tensor import DistTensor
from tessera.dtypes import as_dtype
from tessera.frontend import pytree
from tessera.frontend.roll_regions import region_chains
from tessera.frontend.tracer import SliceTensor, Tensor, Trace, tracing
from tessera.ir.abstract import AbstractTensor
from tessera.ir.sharding import Sharding

# a program's state leaves in order, each a stack of the user's leaves (their indices,
# in layer order) or one of them (its index)
Entries = list[tuple[int, ...] | int]


def by_entries(entries: Entries, values: Sequence[Any], stacked: Callable[[list[Any]], Any]) -> list[Any]:
    """Per entry: ``stacked`` of the ``values`` it stacks, or the one value it is."""
    return [stacked([values[i] for i in e]) if isinstance(e, tuple) else values[e] for e in entries]


@dataclass(frozen=True)
class LayerStacks:
    """Which parameter leaves (indices into the flattened parameters, ``count`` of them)
    a step keeps stacked: ``groups``, each in layer order; the program's parameters are
    ``(stacks, rest)``: one tensor per group, then the other leaves in order."""

    groups: tuple[tuple[int, ...], ...]
    count: int

    @property
    def rest(self) -> list[int]:
        grouped = {i for group in self.groups for i in group}
        return [i for i in range(self.count) if i not in grouped]

    def tree(self) -> pytree.TreeDef:
        """The program's parameter tree: ``(stacks, rest)``."""
        return pytree.flatten(([0] * len(self.groups), [0] * len(self.rest)))[1]

    @property
    def entries(self) -> Entries:
        """The program's parameters as :data:`Entries`."""
        return [*self.groups, *self.rest]

    def storage_shapes(self, shapes: Sequence[tuple[int, ...]]) -> list[tuple[int, ...]]:
        """The program's parameters' shapes from the step function's."""
        return by_entries(self.entries, shapes, lambda group: (len(group), *group[0]))

    def unstacked(self, used: Sequence[Tensor]) -> list[Tensor]:
        """While tracing: the step function's parameters from the program's (``used``): each
        grouped one a lazy slice of its stack (:meth:`Trace.lazy_slices`)."""
        leaves: list[Tensor | None] = [None] * self.count
        for stack, group in zip(used, self.groups, strict=False):
            for leaf, piece in zip(group, stack.trace.lazy_slices(stack), strict=True):
                leaves[leaf] = piece
        for value, leaf in zip(used[len(self.groups) :], self.rest, strict=True):
            leaves[leaf] = value
        return [leaf for leaf in leaves if leaf is not None]

    def restacked(self, grads: Sequence[Tensor]) -> list[Tensor]:
        """While tracing: the gradients of the program's parameters from those of the step
        function's (``grads``): a stack's is the gradient ``graph.backward`` computed for it
        when the group's are its slices, in order, else the group's stacked."""

        def stacked(members: list[Tensor]) -> Tensor:
            first = members[0]
            if isinstance(first, SliceTensor) and all(
                isinstance(g, SliceTensor) and g.stack is first.stack and g.index == i
                for i, g in enumerate(members)
            ):
                return first.stack
            return op.stack(members)

        return by_entries(self.entries, grads, stacked)


def find(
    fn: Callable[..., Any],
    tree: pytree.TreeDef,
    params: Sequence[AbstractTensor],
    batch: Any,
    mesh: Any,
    alike: Callable[[int, int], bool],
    trace_step: Callable[[Any], Any],
) -> LayerStacks | None:
    """The stacks for a step whose function is ``fn(params, *batch)`` (``params``: its
    leaves' types; ``batch``: the batch's torch tensors), or None when it calls no chain
    of regions. ``alike(i, j)``: whether leaves ``i`` and ``j`` may share a stack (one
    layout, one weight-decay flag); ``trace_step(params)``: a context in which
    ``graph.backward`` records the loss only. Any error tracing gives None: the step's
    own trace reports it."""
    batch_leaves, batch_tree = pytree.flatten(batch)
    batch_avals = [
        AbstractTensor(tuple(x.shape), as_dtype(x.dtype)) for x in batch_leaves if isinstance(x, torch.Tensor)
    ]
    trace = Trace("layer_stacks", [*params, *batch_avals], mesh=mesh)
    arguments = [Tensor(trace, a) for a in trace.block.args]
    values = iter(arguments[len(params) :])
    batch_args = [next(values) if isinstance(x, torch.Tensor) else x for x in batch_leaves]
    used = pytree.unflatten(tree, arguments[: len(params)])
    try:
        with tracing(trace), trace_step(used):
            fn(used, *pytree.unflatten(batch_tree, batch_args))
    except Exception:  # the step's own trace reports it, at the user's line
        return None
    position = {a.value: i for i, a in enumerate(arguments[: len(params)])}

    def stack_of(values: list[SSAValue]) -> Hashable | None:
        leaves = [position.get(v) for v in values]
        if any(i is None for i in leaves) or len(set(leaves)) != len(leaves):
            return None
        first = leaves[0]
        assert first is not None
        if not all(alike(first, i) for i in leaves[1:] if i is not None):
            return None
        return tuple(leaves)

    groups: list[tuple[int, ...]] = []
    taken: set[int] = set()
    for chain in region_chains(trace.block, stack_of):
        found = [g for g in chain.stacked.values() if isinstance(g, tuple)]
        leaves = [i for group in found for i in group]
        if len(set(leaves)) != len(leaves) or taken & set(leaves):
            continue  # a leaf in two stacks: these layers stay calls
        for group in found:
            taken |= set(group)
            groups.append(group)
    return LayerStacks(tuple(groups), len(params)) if groups else None


def stacked_storage(
    leaves: Sequence[torch.Tensor], entries: Entries
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The program's state for the user's ``leaves``: per stacking entry the tensor its
    leaves are views of (made, and those leaves replaced by views into it, when they are
    not yet); and the leaves."""
    leaves = list(leaves)
    storage = []
    for entry in entries:
        if not isinstance(entry, tuple):
            storage.append(leaves[entry])
            continue
        members = [leaves[i] for i in entry]
        base = members[0]._base
        if base is None or not _views_of(base, members):
            base = torch.stack([m.detach() for m in members])
            for index, leaf in enumerate(entry):
                leaves[leaf] = base[index]
        storage.append(base)
    return storage, leaves


def stacked_shards(
    leaves: Sequence[DistTensor], entries: Entries, layouts: Sequence[Sharding], mesh: Any, rank: int
) -> tuple[list[DistTensor], list[DistTensor]]:
    """:func:`stacked_storage` for a state held as this rank's shards (``tessera run``):
    a stack's shard is its layers' shards stacked (its layout, ``layouts``, is theirs
    after a whole dim 0), and each layer's shard becomes a view into it."""
    leaves = list(leaves)
    storage = []
    for entry, layout in zip(entries, layouts, strict=True):
        if not isinstance(entry, tuple):
            storage.append(leaves[entry])
            continue
        members = [leaves[i] for i in entry]
        pieces = [m.local(rank) for m in members]
        base = pieces[0]._base
        if base is None or not _views_of(base, pieces):
            base = torch.stack([p.detach() for p in pieces])
            for index, leaf in enumerate(entry):
                leaves[leaf] = members[index].with_local(base[index])
        spec = ShardSpec.from_sharding(layout)
        storage.append(DistTensor.from_local(base, spec, mesh, rank, name="a layer stack"))
    return storage, leaves


def _views_of(base: torch.Tensor, members: list[torch.Tensor]) -> bool:
    """Whether ``members`` are ``base[0]``, ``base[1]``, … and nothing more."""
    if base.ndim == 0 or base.shape[0] != len(members) or not base.is_contiguous():
        return False
    step = base.stride(0)
    return all(
        m._base is base
        and tuple(m.shape) == tuple(base.shape[1:])
        and m.storage_offset() == base.storage_offset() + i * step
        and m.stride() == base.stride()[1:]
        for i, m in enumerate(members)
    )


class Tag:
    """Marks a leaf (a parameter's index, or None for the others) in a tree given to an
    optimizer's ``state_layout``: where its state for each parameter goes."""

    def __init__(self, leaf: int | None):
        self.leaf = leaf


def state_entries(
    optimizer: Any, tree: pytree.TreeDef, stacks: LayerStacks
) -> tuple[Entries, pytree.TreeDef]:
    """The optimizer state's :data:`Entries` (indices into the user's state leaves) and
    the program state's tree. Both states come from ``optimizer.state_layout`` (the same
    fields in the same order), so a parameter's k-th state in one is its k-th in the
    other, and a stack's k-th state stacks its layers' k-th."""
    user = pytree.flatten(
        optimizer.state_layout(pytree.unflatten(tree, [Tag(i) for i in range(stacks.count)]), Tag(None))
    )[0]
    where: dict[int | None, list[int]] = {}
    for index, tag in enumerate(user):
        where.setdefault(tag.leaf, []).append(index)
    params = [Tag(-1 - k) for k in range(len(stacks.groups))] + [Tag(i) for i in stacks.rest]
    program, program_tree = pytree.flatten(
        optimizer.state_layout(pytree.unflatten(stacks.tree(), params), Tag(None))
    )
    seen: dict[int | None, int] = {}
    entries: Entries = []
    for tag in program:
        k = seen[tag.leaf] = seen.get(tag.leaf, -1) + 1
        if tag.leaf is not None and tag.leaf < 0:
            entries.append(tuple(where[leaf][k] for leaf in stacks.groups[-1 - tag.leaf]))
        else:
            entries.append(where[tag.leaf][k])
    return entries, program_tree
