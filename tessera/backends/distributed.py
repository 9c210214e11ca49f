"""The ``torch.distributed`` backend: this process runs one rank of a partitioned program.

:func:`run_rank` executes a scheduled ``func.func`` carrying ``graph.partitioned`` for the
calling rank only, through a launch plan (:class:`RankPlan`, which compiled programs keep
between calls). Kernels run bound by a kernel binder (by default the reference
semantics, each op's ``tessera.opdefs.op_def(op).reference``); collectives go through ``torch.distributed``
over one process group per mesh-axis subgroup (``mesh.groups(axes)``), created once, in
the same order on every rank, and cached (:class:`Runtime`). Collectives are issued with
``async_op=True``; their work handles are joined right before the result's first use.
Their local semantics are the virtual mesh's (:mod:`tessera.backends.virtual`), which is
the oracle this backend is tested against.

A ``schedule.start`` marked ``algorithm = hierarchical`` (``choose-collective-algorithms``)
runs in phases over subgroups of its group (:mod:`tessera.backends.hierarchical`):
within domains of ``domain`` consecutive members, across domains, within domains again
(an all_to_all: within domains, then across).
Every rank creates all of these subgroups in :meth:`Runtime.prepare`, in the same order.
The first phase is issued asynchronously at the start; the other phases depend on it and
run (synchronously) at the wait, so only the first phase overlaps the kernels in between.
Other algorithm names (ring, tree, nvls) need nothing here: NCCL picks its algorithm
itself (``NCCL_ALGO`` forces one), and gloo has one per collective.

Before a program runs, the ranks compare a digest of the whole program (computed once
per compiled program); programs that differ are rejected with an error naming the first
difference (the first differing collective, else the first differing line of the
program) instead of deadlocking or computing garbage. A rank that fails, dies, exits or
hangs makes the others raise :class:`~tessera.errors.DistributedError` naming it
(:mod:`tessera.backends.liveness`): at once, or for a hang after ``TESSERA_TIMEOUT``
seconds (60 by default).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as tdist
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Attribute

from tessera import environment, numerics
from tessera.backends import hierarchical, liveness
from tessera.backends.collective_info import CollectiveInfo, collectives, describe
from tessera.backends.launch_plan import LaunchPlan, build_plan
from tessera.backends.layout import assemble
from tessera.backends.schedule_runner import (
    BoundKernel,
    Buffers,
    KernelBinder,
    KernelContext,
    KernelRunner,
    binder,
    reference_kernel,
)
from tessera.backends.virtual import _check_mesh, _check_value, _function
from tessera.errors import DistributedError, ExecutionError, TesseraError
from tessera.ir import graph, schedule
from tessera.ir.abstract import AbstractTensor
from tessera.ir.mesh import Mesh
from tessera.ir.reduction_kinds import KINDS, NAMES, rounds
from tessera.ir.sharding import Sharding
from tessera.opdefs.collective import accumulation_dtype, finish_reduce, ordered_reduce
from tessera.perf.timeline import Mark

DEFAULT_TIMEOUT_S = environment.DEFAULT_TIMEOUT_S


def timeout_seconds() -> float:
    """The collective timeout: ``TESSERA_TIMEOUT`` seconds (default 60)."""
    return environment.timeout()


def launched() -> bool:
    """Whether this process is one rank of a multi-process run: ``torch.distributed`` is
    initialised, or a launcher (``tessera run``, ``torchrun``) set ``RANK`` and a
    ``WORLD_SIZE`` above 1. ``TESSERA_BACKEND=virtual`` forces the virtual mesh."""
    if environment.backend() == "virtual":
        return False
    if tdist.is_available() and tdist.is_initialized():
        return True
    return environment.world_size() > 1 and environment.rank() is not None


@dataclass
class _Group:
    """One mesh-axis subgroup as seen from a member: its members in mesh order."""

    members: list[int]  # global ranks, ordered as mesh.groups(axes) orders them
    handle: object | None  # the torch ProcessGroup (None for a one-rank group)

    @property
    def by_group_rank(self) -> list[int]:
        """Members in torch's group-rank order (``new_group`` sorts the ranks)."""
        return sorted(self.members)

    def position(self, rank: int) -> int:
        return self.members.index(rank)


@dataclass
class RunRecord:
    """What one rank did in one call: its wall time and the collectives it executed."""

    rank: int
    coords: dict[str, int]
    seconds: float = 0.0
    collectives: list[CollectiveInfo] = field(default_factory=list)


def _attempt_store(timeout: float) -> dict[str, Any]:
    """``init_process_group``'s store under a restarting launcher: torchrun's agent hosts
    one TCPStore for the whole job, and the keys a process group writes there (each rank's
    gloo address) would still hold the previous attempt's after ``--max-restarts``
    restarts every rank; a prefix per attempt (``TORCHELASTIC_RESTART_COUNT``) keeps each
    attempt's keys apart. Empty (env:// as usual) outside torch elastic's agent store."""
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    if attempt is None or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return {}
    store = tdist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        int(os.environ["WORLD_SIZE"]),
        is_master=False,
        timeout=timedelta(seconds=timeout),
    )
    return {
        "store": tdist.PrefixStore(f"/tessera/attempt_{attempt}/", store),
        "rank": int(os.environ["RANK"]),
        "world_size": int(os.environ["WORLD_SIZE"]),
    }


