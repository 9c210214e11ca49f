"""How one op is sharded, given the layouts of its operands.

The decision shared by ``shard-propagate`` (which writes the result layouts) and
``insert-collectives`` (which makes the operands match what the op needs):

- :func:`choose` picks how the op's factors (see ``sharding_rules``) are split over mesh
  axes, at the least modelled time per rank on the mesh's machine
  (``sharding_clock``): each collective's alpha-beta time with its fastest algorithm on
  its groups' links (``reshard_cost``, and the block moves of a split BLOCKS factor)
  plus, for a matmul, its multiply-adds per rank at the device's rate (so that leaving
  a split operand's factor unsplit, which repeats the same products on every rank,
  costs what that compute takes); a move another user of the value makes anyway costs
  nothing more (``available``); the moves of the op's results are credited with the
  compute between the op and their first reader (``Decisions.overlap``). Equal times go
  to fewer bytes received per rank, then (within a greedy round) to a move more users
  share, then to less result memory per rank;
- :func:`required` is the layout an operand must have under that choice;
- :func:`results` are the layouts the op then produces (split reduction factors make
  results partial; partial operands stay partial through linear ops, unless
  ``reduction_points`` says to reduce them first);
- :func:`after_collective` is the layout an explicit collective leaves.

A pass asks through one :class:`Decisions` per function, which reads each op's
:class:`OpShape` (its rule and types; one per distinct op, shared by ops alike) once and
prices each candidate assignment once; a choice is kept by everything it reads (a
bounded cache), so ``insert-collectives`` reuses most of ``shard-propagate``'s choices
and identical layers share theirs. None of this changes a decision.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from math import prod

from xdsl.ir import Block, Operation, SSAValue

from tessera.analysis.reduction_points import REDUCE_WIDENED, ReductionPoints
from tessera.analysis.sharding_clock import ShardingClock
from tessera.errors import ShardingError
from tessera.ir import graph
from tessera.ir.abstract import aval
from tessera.ir.attribute_set import AttributeMap
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
from tessera.transforms.reshard import reshard_moves

Passed = dict[int, tuple[tuple[str, str], ...]]  # operand -> the partial axes it keeps
Cost = tuple[float, float]  # modelled time (``ShardingClock`` units), bytes received per rank
FREE: Cost = (0.0, 0.0)


def _add(a: Cost, b: Cost) -> Cost:
    return (a[0] + b[0], a[1] + b[1])


@dataclass(frozen=True)
class OpLayout:
    """An op's sharding decision: factor splits, operand needs, result layouts."""

    assignment: Assignment
    operands: tuple[Sharding, ...]
    results: tuple[Sharding, ...]


