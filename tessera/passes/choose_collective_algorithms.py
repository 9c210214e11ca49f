"""``choose-collective-algorithms``: mark each collective with the algorithm the cost model picks.

Runs on the Schedule IR (after ``overlap-comm``, before ``plan-memory``). For every
``schedule.start`` of an all_reduce, all_gather, reduce_scatter or all_to_all, it prices the
collective on ``topology`` (a :func:`~tessera.topology.load_topology` name or JSON
file; by default the ``graph.mesh`` symbol's ``topology``, else enough DGX H100 nodes:
:meth:`~tessera.ir.mesh.Mesh.machine`; mesh rank ``r`` runs on device ``r``) with
:func:`~tessera.perf.collective_cost.algorithms_for` and sets the start's ``algorithm``
property to the fastest: ``ring``, ``tree``, ``hierarchical`` or ``nvls`` (an all_to_all
runs ``direct``, left unannotated, or ``hierarchical``). For one group
this is ``collective_time(...).algorithm``; when the axes make several groups, the
algorithm must apply to every group and the slowest group's time decides.

``hierarchical`` also sets ``domain``: how many consecutive members of the (mesh-ordered)
group share one group of the topology level just inside the level that holds the whole
group (a DGX node: 8 on ``dgx_h100x2``). It is a candidate only where the group is
``n2 > 1`` such domains of ``domain > 1`` members each, consecutive in group order,
and every group gives the same ``domain`` (the runtimes cut groups that way:
``tessera.backends.hierarchical``)::

    %h = schedule.start all_reduce %g {axes = [dp, tp], kind = sum, algorithm = hierarchical, domain = 8} : ...

The runtimes run ``hierarchical`` as its phases over domain subgroups; other names
change nothing at run time (NCCL chooses ring, tree or NVLS itself), and the simulator
prices every annotated start with its algorithm.

Left unannotated (and stripped of a previous annotation): other collectives, groups of
one rank, and meshes with ranks beyond the topology's devices (they cannot be priced).
``force`` (for tests: ``force=hierarchical``) sets that algorithm where it is legal as
above; elsewhere the cost model's choice stands.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import IntegerAttr, ModuleOp, StringAttr, i64
from xdsl.passes import ModulePass

from tessera.errors import TesseraError
from tessera.ir import schedule
from tessera.ir.abstract import AbstractTensor, aval
from tessera.ir.mesh import Mesh
from tessera.ir.mesh_symbol import module_mesh
from tessera.perf.collective_cost import ALGORITHMS, algorithms_for
from tessera.topology import Topology

CHOSEN_COLLECTIVES = schedule.HIERARCHICAL_COLLECTIVES  # the reductions, gathers, all_to_all


@dataclass(frozen=True)
class ChooseCollectiveAlgorithmsPass(ModulePass):
    """Sets each collective start's algorithm (and hierarchical domain) by the cost model."""

    name = "choose-collective-algorithms"

    topology: str = ""  # the machine the cost model prices ("": the mesh's, Mesh.machine)
    force: str = ""  # "": the cost model's choice; else this algorithm where legal

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        if self.force and self.force not in ALGORITHMS:
            raise TesseraError(
                f"choose-collective-algorithms: force must be one of {', '.join(ALGORITHMS)} "
                f"(or empty), found {self.force!r}"
            )
        found = module_mesh(op)
        if found is None:
            return
        chooser = _Chooser(found[1], self.topology, self.force)
        for function in op.ops:
            if not isinstance(function, func.FuncOp) or not function.body.blocks:
                continue
            for start in function.walk():
                if isinstance(start, schedule.StartOp):
                    annotate(start, chooser.choose(start))


def annotate(start: schedule.StartOp, choice: tuple[str, int | None] | None) -> None:
    """Sets (or, for ``None``, removes) the start's ``algorithm`` and ``domain``."""
    for name in ("algorithm", "domain"):
        start.properties.pop(name, None)
    if choice is None:
        return
    algorithm, domain = choice
    start.properties["algorithm"] = StringAttr(algorithm)
    if domain is not None:
        start.properties["domain"] = IntegerAttr(domain, i64)


def domain_of(topology: Topology, members: Sequence[int]) -> int | None:
    """How many consecutive ``members`` share each group of the level just inside the one
    holding them all, when they form ``n2 > 1`` such groups of ``d > 1`` members each,
    consecutive in ``members``' order; else None."""
    level = topology.level_of(members)
    if level == 0:
        return None
    counts = topology.group_counts(members)
    d = counts[0]
    if d < 2 or len(counts) < 2 or any(c != d for c in counts):
        return None
    inner = topology.levels[level - 1].group_size
    for k in range(0, len(members), d):
        if len({rank // inner for rank in members[k : k + d]}) != 1:
            return None  # the mesh order interleaves the domains
    return d


class _Chooser:
    """The algorithm of each start on one topology (forced where legal)."""

    def __init__(self, mesh: Mesh, topology: str, force: str):
        self.mesh = mesh
        self.topology_name = topology
        self.force = force

    @cached_property
    def topology(self) -> Topology:
        return self.mesh.machine(self.topology_name)

    def choose(self, start: schedule.StartOp) -> tuple[str, int | None] | None:
        """(algorithm, domain or None), or None to leave the start unannotated."""
        kind = start.collective_name
        if kind not in CHOSEN_COLLECTIVES or start.input is None:
            return None
        groups = self.mesh.groups(start.attrs()["axes"])
        if len(groups[0]) < 2:
            return None
        if max(max(g) for g in groups) >= self.topology.num_devices:
            return None  # the machine is too small to price it
        result = AbstractTensor.from_xdsl(start.handle.type.tensor)
        nbytes = result.nbytes if kind == "all_gather" else aval(start.input).nbytes
        times = [algorithms_for(self.topology, kind, nbytes, g) for g in groups]
        # every group's algorithms; "direct" (an all_to_all's pairwise exchange) is the
        # default way to run, never written on the start
        candidates = [a for a in times[0] if all(a in t for t in times)]
        domain = None
        if "hierarchical" in candidates:
            domains = {domain_of(self.topology, g) for g in groups}
            domain = domains.pop() if len(domains) == 1 else None
            if domain is None:
                candidates.remove("hierarchical")
        legal = [a for a in candidates if a in ALGORITHMS]
        if not legal:
            return None
        if self.force in legal:
            algorithm = self.force
        else:  # the first fastest, in the cost model's order (as collective_time picks)
            algorithm = min(candidates, key=lambda a: max(t[a] for t in times))
            if algorithm not in ALGORITHMS:
                return None
        return algorithm, domain if algorithm == "hierarchical" else None
