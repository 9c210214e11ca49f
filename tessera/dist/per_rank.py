"""Per-rank collectives: what ``dist.all_reduce`` and the others mean inside a
``dist.shard_map`` body, and the ops that only have a per-rank meaning (``ppermute``,
``send`` / ``recv`` pairs, ``axis_index``, ``axis_size``, the ``*_async`` forms).

In a body each rank holds its block, so a collective communicates: ``all_reduce(x,
"tp")`` is the sum of the blocks of the ranks along ``tp``, ``all_gather(x, "tp",
dim=1)`` concatenates them on dim 1 (in rank order), ``reduce_scatter`` sums and keeps
this rank's slice, ``all_to_all`` re-cuts (``split_dim`` shrinks, ``concat_dim`` grows),
``ppermute(x, "tp", perm=[(0, 1), (1, 0)])`` sends each source's block to its target
(a rank that is no target receives zeros). Each binds the partitioned Graph IR
collective that ``shard-partition`` would emit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tessera.errors import ShardingError, TraceError
from tessera.frontend.tracer import Tensor, current_trace, is_tracing, user_location
from tessera.ir import graph
from tessera.ir.mesh import Mesh
from tessera.ir.shape_rules import normalize_axis


def in_manual_region() -> bool:
    """Whether the code being traced is a ``dist.shard_map`` body."""
    return is_tracing() and current_trace().manual


def _manual_mesh(what: str) -> Mesh:
    if not in_manual_region():
        raise TraceError(
            f"{what} has a per-rank meaning: call it inside a dist.shard_map body, at "
            f"{user_location()}"
        )
    mesh = current_trace().mesh
    assert mesh is not None  # a shard_map body is traced over its mesh
    return mesh


def checked_axes(mesh: Mesh, what: str, axis: str | Sequence[str]) -> tuple[str, ...]:
    """The mesh axes named by ``axis``; an unknown or repeated axis is an error at the user's line."""
    axes = (axis,) if isinstance(axis, str) else tuple(axis)
    for name in axes:
        if name not in mesh.axis_names:
            raise ShardingError(
                f"{what}: unknown mesh axis {name!r}; the mesh has axes {list(mesh.axis_names)}, "
                f"at {user_location()}"
            )
    if len(set(axes)) != len(axes):
        raise ShardingError(f"{what}: mesh axes {list(axes)} repeat an axis, at {user_location()}")
    return axes


def axes_of(what: str, axis: str | Sequence[str]) -> tuple[tuple[str, ...], int]:
    """The mesh axes named by ``axis`` in a shard_map body and the number of ranks along them."""
    mesh = _manual_mesh(what)
    axes = checked_axes(mesh, what, axis)
    return axes, math.prod(mesh.axis_size(a) for a in axes)


def bind_unary(op_type: type[graph.GraphOp], what: str, x: Tensor, **attrs: Any) -> Tensor:
    """Binds ``op_type`` to the traced tensor ``x`` (an error naming ``what`` otherwise)."""
    if not isinstance(x, Tensor):
        raise TraceError(
            f"{what} expects a traced tensor, found {type(x).__name__} at {user_location()}"
        )
    (result,) = current_trace().bind(op_type, [x], **attrs)
    return result


def all_reduce(x: Tensor, axis: str | Sequence[str], op: str = "sum") -> Tensor:
    axes, size = axes_of("dist.all_reduce", axis)
    return bind_unary(graph.AllReduceOp, "dist.all_reduce", x, axes=axes, kind=op, group_size=size)


def all_gather(x: Tensor, axis: str | Sequence[str], dim: int = 0) -> Tensor:
    axes, size = axes_of("dist.all_gather", axis)
    return bind_unary(
        graph.AllGatherOp,
        "dist.all_gather",
        x,
        axes=axes,
        dim=normalize_axis(dim, x.ndim),
        group_size=size,
    )


