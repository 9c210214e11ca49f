"""How one op is sharded, given the layouts of its operands.

The decision shared by ``shard-propagate`` (which writes the result layouts) and
``insert-collectives`` (which makes the operands match what the op needs):

- :func:`choose` picks how the op's factors (see ``sharding_rules``) are split over mesh
  axes, at the least cost: the bytes moved (``reshard_cost``, and the block moves of a
  split BLOCKS factor, :func:`block_move_bytes`) plus, for a matmul, its multiply-adds
  per device priced in bytes (so that leaving a split operand's factor unsplit, which
  repeats the same products on every rank, is not free);
- :func:`required` is the layout an operand must have under that choice;
- :func:`results` are the layouts the op then produces (split reduction factors make
  results partial; partial operands stay partial through linear ops, unless
  ``reduction_points`` says to reduce them first);
- :func:`after_collective` is the layout an explicit collective leaves.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from math import prod

from xdsl.ir import Operation

from tessera.analysis.reduction_points import REDUCE_WIDENED, ReductionPoints
from tessera.errors import ShardingError
from tessera.ir import graph
from tessera.ir.abstract import aval
from tessera.ir.reduction_kinds import KINDS
from tessera.ir.sharding import MeshLike, Sharding
from tessera.ir.sharding_rules import (
    Assignment,
    Dims,
    FactorKind,
    ShardingRule,
    axis_sharing,
    context_layouts,
    factor_product,
)
from tessera.opdefs import LayoutTransition, op_def, sharding_rule
from tessera.transforms.block_moves import (
    Window,
    communicating_moves,
    plan_block_moves,
    received_elements,
)
from tessera.transforms.reshard import ALPHA_BYTES, reshard_cost

# One multiply-add priced as this many bytes of communication: an H100 does about 495e12
# dense bf16 multiply-adds per second (989 TFLOP/s) and an NVLink 4 port moves about
# 450e9 bytes per second each way, about 1100 multiply-adds per byte (rounded to 2**10).
BYTES_PER_MULTIPLY_ADD = 1 / 1024

Passed = dict[int, tuple[tuple[str, str], ...]]  # operand -> the partial axes it keeps


@dataclass(frozen=True)
class OpLayout:
    """An op's sharding decision: factor splits, operand needs, result layouts."""

    assignment: Assignment
    operands: tuple[Sharding, ...]
    results: tuple[Sharding, ...]


def decide(
    op: graph.GraphOp,
    known: Sequence[Sharding],
    mesh: MeshLike,
    points: ReductionPoints,
    wanted: Sequence[Sharding | None] = (),
) -> OpLayout:
    """The full decision for ``op`` whose operands have the layouts ``known`` (and whose
    users want its results laid out as ``wanted``, where given)."""
    rule = sharding_rule(op)
    assignment = choose(op, rule, known, mesh, points, wanted)
    passed = _passthrough(op, known, assignment, points)
    operands = tuple(
        required(op, rule, assignment, known, i, points, passed) for i in range(len(op.operands))
    )
    produced = results(op, rule, assignment, known, points, passed)
    return OpLayout(assignment, operands, tuple(produced))


def choose(
    op: graph.GraphOp,
    rule: ShardingRule,
    known: Sequence[Sharding | None],
    mesh: MeshLike,
    points: ReductionPoints,
    wanted: Sequence[Sharding | None] = (),
) -> Assignment:
    """Greedy over proposals: each round adds the split that moves the fewest bytes.

    Every operand proposes the axes on its dims. A round costs each proposal that still
    fits (its axes unused, except that a ``CONTEXT`` factor shares axes with the factors
    it never meets in a tensor; its factor divisible) together with the splits already
    chosen and keeps the cheapest, if it moves no more bytes than before; equal costs
    go to the factor of the largest tensor. Comparing across factors, not factor by
    factor, keeps the choice independent of operand order.

    Results the users want laid out some way (``wanted``: a constraint's layout, or what
    the consumer's choice requires) propose their splits too: a reshape whose merged dims
    cannot carry its operand's split may take the split its user wants (by an
    all-to-all), a partial sum may be reduce-scattered into it. As one greedy pass can be
    led astray by such a proposal (taken early, it can block a pair of operand splits
    that only pay together), the choice is the cheaper of the greedy passes without and
    with them (at equal cost, the one that splits the work more, as a round does).
    """
    operand_side = _proposals(rule, known, rule.operands)
    assignment, cost = _greedy(op, rule, known, mesh, points, wanted, operand_side)
    # a split over several axes that another factor's split shares (tokens over
    # (dp, ep), experts over ep) can block the pair of its prefix and the other split,
    # which only pays together: try without it too
    blocking = [
        (f, axes)
        for f, axes in operand_side
        if len(axes) > 1
        and any(g != f and set(axes) & set(other) for g, other in operand_side)
    ]
    if blocking:
        unblocked = [p for p in operand_side if p not in blocking]
        trial, trial_cost = _greedy(op, rule, known, mesh, points, wanted, unblocked)
        if (trial_cost, -_ways(trial, mesh)) < (cost, -_ways(assignment, mesh)):
            assignment, cost = trial, trial_cost
    result_side = [p for p in _proposals(rule, wanted, rule.results) if p not in operand_side]
    if result_side:
        trial, trial_cost = _greedy(op, rule, known, mesh, points, wanted, operand_side + result_side)
        if (trial_cost, -_ways(trial, mesh)) < (cost, -_ways(assignment, mesh)):
            return trial
    return assignment