class Runtime:
    """The process's ``torch.distributed`` state: the world, its device, and the cached
    process groups of every (mesh, axes) a program used."""

    def __init__(self) -> None:
        if not tdist.is_available():
            raise DistributedError("torch.distributed is not available in this build of torch")
        self.timeout = timeout_seconds()
        if not tdist.is_initialized():
            for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
                if name not in os.environ:
                    raise DistributedError(
                        f"cannot join the process group: {name} is not set; start the script "
                        f"with `tessera run -n N script.py` or torchrun"
                    )
            use_cuda = environment.device() == "cuda"
            if use_cuda:
                if not torch.cuda.is_available():
                    raise DistributedError(
                        "TESSERA_DEVICE=cuda but torch sees no CUDA device on this machine"
                    )
                torch.cuda.set_device(environment.integer("LOCAL_RANK", 0) or 0)
            try:
                tdist.init_process_group(
                    "nccl" if use_cuda else "gloo",
                    timeout=timedelta(seconds=self.timeout),
                    **_attempt_store(self.timeout),
                )
            except Exception as error:
                raise DistributedError(
                    f"rank {os.environ['RANK']}: joining the process group of "
                    f"{os.environ['WORLD_SIZE']} ranks failed: another rank failed, exited or did "
                    f"not join within the timeout of {self.timeout:g} s (TESSERA_TIMEOUT) "
                    f"[{type(error).__name__}: {_first_line(error)}]"
                ) from None
            channel = liveness.Liveness.of_process_group(tdist.get_rank(), tdist.get_world_size())
            liveness.install(channel, self.timeout)
        self.liveness = liveness.channel()
        self.backend = str(tdist.get_backend())
        self.rank = tdist.get_rank()
        self.world_size = tdist.get_world_size()
        self.device = (
            torch.device("cuda", torch.cuda.current_device())
            if self.backend == "nccl"
            else torch.device("cpu")
        )
        self._groups: dict[tuple[Mesh, tuple[str, ...]], _Group] = {}
        self._domains: dict[tuple[Mesh, tuple[str, ...], int], tuple[_Group, _Group]] = {}

    def waiting(self, what: str, members: Sequence[int] | None = None) -> Any:
        """A context in which this rank waits in ``what`` for ``members`` (by default every
        rank): published on the liveness channel, so that a failure names the cause."""
        if self.liveness is None:
            return contextlib.nullcontext()
        members = range(self.world_size) if members is None else members
        return self.liveness.waiting(what, members)

    def check_mesh(self, mesh: Mesh) -> None:
        if mesh.size != self.world_size:
            raise DistributedError(
                f"the program runs on {mesh} ({mesh.size} ranks) but {self.world_size} "
                f"processes were launched; start it with `tessera run -n {mesh.size}`"
            )

    def group(self, mesh: Mesh, axes: Sequence[str]) -> _Group:
        """This rank's group over ``axes``, creating every group over ``axes`` (all ranks
        call ``new_group`` for each, in ``mesh.groups`` order) on first use."""
        key = (mesh, tuple(axes))
        if key not in self._groups:
            mine: _Group | None = None
            for members in mesh.groups(axes):
                handle = tdist.new_group(members) if len(members) > 1 else None
                if self.rank in members:
                    mine = _Group(list(members), handle)
            assert mine is not None
            self._groups[key] = mine
        return self._groups[key]

    def domains(self, mesh: Mesh, axes: Sequence[str], domain: int) -> tuple[_Group, _Group]:
        """This rank's intra-domain and inter-domain subgroups of its group over ``axes``
        (``hierarchical.domains``), creating those of every group over ``axes`` (all ranks
        call ``new_group`` for each, in the same order) on first use."""
        key = (mesh, tuple(axes), domain)
        if key not in self._domains:
            mine: list[_Group | None] = [None, None]
            for members in mesh.groups(axes):
                for which, subgroups in enumerate(hierarchical.domains(members, domain)):
                    for sub in subgroups:
                        handle = tdist.new_group(sub) if len(sub) > 1 else None
                        if self.rank in sub:
                            mine[which] = _Group(list(sub), handle)
            intra, inter = mine
            assert intra is not None and inter is not None
            self._domains[key] = (intra, inter)
        return self._domains[key]

    def prepare(self, module: ModuleOp, mesh: Mesh) -> None:
        """Creates the groups ``module`` needs (every rank runs ``module``)."""
        self.create_groups(mesh, needed_groups(module))

    def prepare_shared(self, modules: Sequence[ModuleOp], mesh: Mesh) -> None:
        """Creates the groups that ``modules`` (this rank's programs) or any other rank's
        programs need: each rank says what it needs (one small all-gather over the
        world), so no rank has to compile the programs it does not run."""
        mine = set().union(*(needed_groups(m) for m in modules))
        everyone: list[Any] = [None] * self.world_size
        what = "agreeing on the process groups"
        try:
            with self.waiting(what):
                tdist.all_gather_object(everyone, sorted(mine, key=lambda n: (n[0], n[1] or 0)))
        except Exception as error:
            raise failure(self, what, error) from None
        self.create_groups(mesh, {tuple(need) for needs in everyone for need in needs})

    def create_groups(self, mesh: Mesh, needed: set[tuple[Any, ...]]) -> None:
        """Creates ``needed`` groups (``(axes, None)``: a group over axes; ``(axes,
        domain)``: its domain subgroups) in a deterministic order: every group over axes,
        then the domain subgroups (``new_group`` is collective over the whole world)."""
        with self.waiting("creating process groups"):
            for axes, _ in sorted(n for n in needed if n[1] is None):
                self.group(mesh, axes)
            for axes, domain in sorted(n for n in needed if n[1] is not None):
                self.domains(mesh, axes, domain)

    def all_gather_world(
        self, tensor: torch.Tensor, what: str = "all_gather over all ranks"
    ) -> list[torch.Tensor]:
        """Every rank's ``tensor`` (same shape and dtype everywhere), indexed by rank."""
        local = tensor.to(self.device).contiguous()
        pieces = [torch.empty_like(local) for _ in range(self.world_size)]
        try:
            with self.waiting(what):
                tdist.all_gather(pieces, local)
        except Exception as error:
            raise failure(self, what, error) from None
        return [p.cpu() for p in pieces]

    def check_same_program(
        self, name: str, digest: bytes, explain: Callable[[], tuple[list[str], list[str]]]
    ) -> None:
        """Raises on every rank if the ranks' program digests differ, naming the
        first difference of what ``explain`` returns on each rank (its collective
        sequence, :func:`describe_collectives`, and its program's lines)."""
        mine = torch.frombuffer(bytearray(digest[:16]), dtype=torch.int64).clone()
        digests = self.all_gather_world(mine, f"comparing the ranks' programs before @{name}")
        if all(torch.equal(d, digests[0]) for d in digests):
            return
        everyone: list[tuple[list[str], list[str]] | None] = [None] * self.world_size
        what = "exchanging the programs that differ"
        try:
            with self.waiting(what):
                tdist.all_gather_object(everyone, explain())
        except Exception as error:
            raise failure(self, what, error) from None
        collectives = [e[0] if e else None for e in everyone]
        lines = [e[1] if e else None for e in everyone]
        difference = _first_difference(collectives) or _first_difference(
            lines, "line", "of the scheduled program"
        )
        raise DistributedError(
            f"@{name}: the ranks run different programs: "
            f"{difference or 'their digests differ'}"
        )


