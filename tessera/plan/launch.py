"""Launch commands for a chosen strategy: torchrun for one node and for several, and a
SLURM batch script, with the environment the cluster wants."""

from __future__ import annotations

import shlex

from tessera.plan.strategy import Strategy

GPUS_PER_NODE = {
    "dgx_h100": 8,
    "dgx_a100": 8,
    "dgx_h800": 8,
    "gb200_nvl72": 4,
}  # GB200: 4 GPUs per tray

ENVIRONMENT = {
    "dgx_h100": {"NCCL_IB_HCA": "mlx5", "NCCL_NVLS_ENABLE": "1", "CUDA_DEVICE_MAX_CONNECTIONS": "1"},
    "dgx_a100": {"NCCL_IB_HCA": "mlx5", "CUDA_DEVICE_MAX_CONNECTIONS": "1"},
    "dgx_h800": {"NCCL_IB_HCA": "mlx5", "CUDA_DEVICE_MAX_CONNECTIONS": "1"},
    "gb200_nvl72": {"NCCL_MNNVL_ENABLE": "1", "NCCL_NVLS_ENABLE": "1",
                    "CUDA_DEVICE_MAX_CONNECTIONS": "1"},
}  # fmt: skip


KEPT = {"none": "everything", "full": "nothing"}  # plan's remat -> what the backward keeps


def plan_arguments(s: Strategy, global_batch: int | None = None) -> list[str]:
    """The strategy as arguments for the training script, in the flags of
    ``examples/train_gpt.py`` (Megatron-LM's where it has them): ``--remat`` says what the
    backward keeps of each block (the plan's ``none``: ``everything``; ``full``:
    ``nothing``); ``--micro-batch`` sequences per microbatch and dp rank, the global
    batch cut into pipeline microbatches (or accumulation steps without pp)."""
    args = [f"--dp={s.dp}", f"--tp={s.tp}", f"--pp={s.pp}"]
    args += [f"--cp={s.cp}"] if s.cp > 1 else []
    args += [f"--ep={s.ep}"] if s.ep > 1 else []
    args += [f"--zero={s.zero}"]
    args += [f"--batch={global_batch}"] if global_batch is not None else []
    args += [f"--micro-batch={s.micro_batch}"]
    if s.pp > 1:
        args += [f"--schedule={s.schedule}"]
        args += [f"--virtual={s.virtual}"] if s.schedule == "interleaved" else []
    args += [f"--remat={KEPT[s.remat]}", f"--precision={s.precision}"]
    return args + (["--sequence-parallel"] if s.sp and s.tp > 1 else [])


def unsupported(s: Strategy) -> list[str]:
    """What of the strategy ``examples/train_gpt.py`` (Tessera's training step) cannot run yet."""
    notes = []
    if s.pp > 1 and s.zero == 3:
        notes.append(
            f"Tessera's pipelined steps do not support ZeRO-3 yet: with --pp {s.pp} the script "
            f"fails at --zero=3 (pass --zero 1 or 2 to plan for it)"
        )
    if s.ep > 1:
        notes.append(
            "--ep is for an MoE script (examples/train_moe.py takes --dp, --ep, --tp and --batch "
            "only); examples/train_gpt.py is dense and has no --ep"
        )
    if s.moe_overlap:
        notes.append(
            "moe_overlap (DualPipe's overlap of expert all-to-alls with another microbatch's "
            "compute) is priced for published runs only; Tessera's pipeline does not run it"
        )
    return notes


def _env(cluster: str) -> str:
    return " ".join(f"{k}={v}" for k, v in ENVIRONMENT.get(cluster, {}).items())


def torchrun_single(
    s: Strategy, cluster: str, script: str, script_args: list[str], global_batch: int | None = None
) -> str:
    """One node: every rank on this machine."""
    args = " ".join(
        shlex.quote(a) for a in [script, *plan_arguments(s, global_batch), *script_args]
    )
    return f"{_env(cluster)} torchrun --standalone --nproc-per-node={s.gpus} {args}".strip()


def torchrun_multi(
    s: Strategy, cluster: str, script: str, script_args: list[str], global_batch: int | None = None
) -> str:
    """Several nodes: run on every node with its rank (c10d rendezvous on the first)."""
    per_node = min(GPUS_PER_NODE.get(cluster, 8), s.gpus)
    nodes = -(-s.gpus // per_node)
    args = " ".join(
        shlex.quote(a) for a in [script, *plan_arguments(s, global_batch), *script_args]
    )
    return (
        f"{_env(cluster)} torchrun --nnodes={nodes} --nproc-per-node={per_node} "
        f"--node-rank=$NODE_RANK --rdzv-backend=c10d --rdzv-endpoint=$MASTER_ADDR:29500 "
        f"--rdzv-id=tessera-plan {args}"
    ).strip()


def slurm_script(
    s: Strategy,
    cluster: str,
    script: str,
    script_args: list[str],
    job: str,
    global_batch: int | None = None,
) -> str:
    """A batch script: one task per node, each running torchrun for its GPUs."""
    per_node = min(GPUS_PER_NODE.get(cluster, 8), s.gpus)
    nodes = -(-s.gpus // per_node)
    exports = "\n".join(f"export {k}={v}" for k, v in ENVIRONMENT.get(cluster, {}).items())
    args = " ".join(
        shlex.quote(a) for a in [script, *plan_arguments(s, global_batch), *script_args]
    )
    return f"""#!/bin/bash
#SBATCH --job-name={job}
#SBATCH --nodes={nodes}
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node={per_node}
#SBATCH --exclusive
# plan: {s.label()}
{exports}
export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
srun torchrun --nnodes={nodes} --nproc-per-node={per_node} --rdzv-backend=c10d \\
  --rdzv-endpoint=$MASTER_ADDR:29500 --rdzv-id=$SLURM_JOB_ID {args}
"""