def _ways(assignment: Assignment, mesh: MeshLike) -> int:
    """Into how many pieces ``assignment`` splits the op's work."""
    return prod(mesh.axis_size(a) for axes in assignment.values() for a in axes)


def _proposals(
    rule: ShardingRule, layouts: Sequence[Sharding | None], dims_of: Sequence[Dims]
) -> list[tuple[int, tuple[str, ...]]]:
    """The (factor, axes) splits that the given tensors' layouts show, then the major
    prefixes of those over several axes (a dim over ``(dp, ep)`` proposes ``(dp,)``
    too): when a minor axis is taken by another factor (experts over ``ep``), the
    op may keep the major ones, and an all-to-all moves only the minor one."""
    proposals: list[tuple[int, tuple[str, ...]]] = []
    for sharding, dims in zip(layouts, dims_of, strict=False):
        if sharding is None:
            continue
        for factor, axes in zip(dims, sharding.dims, strict=True):
            splittable = (
                factor is not None and axes and rule.factors[factor].kind != FactorKind.REPLICATED
            )
            if splittable and (factor, axes) not in proposals:
                proposals.append((factor, axes))
    prefixes = [(f, axes[:n]) for f, axes in proposals for n in range(len(axes) - 1, 0, -1)]
    return proposals + [p for p in dict.fromkeys(prefixes) if p not in proposals]


def _greedy(
    op: graph.GraphOp,
    rule: ShardingRule,
    known: Sequence[Sharding | None],
    mesh: MeshLike,
    points: ReductionPoints,
    wanted: Sequence[Sharding | None],
    proposals: Sequence[tuple[int, tuple[str, ...]]],
) -> tuple[Assignment, float]:
    """The greedy pass of :func:`choose` over ``proposals``, and its cost."""
    weight = {f: 0 for f, _ in proposals}  # the largest operand (else result) with it
    for tensors in (zip(rule.operands, op.operands, strict=True), zip(rule.results, op.results, strict=True)):
        unweighed = {f for f, w in weight.items() if w == 0}
        for dims, value in tensors:
            for factor in dims:
                if factor in unweighed:
                    weight[factor] = max(weight[factor], aval(value).nbytes)
    assignment: Assignment = {}
    sharing = axis_sharing(rule)
    current = _cost(op, rule, assignment, known, mesh, points, wanted)
    while True:
        best: tuple[tuple[float, int], int, tuple[str, ...]] | None = None
        for factor, axes in proposals:
            used = {a for axes in assignment.values() for a in axes}
            if sharing:  # a context factor may reuse the axes of factors it never meets
                used = {
                    a
                    for other, taken in assignment.items()
                    if frozenset((factor, other)) not in sharing
                    for a in taken
                }
            if factor in assignment or used & set(axes):
                continue
            if not rule.divides(factor, prod(mesh.axis_size(a) for a in axes)):
                continue
            trial = {**assignment, factor: axes}
            key = (_cost(op, rule, trial, known, mesh, points, wanted), -weight[factor])
            if best is None or key < best[0]:
                best = (key, factor, axes)
        if best is None or best[0][0] > current:
            return assignment, current
        (current, _), factor, axes = best
        assignment[factor] = axes


