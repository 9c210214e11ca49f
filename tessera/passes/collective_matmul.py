"""``collective-matmul``: cut collectives and the work around them into row chunks that pipeline.

Runs on partitioned functions (``graph.partitioned``, per-rank types; the mesh is the
module's ``graph.mesh``), before ``lower-graph-to-schedule``. A matmul that waits for a
gather, or a collective that waits for a matmul, serialises communication and compute.
Cut into ``k`` chunks of rows, chunk ``j + 1``'s work runs while chunk ``j``'s collective
is in flight (once ``overlap-comm`` hoists the starts and sinks the waits).

*Seeds* start the chunking (``n`` ranks per group):

1. ``all_gather(x, dim d)`` used only as the lhs of a matmul, ``d`` not the contracting
   dim: ``x`` is cut on ``d``.
2. ``reduce_scatter(matmul(a, w), dim d)``, the matmul's only user, ``d`` a row dim from the
   lhs: ``a``'s dim is viewed as ``n`` rank blocks and every block is cut alike.
3. ``all_reduce(matmul(a, w))``, the matmul's only user: ``a`` is cut on its first row dim
   (or rhs-broadcast batch dim) that ``k`` divides.

*Propagation*: a chunked value flows, one op per chunk, through every consumer that acts
on each row of the cut dim on its own: elementwise ops, reductions, softmaxes and norms
not over that dim, a matmul with the value as lhs and the dim a row (or rhs-broadcast
batch) dim, and all_reduce, broadcast, all_gather and reduce_scatter (whose chunks reduce
or gather elementwise across ranks). A consumer's other operands are used whole where
they broadcast over the dim, cut alike where they have it whole, and their chunks where
they are chunked alike; otherwise (and at a non-row-wise op, the return, ...) the chunks
are concatenated, just before the first op that needs the whole value, which gets the
replaced op's attributes. So after the attention's output all-reduce of a Megatron layer
the residual add, layer norm, MLP and its all-reduce run per chunk (token-wise
pipelining), and the MLP hides the first all-reduce.

Chunk ``j`` of a value whose dim has ``blocks · k · c`` rows holds rows ``[:, j, :]`` of
that dim viewed as ``(blocks, k, c)``: a gather on the cut dim multiplies ``blocks`` by
``n`` (each chunk gathers ``c`` rows of every rank), a reduce-scatter divides it by ``n``.
A concatenation with ``blocks > 1`` reshapes each chunk to ``(blocks, c)`` and concatenates
on the ``c`` axis.

Order: replaced ops form runs (ops adjacent in program order); a run's chunk ops go
where the run starts, so the program order of other ops (a backward's weight-gradient
matmuls) is kept. Inside a run the chunks are software-pipelined: chunk ``j`` of an op
``s`` collectives downstream of the run's start is issued at step ``j + s`` (program
order within a step), so while chunk ``j`` crosses a collective, chunk ``j + 1``
computes; a collective is issued right after its operand's chunk. Chunks reduce
elementwise across ranks and rows are independent, so results equal the unchunked
program's up to matmul rounding. New ops carry no ``graph.sharding`` (after
partitioning it only describes values).

How many chunks: ``chunks=k`` (k >= 2) uses ``k`` where the sizes divide (a seed that
does not divide is left alone). ``chunks=0`` chooses, per function, by simulation on
``topology`` (a :func:`~tessera.topology.load_topology` name; by default the mesh's,
:meth:`~tessera.ir.mesh.Mesh.machine`) with ``numerics``'
collectives: each k in 1, 2, 4, 8 that some seed allows is applied to a copy, which the
compile driver schedules and simulates (:func:`tessera.driver.schedule_trial`, handed to
the pass by the driver and ``tessera-opt``: :meth:`CollectiveMatmulPass.using`); the
shortest step wins, ties to the smaller k (k = 1 leaves the function alone). A mesh
larger than the topology cannot be simulated and is left alone.

References: Wang et al., "Overlap Communication with Dependent Computation via
Decomposition in Large Deep Learning Models", ASPLOS 2023; PyTorch's async tensor
parallelism (micro-pipelined TP); token-wise pipelining of TP layers (e.g. Jangda et
al., CoCoNet, ASPLOS 2022).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Block, Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.rewriter import Rewriter

from tessera.codegen.kernels import reduced_axes
from tessera.errors import TesseraError
from tessera.ir import graph
from tessera.ir.abstract import aval
from tessera.ir.mesh import Mesh
from tessera.ir.mesh_symbol import module_mesh
from tessera.numerics import check as check_numerics
from tessera.opdefs import Fusion, fusion_of
from tessera.topology import Topology

CANDIDATE_CHUNKS = (2, 4, 8)

ScheduleTrial = Callable[[ModuleOp, str, Mesh, Topology, str], float]
"""``trial(module, function, mesh, topology, numerics)``: the step time of ``@function``
of a partitioned ``module`` (changed in place) once scheduled, simulated on ``topology``
with ``numerics``' collectives (the compile driver's ``schedule_trial``)."""


@dataclass(frozen=True)
class CollectiveMatmulPass(ModulePass):
    """Chunks collectives next to matmuls, and the row-wise work after them, so they overlap."""

    name = "collective-matmul"

    chunks: int = 0  # 0: chosen by simulation; k >= 2: k chunks where the sizes divide
    topology: str = ""  # the machine the simulation prices ("": the mesh's, Mesh.machine)
    numerics: str = "fast"  # the numerics mode the simulation prices reductions in

    # how a candidate chunking is timed (chunks=0): see `using`
    trial: ClassVar[ScheduleTrial | None] = None

    @classmethod
    def using(cls, trial: ScheduleTrial) -> type[CollectiveMatmulPass]:
        """This pass, timing its candidates with ``trial``: the compile driver hands in
        its ``schedule_trial`` (a pass does not build the passes that schedule it)."""
        return type(cls.__name__, (cls,), {"trial": staticmethod(trial)})

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        if self.chunks < 0:
            raise TesseraError(f"collective-matmul: chunks must be >= 0, found {self.chunks}")
        check_numerics(self.numerics, "collective-matmul: numerics")
        found = module_mesh(op)
        if found is None or self.chunks == 1:
            return
        mesh = found[1]
        for function in list(op.ops):
            if (
                isinstance(function, func.FuncOp)
                and function.body.blocks
                and graph.PARTITIONED in function.attributes
            ):
                chunks = self.chunks or choose_chunks(
                    op, function, mesh, self.topology, self._trial(), self.numerics
                )
                if chunks > 1:
                    decompose(function.body.block, mesh, chunks)

    def _trial(self) -> ScheduleTrial:
        if self.trial is None:
            raise TesseraError(
                "collective-matmul: chunks=0 chooses the chunks by simulating the scheduled "
                "program, which the compile driver does: run the pass from "
                "tessera.driver.available_passes() (as tessera-opt does) or give chunks=k"
            )
        return self.trial


# --- seeds -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Site:
    """A collective and the matmul it feeds or is fed by, with the dims it may be cut on."""

    collective: graph.CollectiveOp
    matmul: graph.GraphOp
    group_size: int
    # (lhs dim, result dim, extent): the lhs (or the gathered operand) is cut on lhs dim
    # into chunks of extent / k rows (per rank block for a reduce_scatter); in order of
    # preference
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

    def entry(self, chunks: int) -> tuple[Operation, int, _Layout] | None:
        """(op, operand index, layout): where ``chunks`` chunks of this site start."""
        split = self.split(chunks)
        if split is None:
            return None
        lhs_dim, _, rows = split
        if self.gathers_first:
            return self.collective, 0, _Layout(lhs_dim, 1, rows)
        blocks = self.group_size if isinstance(self.collective, graph.ReduceScatterOp) else 1
        return self.matmul, 0, _Layout(lhs_dim, blocks, rows)


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


def _sites(block: Block, mesh: Mesh) -> list[_Site]:
    return [site for op in block.ops if (site := _match(op, mesh)) is not None]


# --- choosing the number of chunks ---------------------------------------------------------


def choose_chunks(
    module: ModuleOp,
    function: func.FuncOp,
    mesh: Mesh,
    topology: str,
    trial: ScheduleTrial,
    numerics: str = "fast",
) -> int:
    """The k in 1, 2, 4, 8 whose chunked ``function`` simulates fastest on ``topology``
    (each candidate timed by ``trial``)."""
    sites = _sites(function.body.block, mesh)
    legal = [k for k in CANDIDATE_CHUNKS if any(s.split(k) is not None for s in sites)]
    machine = mesh.machine(topology)
    if not legal or mesh.size > machine.num_devices:  # nothing to cut, or cannot price it
        return 1
    index = list(module.ops).index(function)
    times = {
        k: simulated_time(module, index, mesh, machine, k, trial, numerics) for k in (1, *legal)
    }
    return min(times, key=lambda k: (times[k], k))


def simulated_time(
    module: ModuleOp,
    index: int,
    mesh: Mesh,
    topology: Topology,
    chunks: int,
    trial: ScheduleTrial,
    numerics: str = "fast",
) -> float:
    """Step time of function ``index`` of ``module`` cut into ``chunks`` chunks, as
    ``trial`` schedules and simulates it on ``topology`` (the module is not changed)."""
    copy = module.clone()
    function = list(copy.ops)[index]
    assert isinstance(function, func.FuncOp)
    if chunks > 1:
        decompose(function.body.block, mesh, chunks)
    return trial(copy, function.sym_name.data, mesh, topology, numerics)


# --- chunked values ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Layout:
    """How a value is cut: dim ``dim`` viewed as ``(blocks, k, rows)``; chunk j is ``[:, j, :]``."""

    dim: int
    blocks: int
    rows: int


@dataclass
class _Member:
    """A replaced op: its chunks, and where they are issued in their run."""

    op: Operation
    run: _Run
    stage: int  # collectives between the run's start and this op
    order: tuple[int, int]  # (position, tie break) within a pipeline step
    chunks: list[Operation] = field(default_factory=list)


@dataclass
class _Chunked:
    layout: _Layout
    pieces: list[SSAValue]
    member: _Member


@dataclass
class _Run:
    """Replaced ops adjacent in program order: their chunks go before ``anchor``."""

    anchor: Operation
    prologue: list[Operation] = field(default_factory=list)  # cuts of whole operands
    members: list[_Member] = field(default_factory=list)
    cuts: dict[tuple[SSAValue, _Layout], list[SSAValue]] = field(default_factory=dict)


class _Ops(list[Operation]):
    """Builds graph ops (types from their shape rules) into a list, not yet in a block."""

    def __call__(
        self, op_type: type[graph.GraphOp], operands: Sequence[SSAValue], **attrs: Any
    ) -> SSAValue:
        op = graph.build(op_type, operands, **attrs)
        self.append(op)
        return op.results[0]

    def slice(self, value: SSAValue, dim: int, start: int, stop: int) -> SSAValue:
        shape = aval(value).shape
        starts = [start if d == dim else 0 for d in range(len(shape))]
        limits = [stop if d == dim else size for d, size in enumerate(shape)]
        return self(graph.SliceOp, [value], starts=starts, limits=limits, strides=[1] * len(shape))

    def reshape_dim(self, value: SSAValue, dim: int, sizes: Sequence[int]) -> SSAValue:
        """``value`` with dim ``dim`` replaced by dims of ``sizes`` (their product)."""
        shape = aval(value).shape
        return self(graph.ReshapeOp, [value], shape=(*shape[:dim], *sizes, *shape[dim + 1 :]))

    def cut(self, value: SSAValue, layout: _Layout, chunks: int) -> list[SSAValue]:
        """The ``chunks`` chunks of ``value`` under ``layout``."""
        dim, blocks, rows = layout.dim, layout.blocks, layout.rows
        if blocks == 1:
            return [self.slice(value, dim, j * rows, (j + 1) * rows) for j in range(chunks)]
        blocked = self.reshape_dim(value, dim, (blocks, chunks * rows))
        shape = list(aval(value).shape)
        shape[dim] = blocks * rows
        return [
            self(graph.ReshapeOp, [self.slice(blocked, dim + 1, j * rows, (j + 1) * rows)], shape=shape)
            for j in range(chunks)
        ]

    def join(self, pieces: Sequence[SSAValue], layout: _Layout, shape: Sequence[int]) -> SSAValue:
        """The whole value (of ``shape``) of its chunks ``pieces`` under ``layout``."""
        dim, blocks = layout.dim, layout.blocks
        if blocks == 1:
            return self(graph.ConcatOp, pieces, axis=dim)
        parts = [self.reshape_dim(p, dim, (blocks, layout.rows)) for p in pieces]
        return self(graph.ReshapeOp, [self(graph.ConcatOp, parts, axis=dim + 1)], shape=shape)


def _communicates(op: Operation) -> bool:
    """A collective that communicates: a chunk's consumers come one pipeline step later."""
    return fusion_of(op) is Fusion.COLLECTIVE