Tensor = tuple[tuple[int, ...], int]  # a tensor's shape and item size, as costs read it
class OpShape:
    """Everything of an op that its sharding decision reads but the values around it:
    its rule, its tensors' types, how partial operands pass through it. Ops alike (of
    one class, with equal types and properties) share one (:func:`op_shape`)."""

    def __init__(self, op: graph.GraphOp, rule: ShardingRule | None = None):
        self.rule = rule = sharding_rule(op) if rule is None else rule
        self.operand_tensors = tuple(_tensor(v) for v in op.operands)
        self.result_tensors = tuple(_tensor(r) for r in op.results)
        definition = op_def(op)
        widened = REDUCE_WIDENED in op.attributes  # a widening cast carrying partial sums
        self.linear = definition.linear or widened
        self.policy = "all" if widened else definition.partial
        self.matmul = isinstance(op, graph.MatmulOp)
        self.context = rule.has_context
        kinds = [f.kind for f in rule.factors]
        self.reductions = frozenset(f for f, k in enumerate(kinds) if k is FactorKind.REDUCTION)

        def splittable(dims: Dims) -> Dims:  # a tensor's factors, None where never split
            return tuple(
                f if f is not None and kinds[f] != FactorKind.REPLICATED else None for f in dims
            )

        self.operand_factors = tuple(splittable(dims) for dims in rule.operands)
        self.result_factors = tuple(splittable(dims) for dims in rule.results)
        self.result_context = tuple(
            frozenset(f for f in dims if f is not None and kinds[f] is FactorKind.CONTEXT)
            for dims in rule.results
        )
        self._divides: dict[tuple[int, int], bool] = {}

    @cached_property
    def work(self) -> int | None:
        """A matmul's multiply-adds (None for other ops)."""
        return factor_product(self.rule) if self.matmul else None

    @cached_property
    def sharing(self) -> frozenset[frozenset[int]]:
        return axis_sharing(self.rule)

    @cached_property
    def weight(self) -> dict[int, int]:
        """Per factor, the bytes of the largest operand (else result) with it: equal
        costs go to the heaviest factor."""
        weight: dict[int, int] = {}
        sides = (
            zip(self.rule.operands, self.operand_tensors, strict=True),
            zip(self.rule.results, self.result_tensors, strict=True),
        )
        for tensors in sides:
            unweighed = {f for f in range(len(self.rule.factors)) if not weight.get(f)}
            for dims, (shape, itemsize) in tensors:
                for factor in dims:
                    if factor in unweighed:
                        weight[factor] = max(weight.get(factor, 0), prod(shape) * itemsize)
        return weight

    def divides(self, factor: int, ways: int) -> bool:
        """``rule.divides``, memoized."""
        found = self._divides.get((factor, ways))
        if found is None:
            found = self._divides[(factor, ways)] = self.rule.divides(factor, ways)
        return found

    def required(self, assignment: Assignment, index: int, passed: Passed) -> Sharding:
        """The layout operand ``index`` must have under ``assignment`` (``passed``: the
        partial axes that operands keep under it)."""
        factors = self.operand_factors[index]
        dims = tuple(assignment.get(f, ()) if f is not None else () for f in factors)
        return Sharding(dims, passed.get(index, ()))

    def results(self, assignment: Assignment, passed: Passed) -> list[Sharding]:
        """:func:`results` (``passed``: the partial axes that operands keep under
        ``assignment``)."""
        kind = self.rule.reduction_kind
        inherited = next(iter(passed.values()), ())
        produced = []
        for dims, factors, context in zip(
            self.rule.results, self.result_factors, self.result_context, strict=True
        ):
            context_axes = {a for f in context for a in assignment.get(f, ())}
            partial = [
                (axis, kind)
                for factor, axes in assignment.items()
                if factor in self.reductions and factor not in dims
                for axis in axes
                if axis not in context_axes
            ]
            split = tuple(assignment.get(f, ()) if f is not None else () for f in factors)
            produced.append(Sharding(split, (*inherited, *partial)))
        return produced

    def read_reductions(
        self, known: Sequence[Sharding | None], reduced: Callable[[int], bool]
    ) -> tuple[bool | None, ...]:
        """The answers of ``reduced`` (whether a partial operand is reduced before its
        uses) that a choice for operand layouts ``known`` reads."""
        if not self.linear:
            return ()
        return tuple(
            reduced(i) if s is not None and s.partial else None for i, s in enumerate(known)
        )

    def passthrough(
        self, known: Sequence[Sharding | None], reduced: Callable[[int], bool]
    ) -> tuple[Passed, frozenset[str]]:
        """Partial axes of a linear kind (sum, mean) each operand may keep because the op
        is linear in it, and the axes that, split by the op, make it keep none."""
        if not self.linear or not any(s is not None and s.partial for s in known):
            return {}, frozenset()
        partials = [
            tuple((a, k) for a, k in s.partial if KINDS[k].linear)
            if s is not None and s.partial and not reduced(i)
            else ()
            for i, s in enumerate(known)
        ]
        axes = frozenset(a for p in partials for a, _ in p)
        if self.policy == "all":
            # a sum over mesh axes does not depend on their order: (tp, dp) is (dp, tp)
            if partials and partials[0] and all(set(p) == set(partials[0]) for p in partials):
                return dict.fromkeys(range(len(partials)), partials[0]), axes
            return {}, axes
        carriers = [i for i in self.policy if i < len(partials) and partials[i]]  # type: ignore[union-attr]
        if len(carriers) == 1 and all(
            not partials[i] for i in range(len(partials)) if i != carriers[0]
        ):
            return {carriers[0]: partials[carriers[0]]}, axes
        return {}, axes


    def accepted(
        self,
        known: Sequence[Sharding | None],
        reduced: Callable[[int], bool],
        wanted: Sequence[Sharding | None] = (),
    ) -> dict[int, tuple[tuple[str, str], ...]]:
        """The partial axes each operand could have and still be passed through: for an
        op linear in all its operands (an add), the partial axes of those that are partial
        or that its users take its result partial over (``wanted``; all alike), which
        every operand may then carry, their one reduction after the op serving all; for
        an op of one operand linear in it (a transpose, a reshape), also the partial axes
        its users take its result over; else what ``passthrough`` lets operands keep."""
        passed, _ = self.passthrough(known, reduced)
        if self.linear and self.policy == (0,) and len(known) == 1 and not passed:
            taken = {
                tuple((a, k) for a, k in w.partial if KINDS[k].linear)
                for w in wanted
                if w is not None and w.partial
            }
            if len(taken) == 1:
                return {0: next(iter(taken))}
        if self.policy != "all" or not self.linear:
            return passed
        partials = {
            frozenset((a, k) for a, k in s.partial if KINDS[k].linear)
            for i, s in enumerate(known)
            if s is not None and s.partial and not reduced(i)
        }
        partials |= {
            frozenset((a, k) for a, k in w.partial if KINDS[k].linear)
            for w in wanted
            if w is not None and w.partial
        }
        if len(partials) != 1:
            return passed
        axes = tuple(sorted(next(iter(partials))))
        return dict.fromkeys(range(len(known)), axes)


