"""The alpha-beta cost model of collectives: :mod:`tessera.analysis.collective_cost`
(defined below the passes' layer, so that the sharding decisions price moves with it)."""

from tessera.analysis.collective_cost import (
    ALGORITHMS,
    COLLECTIVE_OPERATIONS,
    CollectiveCost,
    algorithms_for,
    collective_time,
    groups_time,
)

__all__ = [
    "ALGORITHMS",
    "COLLECTIVE_OPERATIONS",
    "CollectiveCost",
    "algorithms_for",
    "collective_time",
    "groups_time",
]
