"""Run under ``tessera run -n N failures.py MODE``: after the ranks' first collective,
rank 1 misbehaves while the others call the next one. It prints ``misbehaves at T``
(``time.time()``) first, for the test to time how long the job takes to end.

MODE: ``raise`` (an exception), ``exit`` (``sys.exit(3)``), ``exit0`` (``sys.exit(0)``
while the others still expect it), ``os_exit`` (``os._exit(3)``), ``kill`` (SIGKILL),
``hang`` (sleeps past the timeout), ``mismatch`` (a program with a different collective
sequence), ``different`` (another program with the same collective sequence).
"""

from __future__ import annotations

import os
import signal
import sys
import time

import torch

import tessera as ts
from tessera import dist, op

mesh = dist.Mesh(axes=["tp"], shape=(int(os.environ["WORLD_SIZE"]),))
specs = (
    dist.ShardSpec(partition=(1,), mesh_axes=("tp",)),
    dist.ShardSpec(partition=(0,), mesh_axes=("tp",)),
)
matmul = ts.jit(lambda x, w: x @ w, mesh=mesh, in_shardings=specs)
mode, rank = sys.argv[1], int(os.environ["RANK"])
x, w = torch.randn(4, 8), torch.randn(8, 4)
matmul(x, w).full()  # every rank is up and connected
if rank == 1:
    print(f"rank 1 misbehaves at {time.time()!r}", flush=True)
    if mode == "raise":
        raise ValueError("rank 1 fails on purpose")
    if mode == "exit":
        sys.exit(3)
    if mode == "exit0":
        sys.exit(0)
    if mode == "os_exit":
        os._exit(3)
    if mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "hang":
        time.sleep(120)
    if mode == "mismatch":
        x = torch.randn(6, 8)  # a different local shape: a different all_reduce
    if mode == "different":  # the same collective, another computation
        matmul = ts.jit(lambda x, w: op.tanh(x) @ w, mesh=mesh, in_shardings=specs)
matmul(x, w)
print(f"rank {rank}: finished", flush=True)
