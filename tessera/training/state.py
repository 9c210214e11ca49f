"""The training state of a ``graph.training_step``, and how it lives across processes.

On the virtual mesh (one process) the state's leaves are the global torch tensors: the
parameters the user passed to ``step.init`` and fresh optimizer state, updated in place
by each step, as torch optimizers update a model's parameters.

Under ``tessera run`` (one process per rank) each process holds and updates only its
rank's piece of every tensor, as ZeRO/FSDP do: copying the whole model to every rank
after each step would cost an all-gather per step. So the state's leaves are then
:class:`~tessera.dist.tensor.DistTensor` values built from this rank's shard
(``DistTensor.from_local``): ``.local(rank)`` is the shard the steps update, and
``.data`` raises an error saying how to get the whole value: ``step.gather(state)`` or
``step.state_dict(state)``, collectives that give every rank the whole state. The
tensors the user passed to ``init`` are copied from, never updated (each process would
otherwise update only its own part of them and keep stale values elsewhere).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from tessera.backends.distributed import LocalResult
from tessera.backends.layout import block, piece
from tessera.dist.shard_spec import ShardSpec
from tessera.dist.tensor import DistTensor
from tessera.errors import TesseraError
from tessera.ir.mesh import Mesh
from tessera.ir.sharding import Sharding


@dataclass
class TrainState:
    """What a training step updates: the parameters and the optimizer state (pytrees of
    torch tensors on the virtual mesh, of this rank's shards as ``DistTensor``\\ s under
    ``tessera run``; see the module docstring) and the number of steps taken."""

    params: Any
    opt_state: Any
    step: int = 0


def rank_shards(
    leaves: Sequence[Any], layouts: Sequence[Sharding], mesh: Mesh, rank: int, paths: Sequence[str],
    step_name: str,
) -> list[DistTensor]:  # fmt: skip
    """This rank's shard of each state leaf (a copy: the leaf is never written), as a
    ``DistTensor`` laid out as ``layouts`` say; leaves that are shards so laid out already
    stay, shards laid out otherwise are gathered (a collective: every rank places its
    state the same way) and cut again."""
    shards = []
    for leaf, layout, path in zip(leaves, layouts, paths, strict=True):
        if isinstance(leaf, DistTensor):
            if leaf.sharding == layout:
                shards.append(leaf)
                continue
            leaf = gathered(leaf, rank)
        tensor = leaf if isinstance(leaf, torch.Tensor) else torch.as_tensor(leaf)
        local = piece(tensor.detach(), layout, mesh, rank).clone()
        whole = (
            f"{path} holds rank {{rank}}'s shard only: under tessera run each process updates "
            f"its own piece of the training state; {step_name}.gather(state) or "
            f"{step_name}.state_dict(state) gives every rank the whole state (a collective: "
            f"every rank calls it)"
        )
        shard = DistTensor.from_local(
            local, ShardSpec.from_sharding(layout), mesh, rank, name=path, whole=whole
        )
        if shard.shape != tuple(tensor.shape) or shard.sharding != layout:
            raise TesseraError(f"internal error: the shard of {path} is laid out {shard.sharding}, not {layout}")
        shards.append(shard)
    return shards


def local_piece(leaf: Any, layout: Sharding, mesh: Mesh, rank: int) -> torch.Tensor:
    """``rank``'s piece of a state leaf laid out as ``layout``: a shard's own tensor, or
    the piece cut from a global tensor."""
    if isinstance(leaf, DistTensor):
        _check_layout(leaf, layout)
        return leaf.local(rank)
    return piece(leaf.detach(), layout, mesh, rank)


def write_piece(leaf: Any, layout: Sharding, mesh: Mesh, rank: int, value: torch.Tensor) -> None:
    """Writes ``rank``'s new piece of a state leaf, in place."""
    with torch.no_grad():
        if isinstance(leaf, DistTensor):
            _check_layout(leaf, layout)
            leaf.local(rank).copy_(value)
        else:
            leaf[block(rank, layout, mesh, tuple(leaf.shape))].copy_(value)


def write_result(leaf: Any, result: Any) -> None:
    """Writes a step's new value of a state leaf in place: a global value, or (under
    ``tessera run``) this rank's :class:`LocalResult`."""
    if isinstance(result, LocalResult):
        write_piece(leaf, result.sharding, result.mesh, result.rank, result.local)
        return
    with torch.no_grad():
        leaf.copy_(torch.as_tensor(result))


def gathered(leaf: Any, rank: int) -> torch.Tensor:
    """The whole value of a state leaf (a collective when it is a shard)."""
    if not isinstance(leaf, DistTensor):
        return leaf
    return LocalResult(leaf.local(rank), leaf.sharding, leaf.mesh, rank).full()


def _check_layout(leaf: DistTensor, layout: Sharding) -> None:
    if leaf.sharding != layout:
        raise TesseraError(
            f"a training state shard is laid out {leaf.sharding} but the step needs {layout}; "
            f"build the state with the step's init (or load_state_dict)"
        )


__all__ = ["TrainState", "gathered", "local_piece", "rank_shards", "write_piece", "write_result"]