_SHAPES: AttributeMap[OpShape] = AttributeMap(4096)


def op_shape(op: graph.GraphOp) -> OpShape:
    """The :class:`OpShape` of ``op``, shared with the ops alike (a rule reads only the
    op's class, types and properties)."""
    if isinstance(op, graph.ConstantOp):  # its value may be large: not worth a key
        return OpShape(op)
    key = (
        type(op),
        *(v.type for v in op.operands),
        None,  # operands end
        *(r.type for r in op.results),
        None,  # results end
        *(part for item in op.properties.items() for part in item),
        REDUCE_WIDENED in op.attributes,
    )
    try:
        found = _SHAPES.get(key)
    except TypeError:  # an unhashable property: not shared
        return OpShape(op)
    if found is None:
        found = _SHAPES[key] = OpShape(op)
    return found


def _tensor(value: SSAValue) -> Tensor:
    typ = aval(value)
    return typ.shape, typ.dtype.itemsize


def _kept(passthrough: tuple[Passed, frozenset[str]], assignment: Assignment) -> Passed:
    """What ``OpShape.passthrough`` lets operands keep under ``assignment``: nothing
    when it splits one of their partial axes."""
    passed, axes = passthrough
    if axes and any(a in axes for split in assignment.values() for a in split):
        return {}
    return passed


# Choices by everything a choice reads: the op's shape, its operands' layouts, its users'
# wishes, the ``points`` answers it reads and the mesh axes' sizes (insert-collectives
# asks most of shard-propagate's last questions again); at most _MAX_CHOICES of them
# (the cache starts afresh when full).
_CHOICES: dict[tuple[object, ...], Assignment] = {}
_MAX_CHOICES = 4096