def describe_collectives(module: ModuleOp) -> list[str]:
    """The collective sequence the ranks compare before a program runs."""
    return [
        f"{i.kind} over {list(i.mesh_axes)} {i.dtype}{list(i.shape)}" for i in collectives(module)
    ]


def program_lines(module: ModuleOp) -> list[str]:
    """The lines of ``module``'s text, as the ranks compare them when digests differ."""
    return str(module).splitlines()


def _first_difference(
    sequences: Sequence[Sequence[str] | None], item: str = "collective #", of: str = ""
) -> str:
    """Where the first rank whose sequence differs from rank 0's differs, or ""."""
    base = list(sequences[0] or [])
    for rank, other in enumerate(sequences[1:], start=1):
        other = list(other or [])
        for index in range(max(len(base), len(other))):
            a = base[index] if index < len(base) else "nothing (the program ends)"
            b = other[index] if index < len(other) else "nothing (the program ends)"
            if a != b:
                where = f"{item}{index}" if item.endswith("#") else f"{item} {index + 1}"
                where += f" {of}" if of else ""
                return f"{where} is {_clip(a)} on rank 0 but {_clip(b)} on rank {rank}"
    return ""


def _clip(text: str, limit: int = 160) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[: limit - 3] + "..."


_RUNTIME: Runtime | None = None


def runtime() -> Runtime:
    """The process's runtime (joins the process group on first use)."""
    global _RUNTIME
    if _RUNTIME is None:
        _RUNTIME = Runtime()
    return _RUNTIME


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    line = text.splitlines()[0] if text else type(error).__name__
    return line.split(". This is typically")[0]  # gloo's advice to check the remote logs


def needed_groups(module: ModuleOp) -> set[tuple[Any, ...]]:
    """The process groups ``module`` uses: ``(axes, None)`` for every collective's axes,
    ``(axes, domain)`` for the domain subgroups of hierarchical starts."""
    needed: set[tuple[Any, ...]] = set()
    for op in module.walk():
        if isinstance(op, (graph.CollectiveOp, schedule.StartOp)):
            axes = tuple(op.attrs()["axes"])
            needed.add((axes, None))
            if (
                isinstance(op, schedule.StartOp)
                and op.algorithm_name == "hierarchical"
                and op.domain_size is not None
            ):
                needed.add((axes, op.domain_size))
    return needed


