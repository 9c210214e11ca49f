"""Op definitions: everything the compiler knows about each graph op, in one place.

Each family module declares, together, its ops' sharding rule, linearity, VJP, torch
reference, tile code and fusion class (:func:`tessera.opdefs.registry.register`); importing
this package registers every op. Passes, codegen, backends and autodiff look ops up with
:func:`op_def` instead of keeping their own per-op tables.
"""

from __future__ import annotations

from tessera.opdefs import (  # noqa: F401  (registers the ops)
    attention,
    collective,
    constant,
    contraction,
    dynamic_update_slice,
    elementwise,
    indexing,
    iota,
    layout,
    moe,
    normalization,
    random,
    rank,
    reduction,
    top_k,
    wait,
)
from tessera.opdefs.registry import (
    LOCAL,
    NOT_LINEAR,
    Fusion,
    IndexMap,
    Kernel,
    LayoutTransition,
    NotApplicable,
    OpDef,
    Partition,
    Pointwise,
    RankIndexMap,
    RankReference,
    RowReduction,
    bind_reference,
    bound,
    fusion_of,
    has_sharding_rule,
    lookup,
    op_def,
    register,
    registered,
    sharding_rule,
)

__all__ = [
    "LOCAL",
    "NOT_LINEAR",
    "Fusion",
    "IndexMap",
    "Kernel",
    "LayoutTransition",
    "NotApplicable",
    "OpDef",
    "Partition",
    "Pointwise",
    "RankIndexMap",
    "RankReference",
    "RowReduction",
    "bind_reference",
    "bound",
    "fusion_of",
    "has_sharding_rule",
    "lookup",
    "op_def",
    "register",
    "registered",
    "sharding_rule",
]
