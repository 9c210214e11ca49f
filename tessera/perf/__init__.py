"""Performance models: topologies, collective and compute costs, the schedule simulator.

:mod:`tessera.topology` describes machines (devices, interconnect levels, SHARP) with
documented preset numbers; :mod:`tessera.perf.collective_cost` prices collectives with the
alpha-beta model; :mod:`tessera.perf.compute_cost` prices kernels (a roofline);
:mod:`tessera.perf.simulate` runs a scheduled program on a topology (``lowered.simulate``);
:mod:`tessera.perf.timeline` records real runs (``record_timeline``) in the same trace format.
"""

from tessera.perf.collective_cost import (
    ALGORITHMS,
    COLLECTIVE_OPERATIONS,
    CollectiveCost,
    algorithms_for,
    collective_time,
)
from tessera.perf.compute_cost import compute_time, kernel_time
from tessera.perf.simulate import Simulation, simulate
from tessera.perf.timeline import Timeline, record_timeline
from tessera.perf.trace import Event
from tessera.topology import (
    PRESETS,
    Device,
    Link,
    Sharp,
    Topology,
    dgx_a100,
    dgx_h100,
    dgx_h800,
    gb200_nvl72,
    load_topology,
    single_gpu,
)

__all__ = [
    "ALGORITHMS",
    "COLLECTIVE_OPERATIONS",
    "PRESETS",
    "CollectiveCost",
    "Device",
    "Event",
    "Link",
    "Sharp",
    "Simulation",
    "Timeline",
    "Topology",
    "algorithms_for",
    "collective_time",
    "compute_time",
    "dgx_a100",
    "dgx_h100",
    "dgx_h800",
    "gb200_nvl72",
    "kernel_time",
    "load_topology",
    "record_timeline",
    "simulate",
    "single_gpu",
]