def reduce_scatter(x: Tensor, axis: str | Sequence[str], dim: int = 0, op: str = "sum") -> Tensor:
    axes, size = axes_of("dist.reduce_scatter", axis)
    _divides("dist.reduce_scatter", x, dim, size, axes)
    return bind_unary(
        graph.ReduceScatterOp, "dist.reduce_scatter", x, axes=axes, dim=normalize_axis(dim, x.ndim),
        kind=op, group_size=size,
    )  # fmt: skip


def all_to_all(x: Tensor, axis: str | Sequence[str], split_dim: int, concat_dim: int) -> Tensor:
    axes, size = axes_of("dist.all_to_all", axis)
    _divides("dist.all_to_all", x, split_dim, size, axes)
    return bind_unary(
        graph.AllToAllOp, "dist.all_to_all", x, axes=axes, split_dim=normalize_axis(split_dim, x.ndim),
        concat_dim=normalize_axis(concat_dim, x.ndim), group_size=size,
    )  # fmt: skip


def broadcast(x: Tensor, axis: str | Sequence[str], src: int = 0) -> Tensor:
    axes, size = axes_of("dist.broadcast", axis)
    if not 0 <= src < size:
        raise ShardingError(
            f"dist.broadcast: src {src} is out of range for {size} ranks, at {user_location()}"
        )
    return bind_unary(graph.BroadcastOp, "dist.broadcast", x, axes=axes, src=src, group_size=size)


def ppermute(x: Tensor, axis: str | Sequence[str], perm: Sequence[tuple[int, int]]) -> Tensor:
    """Sends the block of the rank at each ``(source, target)`` pair's source position
    along ``axis`` to its target (``jax.lax.ppermute``); a rank that is no target
    receives zeros. No position may be a source twice or a target twice."""
    axes, size = axes_of("dist.ppermute", axis)
    pairs = _pairs("dist.ppermute: perm", perm, size, axes)
    return bind_unary(
        graph.CollectivePermuteOp, "dist.ppermute", x, axes=axes, pairs=[list(p) for p in pairs],
        group_size=size,
    )  # fmt: skip


def _pairs(
    what: str, pairs: Sequence[tuple[int, int]], size: int, axes: tuple[str, ...]
) -> list[tuple[int, int]]:
    """``pairs`` checked: (source, target) positions below ``size``, each once per role."""
    checked: list[tuple[int, int]] = []
    for pair in pairs:
        if (
            not isinstance(pair, (tuple, list))
            or len(pair) != 2
            or not all(isinstance(p, int) for p in pair)
        ):
            raise ShardingError(
                f"{what}: expected a list of (source, target) positions, found {pair!r}, "
                f"at {user_location()}"
            )
        checked.append((int(pair[0]), int(pair[1])))
    for role, positions in (
        ("source", [s for s, _ in checked]),
        ("target", [t for _, t in checked]),
    ):
        out = [p for p in positions if not 0 <= p < size]
        if out:
            raise ShardingError(
                f"{what}: {role} position {out[0]} is out of range for the {size} ranks "
                f"along {list(axes)}, at {user_location()}"
            )
        repeated = sorted({p for p in positions if positions.count(p) > 1})
        if repeated:
            raise ShardingError(
                f"{what}: {checked} is not a permutation: position {repeated[0]} is the "
                f"{role} of more than one pair, at {user_location()}"
            )
    return checked


@dataclass
class _Send:
    value: Tensor
    axes: tuple[str, ...]
    pairs: list[tuple[int, int]]
    where: str


def send(x: Tensor, axis: str | Sequence[str], to: Sequence[tuple[int, int]]) -> None:
    """Sends ``x`` from each ``(source, target)`` pair's source position along ``axis``
    to its target; the matching ``dist.recv(axis, frm=<the same pairs>, like=x)`` of the
    same body receives it (together they are one ``ppermute``)."""
    axes, size = axes_of("dist.send", axis)
    if not isinstance(x, Tensor):
        raise TraceError(
            f"dist.send expects a traced tensor, found {type(x).__name__} at {user_location()}"
        )
    pairs = _pairs("dist.send: to", to, size, axes)
    current_trace().sends.append(_Send(x, axes, pairs, user_location()))