class Decisions:
    """The sharding decisions of one pass run over a function on ``mesh``: each op's
    shape is read once (a run must not change an op's types or properties) and each
    reshard priced once. ``points`` is asked about an operand only when its layout is
    partial (no other answer is read), when a choice first needs it, except in
    :meth:`decide`, which asks as soon as it is called (``insert-collectives`` changes
    the IR between two decisions). How many ops read a value is counted once (a scalar
    constant read by every update of an unrolled step would be counted again by each of
    its readers, quadratic in depth): a pass that changes a value's uses says so
    (:meth:`forget`)."""

    def __init__(self, mesh: MeshLike, points: ReductionPoints):
        self.mesh = mesh
        self.points = points
        self._shapes: dict[Operation, OpShape] = {}
        self._sizes = {a: mesh.axis_size(a) for a in mesh.axis_names}
        self.clock = ShardingClock(mesh)
        self._mesh_key = (*self._sizes.items(), self.clock.key)
        self._reshards: dict[tuple[Sharding, Sharding, Tensor], Cost] = {}
        self._users: dict[SSAValue, int] = {}
        self._compute_before: dict[Block, dict[Operation, tuple[int, float]]] = {}

    def users(self, value: SSAValue) -> int:
        """How many ops read ``value`` (a value's reshard is made once for all of them:
        ``insert-collectives`` shares it), as of the last :meth:`forget` of it."""
        found = self._users.get(value)
        if found is None:
            found = self._users[value] = len({use.operation for use in value.uses})
        return found

    def overlap(self, op: Operation) -> float:
        """The compute ``op``'s result moves may hide behind: the matmuls between ``op``
        and the first op reading its result (``overlap-comm`` starts a collective when
        its operand is made and waits where its result is first read), each at its
        multiply-adds split over the whole mesh (the least it can take per rank). The ops
        of ``op``'s block are counted once, as they are when first asked; a reader made
        since (a collective ``insert-collectives`` inserted) gives no window."""
        block = op.parent_block()
        if block is None:
            return 0.0
        before = self._compute_before.get(block)
        if before is None:
            before = self._compute_before[block] = self._block_compute(block)
        start = before.get(op)
        if start is None:
            return 0.0
        first = None
        for result in op.results:
            for use in result.uses:
                reader = use.operation
                while reader is not None and reader.parent_block() is not block:
                    reader = reader.parent_op()
                found = before.get(reader) if reader is not None else None
                if found is None:
                    return 0.0
                if first is None or found[0] < first[0]:
                    first = found
        if first is None:
            return 0.0
        return max(first[1] - start[1] - self._op_compute(op), 0.0)

    def _block_compute(self, block: Block) -> dict[Operation, tuple[int, float]]:
        """Per op of ``block``: its index and the compute of the ops before it."""
        table: dict[Operation, tuple[int, float]] = {}
        total = 0.0
        for index, op in enumerate(block.ops):
            table[op] = (index, total)
            total += self._op_compute(op)
        return table

    def _op_compute(self, op: Operation) -> float:
        if not isinstance(op, graph.MatmulOp):
            return 0.0
        shape = self.shape(op)
        work = (shape.work or 0) / self.clock.size
        return self.clock.compute(work, shape.result_tensors[0][1])

    def forget(self, values: Iterable[SSAValue]) -> None:
        """``values``' uses changed: their readers are counted again when next asked."""
        for value in values:
            self._users.pop(value, None)

    def shape(self, op: graph.GraphOp) -> OpShape:
        found = self._shapes.get(op)
        if found is None:
            found = self._shapes[op] = op_shape(op)
        return found

    def size(self, axis: str) -> int:
        found = self._sizes.get(axis)
        return found if found is not None else self.mesh.axis_size(axis)

    def ways(self, assignment: Assignment) -> int:
        """Into how many pieces ``assignment`` splits the op's work."""
        return prod(self.size(a) for axes in assignment.values() for a in axes)

    def reshard_cost(self, src: Sharding, dst: Sharding, tensor: Tensor) -> Cost:
        """The time a reshard takes on the mesh's machine (``ShardingClock``: each step's
        collective with its fastest algorithm) and the ring bytes a rank receives by it,
        memoized."""
        if src == dst:
            return FREE
        key = (src, dst, tensor)
        found = self._reshards.get(key)
        if found is None:
            moves = reshard_moves(src, dst, tensor[0], tensor[1], self.mesh)
            time = sum(self.clock.collective(m.kind, m.axes, m.nbytes) for m in moves)
            found = self._reshards[key] = (time, sum(m.received for m in moves))
        return found

    def decide(
        self,
        op: graph.GraphOp,
        known: Sequence[Sharding],
        wanted: Sequence[Sharding | None] = (),
        available: Sequence[frozenset[Sharding]] = (),
    ) -> OpLayout:
        """The full decision for ``op`` whose operands have the layouts ``known`` (and
        whose users want its results laid out as ``wanted``, where given; ``available``:
        per operand, the layouts it is moved to anyway, for other users)."""
        for value, sharding in zip(op.operands, known, strict=True):
            if sharding is not None and sharding.partial:
                _ = value in self.points  # asked as the IR is now (see the class)
        pricing = _Pricing(self, op, self.shape(op), known, wanted, available)
        assignment = self._choose(pricing)
        passed = pricing.passthrough(assignment)
        shape = pricing.shape
        operands = tuple(shape.required(assignment, i, passed) for i in range(len(op.operands)))
        return OpLayout(assignment, operands, tuple(shape.results(assignment, passed)))

    def choose(
        self,
        op: graph.GraphOp,
        known: Sequence[Sharding | None],
        wanted: Sequence[Sharding | None] = (),
        available: Sequence[frozenset[Sharding]] = (),
    ) -> Assignment:
        """:func:`choose` for ``op`` (``available``: as in :meth:`decide`)."""
        return self._choose(_Pricing(self, op, self.shape(op), known, wanted, available))

    def priced_choice(
        self,
        op: graph.GraphOp,
        known: Sequence[Sharding | None],
        wanted: Sequence[Sharding | None] = (),
        available: Sequence[frozenset[Sharding]] = (),
    ) -> Cost:
        """The cost of :meth:`choose`'s pick for these layouts and wishes."""
        pricing = _Pricing(self, op, self.shape(op), known, wanted, available)
        return pricing.cost(self._choose(pricing))

    def move_cost(self, value: SSAValue, src: Sharding, dst: Sharding) -> Cost:
        """:meth:`reshard_cost` of ``value`` from ``src`` to ``dst``."""
        return self.reshard_cost(src, dst, _tensor(value))

    def needs(
        self, op: graph.GraphOp, assignment: Assignment, known: Sequence[Sharding | None]
    ) -> list[Sharding]:
        """The layouts ``op`` under ``assignment`` needs its operands in (``required``)."""
        shape = self.shape(op)
        passed = _Pricing(self, op, shape, known).passthrough(assignment)
        return [shape.required(assignment, i, passed) for i in range(len(op.operands))]

    def gathers(
        self, op: graph.GraphOp, assignment: Assignment, known: Sequence[Sharding | None]
    ) -> list[Sharding | None]:
        """Per operand, the layout the expansion of ``op``'s split ``CONTEXT`` factors
        gathers it to where ``op`` reads it as it is (``known``), else None:
        ``shard-partition`` makes that move once per value, like a reshard, so it is
        another user's move to share (``available``)."""
        shape = self.shape(op)
        if not shape.context:
            return [None] * len(op.operands)
        pricing = _Pricing(self, op, shape, known)
        return pricing.gathers(assignment)

    def wants(
        self,
        op: graph.GraphOp,
        assignment: Assignment,
        known: Sequence[Sharding | None],
        wanted: Sequence[Sharding | None] = (),
    ) -> list[Sharding]:
        """The layouts ``op`` under ``assignment`` wants of its operands, for their
        producers to weigh: the splits it requires, partial over the axes it would pass
        through (``OpShape.accepted``, with its users' wishes ``wanted``: a producer may
        leave such a sum partial)."""
        shape = self.shape(op)
        pricing = _Pricing(self, op, shape, known)
        accepted = shape.accepted(known, pricing.reduced, wanted)
        split = {a for axes in assignment.values() for a in axes}
        wants = []
        for index in range(len(op.operands)):
            partial = accepted.get(index, ())
            if any(a in split for a, _ in partial):
                partial = ()
            wants.append(Sharding(shape.required(assignment, index, {}).dims, partial))
        return wants

    def results(
        self, op: graph.GraphOp, assignment: Assignment, known: Sequence[Sharding | None]
    ) -> list[Sharding]:
        """:func:`results` for ``op``."""
        pricing = _Pricing(self, op, self.shape(op), known)
        return pricing.shape.results(assignment, pricing.passthrough(assignment))

    def _choose(self, pricing: _Pricing) -> Assignment:
        known, wanted = pricing.known, pricing.wanted
        reads = pricing.shape.read_reductions(known, pricing.reduced)
        key = (
            pricing.shape, known, wanted, reads, self._mesh_key, pricing.available, pricing.users,
            pricing.overlap,
        )  # fmt: skip
        found = _CHOICES.get(key)
        if found is None:
            found = self._compute_choice(pricing)
            if len(_CHOICES) >= _MAX_CHOICES:
                _CHOICES.clear()
            _CHOICES[key] = found
        return dict(found)

    def _compute_choice(self, pricing: _Pricing) -> Assignment:
        rule, known, wanted = pricing.shape.rule, pricing.known, pricing.wanted
        operand_side = _proposals(rule, known, rule.operands)
        assignment, cost = self._greedy(pricing, operand_side)
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
            trial, trial_cost = self._greedy(pricing, unblocked)
            if (trial_cost, -self.ways(trial)) < (cost, -self.ways(assignment)):
                assignment, cost = trial, trial_cost
        result_side = [p for p in _proposals(rule, wanted, rule.results) if p not in operand_side]
        if result_side:
            trial, trial_cost = self._greedy(pricing, operand_side + result_side)
            if (trial_cost, -self.ways(trial)) < (cost, -self.ways(assignment)):
                return trial
        return assignment

    def _greedy(
        self, pricing: _Pricing, proposals: Sequence[tuple[int, tuple[str, ...]]]
    ) -> tuple[Assignment, Cost]:
        """The greedy pass of :func:`choose` over ``proposals``, and its cost."""
        shape = pricing.shape
        sharing = shape.sharing
        assignment: Assignment = {}
        current = pricing.cost(assignment)
        while True:
            best: tuple[tuple[Cost, int, int, int], int, tuple[str, ...]] | None = None
            taken = {a for axes in assignment.values() for a in axes}
            for factor, axes in proposals:
                if factor in assignment:
                    continue
                used = taken
                if sharing:  # a context factor may reuse the axes of factors it never meets
                    used = {
                        a
                        for other, split in assignment.items()
                        if frozenset((factor, other)) not in sharing
                        for a in split
                    }
                if used.intersection(axes):
                    continue
                if not shape.divides(factor, prod(self.size(a) for a in axes)):
                    continue
                trial = {**assignment, factor: axes}
                key = (
                    pricing.cost(trial),
                    -self.ways(trial),
                    -pricing.shareable(trial),
                    pricing.memory(trial),
                    -shape.weight.get(factor, 0),
                )
                if best is None or key < best[0]:
                    best = (key, factor, axes)
            if best is None or best[0][0] > current:
                return assignment, current
            (current, *_), factor, axes = best
            assignment[factor] = axes