def _cost(
    op: graph.GraphOp,
    rule: ShardingRule,
    assignment: Assignment,
    known: Sequence[Sharding | None],
    mesh: MeshLike,
    points: ReductionPoints,
    wanted: Sequence[Sharding | None] = (),
) -> float:
    """Bytes received per device: the operands' reshards, the results' moves to the
    splits their users want, plus the all-reduce that a split reduction factor's partial
    result will eventually need (priced on this op's result; a later linear op may
    reduce a smaller tensor, so this is an upper bound), plus what the expansion of split
    ``CONTEXT`` factors moves (the gathers of their operands, the reduce-scatters of
    their results), plus a matmul's multiply-adds per device
    (``BYTES_PER_MULTIPLY_ADD``)."""
    total = 0.0
    if isinstance(op, graph.MatmulOp):
        total += factor_product(rule) / _ways(assignment, mesh) * BYTES_PER_MULTIPLY_ADD
    passed = _passthrough(op, known, assignment, points)
    for index, (value, sharding) in enumerate(zip(op.operands, known, strict=True)):
        if sharding is None:
            continue
        needed = required(op, rule, assignment, known, index, points, passed)
        typ = aval(value)
        total += reshard_cost(sharding, needed, typ.shape, typ.dtype.itemsize, mesh)
    produced = results(op, rule, assignment, known, points, passed)
    total += block_move_bytes(op, rule, assignment, produced, mesh)
    if rule.has_context:
        total += _context_cost(op, rule, assignment, known, produced, mesh, points)
    inherited = {a for s in known if s is not None for a, _ in s.partial}
    wants = [*wanted, *[None] * (len(produced) - len(wanted))]
    for result, sharding, want in zip(op.results, produced, wants, strict=True):
        # new partial axes are resolved (reduce-scattered where the users' split allows)
        kept = tuple(p for p in sharding.partial if p[0] in inherited)
        dims = want.dims if want is not None else sharding.dims
        target = Sharding(tuple(tuple(a for a in d if a not in dict(kept)) for d in dims), kept)
        if target != sharding:
            typ = aval(result)
            total += reshard_cost(sharding, target, typ.shape, typ.dtype.itemsize, mesh)
    return total


def _context_cost(
    op: graph.GraphOp,
    rule: ShardingRule,
    assignment: Assignment,
    known: Sequence[Sharding | None],
    produced: Sequence[Sharding],
    mesh: MeshLike,
    points: ReductionPoints,
) -> float:
    """Bytes the expansion of split ``CONTEXT`` factors moves (``context_layouts``)."""
    needed = [required(op, rule, assignment, known, i, points) for i in range(len(known))]
    computed_operands, computed_results = context_layouts(rule, assignment, needed, produced)
    total = 0.0
    for value, needs, gathered in zip(op.operands, needed, computed_operands, strict=True):
        typ = aval(value)
        total += reshard_cost(needs, gathered, typ.shape, typ.dtype.itemsize, mesh)
    for value, computed, gives in zip(op.results, computed_results, produced, strict=True):
        typ = aval(value)
        total += reshard_cost(computed, gives, typ.shape, typ.dtype.itemsize, mesh)
    return total


def assignment_of(rule: ShardingRule, operands: Sequence[Sharding]) -> Assignment:
    """The factor splits an op computes with, read from its operands' layouts (which
    ``insert-collectives`` made what the op requires): every factor an operand has."""
    assignment: Assignment = {}
    for sharding, dims in zip(operands, rule.operands, strict=True):
        for factor, axes in zip(dims, sharding.dims, strict=True):
            if factor is not None and axes and factor not in assignment:
                assignment[factor] = axes
    return assignment


def block_move_bytes(
    op: graph.GraphOp,
    rule: ShardingRule,
    assignment: Assignment,
    produced: Sequence[Sharding],
    mesh: MeshLike,
) -> float:
    """Bytes the busiest rank receives when the op's split BLOCKS factors move blocks
    (:mod:`tessera.transforms.block_moves`), plus ``ALPHA_BYTES`` per permute that sends."""
    total = 0.0
    for windows in rule.windows:
        axes = assignment.get(windows.factor)
        if not axes:
            continue
        ranks = prod(mesh.axis_size(a) for a in axes)
        plan = plan_block_moves(
            [Window(*w) for w in windows.operands if w is not None],
            [Window(*w) for w in windows.results if w is not None],
            ranks,
        )
        targets = [j for j, w in enumerate(windows.results) if w is not None]
        per_rank = [0.0] * ranks
        for j, received in zip(targets, received_elements(plan, ranks), strict=True):
            typ = aval(op.results[j])
            local = produced[j].local_shape(mesh, typ.shape)
            dim = rule.results[j].index(windows.factor)
            row = prod(size for d, size in enumerate(local) if d != dim) * typ.dtype.itemsize
            per_rank = [have + count * row for have, count in zip(per_rank, received, strict=True)]
        total += max(per_rank) + ALPHA_BYTES * communicating_moves(plan)
    return total


