"""Run under ``tessera run -n 2 failures.py MODE``: rank 1 misbehaves before the ranks'
first collective. MODE: ``raise`` (an exception), ``kill`` (SIGKILL), ``hang`` (sleeps
past the timeout), ``mismatch`` (runs a program with a different collective sequence).
"""

from __future__ import annotations

import os
import signal
import sys
import time

import torch

import tessera as ts
from tessera import dist

mesh = dist.Mesh(axes=["tp"], shape=(2,))
matmul = ts.jit(
    lambda x, w: x @ w,
    mesh=mesh,
    in_shardings=(dist.ShardSpec(partition=(1,), mesh_axes=("tp",)), dist.ShardSpec(partition=(0,), mesh_axes=("tp",))),
)
mode, rank = sys.argv[1], int(os.environ["RANK"])
x, w = torch.randn(4, 8), torch.randn(8, 4)
matmul(x, w).full()  # both ranks are up and connected
if rank == 1:
    if mode == "raise":
        raise ValueError("rank 1 fails on purpose")
    if mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "hang":
        time.sleep(120)
    if mode == "mismatch":
        x = torch.randn(6, 8)  # a different local shape: a different all_reduce
matmul(x, w)
print(f"rank {rank}: finished", flush=True)
