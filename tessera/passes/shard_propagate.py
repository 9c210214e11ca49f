"""``shard-propagate``: decide the sharding of every value from the user's annotations.

Annotated function arguments and ``graph.shard`` constraints are *closed*: they keep
the user's layout. Every other value is *open* until propagation gives it a sharding.
The pass sweeps forward and backward to a fixed point:

- forward, each op chooses how to split its factors (see ``sharding_rules``): every
  operand proposes the mesh axes on its dims; the proposals are taken greedily, the one
  of the least modelled time (``op_sharding``: moves over their links, a matmul's
  compute per rank) first, and a split costs nothing more than no split (so a free
  local slice always beats communication); a move of an operand that another user's
  choice already needs costs nothing (one collective serves both); split reduction
  factors make results partial, and partial operands stay partial through linear ops;
- backward, an open operand takes the layout its consumer's result implies, and on
  factors no result shows (a contraction's k) the split the op uses going forward;
  every operand also records the split its consumer wants of it (a constraint's, or
  what the consumer's choice requires; partial over the axes an add would pass through,
  when its other operand or its own users are partial over them, so that a producer
  leaves such a sum partial for the one reduction; a sum whose every term a contraction
  could leave partial for free asks for them partial when its one reduction takes less
  time than the terms' producers spend to avoid it), which its producer weighs going forward as
  proposals and as the cost of moving its results there (a *result-side* proposal: a
  reshape whose merged dims cannot carry its operand's split takes its user's split
  by an all-to-all, a partial sum is reduce-scattered into the split its user wants).

Values never reached are replicated. The result sharding is written on each op
(``graph.sharding``) and on every function argument.

Region calls (``graph.call``, ``graph.scan``) are propagated per distinct layout of
their operands: the callee is propagated once per layout its calls pass (its arguments
closed to it), and the call's results take the layouts the callee returns, never
partial (a region reduces its partial results before returning) unless a constraint on
the call keeps one partial (a gradient summed over microbatches, reduced once after). A scan's step gets its
stacked operands' layouts without dim 0 (which stays whole), and returns its carries
constrained to the layouts it got them in. After the callers' fixed point each call names
the variant for its operands' layouts: the first variant of ``@f`` keeps the name, the
others are ``@f_1``, ``@f_2``... Calls neither take their users' wishes nor pass theirs
on: layouts cross a region boundary forward only. A call's ``graph.result_shardings``
(constraints ``canonicalize`` folded into it) are part of its variant: the variant returns
those results constrained, as a ``graph.shard`` before its return, so the call's results
have the constrained layouts (closed, as a ``graph.shard``'s result is). A scan's
constrained stacked result (dim 0 whole) has its step return each slice so constrained:
a ZeRO gradient is reduce-scattered step by step.

A call of a manual function (``dist.shard_map``'s body, see ``tessera.ir.manual``) is
not propagated into: its results are closed to its ``out_specs``, and its open operands
take its ``in_specs`` (``insert-collectives`` reshards the others to them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from math import prod

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import DenseArrayBase, ModuleOp, StringAttr, SymbolRefAttr, i64
from xdsl.ir import Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.rewriter import InsertPoint, Rewriter

from tessera.analysis.op_sharding import Assignment, Decisions, after_collective
from tessera.analysis.reduction_points import ReductionPoints
from tessera.ir import graph
from tessera.ir.abstract import aval
from tessera.ir.located_error import LocatedPassFailure
from tessera.ir.manual import in_specs, is_manual, out_specs
from tessera.ir.mesh import Mesh
from tessera.ir.mesh_symbol import sharded_functions
from tessera.ir.reduction_kinds import KINDS
from tessera.ir.sharding import (
    Sharding,
    ShardingAttr,
    arg_sharding,
    set_arg_shardings,
    set_op_shardings,
    value_sharding,
)
from tessera.opdefs import has_sharding_rule


@dataclass(frozen=True)
class ShardPropagatePass(ModulePass):
    name = "shard-propagate"

    max_iterations: int = 16
    topology: str = ""  # the machine for a mesh naming none ("": its default, latency left out)

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        called = graph.called_functions(op)
        variants: _Variants | None = None
        roots: list[func.FuncOp] = []
        for mesh_name, symbol_mesh, function in sharded_functions(op, self.name):
            mesh = symbol_mesh.priced_on(self.topology)
            if function.sym_name.data in called:
                continue  # propagated once per layout its calls pass
            if variants is None:
                variants = _Variants(op, mesh, mesh_name, self.max_iterations)
            _Propagation(mesh, mesh_name, function, variants).run(self.max_iterations)
            roots.append(function)
        if variants is not None and called:
            variants.materialize(roots)


# the callee, its arguments' layouts and the call's constraints on its results
_VariantKey = tuple[str, tuple[Sharding, ...], tuple[Sharding | None, ...]]
Caller = graph.CallOp | graph.ScanOp


class _Variants:
    """The regions of a module, each propagated once per layout of its arguments."""

    def __init__(self, module: ModuleOp, mesh: Mesh, mesh_name: str, max_iterations: int):
        self.module = module
        self.mesh = mesh
        self.mesh_name = mesh_name
        self.max_iterations = max_iterations
        self.functions = {f.sym_name.data: f for f in module.ops if isinstance(f, func.FuncOp)}
        self.propagated: dict[_VariantKey, tuple[func.FuncOp, list[Sharding]]] = {}
        self.keys: dict[Operation, _VariantKey] = {}  # each call's final key
        self.constraints: dict[Operation, tuple[Sharding | None, ...]] = {}

    def constrained(self, call: Caller) -> tuple[Sharding | None, ...]:
        """``call``'s result constraints (``graph.result_shardings``)."""
        found = self.constraints.get(call)
        if found is None:
            found = self.constraints[call] = tuple(call.result_constraints())
        return found

    def key(self, call: Caller, operands: Sequence[Sharding]) -> _VariantKey:
        """The variant ``call``'s operand layouts choose: its callee's argument layouts
        (never partial; a scan's stacked operands without their scanned dim 0), and the
        call's result constraints."""
        layouts = [Sharding(s.dims) for s in operands]
        constraints = self.constrained(call)
        if isinstance(call, graph.ScanOp):  # a step's layouts: without the steps' dim 0
            carries = call.carry_count
            layouts[carries:] = [Sharding(s.dims[1:]) for s in layouts[carries:]]
            constraints = tuple(
                None if c is None else Sharding(c.dims[1:], c.partial) for c in constraints
            )
        return (call.callee_name, tuple(layouts), constraints)

    def results(self, call: Caller, operands: Sequence[Sharding]) -> list[Sharding]:
        """The layouts of ``call``'s results when its operands have ``operands``: its
        callee's results (a scan's carries keep their layouts; its other results
        stack the step's on an unsplit dim 0)."""
        key = self.key(call, operands)
        carries = call.carry_count if isinstance(call, graph.ScanOp) else 0
        if key not in self.propagated:
            source = self.functions.get(key[0])
            if source is None:
                raise LocatedPassFailure(call, f"shard-propagate: no function @{key[0]}")
            variant = source.clone()
            set_arg_shardings(variant, self.mesh_name, dict(enumerate(key[1])))
            returned = variant.body.block.last_op
            assert returned is not None
            # a step hands its carries on as it got them; a call's constrained results
            # leave its callee constrained
            kept = {index: key[1][index] for index in range(carries)}
            kept |= {i: c for i, c in enumerate(key[2]) if c is not None}
            partial = [i for i, c in kept.items() if c.partial]
            if partial:  # insert-collectives leaves them partial at the return
                variant.attributes[graph.PARTIAL_RESULTS] = DenseArrayBase.from_list(i64, partial)
            for index, sharding in kept.items():
                value = returned.operands[index]
                constraint = graph.ShardOp.create(
                    operands=[value],
                    result_types=[value.type],
                    properties={"sharding": ShardingAttr.get(self.mesh_name, sharding)},
                )
                Rewriter.insert_op(constraint, InsertPoint.before(returned))
                returned.operands[index] = constraint.results[0]
            _Propagation(self.mesh, self.mesh_name, variant, self).run(self.max_iterations)
            # complete values, but where a constraint keeps a result partial
            layouts = [
                Sharding(value_sharding(variant, v).dims, c.partial if c is not None else ())
                for v, c in zip(returned.operands, _padded(key[2], len(returned.operands)), strict=True)
            ]
            if isinstance(call, graph.ScanOp):
                layouts[carries:] = [Sharding(((), *s.dims), s.partial) for s in layouts[carries:]]
            self.propagated[key] = (variant, layouts)
        return self.propagated[key][1]

    def materialize(self, roots: Sequence[func.FuncOp]) -> None:
        """Each call named after the variant its final operand layouts chose; the
        variants replace the regions in the module."""
        names: dict[_VariantKey, str] = {}
        taken = {name for name in self.functions if name not in {k[0] for k in self.propagated}}
        placed: list[func.FuncOp] = []
        work = list(roots)
        while work:
            function = work.pop()
            for call in function.body.block.ops:
                if not isinstance(call, graph.CallOp | graph.ScanOp) or is_manual(
                    call.callee_function()
                ):
                    continue
                key = self.keys.get(call)
                if key is None:  # a call no operand layout reached: replicated operands
                    operands = [Sharding.replicated(aval(v).rank) for v in call.operands]
                    self.results(call, operands)
                    key = self.key(call, operands)
                if key not in names:
                    base, name, n = key[0], key[0], 0
                    while name in taken:
                        n += 1
                        name = f"{base}_{n}"
                    taken.add(name)
                    names[key] = name
                    variant = self.propagated[key][0]
                    variant.sym_name = StringAttr(name)
                    placed.append(variant)
                    work.append(variant)
                call.properties["callee"] = SymbolRefAttr(names[key])
        block = self.module.body.block
        for key in {k[0] for k in self.propagated}:
            original = self.functions[key]
            if original.parent is block:
                block.erase_op(original)
        for variant in placed:
            block.add_op(variant)


