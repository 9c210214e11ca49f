"""The VJP rule of every differentiable graph op, by op class.

A rule is ``rule(b, op, cotangents) -> operand cotangents``: ``cotangents`` has one entry
per result of ``op`` (None where no gradient flows), and the rule returns one entry per
operand (None for operands without a gradient, such as integer indices). Rules build the
backward ops with the :class:`~tessera.autodiff.builder.GradBuilder` ``b``; the forward
values (``op.operands``, ``op.results``) can be used freely.
"""

from __future__ import annotations

from collections.abc import Callable

from xdsl.ir import SSAValue

from tessera.autodiff.builder import GradBuilder
from tessera.ir import graph

Cotangents = list[SSAValue | None]
Rule = Callable[[GradBuilder, graph.GraphOp, Cotangents], Cotangents]

VJP_RULES: dict[type[graph.GraphOp], Rule] = {}


def vjp(*op_types: type[graph.GraphOp]) -> Callable[[Rule], Rule]:
    """Registers a rule for ``op_types``."""

    def register(rule: Rule) -> Rule:
        for op_type in op_types:
            VJP_RULES[op_type] = rule
        return rule

    return register


def _load_rules() -> None:
    from tessera.autodiff import rules_elementwise, rules_structure  # noqa: F401


_load_rules()
