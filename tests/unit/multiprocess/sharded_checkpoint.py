"""Run under ``tessera run -n 4 sharded_checkpoint.py MODE DIR``.

``save``: trains the step of ``test_sharded_checkpoint.make_step`` on dp 2 x tp 2 (ZeRO-3)
for two steps and saves ``DIR/ckpt`` (each process its own pieces). ``resume``: restores
``DIR/ckpt`` (saved on any mesh) onto tp 4, trains two more steps and rank 0 writes the
losses and the whole parameters to ``DIR/resumed.pt``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parents[1]))
from test_sharded_checkpoint import init, make_step, run


def main() -> None:
    mode, folder = sys.argv[1], Path(sys.argv[2])
    params, x, y = init()
    if mode == "save":
        step = make_step({"dp": 2, "tp": 2}, zero=3)
        state = step.init(params)
        run(step, state, x, y, 2)
        step.save(state, folder / "ckpt")
    else:
        step = make_step({"tp": 4})
        state = step.restore(
            step.init({k: torch.zeros_like(v) for k, v in params.items()}), folder / "ckpt"
        )
        losses = run(step, state, x, y, 2)
        whole = step.state_dict(state)
        if int(os.environ["RANK"]) == 0:
            torch.save(
                {"losses": losses, "params": whole["params"], "step": state.step},
                folder / "resumed.pt",
            )
    print(f"rank {os.environ['RANK']} OK", flush=True)


if __name__ == "__main__":
    main()
