"""Machine descriptions for the performance models: devices, interconnect levels, presets.

A :class:`Topology` is ``num_devices`` identical devices (rank ``r`` runs on device ``r``)
joined by a hierarchy of :class:`Link` levels, innermost first: level ``i`` joins groups of
``levels[i].group_size`` consecutive ranks. An optional :class:`Sharp` describes in-network
reduction (NVLink SHARP). Every number of a preset names its origin in ``Topology.sources``.

Presets: :func:`single_gpu`, :func:`dgx_h100` (``nodes=``), :func:`gb200_nvl72`; a custom
machine is built directly, e.g.
``Topology("my_box", 4, device, (Link("pcie", 4, 10e-6, 25e9),))``.
:func:`load_topology` takes a preset name (``"dgx_h100x4"``, ``"dgx_h100(nodes=4)"``) or a
JSON file: a full topology (:meth:`Topology.to_json`) or measured overrides of a preset::

    {"base": "dgx_h100", "device": {"memory_bandwidth": 3.0e12}, "levels": [{"bandwidth": 4.0e11}]}
"""

from __future__ import annotations

import dataclasses
import json
import operator
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tessera.errors import TesseraError

MATMUL_DTYPES = ("f32", "bf16", "f16", "fp8")  # fp8: only devices with FP8 tensor cores


def _require_positive(owner: str, **values: float) -> None:
    for name, value in values.items():
        if not value > 0:
            raise TesseraError(f"{owner}.{name} must be positive, got {value!r}")


@dataclass(frozen=True)
class Link:
    """One level of the interconnect: the devices of a group of ``group_size`` consecutive
    ranks talk over it."""

    name: str
    group_size: int  # consecutive ranks sharing this level (8 for a DGX node)
    latency_s: float  # alpha: seconds per message step
    bandwidth: float  # bytes/s per device, per direction (beta = 1 / bandwidth)

    def __post_init__(self) -> None:
        if not isinstance(self.group_size, int) or self.group_size < 1:
            raise TesseraError(
                f"Link {self.name!r}: group_size must be an int >= 1, got {self.group_size!r}"
            )
        if self.latency_s < 0:
            raise TesseraError(
                f"Link {self.name!r}: latency_s must be >= 0, got {self.latency_s!r}"
            )
        _require_positive(f"Link {self.name!r}", bandwidth=self.bandwidth)


@dataclass(frozen=True)
class Sharp:
    """In-network reduction (NVLink SHARP / NVLS): all_reduce in about one switch pass."""

    level: int  # the highest index into Topology.levels whose groups the switch can reduce
    latency_s: float
    bandwidth: float  # bytes/s per device, each of send and receive
    min_bytes: int  # smaller messages use ring/tree
    max_bytes: int  # larger ones fall back too

    def __post_init__(self) -> None:
        if self.latency_s < 0:
            raise TesseraError(f"Sharp.latency_s must be >= 0, got {self.latency_s!r}")
        _require_positive("Sharp", bandwidth=self.bandwidth)
        if not 0 <= self.min_bytes <= self.max_bytes:
            raise TesseraError(
                f"Sharp.min_bytes/max_bytes must satisfy 0 <= min_bytes <= max_bytes, "
                f"got {self.min_bytes!r} and {self.max_bytes!r}"
            )


@dataclass(frozen=True)
class Device:
    """One accelerator: peak matmul rates, memory system and kernel launch cost."""

    name: str
    matmul_flops: dict[str, float]  # peak dense FLOP/s by dtype name: f32, bf16, f16 (, fp8)
    matmul_efficiency: float  # fraction of peak that large matmuls reach
    memory_bandwidth: float  # HBM bytes/s
    memory_efficiency: float  # fraction of memory_bandwidth memory-bound kernels reach
    memory_bytes: int  # HBM capacity
    launch_overhead_s: float  # per kernel launch

    def __post_init__(self) -> None:
        owner = f"Device {self.name!r}"
        for dtype, flops in self.matmul_flops.items():
            if dtype not in MATMUL_DTYPES:
                raise TesseraError(
                    f"{owner}: matmul_flops has unknown dtype {dtype!r}; "
                    f"valid: {', '.join(MATMUL_DTYPES)}"
                )
            _require_positive(owner, **{f"matmul_flops[{dtype}]": flops})
        _require_positive(
            owner,
            memory_bandwidth=self.memory_bandwidth,
            memory_bytes=self.memory_bytes,
            matmul_efficiency=self.matmul_efficiency,
            memory_efficiency=self.memory_efficiency,
        )
        for name in ("matmul_efficiency", "memory_efficiency"):
            if getattr(self, name) > 1:
                raise TesseraError(f"{owner}.{name} must be in (0, 1], got {getattr(self, name)!r}")
        if self.launch_overhead_s < 0:
            raise TesseraError(
                f"{owner}.launch_overhead_s must be >= 0, got {self.launch_overhead_s!r}"
            )