# --- propagation -----------------------------------------------------------------------------

_Plan = tuple[_Layout, dict[int, "_Layout | None"]]


def _plan(op: Operation, layouts: dict[int, _Layout]) -> _Plan | None:
    """The result layout of ``op`` whose operands ``layouts`` are chunked (the others: a
    layout to cut them to, or None to use them whole), if ``op`` is row-wise on them."""
    result = aval(op.results[0]) if len(op.results) == 1 else None
    if result is None or not isinstance(op, graph.GraphOp):
        return None
    fusion = fusion_of(op)
    if fusion is Fusion.ELEMENTWISE:
        rank = result.rank
        found = {replace(lay, dim=lay.dim + rank - aval(op.operands[i]).rank) for i, lay in layouts.items()}
        if len(found) != 1:
            return None
        out = found.pop()
        others: dict[int, _Layout | None] = {}
        for i, operand in enumerate(op.operands):
            if i in layouts:
                continue
            shape = aval(operand).shape
            dim = out.dim - (rank - len(shape))
            if dim < 0 or shape[dim] == 1:
                others[i] = None
            elif shape[dim] == result.shape[out.dim]:
                others[i] = replace(out, dim=dim)
            else:
                return None
        return out, others
    if set(layouts) != {0}:  # one chunked operand, the first
        return None
    lay = layouts[0]
    dim = lay.dim
    attrs = op.attrs()
    if isinstance(op, graph.ReductionOp):
        axes = attrs["axes"]
        if dim in axes:
            return None
        kept = dim if attrs["keepdims"] else dim - sum(a < dim for a in axes)
        return replace(lay, dim=kept), {}
    if fusion is Fusion.NORMALIZATION:  # row-wise along the other dims
        return (lay, {}) if dim not in reduced_axes(op) else None
    if isinstance(op, graph.MatmulOp):
        result_dim = _result_dim(op, dim)
        return (replace(lay, dim=result_dim), {1: None}) if result_dim is not None else None
    if isinstance(op, (graph.AllReduceOp, graph.BroadcastOp)):
        return lay, {}
    if isinstance(op, (graph.AllGatherOp, graph.ReduceScatterOp)):
        if attrs["dim"] != dim:
            return lay, {}
        n = op.group_size()
        assert n is not None
        if isinstance(op, graph.AllGatherOp):
            return replace(lay, blocks=lay.blocks * n), {}
        return (replace(lay, blocks=lay.blocks // n), {}) if lay.blocks % n == 0 else None
    return None


def decompose(block: Block, mesh: Mesh, chunks: int) -> None:
    """Cuts ``block``'s seeds into ``chunks`` chunks and propagates them (see the module)."""
    entries: dict[Operation, tuple[int, _Layout]] = {}
    for site in _sites(block, mesh):
        if (entry := site.entry(chunks)) is not None:
            entries[entry[0]] = entry[1:]
    if not entries:
        return
    ops = list(block.ops)
    position = {op: i for i, op in enumerate(ops)}
    chunked: dict[SSAValue, _Chunked] = {}
    members: dict[Operation, _Member] = {}
    runs: list[_Run] = []
    open_run: _Run | None = None  # the run the next op may join (none after another op)
    for i, op in enumerate(ops):
        layouts = {k: chunked[v].layout for k, v in enumerate(op.operands) if v in chunked}
        if not layouts and op in entries:
            index, lay = entries[op]
            planned = _plan(op, {index: lay})
            if planned is not None:
                planned[1][index] = lay  # the entry operand is cut too
        else:
            planned = _plan(op, layouts) if layouts else None
        if planned is None:
            open_run = None
            continue
        out, others = planned
        sources = [chunked[v].member for v in op.operands if v in chunked]
        if _communicates(op) and sources:  # right after its operand's chunks
            run, order = sources[0].run, (position[sources[0].op], i + 1)
        else:
            if open_run is None:
                open_run = _Run(anchor=op)
                runs.append(open_run)
            run, order = open_run, (i, 0)
        stage = max(
            (s.stage + _communicates(s.op) for s in sources if s.run is run), default=0
        )
        member = _Member(op, run, stage, order)
        operands: list[list[SSAValue]] = []
        for k, value in enumerate(op.operands):
            if k in layouts:
                operands.append(chunked[value].pieces)
            elif others.get(k) is not None:
                key = (value, others[k])
                if key not in run.cuts:
                    built = _Ops()
                    run.cuts[key] = built.cut(value, others[k], chunks)
                    run.prologue.extend(built)
                operands.append(run.cuts[key])
            else:
                operands.append([value] * chunks)
        attrs = op.rule_attrs()  # type: ignore[attr-defined]
        for j in range(chunks):
            member.chunks.append(graph.build(type(op), [o[j] for o in operands], **attrs))
        run.members.append(member)
        members[op] = member
        chunked[op.results[0]] = _Chunked(out, [c.results[0] for c in member.chunks], member)
    _emit(block, runs, chunks)
    _join_and_erase(members, chunked, position)


def _emit(block: Block, runs: list[_Run], chunks: int) -> None:
    """Inserts each run's chunks before its anchor, software-pipelined (see the module)."""
    for run in runs:
        steps = sorted(
            ((j + m.stage, m.order, j), m.chunks[j]) for m in run.members for j in range(chunks)
        )
        block.insert_ops_before([*run.prologue, *(op for _, op in steps)], run.anchor)


def _join_and_erase(
    members: dict[Operation, _Member],
    chunked: dict[SSAValue, _Chunked],
    position: dict[Operation, int],
) -> None:
    """Concatenates chunks where an op needs the whole value; erases the replaced ops."""
    for op in members:
        value = op.results[0]
        uses = [u for u in value.uses if u.operation not in members]
        if not uses:
            continue
        first = min((u.operation for u in uses), key=lambda o: position[o])
        built = _Ops()
        found = chunked[value]
        whole = built.join(found.pieces, found.layout, aval(value).shape)
        whole.owner.attributes.update(op.attributes)  # type: ignore[union-attr]
        assert first.parent is not None
        first.parent.insert_ops_before(built, first)
        for use in uses:
            use.operation.operands[use.index] = whole
    for op in sorted(members, key=lambda o: position[o], reverse=True):
        Rewriter.erase_op(op)