class _Pricing:
    """The costs of assignments for one op, its operands' layouts and its users' wishes
    (each assignment priced once)."""

    def __init__(
        self,
        decisions: Decisions,
        op: graph.GraphOp,
        shape: OpShape,
        known: Sequence[Sharding | None],
        wanted: Sequence[Sharding | None] = (),
        available: Sequence[frozenset[Sharding]] = (),
    ):
        self.decisions = decisions
        self.op = op
        self.shape = shape
        self.known = tuple(known)
        self.wanted = tuple(wanted)
        self.available = tuple(available)
        self._passed: tuple[Passed, frozenset[str]] | None = None
        self._costs: dict[tuple[tuple[int, tuple[str, ...]], ...], Cost] = {}

    @cached_property
    def users(self) -> tuple[int, ...]:
        """Per operand, how many ops read its value (a value's reshard is made once for
        all of them: ``insert-collectives`` shares it)."""
        return tuple(self.decisions.users(v) for v in self.op.operands)

    @cached_property
    def overlap(self) -> float:
        """The time the moves of the op's results may hide behind (``Decisions.overlap``),
        at most what the largest of them could take (two all-reduces of every result over
        the whole mesh), so that ops alike far from their readers price alike."""
        decisions = self.decisions
        axes = tuple(decisions.mesh.axis_names)
        bound = sum(
            2 * decisions.clock.collective("all_reduce", axes, prod(shape) * itemsize)
            for shape, itemsize in self.shape.result_tensors
        )
        return min(decisions.overlap(self.op), bound) if bound else 0.0

    def shareable(self, assignment: Assignment) -> int:
        """The bytes of each operand ``assignment`` moves times the number of other ops
        that read it (a tie-break: at equal cost, a move more users may share wins)."""
        passed = self.passthrough(assignment)
        total = 0
        for index, (tensor, sharding) in enumerate(
            zip(self.shape.operand_tensors, self.known, strict=True)
        ):
            if sharding is None or self.users[index] < 2:
                continue
            if self.shape.required(assignment, index, passed) != sharding:
                total += prod(tensor[0]) * tensor[1] * (self.users[index] - 1)
        return total

    @cached_property
    def inherited(self) -> set[str]:
        """The axes over which operands are partial."""
        return {a for s in self.known if s is not None for a, _ in s.partial}

    def reduced(self, index: int) -> bool:
        """Whether a partial operand ``index`` is reduced before its uses (``points``)."""
        return self.op.operands[index] in self.decisions.points

    def passthrough(self, assignment: Assignment) -> Passed:
        """The partial axes each operand keeps under ``assignment``: none when the op
        splits one of them."""
        if self._passed is None:
            self._passed = self.shape.passthrough(self.known, self.reduced)
        return _kept(self._passed, assignment)

    def memory(self, assignment: Assignment) -> int:
        """The bytes of the op's results resident per rank under ``assignment``."""
        mesh = self.decisions.mesh
        produced = self.shape.results(assignment, self.passthrough(assignment))
        return sum(
            prod(sharding.local_shape(mesh, shape)) * itemsize
            for (shape, itemsize), sharding in zip(self.shape.result_tensors, produced, strict=True)
        )

    def cost(self, assignment: Assignment) -> Cost:
        """:func:`_cost` of ``assignment`` and the bytes a rank receives by it."""
        key = tuple(assignment.items())  # the order of the results' partial axes
        found = self._costs.get(key)
        if found is None:
            found = self._costs[key] = self._price(assignment)
        return found

    def _price(self, assignment: Assignment) -> Cost:
        shape, decisions, known = self.shape, self.decisions, self.known
        total = FREE
        if shape.work is not None:
            # the multiply-adds per rank: work a split leaves whole is repeated on each
            itemsize = shape.result_tensors[0][1]
            work = shape.work / decisions.ways(assignment)
            total = (decisions.clock.compute(work, itemsize), 0.0)
        passed = self.passthrough(assignment)
        for index, (tensor, sharding) in enumerate(zip(shape.operand_tensors, known, strict=True)):
            if sharding is None:
                continue
            needed = shape.required(assignment, index, passed)
            if index < len(self.available) and needed in self.available[index]:
                continue  # moved there for another user anyway: made once, shared
            total = _add(total, decisions.reshard_cost(sharding, needed, tensor))
        produced = shape.results(assignment, passed)
        if shape.rule.windows:
            total = _add(total, self._block_move_cost(assignment, produced))
        if shape.context:
            total = _add(total, self._context_cost(assignment, produced, passed))
        wants = [*self.wanted, *[None] * (len(produced) - len(self.wanted))]
        moved = FREE
        for tensor, sharding, want in zip(shape.result_tensors, produced, wants, strict=True):
            # new partial axes are resolved (reduce-scattered where the users' split allows),
            # unless the users take them partial (a linear op adding it to another partial
            # sum over those axes: one reduction of the sum serves both)
            accepted = want.partial if want is not None else ()
            kept = tuple(
                p for p in sharding.partial if p[0] in self.inherited or p in accepted
            )
            gone = dict(kept)
            dims = want.dims if want is not None else sharding.dims
            target = Sharding(tuple(tuple(a for a in d if a not in gone) for d in dims), kept)
            if target != sharding:
                moved = _add(moved, decisions.reshard_cost(sharding, target, tensor))
        # the results' moves run while the ops before their first reader compute
        hidden = min(moved[0], self.overlap)
        return _add(total, (moved[0] - hidden, moved[1]))

    def gathers(self, assignment: Assignment) -> list[Sharding | None]:
        """:meth:`Decisions.gathers` under ``assignment``."""
        shape, passed = self.shape, self.passthrough(assignment)
        needed = [shape.required(assignment, i, passed) for i in range(len(self.known))]
        produced = shape.results(assignment, passed)
        computed, _ = context_layouts(shape.rule, assignment, needed, produced)
        return [
            gathered if gathered != needs and needs == have else None
            for have, needs, gathered in zip(self.known, needed, computed, strict=True)
        ]

    def _context_cost(
        self, assignment: Assignment, produced: Sequence[Sharding], passed: Passed
    ) -> Cost:
        """The time the expansion of split ``CONTEXT`` factors moves (``context_layouts``):
        an operand it reads as it is costs nothing to gather where another user moves it
        to that layout anyway (``shard-partition`` shares the move, see ``available``)."""
        shape, decisions = self.shape, self.decisions
        needed = [shape.required(assignment, i, passed) for i in range(len(self.known))]
        computed_operands, computed_results = context_layouts(
            shape.rule, assignment, needed, produced
        )
        total = FREE
        for index, (tensor, needs, gathered) in enumerate(
            zip(shape.operand_tensors, needed, computed_operands, strict=True)
        ):
            if (
                needs == self.known[index]
                and index < len(self.available)
                and gathered in self.available[index]
            ):
                continue  # gathered there for another user anyway: made once, shared
            total = _add(total, decisions.reshard_cost(needs, gathered, tensor))
        for tensor, computed, gives in zip(
            shape.result_tensors, computed_results, produced, strict=True
        ):
            total = _add(total, decisions.reshard_cost(computed, gives, tensor))
        return total

    def _block_move_cost(self, assignment: Assignment, produced: Sequence[Sharding]) -> Cost:
        """The time the busiest rank takes to receive its blocks when the op's split BLOCKS
        factors move blocks (:mod:`tessera.transforms.block_moves`: a latency per permute
        that sends), and those bytes."""
        mesh, rule = self.decisions.mesh, self.shape.rule
        total = FREE
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
                shape, itemsize = self.shape.result_tensors[j]
                local = produced[j].local_shape(mesh, shape)
                dim = rule.results[j].index(windows.factor)
                row = prod(size for d, size in enumerate(local) if d != dim) * itemsize
                per_rank = [
                    have + count * row for have, count in zip(per_rank, received, strict=True)
                ]
            moved = max(per_rank)
            time = self.decisions.clock.permutes(axes, moved, communicating_moves(plan))
            total = _add(total, (time, moved))
        return total