@dataclass(frozen=True)
class Topology:
    """``num_devices`` copies of ``device`` joined by ``levels`` (innermost first)."""

    name: str
    num_devices: int
    device: Device
    levels: tuple[Link, ...]  # each group_size divides the next; the last is num_devices
    sharp: Sharp | None = None
    # constant path ("device.memory_bandwidth", "levels[0].bandwidth", ...) -> its origin
    sources: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        owner = f"Topology {self.name!r}"
        if not isinstance(self.num_devices, int) or self.num_devices < 1:
            raise TesseraError(
                f"{owner}: num_devices must be an int >= 1, got {self.num_devices!r}"
            )
        object.__setattr__(self, "levels", tuple(self.levels))
        if not self.levels and self.num_devices != 1:
            raise TesseraError(f"{owner}: levels is empty but num_devices is {self.num_devices}")
        for index in range(1, len(self.levels)):
            inner, outer = self.levels[index - 1].group_size, self.levels[index].group_size
            if outer % inner:
                raise TesseraError(
                    f"{owner}: levels[{index}].group_size {outer} is not a multiple of "
                    f"levels[{index - 1}].group_size {inner}"
                )
        if self.levels and self.levels[-1].group_size != self.num_devices:
            raise TesseraError(
                f"{owner}: levels[-1].group_size {self.levels[-1].group_size} must equal "
                f"num_devices {self.num_devices}"
            )
        if self.sharp is not None and not 0 <= self.sharp.level < len(self.levels):
            raise TesseraError(
                f"{owner}: sharp.level {self.sharp.level} is not a level index "
                f"in [0, {len(self.levels)})"
            )

    def check_ranks(self, ranks: Sequence[int]) -> list[int]:
        """``ranks`` as ints; a TesseraError if it is empty or a rank is outside the machine."""
        checked = [operator.index(rank) for rank in ranks]
        if not checked:
            raise TesseraError(f"Topology {self.name!r}: empty group of ranks")
        for rank in checked:
            if not 0 <= rank < self.num_devices:
                raise TesseraError(
                    f"Topology {self.name!r}: rank {rank} is outside [0, {self.num_devices})"
                )
        return checked

    def level_of(self, ranks: Sequence[int]) -> int:
        """Index of the smallest level one of whose groups holds all ``ranks``."""
        checked = self.check_ranks(ranks)
        if not self.levels:
            raise TesseraError(f"Topology {self.name!r} has one device and no interconnect levels")
        for index, link in enumerate(self.levels):
            if len({rank // link.group_size for rank in checked}) == 1:
                return index
        raise AssertionError("the last level holds every rank")

    def group_counts(self, ranks: Sequence[int]) -> list[int]:
        """How many of ``ranks`` lie in each occupied group of the level just inside
        ``level_of(ranks)``, in group order; ``[len(ranks)]`` when that is level 0.

        A group spanning level ``L > 0`` is a two-level group of ``counts[0]`` members per
        inner group and ``len(counts)`` inner groups when all counts are equal.
        """
        level = self.level_of(ranks)
        if level == 0:
            return [len(ranks)]
        inner_size = self.levels[level - 1].group_size
        counts: dict[int, int] = {}
        for rank in ranks:
            counts[rank // inner_size] = counts.get(rank // inner_size, 0) + 1
        return [counts[group] for group in sorted(counts)]

    def spec(self) -> str:
        """The text :func:`load_topology` rebuilds this topology from: its preset name
        (``"gb200_nvl72"``, ``"dgx_h100x4"``) when that preset is it, else its JSON."""
        try:
            if load_topology(self.name) == self:
                return self.name
        except TesseraError:
            pass
        return json.dumps(dataclasses.asdict(self), separators=(",", ":"))

    def to_json(self) -> str:
        """The topology as JSON text (read back by :meth:`from_json`)."""
        return json.dumps(dataclasses.asdict(self), indent=2)

    @classmethod
    def from_json(cls, text_or_path: str | os.PathLike[str]) -> Topology:
        """A topology from JSON text or a JSON file: a full topology, or ``base`` (a preset
        name or file) with overrides as in :meth:`with_overrides`."""
        source = "override"
        if isinstance(text_or_path, os.PathLike) or not text_or_path.lstrip().startswith("{"):
            path = Path(text_or_path)
            try:
                text = path.read_text()
            except OSError as error:
                raise TesseraError(f"cannot read topology file {str(path)!r}: {error}") from None
            source = f"override from {path}"
        else:
            text = text_or_path
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            raise TesseraError(f"topology JSON is not valid: {error}") from None
        if not isinstance(data, dict):
            raise TesseraError("topology JSON must be an object")
        if "base" in data:
            base = data.pop("base")
            return load_topology(base).with_overrides(data, source=source)
        return _topology_from_dict(data)

    def with_overrides(self, overrides: dict[str, Any], source: str = "override") -> Topology:
        """A copy with measured numbers replaced: ``device`` and ``sharp`` fields by name,
        ``levels`` merged by index, plus ``name``, ``num_devices`` and ``sources``.
        Each overridden path's ``sources`` entry becomes ``source``."""
        data = dataclasses.asdict(self)
        sources = dict(self.sources)
        for key, value in overrides.items():
            if key in ("name", "num_devices"):
                data[key] = value
                sources[key] = source
            elif key == "device":
                _merge(data["device"], value, "device", sources, source)
            elif key == "levels":
                if not isinstance(value, list) or len(value) > len(self.levels):
                    raise TesseraError(
                        f"override 'levels' must be a list of at most {len(self.levels)} objects "
                        f"(merged by index), got {value!r}"
                    )
                for index, level in enumerate(value):
                    _merge(data["levels"][index], level, f"levels[{index}]", sources, source)
            elif key == "sharp":
                if value is None or data["sharp"] is None:
                    data["sharp"] = value
                    for name in value or {}:
                        sources[f"sharp.{name}"] = source
                else:
                    _merge(data["sharp"], value, "sharp", sources, source)
            elif key != "sources":
                raise TesseraError(
                    f"unknown override key {key!r}; "
                    "valid: name, num_devices, device, levels, sharp, sources"
                )
        sources.update(overrides.get("sources", {}))
        data["sources"] = sources
        return _topology_from_dict(data)


def _merge(
    target: dict[str, Any], updates: Any, prefix: str, sources: dict[str, str], source: str
) -> None:
    if not isinstance(updates, dict):
        raise TesseraError(f"override {prefix!r} must be an object, got {updates!r}")
    for key, value in updates.items():
        if key not in target:
            raise TesseraError(f"unknown override key '{prefix}.{key}'; valid: {', '.join(target)}")
        if key == "matmul_flops" and isinstance(value, dict):
            target[key] = {**target[key], **value}
            sources.update({f"{prefix}.{key}.{dtype}": source for dtype in value})
        else:
            target[key] = value
            sources[f"{prefix}.{key}"] = source


def _build(cls: type, data: Any, where: str) -> Any:
    if not isinstance(data, dict):
        raise TesseraError(f"topology JSON: {where} must be an object, got {data!r}")
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = [key for key in data if key not in names]
    if unknown:
        raise TesseraError(
            f"topology JSON: unknown key '{where}.{unknown[0]}'; valid: {', '.join(names)}"
        )
    required = [
        f.name
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    missing = [name for name in required if name not in data]
    if missing:
        raise TesseraError(f"topology JSON: {where} is missing {', '.join(missing)}")
    try:
        return cls(**data)
    except TypeError as error:  # a string where a number belongs, and the like
        raise TesseraError(f"topology JSON: bad value in {where}: {error}") from None


def _topology_from_dict(data: dict[str, Any]) -> Topology:
    fields = dict(data)
    fields["device"] = _build(Device, data.get("device"), "device")
    levels = data.get("levels", [])
    if not isinstance(levels, (list, tuple)):
        raise TesseraError(f"topology JSON: levels must be a list, got {levels!r}")
    fields["levels"] = tuple(_build(Link, level, f"levels[{i}]") for i, level in enumerate(levels))
    if data.get("sharp") is not None:
        fields["sharp"] = _build(Sharp, data["sharp"], "sharp")
    return _build(Topology, fields, "topology")


# ---- presets ----

H100_URL = "https://www.nvidia.com/en-us/data-center/h100/ (H100 Tensor Core GPU datasheet, SXM)"
DGX_H100_URL = "https://docs.nvidia.com/dgx/dgxh100-user-guide/introduction-to-dgxh100.html"
GB200_URL = "https://www.nvidia.com/en-us/data-center/gb200-nvl72/ (GB200 NVL72 datasheet)"
NVL72_GUIDE = "Tessera NVL72 Programming Guide (seed 000_f15d06448aac3e46)"
ASSUMED = "typical assumption, not a datasheet figure; override with measured numbers"


def _h100_sxm() -> tuple[Device, dict[str, str]]:
    device = Device(
        name="H100 SXM5 80GB",
        matmul_flops={"bf16": 989e12, "f16": 989e12, "f32": 494e12, "fp8": 1978e12},
        matmul_efficiency=0.7,
        memory_bandwidth=3.35e12,
        memory_efficiency=0.8,
        memory_bytes=80 * 10**9,
        launch_overhead_s=4e-6,
    )
    sources = {
        "device.matmul_flops.bf16": (
            f"{H100_URL}: BF16 Tensor Core 1,979 TFLOPS with sparsity = 989 dense"
        ),
        "device.matmul_flops.f16": (
            f"{H100_URL}: FP16 Tensor Core 1,979 TFLOPS with sparsity = 989 dense"
        ),
        "device.matmul_flops.fp8": (
            f"{H100_URL}: FP8 Tensor Core 3,958 TFLOPS with sparsity = 1,979 dense (1,978: twice the BF16 989 above)"
        ),
        "device.matmul_flops.f32": (
            f"{H100_URL}: TF32 Tensor Core 989 TFLOPS with sparsity = 494 dense; f32 matmuls are "
            "assumed to run on TF32 tensor cores (non-tensor FP32 is 67 TFLOPS)"
        ),
        "device.matmul_efficiency": f"~70% of peak for large GEMMs: {ASSUMED}",
        "device.memory_bandwidth": f"{H100_URL}: HBM3 3.35 TB/s",
        "device.memory_efficiency": f"~80% of HBM peak for memory-bound kernels: {ASSUMED}",
        "device.memory_bytes": f"{H100_URL}: 80 GB HBM3",
        "device.launch_overhead_s": f"~4 us per kernel launch: {ASSUMED}",
    }
    return device, sources


def single_gpu() -> Topology:
    """One H100 SXM, no interconnect."""
    device, sources = _h100_sxm()
    return Topology("single_gpu", 1, device, (), sources={"num_devices": "one GPU", **sources})


def dgx_h100(nodes: int = 1) -> Topology:
    """``nodes`` DGX H100 systems: 8 H100 SXM per node on NVSwitch, InfiniBand between nodes,
    NVLink SHARP within a node."""
    if not isinstance(nodes, int) or nodes < 1:
        raise TesseraError(f"dgx_h100: nodes must be an int >= 1, got {nodes!r}")
    device, sources = _h100_sxm()
    levels = [Link("nvlink", 8, 3e-6, 450e9)]
    sources.update(
        {
            "num_devices": f"8 GPUs per DGX H100 ({DGX_H100_URL}) x {nodes} node(s)",
            "levels[0].group_size": f"{DGX_H100_URL}: 8 H100 GPUs per system on 4 NVSwitch chips",
            "levels[0].latency_s": f"~3 us NCCL small-message latency over NVLink: {ASSUMED}",
            "levels[0].bandwidth": (
                f"{H100_URL}: NVLink 900 GB/s bidirectional per GPU = 450e9 B/s per direction"
            ),
            "sharp.level": (
                f"{DGX_H100_URL}: third-generation NVSwitch does NVLink SHARP (NVLS) within a node"
            ),
            "sharp.latency_s": f"taken equal to the NVLink latency (3 us): {ASSUMED}",
            "sharp.bandwidth": (
                f"ideal: each GPU sends and receives S once at the NVLink rate 450e9 B/s; {ASSUMED}"
            ),
            "sharp.min_bytes": (
                f"no DGX figure; the {NVL72_GUIDE} SHARPConfig min_message_size 256KB"
            ),
            "sharp.max_bytes": (
                f"no DGX figure; the {NVL72_GUIDE} SHARPConfig max_message_size 128MB"
            ),
        }
    )
    if nodes > 1:
        levels.append(Link("infiniband", 8 * nodes, 6e-6, 50e9))
        sources.update(
            {
                "levels[1].group_size": "all GPUs of all nodes",
                "levels[1].latency_s": (
                    f"~6 us NCCL small-message latency over InfiniBand: {ASSUMED}"
                ),
                "levels[1].bandwidth": (
                    f"{DGX_H100_URL}: 8 x ConnectX-7 400 Gb/s InfiniBand per node, one per GPU "
                    "= 50e9 B/s per GPU per direction"
                ),
            }
        )
    sharp = Sharp(
        level=0, latency_s=3e-6, bandwidth=450e9, min_bytes=256 * 1024, max_bytes=128 * 1024**2
    )
    name = "dgx_h100" if nodes == 1 else f"dgx_h100x{nodes}"
    return Topology(name, 8 * nodes, device, tuple(levels), sharp, sources)


def gb200_nvl72() -> Topology:
    """A GB200 NVL72 rack: 72 B200 GPUs as 9 NVSwitch domains of 8, SHARP over the fabric."""
    device = Device(
        name="B200 (GB200 NVL72)",
        matmul_flops={"bf16": 2.5e15, "f16": 2.5e15, "f32": 1.25e15, "fp8": 5e15},
        matmul_efficiency=0.7,
        memory_bandwidth=8e12,
        memory_efficiency=0.8,
        memory_bytes=144 * 10**9,
        launch_overhead_s=4e-6,
    )
    levels = (Link("nvlink", 8, 2e-6, 900e9), Link("nvl72-inter-domain", 72, 5e-6, 450e9))
    sharp = Sharp(
        level=1, latency_s=5e-6, bandwidth=900e9, min_bytes=256 * 1024, max_bytes=128 * 1024**2
    )
    sources = {
        "num_devices": f"{NVL72_GUIDE}, Key Specifications: 72 GPUs",
        "device.matmul_flops.bf16": (
            f"{GB200_URL}: FP16/BF16 Tensor Core 360 PFLOPS per rack with sparsity "
            "= 180 dense / 72 GPUs = 2.5e15"
        ),
        "device.matmul_flops.f16": f"{GB200_URL}: as BF16, 2.5e15 dense per GPU",
        "device.matmul_flops.fp8": (
            f"{GB200_URL}: FP8/FP6 Tensor Core 720 PFLOPS per rack with sparsity "
            "= 360 dense / 72 GPUs = 5e15"
        ),
        "device.matmul_flops.f32": (
            f"{GB200_URL}: TF32 Tensor Core 180 PFLOPS per rack with sparsity = 90 dense / 72 "
            "= 1.25e15; f32 matmuls are assumed to run on TF32 tensor cores"
        ),
        "device.matmul_efficiency": f"~70% of peak for large GEMMs: {ASSUMED}",
        "device.memory_bandwidth": f"{GB200_URL}: HBM3e 576 TB/s per rack / 72 GPUs = 8 TB/s",
        "device.memory_efficiency": f"~80% of HBM peak for memory-bound kernels: {ASSUMED}",
        "device.memory_bytes": f"{NVL72_GUIDE}, Key Specifications: 144GB HBM3e per GPU",
        "device.launch_overhead_s": f"~4 us per kernel launch: {ASSUMED}",
        "levels[0].group_size": f"{NVL72_GUIDE}, Key Specifications: 9 NVSwitch domains x 8 GPUs",
        "levels[0].latency_s": f"{NVL72_GUIDE}, Communication Hierarchy: INTRA_DOMAIN latency 2 us",
        "levels[0].bandwidth": (
            f"{NVL72_GUIDE}, Communication Hierarchy: INTRA_DOMAIN 900 GB/s "
            f"(NVLink 5: 1.8 TB/s bidirectional per GPU, {GB200_URL})"
        ),
        "levels[1].group_size": f"{NVL72_GUIDE}: all 72 GPUs",
        "levels[1].latency_s": f"{NVL72_GUIDE}, Communication Hierarchy: INTER_DOMAIN latency 5 us",
        "levels[1].bandwidth": (
            f"{NVL72_GUIDE}, Communication Hierarchy: INTER_DOMAIN 450 GB/s effective per GPU"
        ),
        "sharp.level": (
            f"{NVL72_GUIDE}: SHARP in-network reductions over the NVSwitch fabric (all 72 GPUs)"
        ),
        "sharp.latency_s": (
            f"one pass through the fabric at the guide's inter-domain latency, 5 us: {ASSUMED}"
        ),
        "sharp.bandwidth": (
            f"ideal: S sent and received once at the NVLink rate 900 GB/s: {ASSUMED}"
        ),
        "sharp.min_bytes": f"{NVL72_GUIDE}, SHARP In-Network Reductions: min_message_size 256KB",
        "sharp.max_bytes": f"{NVL72_GUIDE}, SHARP In-Network Reductions: max_message_size 128MB",
    }
    return Topology("gb200_nvl72", 72, device, levels, sharp, sources)


A100_URL = (
    "https://www.nvidia.com/en-us/data-center/a100/ (A100 Tensor Core GPU datasheet, SXM4 80GB)"
)
DGX_A100_URL = "https://docs.nvidia.com/dgx/dgxa100-user-guide/introduction-to-dgxa100.html"
DEEPSEEK_V3 = "DeepSeek-AI 2024, 'DeepSeek-V3 Technical Report' (arXiv 2412.19437)"


def _dgx(
    name: str, nodes: int, device: Device, nvlink: float, infiniband: float,
    sources: dict[str, str], nvlink_source: str, infiniband_source: str, gpu: str,
) -> Topology:  # fmt: skip
    """``nodes`` 8-GPU NVSwitch nodes (no NVLink SHARP) on an InfiniBand fabric."""
    if not isinstance(nodes, int) or nodes < 1:
        raise TesseraError(f"{name}: nodes must be an int >= 1, got {nodes!r}")
    levels = [Link("nvlink", 8, 3e-6, nvlink)]
    sources = {
        **sources,
        "num_devices": f"8 {gpu} GPUs per node x {nodes} node(s)",
        "levels[0].group_size": f"8 {gpu} GPUs per node on NVSwitch",
        "levels[0].latency_s": f"~3 us NCCL small-message latency over NVLink: {ASSUMED}",
        "levels[0].bandwidth": nvlink_source,
    }
    if nodes > 1:
        levels.append(Link("infiniband", 8 * nodes, 6e-6, infiniband))
        sources.update(
            {
                "levels[1].group_size": "all GPUs of all nodes",
                "levels[1].latency_s": f"~6 us NCCL small-message latency over InfiniBand: {ASSUMED}",
                "levels[1].bandwidth": infiniband_source,
            }
        )
    return Topology(name if nodes == 1 else f"{name}x{nodes}", 8 * nodes, device, tuple(levels),
                    None, sources)  # fmt: skip


A100_CALIBRATED_EFFICIENCY = 0.59


def dgx_a100(nodes: int = 1) -> Topology:
    """``nodes`` DGX A100 80GB (Selene, as in Narayanan et al. 2021): 8 A100 per node on
    NVSwitch, 8 HDR InfiniBand 200 Gb/s per node, no NVLink SHARP."""
    device = Device(
        name="A100 SXM4 80GB",
        matmul_flops={"bf16": 312e12, "f16": 312e12, "f32": 156e12},
        matmul_efficiency=A100_CALIBRATED_EFFICIENCY,
        memory_bandwidth=2.039e12,
        memory_efficiency=0.8,
        memory_bytes=80 * 10**9,
        launch_overhead_s=4e-6,
    )
    sources = {
        "device.matmul_flops.bf16": f"{A100_URL}: BF16 Tensor Core 312 TFLOPS dense",
        "device.matmul_flops.f16": f"{A100_URL}: FP16 Tensor Core 312 TFLOPS dense",
        "device.matmul_flops.f32": f"{A100_URL}: TF32 Tensor Core 156 TFLOPS dense",
        "device.matmul_efficiency": (
            "calibrated, one number for the generation: the value at which tessera plan's "
            "predictions for the six published A100 runs of benchmarks/planner.py "
            "(Narayanan et al. 2021 Table 1, Korthikanti et al. 2022) err by ~0 on average "
            "(at the uncalibrated 0.7 they were 1-22% optimistic). It stands for everything "
            "the simulator leaves out on that software stack (kernel gaps, framework and "
            "optimizer overheads), not a GEMM measurement"
        ),
        "device.memory_bandwidth": f"{A100_URL}: HBM2e 2,039 GB/s",
        "device.memory_efficiency": f"~80% of HBM peak for memory-bound kernels: {ASSUMED}",
        "device.memory_bytes": f"{A100_URL}: 80 GB HBM2e",
        "device.launch_overhead_s": f"~4 us per kernel launch: {ASSUMED}",
    }
    return _dgx(
        "dgx_a100", nodes, device, 300e9, 25e9, sources,
        f"{A100_URL}: NVLink 600 GB/s bidirectional per GPU = 300e9 B/s per direction",
        f"{DGX_A100_URL}: 8 x HDR 200 Gb/s InfiniBand per node, one per GPU = 25e9 B/s",
        "A100",
    )  # fmt: skip


def dgx_h800(nodes: int = 1) -> Topology:
    """``nodes`` 8-GPU H800 nodes as DeepSeek-V3 was trained on: the H100's compute and
    memory with NVLink cut to 400 GB/s (160 GB/s achieved, per the DeepSeek-V3 report),
    one 400 Gb/s InfiniBand NIC per GPU (50 GB/s), no NVLink SHARP assumed."""
    device, sources = _h100_sxm()
    device = dataclasses.replace(device, name="H800 SXM5 80GB")
    for key in list(sources):
        sources[key] = sources[key] + " (H800: the H100's compute and memory)"
    return _dgx(
        "dgx_h800", nodes, device, 160e9, 50e9, sources,
        f"{DEEPSEEK_V3}, §3.2.2: NVLink 160 GB/s achieved per GPU (H800 NVLink 400 GB/s "
        "bidirectional)",
        f"{DEEPSEEK_V3}, §3.2.2: InfiniBand 50 GB/s per GPU",
        "H800",
    )  # fmt: skip


PRESETS: dict[str, Callable[..., Topology]] = {
    "single_gpu": single_gpu,
    "dgx_h100": dgx_h100,
    "gb200_nvl72": gb200_nvl72,
    "dgx_a100": dgx_a100,
    "dgx_h800": dgx_h800,
}


# short names some guides use for the presets
ALIASES = {"nvl72": "gb200_nvl72", "gb200": "gb200_nvl72", "dgx": "dgx_h100", "h100": "single_gpu"}


def load_topology(name_or_path: str | os.PathLike[str]) -> Topology:
    """A preset (``"dgx_h100"``, ``"dgx_h100x4"``, ``"dgx_h100(nodes=4)"``, an alias of
    :data:`ALIASES`), a JSON file, or JSON text (``{...}``, as :meth:`Topology.to_json`)."""
    text = os.fspath(name_or_path)
    if isinstance(name_or_path, str) and text.lstrip().startswith("{"):
        return Topology.from_json(text)
    if isinstance(name_or_path, os.PathLike) or text.endswith(".json") or os.path.exists(text):
        return Topology.from_json(Path(text))
    name, kwargs = text.strip(), {}
    name = ALIASES.get(name.lower(), name)
    if match := re.fullmatch(r"(\w+)\(((?:\s*\w+\s*=\s*\d+\s*,?)*)\)", name):
        name = match[1]
        kwargs = {key: int(value) for key, value in re.findall(r"(\w+)\s*=\s*(\d+)", match[2])}
    elif name not in PRESETS and (match := re.fullmatch(r"(\w+)x(\d+)", name)):
        name, kwargs = match[1], {"nodes": int(match[2])}
    if name not in PRESETS:
        raise TesseraError(
            f"unknown topology {text!r}: not a JSON file nor a preset; "
            f"presets: {', '.join(PRESETS)} (NAMEx<nodes> for several nodes, e.g. "
            f"dgx_h100x4; aliases: {', '.join(ALIASES)})"
        )
    try:
        return PRESETS[name](**kwargs)
    except TypeError as error:
        raise TesseraError(f"topology {text!r}: bad preset arguments: {error}") from None