def failure(
    rt: Runtime, what: str, error: BaseException, members: Sequence[int] | None = None
) -> DistributedError:
    """The error of this rank's ``what`` with ``members`` (by default every rank), which
    failed with ``error``: it names the rank that caused it when the liveness channel
    tells (:meth:`~tessera.backends.liveness.Liveness.blame`)."""
    members = list(range(rt.world_size)) if members is None else list(members)
    timed_out = bool(re.search(r"timed? ?out", str(error), re.IGNORECASE))
    blame = rt.liveness.blame(members, what, timed_out) if rt.liveness else None
    detail = f"[{type(error).__name__}: {_first_line(error)}]"
    limit = f"the timeout of {rt.timeout:g} s (TESSERA_TIMEOUT)"
    if blame is None:
        return DistributedError(
            f"rank {rt.rank}: {what} failed: another rank failed, exited or did not reach it "
            f"within {limit} {detail}"
        )
    waited = f"; it did not come within {limit}" if timed_out else ""
    return DistributedError(
        f"rank {rt.rank}: {what} failed: rank {blame.rank} {blame.reason}{waited} {detail}",
        cause_rank=blame.rank,
        cause=blame.reason,
    )


@dataclass(frozen=True)
class _Start:
    """What a ``schedule.start`` issues, read once from the IR (used as the op)."""

    collective_name: str
    properties: dict[str, Any]
    algorithm_name: str | None
    domain_size: int | None
    stream_name: str
    label: str
    name: str = "schedule.start"

    @staticmethod
    def of(op: schedule.StartOp) -> _Start:
        return _Start(
            op.collective_name,
            op.attrs(),
            op.algorithm_name,
            op.domain_size,
            op.stream_name,
            op.label,
        )

    def attrs(self) -> dict[str, Any]:
        return self.properties


@dataclass
class _Pending:
    """An issued collective: its work handle and how to build the result once done."""

    work: object
    finish: Callable[[], torch.Tensor]
    op: _Start
    members: list[int]
    began: Mark | float = 0.0  # inside record_timeline(): when it was issued
    done: object = None  # and the mark its completion sets


class _AllOf:
    """One work handle for several: ``wait`` waits for each."""

    def __init__(self, works: Sequence[object]):
        self.works = works

    def wait(self) -> bool:
        for work in self.works:
            work.wait()  # type: ignore[attr-defined]
        return True


def _exchange_point_to_point(
    inputs: Sequence[torch.Tensor],
    outputs: Sequence[torch.Tensor],
    order: Sequence[int],
    rank: int,
    pg: object,
) -> _AllOf:
    """all_to_all as non-blocking sends and receives: ``inputs[i]`` goes to rank
    ``order[i]`` and ``outputs[i]`` comes from it (the same bytes as an all_to_all)."""
    works = []
    for peer, send, receive in zip(order, inputs, outputs, strict=True):
        if peer == rank:
            receive.copy_(send)
            continue
        works.append(tdist.isend(send, dst=peer, group=pg))
        works.append(tdist.irecv(receive, src=peer, group=pg))
    return _AllOf(works)


class _Phased:
    """The work of a hierarchical collective: ``wait`` waits for the first phase (issued
    asynchronously) and then runs the remaining phases, which need its result."""

    def __init__(self, first: object, rest: Callable[[], None]):
        self.first = first
        self.rest = rest

    def wait(self) -> bool:
        self.first.wait()  # type: ignore[attr-defined]
        self.rest()
        return True


def _exchange(
    inputs: Sequence[torch.Tensor],
    outputs: Sequence[torch.Tensor],
    group: _Group,
    rank: int,
    async_op: bool,
) -> object:
    """all_to_all over ``group`` (``inputs[i]`` to, ``outputs[i]`` from, the member of
    group rank ``i``): point to point on gloo (no alltoall before torch 2.13)."""
    if tdist.get_backend(group.handle) == "gloo":
        work = _exchange_point_to_point(inputs, outputs, group.by_group_rank, rank, group.handle)
    else:
        work = tdist.all_to_all(list(outputs), list(inputs), group=group.handle, async_op=True)
    if not async_op:
        work.wait()  # type: ignore[attr-defined]
    return work


