"""A parallelism strategy, the cluster it runs on, and the rank layout.

Ranks are laid out as Megatron-LM lays them out: ``tp`` innermost (consecutive ranks, one
NVLink domain), then ``cp``, then ``dp``, then ``pp`` outermost; expert parallelism takes
``ep`` consecutive data-parallel ranks. ``dp · tp · pp · cp`` is the GPU count.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from tessera.errors import TesseraError
from tessera.topology import Link, Topology, dgx_a100, dgx_h100, dgx_h800, gb200_nvl72

SCHEDULES = ("1f1b", "interleaved", "zb-h1", "gpipe")
REMAT = ("none", "full")
PRECISIONS = ("bf16", "fp8")
ZERO_STAGES = (0, 1, 2, 3)
CLUSTERS = ("dgx_h100", "gb200_nvl72", "dgx_a100", "dgx_h800")


@dataclass(frozen=True)
class Strategy:
    """How one training step is split over the GPUs."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    zero: int = 1
    micro_batch: int = 1  # sequences per microbatch per data-parallel rank
    schedule: str = "1f1b"
    virtual: int = 1  # model chunks per pipeline rank (interleaved)
    remat: str = "none"
    precision: str = "bf16"
    sp: bool = True  # sequence parallelism with tp (Korthikanti et al. 2022)
    # each microbatch's expert all-to-alls overlapped with another microbatch's compute
    # (DualPipe's paired forward and backward chunks, DeepSeek-V3 report §3.2.1). Priced for
    # published runs; Tessera's pipeline does not run it, so the search never offers it
    moe_overlap: bool = False

    @property
    def gpus(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    def microbatches(self, global_batch: int) -> int:
        return global_batch // (self.dp * self.micro_batch)

    def label(self) -> str:
        sched = (
            ""
            if self.pp == 1
            else f" {self.schedule}"
            + (f"x{self.virtual}" if self.schedule == "interleaved" else "")
        )
        ep = f" ep{self.ep}" if self.ep > 1 else ""
        return (
            f"dp{self.dp} tp{self.tp} pp{self.pp} cp{self.cp}{ep} z{self.zero} "
            f"mb{self.micro_batch}{sched}{' sp' if self.sp and self.tp > 1 else ''} "
            f"{self.remat} {self.precision}{' a2a-overlap' if self.moe_overlap else ''}"
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def cluster_topology(name: str, gpus: int) -> Topology:
    """``gpus`` GPUs of cluster preset ``name`` as one topology (whole nodes or racks)."""
    if gpus < 1:
        raise TesseraError(f"--gpus must be at least 1, got {gpus}")
    if name == "dgx_h100":
        return dgx_h100(nodes=-(-gpus // 8))
    if name == "dgx_a100":
        return dgx_a100(nodes=-(-gpus // 8))
    if name == "dgx_h800":
        return dgx_h800(nodes=-(-gpus // 8))
    if name == "gb200_nvl72":
        rack = gb200_nvl72()
        racks = -(-gpus // 72)
        if racks == 1:
            return rack
        levels = (*rack.levels, Link("infiniband", 72 * racks, 6e-6, 50e9))
        sources = dict(rack.sources)
        sources["levels[2].bandwidth"] = (
            "one 400 Gb/s ConnectX-7 per GPU between racks = 50e9 B/s per direction: "
            "typical assumption, not a datasheet figure"
        )
        return Topology(
            f"gb200_nvl72x{racks}", 72 * racks, rack.device, levels, rack.sharp, sources
        )
    raise TesseraError(f"unknown cluster {name!r}; clusters: {', '.join(CLUSTERS)}")


def rank_of(strategy: Strategy, tp: int = 0, cp: int = 0, dp: int = 0, pp: int = 0) -> int:
    """The global rank at these coordinates."""
    s = strategy
    return ((pp * s.dp + dp) * s.cp + cp) * s.tp + tp


def dp_group(strategy: Strategy, size: int | None = None) -> list[int]:
    """Ranks of the first data-parallel group (``size`` consecutive dp ranks)."""
    return [rank_of(strategy, dp=d) for d in range(size or strategy.dp)]
