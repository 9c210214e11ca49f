"""Rules a strategy must satisfy for a model, a cluster and a batch, each violation one
message saying what was expected and what was found.

:func:`structural_violations` needs no compilation (sizes and divisibility);
:func:`validate` adds the memory fit, from the compiled layer (:mod:`tessera.plan.estimate`).
"""

from __future__ import annotations

from tessera.errors import TesseraError
from tessera.plan.estimate import MEMORY_HEADROOM, Estimate, estimate, has_fp8
from tessera.plan.layer import fp8_unsupported
from tessera.plan.models import ModelSpec
from tessera.plan.strategy import PRECISIONS, REMAT, SCHEDULES, ZERO_STAGES, Strategy
from tessera.topology import Topology
from tessera.transforms.pipeline_schedules import validate as validate_schedule


def structural_violations(
    model: ModelSpec, s: Strategy, gpus: int, global_batch: int, seq: int
) -> list[str]:
    """Every size rule ``s`` breaks (empty when it is well-formed)."""
    found: list[str] = []
    for name in ("dp", "tp", "pp", "cp", "ep", "micro_batch", "virtual"):
        if getattr(s, name) < 1:
            found.append(f"{name} must be at least 1, found {getattr(s, name)}")
    if found:
        return found
    if s.gpus != gpus:
        found.append(
            f"dp x tp x pp x cp = {s.dp} x {s.tp} x {s.pp} x {s.cp} = {s.gpus}, "
            f"but the cluster has {gpus} GPUs"
        )
    if model.heads % s.tp:
        found.append(f"tp {s.tp} does not divide the {model.heads} attention heads")
    if model.kv_heads % s.tp:
        found.append(f"tp {s.tp} does not divide the {model.kv_heads} key/value heads")
    if model.ffn % s.tp or (model.is_moe and model.expert_ffn % s.tp):
        found.append(f"tp {s.tp} does not divide the MLP width {model.active_ffn()}")
    stages = s.pp * s.virtual
    if model.layers < stages:
        found.append(
            f"pp x virtual = {stages} stages, but the model has only {model.layers} layers"
        )
    if seq % s.cp:
        found.append(f"cp {s.cp} does not divide the sequence length {seq}")
    if s.ep > 1 and not model.is_moe:
        found.append(f"ep {s.ep} needs experts, but {model.name} is a dense model")
    elif model.is_moe and model.experts % s.ep:
        found.append(f"ep {s.ep} does not divide the {model.experts} experts")
    if s.dp % s.ep:
        found.append(
            f"ep {s.ep} must divide dp {s.dp} (experts are split over data-parallel ranks)"
        )
    if global_batch % (s.dp * s.micro_batch):
        found.append(
            f"global batch {global_batch} is not a multiple of dp x micro_batch = "
            f"{s.dp} x {s.micro_batch} = {s.dp * s.micro_batch}"
        )
    elif s.pp > 1:
        try:
            virtual = s.virtual if s.schedule == "interleaved" else 1
            validate_schedule(s.schedule, s.pp, s.microbatches(global_batch), virtual)
        except TesseraError as error:
            found.append(f"pipeline schedule: {error}")
    if s.moe_overlap and not (s.ep > 1 and s.pp > 1):
        found.append(
            f"moe_overlap pairs one microbatch's expert all-to-alls with another's compute: it "
            f"needs ep > 1 and pp > 1, found ep {s.ep}, pp {s.pp}"
        )
    if s.schedule not in SCHEDULES:
        found.append(f"unknown schedule {s.schedule!r}; valid: {', '.join(SCHEDULES)}")
    if s.virtual > 1 and s.schedule != "interleaved":
        found.append(f"virtual {s.virtual} needs the interleaved schedule, not {s.schedule}")
    if s.zero not in ZERO_STAGES:
        found.append(f"ZeRO stage must be one of {ZERO_STAGES}, found {s.zero}")
    if s.remat not in REMAT:
        found.append(f"remat must be one of {', '.join(REMAT)}, found {s.remat!r}")
    if s.precision not in PRECISIONS:
        found.append(f"precision must be one of {', '.join(PRECISIONS)}, found {s.precision!r}")
    return found


def memory_violation(result: Estimate) -> str | None:
    """The memory-fit message, when the estimate does not fit."""
    mem = result.memory
    if mem.fits:
        return None
    return (
        f"needs {mem.total / 1e9:.1f} GB per GPU (params {mem.params / 1e9:.1f}, grads "
        f"{mem.grads / 1e9:.1f}, optimizer {mem.optimizer / 1e9:.1f}, activations "
        f"{mem.activations / 1e9:.1f}), more than {MEMORY_HEADROOM:.0%} of the "
        f"{mem.capacity / 1e9:.0f} GB a GPU has"
    )


def validate(
    model: ModelSpec, s: Strategy, topology: Topology, gpus: int, global_batch: int, seq: int
) -> tuple[list[str], Estimate | None]:
    """All violations of ``s`` and, when it is well-formed, its estimate."""
    found = structural_violations(model, s, gpus, global_batch, seq)
    if s.precision == "fp8" and not has_fp8(topology):
        found.append(
            f"precision fp8 needs FP8 tensor cores, which the {topology.device.name} lacks"
        )
    unsupported = fp8_unsupported(model.layer, model.mlp) if s.precision == "fp8" else None
    if unsupported:
        found.append(f"precision fp8: the model's layer does not run in fp8 ({unsupported})")
    if found:
        return found, None
    result = estimate(model, s, topology, global_batch, seq)
    message = memory_violation(result)
    return ([message] if message else []), result