def _in_order(group: _Group, received: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Tensors received in torch's group-rank order, put in the group's (mesh) order."""
    by_rank = dict(zip(group.by_group_rank, received, strict=True))
    return [by_rank[m] for m in group.members]


def _issue_hierarchical(
    op: _Start, x: torch.Tensor, intra: _Group, inter: _Group, members: list[int], rank: int
) -> _Pending | torch.Tensor:
    """Issues the first phase of a hierarchical collective (see
    :mod:`tessera.backends.hierarchical`); the wait runs the others."""
    attrs = op.attrs()
    kind = op.collective_name
    size, d = len(members), len(intra.members)
    state: dict[str, torch.Tensor] = {}
    if kind == "all_reduce":
        if x.numel() == 0:
            return x.clone()
        reduce = _reduce_op(attrs["kind"])
        pieces, count = hierarchical.padded_pieces(
            hierarchical.accumulate(x, attrs["kind"]).contiguous(), d
        )
        inputs = [pieces[intra.position(r)].contiguous() for r in intra.by_group_rank]
        mine = torch.empty_like(inputs[0])
        first = tdist.reduce_scatter(mine, inputs, op=reduce, group=intra.handle, async_op=True)

        def rest() -> None:
            tdist.all_reduce(mine, op=reduce, group=inter.handle)
            received = [torch.empty_like(mine) for _ in range(d)]
            tdist.all_gather(received, mine, group=intra.handle)
            state["out"] = torch.cat(_in_order(intra, received))[:count].reshape(x.shape)

    elif kind == "reduce_scatter":
        reduce = _reduce_op(attrs["kind"])
        chunks = hierarchical.accumulate(x, attrs["kind"]).chunk(size, attrs["dim"])
        # domain position i receives the bundle of pieces k*d + i, one per domain k
        bundles = [
            torch.stack([chunks[k * d + i] for k in range(size // d)]).contiguous()
            for i in range(d)
        ]
        inputs = [bundles[intra.position(r)] for r in intra.by_group_rank]
        mine = torch.empty_like(inputs[0])
        first = tdist.reduce_scatter(mine, inputs, op=reduce, group=intra.handle, async_op=True)

        def rest() -> None:
            pieces = [mine[inter.position(r)].contiguous() for r in inter.by_group_rank]
            out = torch.empty_like(pieces[0])
            tdist.reduce_scatter(out, pieces, op=reduce, group=inter.handle)
            state["out"] = out

    elif kind == "all_gather":
        received = [torch.empty_like(x) for _ in range(len(inter.members))]
        first = tdist.all_gather(received, x.contiguous(), group=inter.handle, async_op=True)

        def rest() -> None:
            bundle = torch.stack(_in_order(inter, received))  # [k] is piece k*d + i
            gathered = [torch.empty_like(bundle) for _ in range(d)]
            tdist.all_gather(gathered, bundle, group=intra.handle)
            by_position = _in_order(intra, gathered)  # [i][k] is piece k*d + i
            ordered = [by_position[p % d][p // d] for p in range(size)]
            state["out"] = torch.cat(ordered, attrs["dim"])

    elif kind == "all_to_all":
        chunks = x.chunk(size, attrs["split_dim"])
        # domain position i receives the bundle of pieces k*d + i, one per domain k
        bundles = [
            torch.stack([chunks[k * d + i] for k in range(size // d)]).contiguous()
            for i in range(d)
        ]
        inputs = [bundles[intra.position(r)] for r in intra.by_group_rank]
        received = [torch.empty_like(b) for b in inputs]
        first = _exchange(inputs, received, intra, rank, async_op=True)

        def rest() -> None:
            by_position = _in_order(intra, received)  # [j][k]: from member j, for domain k
            pieces = [
                torch.stack([by_position[j][inter.position(r)] for j in range(d)]).contiguous()
                for r in inter.by_group_rank
            ]
            arrived = [torch.empty_like(p) for p in pieces]
            _exchange(pieces, arrived, inter, rank, async_op=False)
            by_domain = _in_order(inter, arrived)  # [k][j]: from member k*d + j
            ordered = [by_domain[k][j] for k in range(size // d) for j in range(d)]
            state["out"] = torch.cat(ordered, attrs["concat_dim"])

    else:
        raise ExecutionError(f"{kind} has no hierarchical algorithm")

    def result() -> torch.Tensor:
        if kind in ("all_gather", "all_to_all"):
            return state["out"]
        return finish_reduce(state["out"], attrs["kind"], size, x.dtype)

    return _Pending(_Phased(first, rest), result, op, members)


def _reduce_op(kind: str) -> object:
    if kind not in KINDS:
        raise ExecutionError(f"reduction kind must be one of {NAMES}, found {kind!r}")
    return KINDS[kind].torch_dist_op()


def _accumulate(x: torch.Tensor, kind: str) -> torch.Tensor:
    """The buffer a reduction runs in: f16/bf16 terms of sums, means and products
    accumulate in f32 (as the virtual mesh does)."""
    dtype = accumulation_dtype(kind, x.dtype)
    return (x.to(dtype) if dtype != x.dtype else x.clone()).contiguous()


def _finish_reduce(
    buffer: torch.Tensor, kind: str, size: int, dtype: torch.dtype
) -> Callable[[], torch.Tensor]:
    return lambda: finish_reduce(buffer, kind, size, dtype)


def _issue_ordered(
    op: _Start, x: torch.Tensor, group: _Group, rank: int, kind: str, attrs: dict
) -> _Pending:
    """A collective whose reduction rounds (sum, mean, prod) in the deterministic
    numerics: all-gather the terms (in their accumulation dtype), then combine them in
    mesh order (``ordered_reduce``), as the virtual mesh does; a reduce-scatter keeps
    this rank's piece."""
    buffer = _accumulate(x, attrs["kind"])
    received = [torch.empty_like(buffer) for _ in group.members]
    work = tdist.all_gather(received, buffer, group=group.handle, async_op=True)
    size = len(group.members)

    def finish() -> torch.Tensor:
        by_rank = dict(zip(group.by_group_rank, received, strict=True))
        total = ordered_reduce([by_rank[m] for m in group.members], buffer.dtype, attrs["kind"])
        if kind == "reduce_scatter":
            total = total.chunk(size, attrs["dim"])[group.position(rank)].contiguous()
        return _finish_reduce(total, attrs["kind"], size, x.dtype)()

    return _Pending(work, finish, op, group.members)


def _kind(op: graph.CollectiveOp | schedule.StartOp | _Start) -> str:
    return (
        op.collective_name
        if isinstance(op, (schedule.StartOp, _Start))
        else op.name.removeprefix("graph.")
    )


def _issue(
    op: _Start,
    x: torch.Tensor,
    group: _Group,
    rank: int,
    domains: tuple[_Group, _Group] | None = None,
) -> _Pending | torch.Tensor:
    """Starts ``op`` on this rank's operand ``x``: a pending collective, or the result
    itself when no communication is needed. ``domains`` (intra-domain, inter-domain
    subgroups) runs a hierarchical start."""
    attrs = op.attrs()
    kind = _kind(op)
    size = len(group.members)
    position = group.position(rank)
    if kind == "all_slice":
        return x.chunk(size, attrs["dim"])[position].clone()
    if size == 1:
        return x.clone()
    pg = group.handle
    order = group.by_group_rank  # torch's order; mesh order is group.members
    ordered = kind in ("all_reduce", "reduce_scatter") and rounds(attrs["kind"])
    if ordered and numerics.deterministic():  # every rank combines the terms, in mesh order
        return _issue_ordered(op, x, group, rank, kind, attrs)
    if domains is not None:
        return _issue_hierarchical(op, x, *domains, group.members, rank)
    if kind == "all_reduce":
        buffer = _accumulate(x, attrs["kind"])
        work = tdist.all_reduce(buffer, op=_reduce_op(attrs["kind"]), group=pg, async_op=True)
        return _Pending(
            work, _finish_reduce(buffer, attrs["kind"], size, x.dtype), op, group.members
        )
    if kind == "all_gather":
        received = [torch.empty_like(x) for _ in range(size)]
        work = tdist.all_gather(received, x.contiguous(), group=pg, async_op=True)

        def gathered() -> torch.Tensor:
            by_rank = dict(zip(order, received, strict=True))
            return torch.cat([by_rank[m] for m in group.members], attrs["dim"])

        return _Pending(work, gathered, op, group.members)
    if kind == "reduce_scatter":
        buffer = _accumulate(x, attrs["kind"])
        chunks = buffer.chunk(size, attrs["dim"])
        inputs = [chunks[group.position(r)].contiguous() for r in order]
        output = torch.empty_like(inputs[0])
        work = tdist.reduce_scatter(
            output, inputs, op=_reduce_op(attrs["kind"]), group=pg, async_op=True
        )
        return _Pending(
            work, _finish_reduce(output, attrs["kind"], size, x.dtype), op, group.members
        )
    if kind == "all_to_all":
        chunks = x.chunk(size, attrs["split_dim"])
        inputs = [chunks[group.position(r)].contiguous() for r in order]
        outputs = [torch.empty_like(c) for c in inputs]
        if tdist.get_backend(pg) == "gloo":  # gloo has no alltoall before torch 2.13
            work = _exchange_point_to_point(inputs, outputs, order, rank, pg)
        else:
            work = tdist.all_to_all(outputs, inputs, group=pg, async_op=True)

        def exchanged() -> torch.Tensor:
            by_rank = dict(zip(order, outputs, strict=True))
            return torch.cat([by_rank[m] for m in group.members], attrs["concat_dim"])

        return _Pending(work, exchanged, op, group.members)
    if kind == "broadcast":
        src = attrs["src"]
        if not 0 <= src < size:
            raise ExecutionError(
                f"{op.name}: source index {src} is outside the group of {size} ranks"
            )
        buffer = x.clone().contiguous()
        work = tdist.broadcast(buffer, src=group.members[src], group=pg, async_op=True)
        return _Pending(work, lambda: buffer, op, group.members)
    if kind == "collective_permute":
        return _issue_permute(op, x, group, position)
    raise ExecutionError(f"the distributed backend cannot run {kind}")


def _issue_permute(
    op: _Start, x: torch.Tensor, group: _Group, position: int
) -> _Pending | torch.Tensor:
    """A collective_permute as point-to-point messages, all issued before any is
    waited for (so no order of ranks can deadlock): this rank sends its value to the
    target of the pair it is the source of and receives from the source of the pair it
    is the target of; a pair of a rank with itself is a copy, and a rank that is no
    target gets zeros."""
    pairs = op.attrs()["pairs"]
    target = next((t for s, t in pairs if s == position), None)
    source = next((s for s, t in pairs if t == position), None)
    if source == position:
        received = x.clone()
    else:
        received = torch.zeros(x.shape, dtype=x.dtype, device=x.device)
    works = []
    if target is not None and target != position:
        works.append(tdist.isend(x.contiguous(), dst=group.members[target], group=group.handle))
    if source is not None and source != position:
        works.append(tdist.irecv(received, src=group.members[source], group=group.handle))
    if not works:
        return received
    return _Pending(_AllOf(works), lambda: received, op, group.members)


def _communicates(op: schedule.StartOp, group_size: int) -> bool:
    """Whether ``_issue`` sends anything (a slice, or a group of one, does not)."""
    return _kind(op) != "all_slice" and group_size > 1


@dataclass
class _IssueStep:
    """Issues a collective of this rank; its handle slot gets the pending work (or
    the result, when nothing is sent)."""

    start: _Start
    input: int
    handle: int
    group: _Group
    domains: tuple[_Group, _Group] | None
    rt: Runtime
    what: str = "schedule.start"

    def run(self, envs: list[list[Any]], timeline: Any) -> None:
        (env,) = envs
        rt = self.rt
        began = timeline.now(rt.device) if timeline else 0.0
        try:
            issued = _issue(self.start, env[self.input], self.group, rt.rank, self.domains)
        except TesseraError:
            raise
        except Exception as error:
            raise failure(
                rt, f"{self.start.collective_name} over {list(self.start.attrs()['axes'])}", error
            ) from None
        if isinstance(issued, _Pending) and timeline:
            issued.began, issued.done = began, timeline.completion(issued.work, rt.device)
        env[self.handle] = issued


@dataclass
class _JoinStep:
    """Waits for a collective's work (when it sent anything) and finishes its result."""

    handle: int
    result: int | None
    check: Callable[[torch.Tensor], None]
    rt: Runtime
    what: str = "schedule.wait"

    def run(self, envs: list[list[Any]], timeline: Any) -> None:
        (env,) = envs
        issued = env[self.handle]
        if isinstance(issued, _Pending):
            rt, start = self.rt, issued.op
            what = f"{start.collective_name} over {list(start.attrs()['axes'])} (ranks {issued.members})"
            try:
                with rt.waiting(what, issued.members):
                    issued.work.wait()  # type: ignore[attr-defined]
            except Exception as error:
                raise failure(rt, what, error, issued.members) from None
            if timeline and issued.done is not None:
                issued.done.set(timeline.now(rt.device))  # type: ignore[attr-defined]
                timeline.add(rt.rank, start.stream_name, start.label, issued.began, issued.done)
            issued = issued.finish()
        if self.result is not None:
            self.check(issued)
            env[self.result] = issued


class _ProcessCollectives:
    """Collectives through ``torch.distributed`` for this process's rank: groups and
    domain subgroups resolved when the plan is built."""

    def __init__(self, rt: Runtime, mesh: Mesh):
        self.rt, self.mesh = rt, mesh
        self.infos: list[CollectiveInfo] = []  # what one run communicates, in order

    def start(self, op: schedule.StartOp, input: int, handle: int) -> _IssueStep:
        axes = op.attrs()["axes"]
        group = self.rt.group(self.mesh, axes)
        domains = (
            self.rt.domains(self.mesh, axes, op.domain_size)
            if op.algorithm_name == "hierarchical" and op.domain_size is not None
            else None
        )
        if _communicates(op, len(group.members)):
            self.infos.extend(collectives_of(op, len(group.members)))
        return _IssueStep(_Start.of(op), input, handle, group, domains, self.rt)

    def wait(self, op: schedule.WaitOp, handle: int, result: int | None) -> _JoinStep:
        what = f"{op.name} on rank {self.rt.rank}"
        check = _value_check(op.result.type, what) if op.result is not None else _no_check
        return _JoinStep(handle, result, check, self.rt)


def _no_check(value: torch.Tensor) -> None:
    pass


def _value_check(type_: Attribute, what: str) -> Callable[[torch.Tensor], None]:
    """Checks a value against the IR type ``type_`` (read once)."""
    aval = AbstractTensor.from_xdsl(type_)
    shape, dtype = aval.shape, aval.dtype.to_torch()

    def check(value: torch.Tensor) -> None:
        if not isinstance(value, torch.Tensor) or value.shape != shape or value.dtype != dtype:
            _check_value(value, aval, what)

    return check


class _CheckedKernels:
    """Kernels bound by ``kernels`` whose outputs are checked against the IR types."""

    def __init__(self, kernels: KernelBinder, rank: int):
        self.kernels, self.rank = kernels, rank
        self.uses_buffers = getattr(kernels, "uses_buffers", False)

    def bind(
        self,
        kernel: schedule.KernelOp,
        context: KernelContext,
        device: torch.device,
        outputs: Buffers = None,
    ) -> BoundKernel:
        fn = self.kernels.bind(kernel, context, device, outputs)
        what = f"{kernel.name} on rank {self.rank}"
        checks = [_value_check(v.type, what) for v in kernel.outputs]

        def run(*inputs: torch.Tensor) -> Sequence[torch.Tensor]:
            outputs = fn(*inputs)
            for check, value in zip(checks, outputs, strict=True):
                check(value)
            return outputs

        return run


class RankPlan:
    """This process's rank of a scheduled function, planned once: the checks of the
    arguments, the collective sequence the ranks compare, and the launch plan (built at
    the first run, after the comparison, since building it creates process groups)."""

    def __init__(
        self,
        module: ModuleOp,
        name: str,
        mesh: Mesh,
        rt: Runtime,
        kernels: KernelBinder | KernelRunner = reference_kernel,
        digest: bytes | None = None,
    ):
        rt.check_mesh(mesh)
        function: func.FuncOp = _function(module, name)
        if any(isinstance(op, graph.GraphOp) for op in function.body.ops):
            raise ExecutionError(
                f"@{name} is not scheduled: run_rank runs the Schedule IR (lower the "
                f"partitioned program with lower-graph-to-schedule first)"
            )
        _check_mesh(module, mesh)
        self.module, self.name, self.mesh, self.rt = module, name, mesh, rt
        self.function = function
        self.kernels = binder(kernels)
        self.avals = [AbstractTensor.from_xdsl(a.type) for a in function.args]
        self._digest = digest  # of the whole program, computed once
        self.plan: LaunchPlan | None = None
        self.collectives: list[CollectiveInfo] = []

    def digest(self) -> bytes:
        """The digest of the whole program the ranks compare before running it: the one
        given (the program cache's key of the traced program and its compile
        configuration), else the SHA-256 of this module's text; computed once."""
        if self._digest is None:
            self._digest = hashlib.sha256(str(self.module).encode()).digest()
        return self._digest

    def _explain(self) -> tuple[list[str], list[str]]:
        """What ranks exchange when their digests differ (see ``check_same_program``)."""
        return describe_collectives(self.module), program_lines(self.module)

    def _build(self) -> LaunchPlan:
        rt = self.rt
        rt.prepare(self.module, self.mesh)
        collectives = _ProcessCollectives(rt, self.mesh)
        plan = build_plan(
            self.function,
            self.mesh,
            [rt.rank],
            _CheckedKernels(self.kernels, rt.rank),
            collectives,
            rt.device,
        )
        plan.on_error = self._error
        self.collectives = collectives.infos
        return plan

    def _error(self, step: Any, error: Exception) -> Exception:
        """A step's error, naming its op (torch errors become ExecutionError)."""
        if isinstance(error, DistributedError):
            return error
        if isinstance(error, TesseraError):
            what = step.what
            return type(error)(f"{what}: {error}" if what not in str(error) else str(error))
        return ExecutionError(f"{step.what} failed on rank {self.rt.rank}: {error}")

    def run(
        self, args: Sequence[torch.Tensor], check_program: bool = True
    ) -> tuple[tuple[torch.Tensor, ...], RunRecord]:
        """This rank's results of one call and its :class:`RunRecord`."""
        rt, name = self.rt, self.name
        if len(args) != len(self.avals):
            raise ExecutionError(
                f"@{name} takes {len(self.avals)} arguments, rank {rt.rank} has {len(args)}"
            )
        for index, (value, aval) in enumerate(zip(args, self.avals, strict=True)):
            _check_value(value, aval, f"rank {rt.rank}, argument {index}")
        start = time.perf_counter()
        record = RunRecord(rt.rank, self.mesh.coords(rt.rank))
        if check_program:
            rt.check_same_program(name, self.digest(), self._explain)
        if self.plan is None:
            self.plan = self._build()
        (outputs,) = self.plan.run([args])
        record.collectives = list(self.collectives)
        record.seconds = time.perf_counter() - start
        return outputs, record


def run_rank(
    module: ModuleOp,
    name: str,
    mesh: Mesh,
    args: Sequence[torch.Tensor],
    rt: Runtime | None = None,
    kernel: KernelBinder | KernelRunner = reference_kernel,
    check_program: bool = True,
) -> tuple[tuple[torch.Tensor, ...], RunRecord]:
    """Runs this process's rank of the scheduled ``func.func @name`` (the Schedule IR)
    on its local arguments; returns its local results and a :class:`RunRecord`.

    Planned for this call (:class:`RankPlan`; compiled programs keep theirs): kernels run
    bound by ``kernel``; a ``schedule.start`` issues its collective with
    ``async_op=True`` and the matching ``schedule.wait`` joins the work handle.
    ``check_program`` first compares the ranks' program digests (a collective over
    all ranks); pipeline stages, whose ranks run different programs at different times,
    turn it off.
    """
    return RankPlan(module, name, mesh, rt or runtime(), kernel).run(args, check_program)


def collectives_of(
    op: graph.CollectiveOp | schedule.StartOp, group_size: int
) -> list[CollectiveInfo]:
    """The :class:`CollectiveInfo` of one communicating op (as ``collectives()`` reports)."""
    info = describe(op, group_size)
    return [info] if info is not None else []


__all__ = [
    "DEFAULT_TIMEOUT_S",
    "LocalResult",
    "RankPlan",
    "RunRecord",
    "Runtime",
    "launched",
    "run_rank",
    "runtime",
    "timeout_seconds",
]


class LocalResult:
    """One output of a multi-process call, as this rank holds it.

    ``local`` is this rank's piece, ``sharding`` its layout over ``mesh`` and ``shape``
    the global shape. :meth:`full` gathers the global value; it is a collective, so every
    rank must call it (in the same order)."""

    def __init__(
        self, local: torch.Tensor, sharding: Sharding, mesh: Mesh, rank: int, to_numpy: bool = False
    ):
        self.local = local
        self.sharding = sharding
        self.mesh = mesh
        self.rank = rank
        self._to_numpy = to_numpy
        self.shape = tuple(size * sharding.shards(mesh, d) for d, size in enumerate(local.shape))

    @property
    def dtype(self) -> torch.dtype:
        return self.local.dtype

    def full(self) -> torch.Tensor:
        """The global value, gathered from every rank's piece (a collective)."""
        pieces = runtime().all_gather_world(
            torch.as_tensor(self.local), "gathering a result (.full())"
        )
        value = assemble(pieces, self.sharding, self.mesh)
        return value.numpy() if self._to_numpy and value.dtype != torch.bfloat16 else value  # type: ignore[return-value]

    def __repr__(self) -> str:
        return (
            f"LocalResult(rank={self.rank}, local shape={list(self.local.shape)}, "
            f"global shape={list(self.shape)}, sharding={self.sharding}, {self.mesh})"
        )