def required(
    op: graph.GraphOp,
    rule: ShardingRule,
    assignment: Assignment,
    known: Sequence[Sharding | None],
    index: int,
    points: ReductionPoints,
    passed: Passed | None = None,
) -> Sharding:
    """The layout operand ``index`` must have under ``assignment`` (``passed``: the
    op's ``_passthrough``, when already known)."""
    dims = tuple(
        assignment.get(f, ())
        if f is not None and rule.factors[f].kind != FactorKind.REPLICATED
        else ()
        for f in rule.operands[index]
    )
    if passed is None:
        passed = _passthrough(op, known, assignment, points)
    return Sharding(dims, passed.get(index, ()))



def _passthrough(
    op: graph.GraphOp,
    known: Sequence[Sharding | None],
    assignment: Assignment,
    points: ReductionPoints,
) -> Passed:
    """Partial axes of a linear kind (sum, mean) each operand may keep because the op is
    linear in it."""
    definition = op_def(op)
    policy = definition.partial
    partials = [
        tuple((a, k) for a, k in s.partial if KINDS[k].linear)
        if s and value not in points
        else ()
        for s, value in zip(known, op.operands, strict=True)
    ]
    split = {a for axes in assignment.values() for a in axes}
    widened = REDUCE_WIDENED in op.attributes  # a widening cast carrying partial sums
    if not (definition.linear or widened) or any(a in split for p in partials for a, _ in p):
        return {}
    if widened:
        policy = "all"
    if policy == "all":
        # a sum over mesh axes does not depend on their order: (tp, dp) is (dp, tp)
        if partials and partials[0] and all(set(p) == set(partials[0]) for p in partials):
            return dict.fromkeys(range(len(partials)), partials[0])
        return {}
    carriers = [i for i in policy if i < len(partials) and partials[i]]  # type: ignore[union-attr]
    if len(carriers) == 1 and all(
        not partials[i] for i in range(len(partials)) if i != carriers[0]
    ):
        return {carriers[0]: partials[carriers[0]]}
    return {}


def results(
    op: graph.GraphOp,
    rule: ShardingRule,
    assignment: Assignment,
    known: Sequence[Sharding | None],
    points: ReductionPoints,
    passed: Passed | None = None,
) -> list[Sharding]:
    """The layouts of the op's results under ``assignment``: split as their factors are;
    partial over the split ``REDUCTION`` factors a result lacks (but over none of the
    axes of a split ``CONTEXT`` factor it has: the expansion reduce-scatters those), and
    over the partial axes a linear op passes through."""
    if passed is None:
        passed = _passthrough(op, known, assignment, points)
    inherited = next(iter(passed.values()), ())
    results = []
    for dims in rule.results:
        context_axes = {
            a for f in dims if f is not None and rule.kind(f) is FactorKind.CONTEXT
            for a in assignment.get(f, ())
        }
        partial = [
            (axis, rule.reduction_kind)
            for factor, axes in assignment.items()
            if rule.kind(factor) is FactorKind.REDUCTION and factor not in dims
            for axis in axes
            if axis not in context_axes
        ]
        split = tuple(
            assignment.get(f, ())
            if f is not None and rule.kind(f) is not FactorKind.REPLICATED
            else ()
            for f in dims
        )
        results.append(Sharding(split, (*inherited, *partial)))
    return results


def after_collective(op: Operation, source: Sharding) -> Sharding:
    """The layout a collective (or a sharding constraint) leaves, given its operand's."""
    transition = op_def(op).sharding
    assert isinstance(transition, LayoutTransition), f"{op.name} is not a layout transition"
    result = transition.fn(op, source)
    used = [a for d in result.dims for a in d] + [a for a, _ in result.partial]
    twice = sorted({a for a in used if used.count(a) > 1})
    if twice:
        error = ShardingError(
            f"{op.name}: its operand's layout {source} already uses mesh axes {twice}; "
            f"the result would use them twice ({result})"
        )
        error.op = op  # type: ignore[attr-defined]  # tessera-opt prints its line
        raise error
    return result
