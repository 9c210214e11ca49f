"""Performance models: topologies, collective and compute costs, the schedule simulator.

:mod:`tessera.perf.topology` describes machines (devices, interconnect levels, SHARP) with
documented preset numbers; :mod:`tessera.perf.collective_cost` prices collectives with the
alpha-beta model.
"""

from tessera.perf.collective_cost import (
    ALGORITHMS,
    COLLECTIVE_KINDS,
    CollectiveCost,
    algorithms_for,
    collective_time,
)
from tessera.perf.topology import (
    PRESETS,
    Device,
    Link,
    Sharp,
    Topology,
    dgx_h100,
    gb200_nvl72,
    load_topology,
    single_gpu,
)

__all__ = [
    "ALGORITHMS",
    "COLLECTIVE_KINDS",
    "PRESETS",
    "CollectiveCost",
    "Device",
    "Link",
    "Sharp",
    "Topology",
    "algorithms_for",
    "collective_time",
    "dgx_h100",
    "gb200_nvl72",
    "load_topology",
    "single_gpu",
]