def _own(
    op: graph.GraphOp,
    rule: ShardingRule,
    known: Sequence[Sharding | None],
    mesh: MeshLike,
    points: ReductionPoints,
    wanted: Sequence[Sharding | None] = (),
) -> _Pricing:
    """A pricing for ``op`` under the rule given (shared with no other op)."""
    return _Pricing(Decisions(mesh, points), op, OpShape(op, rule), known, wanted)


def decide(
    op: graph.GraphOp,
    known: Sequence[Sharding],
    mesh: MeshLike,
    points: ReductionPoints,
    wanted: Sequence[Sharding | None] = (),
) -> OpLayout:
    """The full decision for ``op`` whose operands have the layouts ``known`` (and whose
    users want its results laid out as ``wanted``, where given)."""
    return Decisions(mesh, points).decide(op, known, wanted)


def choose(
    op: graph.GraphOp,
    rule: ShardingRule,
    known: Sequence[Sharding | None],
    mesh: MeshLike,
    points: ReductionPoints,
    wanted: Sequence[Sharding | None] = (),
) -> Assignment:
    """Greedy over proposals: each round adds the split of the least modelled time.

    Every operand proposes the axes on its dims. A round costs each proposal that still
    fits (its axes unused, except that a ``CONTEXT`` factor shares axes with the factors
    it never meets in a tensor; its factor divisible) together with the splits already
    chosen and keeps the cheapest (by modelled time, then bytes received per rank), if
    it costs no more than before; equal costs go to the split into more pieces (as a
    split beats no split: a dim's major-axes prefix, ``(cp,)`` of ``(cp, tp)``, wins
    only when cheaper), then to the split whose moved operands more other ops read (they
    may share the move; sharing a gather with a backward user would keep the gathered
    activation for the backward), then to the one leaving less result memory per rank,
    then to the factor of the largest tensor. Comparing across factors, not factor by
    factor, keeps the choice independent of operand order.

    Results the users want laid out some way (``wanted``: a constraint's layout, or what
    the consumer's choice requires) propose their splits too: a reshape whose merged dims
    cannot carry its operand's split may take the split its user wants (by an
    all-to-all), a partial sum may be reduce-scattered into it. As one greedy pass can be
    led astray by such a proposal (taken early, it can block a pair of operand splits
    that only pay together), the choice is the cheaper of the greedy passes without and
    with them (at equal cost, the one that splits the work more, as a round does).
    """
    pricing = _own(op, rule, known, mesh, points, wanted)
    return pricing.decisions._compute_choice(pricing)


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