def _padded(constraints: Sequence[Sharding | None], count: int) -> list[Sharding | None]:
    return [*constraints, *[None] * (count - len(constraints))]


def _made_here(value: SSAValue) -> Sharding | None:
    """The layout of a value no propagation reaches that every rank can make alone (a
    constant: replicated), for a call that needs all its operands' layouts; else None."""
    owner = value.owner
    if isinstance(owner, graph.ConstantOp):
        return Sharding.replicated(aval(value).rank)
    return None


@dataclass
class _Choice:
    """An op's choice for the operand layouts and wishes ``key``, with what follows from
    it (computed on first need)."""

    key: tuple[object, ...]
    assignment: Assignment
    results: list[Sharding] | None = None  # the results' layouts
    wants: list[Sharding] | None = None  # the layouts it wants of its operands
    needs: list[Sharding] | None = None  # the layouts it needs its operands in
    # per operand it reads as it is, the layout its context expansion gathers it to
    gathers: list[Sharding | None] | None = None


class _Propagation:
    def __init__(
        self, mesh: Mesh, mesh_name: str, function: func.FuncOp, variants: _Variants | None = None
    ):
        self.mesh = mesh
        self.mesh_name = mesh_name
        self.function = function
        self.variants = variants
        self.calls_seen: dict[Operation, list[Sharding | None]] = {}  # operand layouts
        self.shardings: dict[SSAValue, Sharding] = {}
        self.closed: set[SSAValue] = set()
        self.wanted: dict[SSAValue, Sharding] = {}  # the split a value's users want
        # per value, the layout each user's latest choice needs it in: a move there is
        # made once (insert-collectives shares it), so it is free to the other users
        self.needed: dict[SSAValue, dict[Operation, Sharding]] = {}
        self.choices: dict[Operation, _Choice] = {}  # each op's latest choice
        self.decisions = Decisions(mesh, ReductionPoints())
        for index, arg in enumerate(function.args):
            sharding = arg_sharding(function, index)
            if sharding is not None:
                sharding.validate(
                    mesh, aval(arg).shape, f"argument #{index} of @{function.sym_name.data}"
                )
                self.shardings[arg] = sharding
                self.closed.add(arg)
        self.ops = [o for o in function.body.block.ops if isinstance(o, graph.GraphOp)]

    def run(self, max_iterations: int) -> None:
        for _ in range(max_iterations):
            changed = False
            for op in self.ops:
                changed |= self._forward(op)
            for op in reversed(self.ops):
                changed |= self._backward(op)
            if not changed:
                break
        self._write()

    # --- forward ----------------------------------------------------------------------------

    def _forward(self, op: graph.GraphOp) -> bool:
        if isinstance(op, graph.ShardOp):
            sharding = op.sharding.sharding
            sharding.validate(self.mesh, aval(op.result).shape, f"{op.name} constraint")
            self.closed.add(op.result)
            return self._set(op.result, sharding)
        if isinstance(op, graph.CollectiveOp):
            source = self.shardings.get(op.input)
            if source is None:
                return False
            return self._set(op.result, after_collective(op, source))
        if isinstance(op, graph.CallOp | graph.ScanOp):
            return self._call(op)
        if not has_sharding_rule(op) or not op.operands:
            return False
        known = [self.shardings.get(v) for v in op.operands]
        if all(k is None for k in known):
            return False
        choice = self._choose(op, known)
        self._need(op, choice, known)
        if choice.results is None:
            choice.results = self.decisions.results(op, choice.assignment, known)
        changed = False
        for result, sharding in zip(op.results, choice.results, strict=True):
            changed |= self._set(result, sharding)
        return changed

    def _call(self, op: Caller) -> bool:
        """A call's results take the layouts its callee returns for its operands' layouts
        (once every operand has one)."""
        callee = op.callee_function() if isinstance(op, graph.CallOp) else None
        if is_manual(callee):  # a shard_map: its out_specs, whatever its operands
            assert callee is not None
            changed = False
            for result, spec in zip(op.results, out_specs(callee), strict=True):
                assert spec is not None
                self.closed.add(result)
                changed |= self._set(result, spec)
            return changed
        changed = False
        # constrained results: closed from the start
        constraints = self.variants.constrained(op) if self.variants else op.result_constraints()
        for result, constraint in zip(op.results, constraints, strict=True):
            if constraint is not None and result not in self.closed:
                constraint.validate(self.mesh, aval(result).shape, f"{op.name} constraint")
                self.closed.add(result)
                changed |= self._set(result, constraint)
        known = [self.shardings.get(v) or _made_here(v) for v in op.operands]
        if any(k is None for k in known) or self.variants is None:
            return changed
        if self.calls_seen.get(op) == known:  # nothing new since the last sweep
            return changed
        self.calls_seen[op] = known
        operands = [k for k in known if k is not None]
        for result, sharding in zip(op.results, self.variants.results(op, operands), strict=True):
            changed |= self._set(result, sharding)
        return changed

    # --- backward ---------------------------------------------------------------------------

    def _backward(self, op: graph.GraphOp) -> bool:
        self._want(op)
        open_operands = [v for v in op.operands if v not in self.shardings]
        if not open_operands:
            return False
        if isinstance(op, graph.ShardOp):
            wanted = op.sharding.sharding
            return self._set(op.input, Sharding(wanted.dims))
        if isinstance(op, graph.CallOp) and is_manual(callee := op.callee_function()):
            assert callee is not None
            changed = False
            for value, spec in zip(op.operands, in_specs(callee), strict=True):
                if value not in self.shardings and spec is not None:
                    changed |= self._set(value, spec)
            return changed
        if not has_sharding_rule(op):
            return False
        produced = [self.shardings.get(r) for r in op.results]
        if all(p is None for p in produced):
            return False
        shape = self.decisions.shape(op)
        rule = shape.rule
        assignment: Assignment = {}
        for sharding, dims in zip(produced, rule.results, strict=True):
            if sharding is None:
                continue
            for factor, axes in zip(dims, sharding.dims, strict=True):
                if factor is None or not axes or factor in assignment:
                    continue
                if shape.divides(factor, prod(self.decisions.size(a) for a in axes)):
                    assignment[factor] = axes  # (a concat's operands may not divide)
        # factors no result shows (a contraction's k) split as the forward choice splits them
        known = [self.shardings.get(v) for v in op.operands]
        shown = {f for dims in rule.results for f in dims}
        used = {a for axes in assignment.values() for a in axes}
        for factor, axes in self._choose(op, known).assignment.items():
            if factor not in shown and not used & set(axes):
                assignment[factor] = axes
                used |= set(axes)
        changed = False
        for index, value in enumerate(op.operands):
            if value in self.shardings:
                continue
            changed |= self._set(value, Sharding(shape.required(assignment, index, {}).dims))
        return changed

    def _want(self, op: graph.GraphOp) -> None:
        """Records the splits ``op`` wants of its operands (a constraint's, or what its
        forward choice requires), for their producers to weigh; the first user in program
        order wins (this sweep runs backward)."""
        if isinstance(op, graph.ShardOp):
            self.wanted[op.input] = Sharding(op.sharding.sharding.dims)
            return
        if not has_sharding_rule(op) or not op.operands:
            return
        known = [self.shardings.get(v) for v in op.operands]
        if all(k is None for k in known):
            return
        # the choice of this sweep's forward step (the next one weighs new wishes)
        choice = self.choices.get(op) or self._choose(op, known)
        self._need(op, choice, known)
        if choice.wants is None:
            wanted = [self.wanted.get(r) for r in op.results]
            summed = self._summed_partial(op, wanted)
            if summed:
                wanted = [summed]
            choice.wants = self.decisions.wants(op, choice.assignment, known, wanted)
        for value, want in zip(op.operands, choice.wants, strict=True):
            self.wanted[value] = want

    def _summed_partial(
        self, op: graph.GraphOp, wanted: Sequence[Sharding | None]
    ) -> Sharding | None:
        """For a sum of terms (an op linear in all its operands, such as an add) that
        nobody takes partial yet: its result partial over the mesh axes over which every
        term's producer could leave its term partial without moving an operand (a
        contraction whose operands split its reduction factor there, seen through
        transposes and reshapes), when one reduction of the sum takes less time than what
        the producers' own choices spend to avoid a partial result, as GSPMD reduces
        partial sums once (a tied weight's two gradient terms: one all-reduce, not the
        gathers each contraction would choose alone). Else None."""
        shape = self.decisions.shape(op)
        if shape.policy != "all" or not shape.linear or len(op.operands) < 2:
            return None
        if any(w is not None and w.partial for w in wanted):
            return None
        result = wanted[0] or self.shardings.get(op.results[0])
        if result is None or result.partial:
            return None
        terms = [t for v in op.operands if (t := self._partial_term(v, depth=4)) is not None]
        if len(terms) != len(op.operands):
            return None
        common = set.intersection(*(axes for _, axes in terms))
        common -= {p for p in common if any(p[0] in d for d in result.dims)}
        if not common:
            return None
        partial = tuple(sorted(common))
        summed = Sharding(result.dims, partial)
        once = self.decisions.move_cost(op.results[0], summed, result)
        saved = (0.0, 0.0)
        for producer, _ in terms:
            if producer is not None:
                cost = self._partial_saving(producer, partial)
                saved = (saved[0] + cost[0], saved[1] + cost[1])
        return summed if saved > once else None

    def _partial_term(
        self, value: SSAValue, depth: int
    ) -> tuple[graph.GraphOp | None, set[tuple[str, str]]] | None:
        """The contraction that makes ``value`` (through transposes and reshapes read by
        nothing else) and the (axis, kind) partial sums it could leave it in without
        moving an operand: its reduction factor split alike on every operand; (None, its
        axes) for a value partial already; None where there is no such producer."""
        known = self.shardings.get(value)
        if known is not None and known.partial:
            return None, {p for p in known.partial if KINDS[p[1]].linear}
        producer = value.owner
        if depth == 0 or not value.has_one_use() or not isinstance(producer, graph.GraphOp):
            return None
        if not has_sharding_rule(producer):
            return None
        shape = self.decisions.shape(producer)
        operands = [self.shardings.get(v) for v in producer.operands]
        if not shape.reductions:
            if not shape.linear or len(operands) != 1:
                return None
            return self._partial_term(producer.operands[0], depth - 1)
        kind = shape.rule.reduction_kind
        if not KINDS[kind].linear or len(producer.results) != 1:
            return None
        found: set[tuple[str, str]] = set()
        for factor in shape.reductions:
            splits = set()
            for sharding, factors in zip(operands, shape.operand_factors, strict=True):
                for dim, f in enumerate(factors):
                    if f == factor:
                        splits.add(sharding.dims[dim] if sharding is not None else None)
            if len(splits) == 1 and (axes := next(iter(splits))):
                found |= {(a, kind) for a in axes}
        return (producer, found) if found else None

    def _partial_saving(
        self, producer: graph.GraphOp, partial: tuple[tuple[str, str], ...]
    ) -> tuple[float, float]:
        """What ``producer``'s choice costs (time, bytes) with its users wanting its
        result whole, less what it costs when they take it partial over ``partial``."""
        known = [self.shardings.get(v) for v in producer.operands]
        available = self._available(producer)
        result = self.shardings.get(producer.results[0])
        whole = self.wanted.get(producer.results[0]) or result
        if whole is None:
            return (0.0, 0.0)
        whole = Sharding(whole.dims)
        dims = tuple(tuple(a for a in d if a not in dict(partial)) for d in whole.dims)
        plain = self.decisions.priced_choice(producer, known, [whole], available)
        taken = self.decisions.priced_choice(producer, known, [Sharding(dims, partial)], available)
        return (plain[0] - taken[0], plain[1] - taken[1])

    def _need(self, op: graph.GraphOp, choice: _Choice, known: list[Sharding | None]) -> None:
        """Records the layouts ``op``'s choice needs its operands in (see ``needed``):
        those it reshards them to, or for an operand it reads as it is, the layout the
        expansion of a split ``CONTEXT`` factor gathers it to (``shard-partition`` gathers
        a value once: a move other users share as they share a reshard)."""
        if choice.needs is None:
            choice.needs = self.decisions.needs(op, choice.assignment, known)
            choice.gathers = self.decisions.gathers(op, choice.assignment, known)
        gathers = choice.gathers or [None] * len(choice.needs)
        for value, need, have, gather in zip(
            op.operands, choice.needs, known, gathers, strict=True
        ):
            users = self.needed.setdefault(value, {})
            if have is not None and need == have and gather is not None:
                users[op] = gather
            elif have is None or need == have:
                users.pop(op, None)
            else:
                users[op] = need

    def _available(self, op: graph.GraphOp) -> tuple[frozenset[Sharding], ...]:
        """Per operand of ``op``, the layouts its other users need it moved to; for a
        transpose (the backward's view of a forward value) only those that do not gather
        it (``insert-collectives`` keeps no gathered value for later)."""
        return tuple(
            frozenset(
                n
                for user, n in self.needed.get(v, {}).items()
                if user is not op
                and not (isinstance(op, graph.TransposeOp) and self._gathers(v, n))
            )
            for v in op.operands
        )

    def _gathers(self, value: SSAValue, layout: Sharding) -> bool:
        """Whether moving ``value`` to ``layout`` splits it into fewer pieces."""
        have = self.shardings.get(value)
        if have is None:
            return False
        pieces = [prod(self.decisions.size(a) for d in s.dims for a in d) for s in (have, layout)]
        return pieces[1] < pieces[0]

    def _choose(self, op: graph.GraphOp, known: list[Sharding | None]) -> _Choice:
        """``op_sharding.choose`` for the current operand layouts, wishes and moves other
        users make, computed again only when they changed (each sweep asks for every op's
        choice more than once)."""
        wanted = [self.wanted.get(r) for r in op.results]
        available = self._available(op)
        key = (*known, None, *wanted, None, *available)  # None: operands end, wishes start
        cached = self.choices.get(op)
        if cached is not None and cached.key == key:
            return cached
        assignment = self.decisions.choose(op, known, wanted, available)
        choice = self.choices[op] = _Choice(key, assignment)
        return choice

    # --- state ------------------------------------------------------------------------------

    def _set(self, value: SSAValue, sharding: Sharding) -> bool:
        if value in self.closed and value in self.shardings:
            return False
        if self.shardings.get(value) == sharding:
            return False
        self.shardings[value] = sharding
        return True

    def _write(self) -> None:
        set_arg_shardings(
            self.function,
            self.mesh_name,
            {
                index: self.shardings.get(arg) or Sharding.replicated(aval(arg).rank)
                for index, arg in enumerate(self.function.args)
            },
        )
        for op in self.ops:
            shardings = [
                self.shardings.get(r, Sharding.replicated(aval(r).rank)) for r in op.results
            ]
            set_op_shardings(op, self.mesh_name, shardings)
            if (
                isinstance(op, graph.CallOp | graph.ScanOp)
                and self.variants is not None
                and not is_manual(op.callee_function())
            ):
                operands = [
                    self.shardings.get(v) or Sharding.replicated(aval(v).rank) for v in op.operands
                ]
                key = self.variants.key(op, operands)
                if key in self.variants.propagated:
                    self.variants.keys[op] = key
