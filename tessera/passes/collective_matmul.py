"""``collective-matmul``: split a matmul and its collective into chunks that pipeline.

Runs on partitioned functions (``graph.partitioned``, per-rank types; the mesh is the
module's ``graph.mesh``), before ``lower-graph-to-schedule``. A matmul that waits for a
gather, or a collective that waits for a matmul, serialises communication and compute.
Cut into ``k`` chunks, chunk ``j + 1``'s matmul runs while chunk ``j``'s collective is in
flight (once ``overlap-comm`` hoists the starts and sinks the waits). The rewrites, with
``n`` ranks per group and ``c`` rows per chunk:

1. ``g = all_gather(x, dim d)`` used only as the lhs of ``y = matmul(g, w)``, ``d`` not the
   contracting dim, ``m = x.shape[d]``, ``c = m / k``: ``x_j = x[j·c:(j+1)·c]`` on ``d``,
   ``y_j = matmul(all_gather(x_j, dim d), w)``. ``y_j``'s dim holds ``n`` blocks of ``c``
   rows, rank-major, while ``y``'s holds ``n`` blocks of ``m``: each ``y_j`` is reshaped to
   ``(n, c)`` on that dim, the pieces concatenated on the ``c`` axis and reshaped to ``n·m``.
2. ``r = reduce_scatter(y, dim d)`` of ``y = matmul(a, w)`` (its only user), ``d`` a row dim
   of ``y`` that comes from the lhs, ``M = y.shape[d]``, ``c = M / (n·k)``: ``a``'s dim is
   viewed as ``(n, M/n)``, ``a_j`` takes rows ``j·c..(j+1)·c`` of every rank's block, and
   ``r = concat_j reduce_scatter(matmul(a_j, w), dim d)`` on ``d``.
3. ``r = all_reduce(y)`` of ``y = matmul(a, w)`` (its only user): ``a`` is sliced on its first
   chunkable row dim divisible by ``k`` and ``r = concat_j all_reduce(matmul(a_j, w))``.

A row dim is chunkable when the rhs has no matching (non-1) batch dim. Chunks reduce
elementwise across ranks, so any reduction kind is kept exactly; results are the same up
to matmul rounding. New ops carry no ``graph.sharding`` (after partitioning it only
describes values); the op that yields the final result takes the replaced op's attributes.

How many chunks: ``chunks=k`` (k >= 2) forces ``k`` where the sizes divide (else the pair
is left alone). ``chunks=0`` asks the cost model of ``topology`` (a
:func:`~tessera.perf.topology.load_topology` name), for k in 1, 2, 4, 8 where legal::

    T(k) = t_c(k) + (k - 1) · max(t_c(k), t_m(k)) + t_m(k)

the first collective (gather) or the last one (matmul first) being exposed, with
``t_c(k) = collective_time(topology, kind, bytes / k, ranks of the first group)`` and
``t_m(k) = compute_time(device, flops / k, (lhs + result bytes) / k + rhs bytes, dtype)``
(every chunk reads the whole rhs). ``T(1)`` is the serial ``t_c + t_m``; the fastest ``k``
wins, and a pair for which ``k = 1`` wins is left alone, as is one whose group holds ranks
the topology does not have (it cannot be priced).

References: Wang et al., "Overlap Communication with Dependent Computation via
Decomposition in Large Deep Learning Models", ASPLOS 2023; PyTorch's async tensor
parallelism (``torch.distributed._symmetric_memory``, micro-pipelined TP).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Block, Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.rewriter import Rewriter

from tessera.dist.mesh import Mesh
from tessera.errors import TesseraError
from tessera.ir import graph
from tessera.ir.abstract import aval
from tessera.ir.graph_emitter import GraphEmitter
from tessera.ir.mesh_symbol import module_mesh
from tessera.perf.collective_cost import collective_time
from tessera.perf.compute_cost import compute_time, matmul_flops
from tessera.perf.topology import Topology, load_topology

CANDIDATE_CHUNKS = (2, 4, 8)


@dataclass(frozen=True)
class CollectiveMatmulPass(ModulePass):
    """Chunks all_gather→matmul and matmul→reduce_scatter/all_reduce pairs so they overlap."""

    name = "collective-matmul"

    chunks: int = 0  # 0: chosen by the cost model; k >= 2: k chunks where the sizes divide
    topology: str = "dgx_h100"  # the machine the cost model prices (load_topology's name)

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        if self.chunks < 0:
            raise TesseraError(f"collective-matmul: chunks must be >= 0, found {self.chunks}")
        found = module_mesh(op)
        if found is None or self.chunks == 1:
            return
        chooser = _ChunkChooser(found[1], self.chunks, self.topology)
        for function in list(op.ops):
            if (
                isinstance(function, func.FuncOp)
                and function.body.blocks
                and graph.PARTITIONED in function.attributes
            ):
                _decompose(function.body.block, chooser)


# --- matching ------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Site:
    """A collective and the matmul it feeds or is fed by, with the dims it may be cut on."""

    collective: graph.CollectiveOp
    matmul: graph.GraphOp
    group_size: int
    # (lhs dim, result dim, extent): the lhs is cut on lhs dim into chunks of extent / k
    # rows, which lie on result dim of the matmul; in order of preference
    options: tuple[tuple[int, int, int], ...]

    @property
    def gathers_first(self) -> bool:
        return isinstance(self.collective, graph.AllGatherOp)

    def split(self, chunks: int) -> tuple[int, int, int] | None:
        """(lhs dim, result dim, rows per chunk) for ``chunks`` chunks, or None if illegal."""
        for lhs_dim, result_dim, extent in self.options:
            if extent % chunks == 0:
                return lhs_dim, result_dim, extent // chunks
        return None


def _result_dim(matmul: graph.GraphOp, lhs_dim: int) -> int | None:
    """The matmul result dim that lhs dim ``lhs_dim`` becomes, if cutting the lhs alone on it
    cuts the result (a row dim, or a batch dim the rhs broadcasts over); else None."""
    lhs, rhs, result = (aval(v) for v in (*matmul.operands, matmul.results[0]))
    if not 0 <= lhs_dim < lhs.rank - 1:
        return None
    result_dim = lhs_dim + result.rank - lhs.rank
    if lhs_dim < lhs.rank - 2:  # a batch dim: the rhs must not have its own
        rhs_dim = result_dim - (result.rank - rhs.rank)
        if rhs_dim >= 0 and rhs.shape[rhs_dim] != 1:
            return None
    return result_dim


def _only_use(value: SSAValue) -> tuple[Operation, int] | None:
    uses = list(value.uses)
    return (uses[0].operation, uses[0].index) if len(uses) == 1 else None


def _match(op: Operation, mesh: Mesh) -> _Site | None:
    """The site ``op`` (a collective) starts or ends, if it is one."""
    if not isinstance(op, (graph.AllGatherOp, graph.ReduceScatterOp, graph.AllReduceOp)):
        return None
    group_size = len(mesh.groups(op.attrs()["axes"])[0])
    if group_size < 2:
        return None
    if isinstance(op, graph.AllGatherOp):
        use = _only_use(op.results[0])
        if use is None or not isinstance(use[0], graph.MatmulOp) or use[1] != 0:
            return None
        dim = op.attrs()["dim"]
        result_dim = _result_dim(use[0], dim)
        if result_dim is None:
            return None
        return _Site(op, use[0], group_size, ((dim, result_dim, aval(op.operands[0]).shape[dim]),))
    matmul = op.operands[0].owner
    if not isinstance(matmul, graph.MatmulOp) or _only_use(matmul.results[0]) != (op, 0):
        return None
    lhs, result = aval(matmul.operands[0]), aval(matmul.results[0])
    options = [
        (lhs_dim, result_dim, lhs.shape[lhs_dim])
        for lhs_dim in range(lhs.rank - 1)
        if (result_dim := _result_dim(matmul, lhs_dim)) is not None
    ]
    if isinstance(op, graph.ReduceScatterOp):
        dim = op.attrs()["dim"]
        options = [
            (lhs_dim, result_dim, extent // group_size)
            for lhs_dim, result_dim, extent in options
            if result_dim == dim and extent == result.shape[dim]
        ]
    return _Site(op, matmul, group_size, tuple(options)) if options else None


# --- choosing the number of chunks ---------------------------------------------------------


def pipelined_time(comm_s: float, compute_s: float, chunks: int) -> float:
    """Time of ``chunks`` collective/matmul pairs that overlap one stage apart."""
    return comm_s + (chunks - 1) * max(comm_s, compute_s) + compute_s


class _ChunkChooser:
    """How many chunks a site is cut into: forced, or the cost model's fastest."""

    def __init__(self, mesh: Mesh, chunks: int, topology: str):
        self.mesh = mesh
        self.chunks = chunks
        self.topology_name = topology

    @cached_property
    def topology(self) -> Topology:
        return load_topology(self.topology_name)

    def choose(self, site: _Site) -> int:
        """The number of chunks for ``site`` (1: leave it alone)."""
        if self.chunks:
            return self.chunks if site.split(self.chunks) is not None else 1
        ranks = self.mesh.groups(site.collective.attrs()["axes"])[0]
        if max(ranks) >= self.topology.num_devices:  # the machine is too small to price it
            return 1
        legal = [1, *(k for k in CANDIDATE_CHUNKS if site.split(k) is not None)]
        times = {k: self.time(site, k) for k in legal}
        return min(legal, key=lambda k: (times[k], k))

    def time(self, site: _Site, chunks: int) -> float:
        """Modelled time of ``site`` cut into ``chunks`` chunks."""
        matmul, collective = site.matmul, site.collective
        lhs, rhs, result = (aval(v) for v in (*matmul.operands, matmul.results[0]))
        payload = aval(collective.results[0] if site.gathers_first else collective.operands[0])
        ranks = self.mesh.groups(collective.attrs()["axes"])[0]
        kind = collective.name.removeprefix("graph.")
        comm_s = collective_time(self.topology, kind, payload.nbytes // chunks, ranks).time_s
        compute_s = compute_time(
            self.topology.device,
            matmul_flops(matmul) / chunks,
            (lhs.nbytes + result.nbytes) / chunks + rhs.nbytes,
            str(lhs.dtype),
        )
        return pipelined_time(comm_s, compute_s, chunks)


# --- rewriting -----------------------------------------------------------------------------


def _decompose(block: Block, chooser: _ChunkChooser) -> None:
    for op in list(block.ops):
        if op.parent is None:  # erased by an earlier rewrite
            continue
        site = _match(op, chooser.mesh)
        if site is not None and (chunks := chooser.choose(site)) > 1:
            _rewrite(site, chunks)


class _Emitter(GraphEmitter):
    """A GraphEmitter with the slicing and reshaping helpers the chunks need."""

    def slice(self, value: SSAValue, dim: int, start: int, stop: int) -> SSAValue:
        shape = aval(value).shape
        starts = [start if d == dim else 0 for d in range(len(shape))]
        limits = [stop if d == dim else size for d, size in enumerate(shape)]
        return self(graph.SliceOp, [value], starts=starts, limits=limits, strides=[1] * len(shape))

    def reshape_dim(self, value: SSAValue, dim: int, sizes: Sequence[int]) -> SSAValue:
        """``value`` with dim ``dim`` replaced by dims of ``sizes`` (their product)."""
        shape = aval(value).shape
        return self(graph.ReshapeOp, [value], shape=(*shape[:dim], *sizes, *shape[dim + 1 :]))


def _rewrite(site: _Site, chunks: int) -> None:
    split = site.split(chunks)
    assert split is not None
    lhs_dim, result_dim, rows = split
    collective, matmul, n = site.collective, site.matmul, site.group_size
    attrs = collective.attrs()
    lhs, rhs = matmul.operands
    if site.gathers_first:
        first, last = collective, matmul
        emit = _Emitter(matmul)
        source = collective.operands[0]
        parts = [emit.slice(source, lhs_dim, j * rows, (j + 1) * rows) for j in range(chunks)]
        pieces = []
        for part in parts:
            gathered = emit(graph.AllGatherOp, [part], **attrs, group_size=n)
            product = emit(graph.MatmulOp, [gathered, rhs])
            pieces.append(emit.reshape_dim(product, result_dim, (n, rows)))
        joined = emit(graph.ConcatOp, pieces, axis=result_dim + 1)
        result = emit(graph.ReshapeOp, [joined], shape=aval(matmul.results[0]).shape)
    else:
        first, last = matmul, collective
        emit = _Emitter(collective)
        op_type = type(collective)
        blocked = None
        if isinstance(collective, graph.ReduceScatterOp):  # every rank's block, cut alike
            blocked = emit.reshape_dim(lhs, lhs_dim, (n, chunks * rows))
        parts = []
        for j in range(chunks):
            if blocked is None:
                parts.append(emit.slice(lhs, lhs_dim, j * rows, (j + 1) * rows))
            else:
                part = emit.slice(blocked, lhs_dim + 1, j * rows, (j + 1) * rows)
                parts.append(emit(graph.ReshapeOp, [part], shape=_resized(lhs, lhs_dim, n * rows)))
        pieces = []
        for part in parts:
            product = emit(graph.MatmulOp, [part, rhs])
            pieces.append(emit(op_type, [product], **attrs, group_size=n))
        result = emit(graph.ConcatOp, pieces, axis=result_dim)
    result.owner.attributes.update(last.attributes)
    last.results[0].replace_all_uses_with(result)
    Rewriter.erase_op(last)
    Rewriter.erase_op(first)


def _resized(value: SSAValue, dim: int, size: int) -> tuple[int, ...]:
    shape = aval(value).shape
    return (*shape[:dim], size, *shape[dim + 1 :])