def _cost(
    op: graph.GraphOp,
    rule: ShardingRule,
    assignment: Assignment,
    known: Sequence[Sharding | None],
    mesh: MeshLike,
    points: ReductionPoints,
    wanted: Sequence[Sharding | None] = (),
) -> float:
    """Modelled time per device (``sharding_clock`` units): the operands' reshards, the results' moves to the
    splits their users want, plus the all-reduce that a split reduction factor's partial
    result will eventually need (priced on this op's result; a later linear op may
    reduce a smaller tensor, so this is an upper bound), plus what the expansion of split
    ``CONTEXT`` factors moves (the gathers of their operands, the reduce-scatters of
    their results), plus a matmul's multiply-adds per device
    (at the device's rate)."""
    return _own(op, rule, known, mesh, points, wanted).cost(assignment)[0]


def assignment_of(rule: ShardingRule, operands: Sequence[Sharding]) -> Assignment:
    """The factor splits an op computes with, read from its operands' layouts (which
    ``insert-collectives`` made what the op requires): every factor an operand has."""
    assignment: Assignment = {}
    for sharding, dims in zip(operands, rule.operands, strict=True):
        for factor, axes in zip(dims, sharding.dims, strict=True):
            if factor is not None and axes and factor not in assignment:
                assignment[factor] = axes
    return assignment


def required(
    op: graph.GraphOp,
    rule: ShardingRule,
    assignment: Assignment,
    known: Sequence[Sharding | None],
    index: int,
    points: ReductionPoints,
) -> Sharding:
    """The layout operand ``index`` must have under ``assignment``."""
    shape = OpShape(op, rule)
    passed = _kept(shape.passthrough(known, lambda i: op.operands[i] in points), assignment)
    return shape.required(assignment, index, passed)


def results(
    op: graph.GraphOp,
    rule: ShardingRule,
    assignment: Assignment,
    known: Sequence[Sharding | None],
    points: ReductionPoints,
) -> list[Sharding]:
    """The layouts of the op's results under ``assignment``: split as their factors are;
    partial over the split ``REDUCTION`` factors a result lacks (but over none of the
    axes of a split ``CONTEXT`` factor it has: the expansion reduce-scatters those), and
    over the partial axes a linear op passes through."""
    shape = OpShape(op, rule)
    passed = _kept(shape.passthrough(known, lambda i: op.operands[i] in points), assignment)
    return shape.results(assignment, passed)


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
