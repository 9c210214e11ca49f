"""Building graph ops in place, for passes that rewrite one op into several."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from xdsl.ir import Operation, SSAValue
from xdsl.rewriter import InsertPoint, Rewriter

from tessera.ir import graph


class GraphEmitter:
    """Builds graph ops (types from their shape rules) before ``anchor``."""

    def __init__(self, anchor: Operation):
        self.anchor = anchor

    def __call__(
        self, op_type: type[graph.GraphOp], operands: Sequence[SSAValue], **attrs: Any
    ) -> SSAValue:
        op = graph.build(op_type, operands, **attrs)
        Rewriter.insert_op(op, InsertPoint.before(self.anchor))
        return op.results[0]
