"""``unzigzag-attention``: causal or windowed attention over a sequence stored in zig-zag order
(``zigzag = n``, :mod:`tessera.ir.zigzag`), rewritten into attention in natural order.

The attention kernels mask by positions that grow along the sequence, so an op whose
sequence is stored zig-zag is rewritten into calls whose chunks are in true order:

- keys and values held whole (always: unsharded, or all-gathered by ``shard-partition``'s
  context parallelism): their ``2n`` chunks are put in true order by local slices and a
  concat, and the backward's dk, dv put back;
- queries held whole: likewise, and one call (the outputs put back in stored order);
- queries split over ``p`` ranks (``p`` divides ``n``): each rank holds ``m = 2n / p``
  stored chunks, ``r·m .. r·m + m - 1`` for rank ``r``; each chunk is one call whose
  causal offset is the chunk's true start, ``(r·m/2 + j/2) · c`` for an even ``j`` and
  ``(2n - 1 - r·m/2 - (j-1)/2) · c`` for an odd one (``c`` the chunk length, ``r`` from
  ``graph.axis_index``): the dk and dv of the calls are summed.

Segment ids are stored like the tokens and move with them (the key ids to true order,
the query ids cut per chunk). Nothing moves between ranks. Attention with neither a
causal mask nor a window does not depend on the order, and an order over one rank is the
natural one: the attribute is dropped. Ring attention (``shard-partition``) consumes the order itself,
so this pass runs after it and before ``lower-graph-to-schedule``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import DenseIntOrFPElementsAttr, ModuleOp
from xdsl.ir import SSAValue
from xdsl.passes import ModulePass
from xdsl.rewriter import InsertPoint, Rewriter

from tessera.dtypes import DType
from tessera.ir import graph
from tessera.ir.abstract import AbstractTensor, aval
from tessera.ir.located_error import LocatedPassFailure, LocatedShardingFailure
from tessera.ir.mesh import Mesh
from tessera.ir.mesh_symbol import module_mesh
from tessera.ir.sharding import (
    SHARDING_KEY,
    Sharding,
    ShardingAttr,
    op_shardings,
    set_op_shardings,
    value_sharding,
)
from tessera.ir.zigzag import true_chunk

_SCALAR = Sharding(())
_FORWARD_OPERANDS, _BACKWARD_OPERANDS = 3, 6


@dataclass(frozen=True)
class UnzigzagAttentionPass(ModulePass):
    """Rewrites causal attention stored in zig-zag order into natural-order attention."""

    name = "unzigzag-attention"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        found = module_mesh(op)
        mesh = found[1] if found else None
        for function in op.ops:
            if not isinstance(function, func.FuncOp):
                continue
            partitioned = graph.PARTITIONED in function.attributes
            reordered: dict[tuple[SSAValue, int, bool], SSAValue] = {}  # shared by ops
            for inner in list(function.body.ops):
                attention = isinstance(inner, graph.AttentionOp | graph.AttentionBackwardOp)
                if attention and "zigzag" in inner.properties:
                    mesh_here = mesh if partitioned else None
                    _Unzigzag(inner, mesh_here, function, reordered).run()


class _Unzigzag:
    """The rewrite of one op (``mesh``: the function is partitioned over it)."""

    def __init__(
        self,
        op: graph.GraphOp,
        mesh: Mesh | None,
        function: func.FuncOp,
        reordered: dict[tuple[SSAValue, int, bool], SSAValue],
    ):
        self.op = op
        self.reordered = reordered  # a backward reuses its forward's keys in true order
        self.function = function
        self.mesh = mesh
        self.attrs = op.attrs()
        self.ranks: int = self.attrs.pop("zigzag")
        self.backward = isinstance(op, graph.AttentionBackwardOp)
        annotation = op.attributes.get(SHARDING_KEY)
        if isinstance(annotation, ShardingAttr):
            self.mesh_name: str | None = annotation.mesh_name
        elif annotation is not None:
            self.mesh_name = annotation.data[0].mesh_name  # type: ignore[attr-defined]
        else:
            self.mesh_name = None
        self.results = op_shardings(op) if mesh is not None else None

    # --- emission --------------------------------------------------------------------------

    def emit(
        self,
        op_type: type[graph.GraphOp],
        operands: Sequence[SSAValue],
        layouts: Sequence[Sharding | None],
        **attrs: object,
    ) -> tuple[SSAValue, ...]:
        built = graph.build(op_type, operands, **attrs)
        Rewriter.insert_op(built, InsertPoint.before(self.op))
        if self.mesh_name is not None and all(lay is not None for lay in layouts):
            set_op_shardings(built, self.mesh_name, layouts)  # type: ignore[arg-type]
        return tuple(built.results)

    def one(
        self, op_type: type[graph.GraphOp], operands: Sequence[SSAValue], layout: Sharding | None,
        **attrs: object,
    ) -> SSAValue:  # fmt: skip
        return self.emit(op_type, operands, [layout], **attrs)[0]

    def scalar(self, value: int) -> SSAValue:
        dense = DenseIntOrFPElementsAttr.from_list(AbstractTensor((), DType.i32).to_xdsl(), [value])
        return self.one(graph.ConstantOp, [], self.scalar_layout, value=dense)

    @property
    def scalar_layout(self) -> Sharding | None:
        return _SCALAR if self.mesh_name is not None else None

    def layout_of(self, value: SSAValue) -> Sharding | None:
        """How ``value`` lies over the mesh (None in an unsharded function)."""
        if self.mesh_name is None:
            return None
        return value_sharding(self.function, value)

    def cut(self, value: SSAValue, dim: int, start: int, length: int) -> SSAValue:
        shape = aval(value).shape
        starts, limits = [0] * len(shape), list(shape)
        starts[dim], limits[dim] = start, start + length
        return self.one(
            graph.SliceOp, [value], self.layout_of(value),
            starts=starts, limits=limits, strides=[1] * len(shape),
        )  # fmt: skip

    def reorder(self, value: SSAValue, dim: int, to_true: bool) -> SSAValue:
        """``value`` (whole along ``dim``: ``2n`` chunks) from stored to true order
        (``to_true``) or back (once per value)."""
        key = (value, dim, to_true)
        if key not in self.reordered:
            self.reordered[key] = self._reorder(value, dim, to_true)
        return self.reordered[key]

    def _reorder(self, value: SSAValue, dim: int, to_true: bool) -> SSAValue:
        chunks = 2 * self.ranks
        length = aval(value).shape[dim] // chunks
        if to_true:  # true chunk t lies at stored chunk 2t (t < n) or 2(2n-1-t)+1
            order = [2 * t if t < self.ranks else 2 * (chunks - 1 - t) + 1 for t in range(chunks)]
        else:
            order = [true_chunk(s, self.ranks) for s in range(chunks)]
        pieces = [self.cut(value, dim, c * length, length) for c in order]
        return self.one(graph.ConcatOp, pieces, self.layout_of(value), axis=dim)

    # --- the rewrite ---------------------------------------------------------------------------

    def run(self) -> None:
        op = self.op
        positional = self.attrs["causal"] or self.attrs.get("window")
        if not positional or self.ranks <= 1:  # natural order, or it does not matter
            del op.properties["zigzag"]
            return
        first = _BACKWARD_OPERANDS if self.backward else _FORWARD_OPERANDS
        values, user = list(op.operands[:first]), list(op.operands[first:])
        ids = user[:2] if self.attrs.get("segments") else []  # stored like the tokens
        user = user[len(ids) :]
        rows = aval(values[0]).rank - 2  # also lse's and delta's last dim
        key_axes = self._split_axes(values[1], rows)
        if key_axes:
            raise LocatedPassFailure(
                op,
                f"unzigzag-attention: the keys are split over {list(key_axes)}; they must be "
                f"whole here (shard-partition gathers them, or runs a ring over the "
                f"{self.ranks} ranks of the zig-zag order)",
            )
        axes = self._query_axes()
        pieces = math.prod(self.mesh.axis_size(a) for a in axes) if self.mesh and axes else 1
        if self.ranks % pieces:
            raise LocatedShardingFailure(
                op,
                f"unzigzag-attention: the queries are split into {pieces} pieces over "
                f"{list(axes)}, which does not divide the zig-zag order's {self.ranks} ranks "
                f"(each piece must hold whole chunk pairs)",
            )
        per_rank = 2 * self.ranks // pieces
        for role, value, count in (
            ("query", values[0], per_rank),
            ("key", values[1], 2 * self.ranks),
        ):
            length = aval(value).shape[rows]
            if length % count:
                raise LocatedPassFailure(
                    op,
                    f"unzigzag-attention: the {role} sequence here ({length} rows) does not "
                    f"cut into the {count} chunks of a zig-zag order over {self.ranks} ranks",
                )
        if pieces == 1:
            results = self._whole(values, ids, user, rows)
        else:
            results = self._split(values, ids, user, rows, axes, pieces)
        for old, new in zip(op.results, results, strict=True):
            old.replace_all_uses_with(new)
        Rewriter.erase_op(op)

    def _split_axes(self, value: SSAValue, dim: int) -> tuple[str, ...]:
        layout = self.layout_of(value) if self.mesh is not None else None
        return layout.dims[dim] if layout is not None else ()

    def _query_axes(self) -> tuple[str, ...]:
        """The mesh axes the query rows are split over (the first result's layout)."""
        if self.results is None:
            return ()
        return self.results[0].dims[aval(self.op.results[0]).rank - 2]

    def _call(self, operands: Sequence[SSAValue]) -> tuple[SSAValue, ...]:
        op_type = graph.AttentionBackwardOp if self.backward else graph.AttentionOp
        layouts = self.results or [None] * len(self.op.results)
        return self.emit(op_type, operands, layouts, **self.attrs)

    def _whole(
        self, values: list[SSAValue], ids: list[SSAValue], user: list[SSAValue], rows: int
    ) -> list[SSAValue]:
        """Every operand (and segment ids) in true order, one call, the results back in
        stored order."""
        natural = [self.reorder(v, rows, to_true=True) for v in values]
        natural += [self.reorder(i, aval(i).rank - 1, to_true=True) for i in ids]
        return [self.reorder(r, rows, to_true=False) for r in self._call([*natural, *user])]

    def _split(
        self,
        values: list[SSAValue],
        ids: list[SSAValue],
        user: list[SSAValue],
        rows: int,
        axes: tuple[str, ...],
        pieces: int,
    ) -> list[SSAValue]:
        """One call per local query chunk at its true offset, keys (and their segment
        ids) in true order."""
        per_rank = 2 * self.ranks // pieces  # m: even, as pieces divides ranks
        length = aval(values[0]).shape[rows] // per_rank  # c
        k, v = (self.reorder(x, rows, to_true=True) for x in values[1:3])
        rank = self.one(graph.AxisIndexOp, [], self.scalar_layout, axes=list(axes))
        base = self.one(graph.MulOp, [rank, self.scalar(per_rank // 2)], self.scalar_layout)
        user_q, user_k = user if user else (None, self.scalar(0))
        queries = [values[0], *values[3:]]  # q (and the backward's do, lse, delta)
        outputs: list[list[SSAValue]] = []
        key_grads: list[SSAValue | None] = [None, None]
        for j in range(per_rank):
            if j % 2 == 0:  # true chunk r·m/2 + j/2
                chunk = self.one(graph.AddOp, [base, self.scalar(j // 2)], self.scalar_layout)
            else:  # true chunk 2n - 1 - r·m/2 - (j-1)/2
                last = self.scalar(2 * self.ranks - 1 - (j - 1) // 2)
                chunk = self.one(graph.SubOp, [last, base], self.scalar_layout)
            start = self.one(graph.MulOp, [chunk, self.scalar(length)], self.scalar_layout)
            if user_q is not None:
                start = self.one(graph.AddOp, [start, user_q], self.scalar_layout)
            q, *rest = (self.cut(x, rows, j * length, length) for x in queries)
            chunk_ids = []
            if ids:
                q_ids, kv_ids = ids
                chunk_ids = [
                    self.cut(q_ids, aval(q_ids).rank - 1, j * length, length),
                    self.reorder(kv_ids, aval(kv_ids).rank - 1, to_true=True),
                ]
            results = self._call([q, k, v, *rest, *chunk_ids, start, user_k])
            outputs.append(list(results if not self.backward else results[:1]))
            if self.backward:
                for i, grad in enumerate(results[1:]):
                    previous = key_grads[i]
                    key_grads[i] = grad if previous is None else self.one(
                        graph.AddOp, [previous, grad], self.layout_of(grad)
                    )  # fmt: skip
        joined = [
            self.one(graph.ConcatOp, list(parts), self.layout_of(parts[0]), axis=rows)
            for parts in zip(*outputs, strict=True)
        ]
        if not self.backward:
            return joined
        dk, dv = (self.reorder(g, rows, to_true=False) for g in key_grads if g is not None)
        return [joined[0], dk, dv]


__all__ = ["UnzigzagAttentionPass"]