def recv(axis: str | Sequence[str], frm: Sequence[tuple[int, int]], like: Tensor) -> Tensor:
    """What the ``dist.send`` over ``axis`` with the pairs ``frm`` sent: on each pair's
    target, the source's block; zeros on the ranks that are no target. ``like`` gives
    the block's shape and dtype."""
    axes, size = axes_of("dist.recv", axis)
    pairs = _pairs("dist.recv: frm", frm, size, axes)
    sends = current_trace().sends
    for index, sent in enumerate(sends):
        if sent.axes == axes and sent.pairs == pairs:
            if not isinstance(like, Tensor) or sent.value.aval != like.aval:
                found = like.aval if isinstance(like, Tensor) else type(like).__name__
                raise ShardingError(
                    f"dist.recv: the matching dist.send (at {sent.where}) sends {sent.value.aval}, "
                    f"but like is {found}, at {user_location()}"
                )
            del sends[index]
            return ppermute(sent.value, axes, pairs)
    pending = "; ".join(f"over {list(s.axes)} to {s.pairs} at {s.where}" for s in sends) or "none"
    raise ShardingError(
        f"dist.recv over {list(axes)} from {pairs} has no matching dist.send (the same axis "
        f"and pairs) before it; sends not yet received: {pending}, at {user_location()}"
    )


def axis_index(axis: str | Sequence[str]) -> Tensor:
    """This rank's position along ``axis`` (major first over several): an i32 scalar."""
    axes, size = axes_of("dist.axis_index", axis)
    (result,) = current_trace().bind(graph.AxisIndexOp, [], axes=axes, group_size=size)
    return result


def axis_size(axis: str | Sequence[str]) -> int:
    """The number of ranks along ``axis`` (a Python int)."""
    return axes_of("dist.axis_size", axis)[1]


def _divides(what: str, x: Tensor, dim: int, size: int, axes: tuple[str, ...]) -> None:
    if not isinstance(x, Tensor):
        return
    d = normalize_axis(dim, x.ndim)
    if x.shape[d] % size:
        raise ShardingError(
            f"{what}: dim {d} of the block {x.aval} ({x.shape[d]}) does not split into the "
            f"{size} ranks along {list(axes)}, at {user_location()}"
        )


class Handle:
    """An asynchronous collective in flight (``h = dist.all_reduce_async(x, "tp")``):
    ``h.wait()`` is its result. The collective is a ``schedule.start`` where it was
    called (``overlap-comm`` may start it earlier, once its operand is made), and its
    ``schedule.wait`` is where ``h.wait()`` was called (a ``graph.wait`` records the
    point): the kernels traced between the two overlap the transfer, and those traced
    after the wait run after it. Waiting again returns the same tensor."""

    def __init__(self, result: Tensor):
        self._result = result
        self._waited: Tensor | None = None

    def wait(self) -> Tensor:
        if self._waited is None:
            (self._waited,) = current_trace().bind(graph.WaitOp, [self._result])
        return self._waited


def all_reduce_async(x: Tensor, axis: str | Sequence[str], op: str = "sum") -> Handle:
    return Handle(all_reduce(x, axis, op))


def all_gather_async(x: Tensor, axis: str | Sequence[str], dim: int = 0) -> Handle:
    return Handle(all_gather(x, axis, dim))


def reduce_scatter_async(
    x: Tensor, axis: str | Sequence[str], dim: int = 0, op: str = "sum"
) -> Handle:
    return Handle(reduce_scatter(x, axis, dim, op))


def all_to_all_async(
    x: Tensor, axis: str | Sequence[str], split_dim: int, concat_dim: int
) -> Handle:
    return Handle(all_to_all(x, axis, split_dim, concat_dim))


def ppermute_async(x: Tensor, axis: str | Sequence[str], perm: Sequence[tuple[int, int]]) -> Handle:
    return Handle(ppermute(x, axis, perm))
