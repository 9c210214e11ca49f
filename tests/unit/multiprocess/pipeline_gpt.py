"""A pipelined GPT training step over pp x dp x tp processes (run by test_pipeline_training).

Usage: ``tessera run -n N pipeline_gpt.py PP DP TP MICROBATCHES KIND VIRTUAL STEPS``.
Rank 0 prints every step's loss as a float hex string (``losses: ...``) and a digest of
the parameters after the last step (gathered from the pipeline ranks that own them), for
the test to compare with the same pipeline on the virtual mesh and with the unpipelined
step. Every rank prints the functions it compiled down to the schedule stage (only its
own stage's programs and update).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.distributed as tdist

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "examples"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline_case import losses_and_params


def _record_scheduled() -> list[str]:
    """The functions this process compiles to the schedule stage (every stage program a
    process compiles that far is one it runs)."""
    from xdsl.dialects import func

    from tessera import program

    scheduled: list[str] = []
    compile_stage = program.run_stage

    def run_stage(stage, previous, config):  # type: ignore[no-untyped-def]
        if stage == "schedule":
            scheduled.extend(f.sym_name.data for f in previous.ops if isinstance(f, func.FuncOp))
        return compile_stage(stage, previous, config)

    program.run_stage = run_stage
    return scheduled


def main() -> None:
    scheduled = _record_scheduled()
    pp, dp, tp, m = (int(a) for a in sys.argv[1:5])
    kind, virtual, steps = sys.argv[5], int(sys.argv[6]), int(sys.argv[7])
    losses, params = losses_and_params(pp, dp, tp, m, kind, virtual, steps)  # params gathered
    rank = tdist.get_rank()
    if rank == 0:
        _say(f"losses: {' '.join(float(x).hex() for x in losses)}")
        digest = torch.cat([params[k].flatten() for k in sorted(params)]).double()
        _say(f"params: {float(digest.sum()).hex()} {float(digest.abs().sum()).hex()}")
    _say(f"rank {rank} scheduled: {' '.join(sorted(set(scheduled)))}")
    _say(f"rank {rank} OK (pid {os.getpid()})")


def _say(line: str) -> None:
    """One write per line: the ranks share stdout, unbuffered (print writes the line and
    its newline apart, and another rank's line can come between)."""
    os.write(sys.stdout.fileno(), (line + "\n").encode())


if __name__ == "__main__":
    main()
