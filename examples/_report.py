"""The loss check of the training examples (train_gpt.py, train_moe.py): each step's
loss against a torch loop's, then the largest difference and a verdict.

A helper module, not an example: the examples import it from their own directory (the
first entry of ``sys.path`` when run as ``python examples/train_gpt.py``).
"""

from __future__ import annotations


class LossCheck:
    """Per-step losses of a run of ``steps`` steps against torch's: each relative
    difference within ``tolerance``, the last loss below the first. With ``show`` (rank 0)
    it prints every ``every``-th step's losses (and the last step's) and the verdict."""

    def __init__(self, steps: int, tolerance: float, every: int, show: bool) -> None:
        self.steps, self.tolerance, self.every, self.show = steps, tolerance, every, show
        self.worst = 0.0
        self.first: float | None = None
        self.last: float | None = None

    def add(self, i: int, loss: float, expected: float) -> None:
        """Step ``i``'s loss and torch's."""
        error = abs(loss - expected) / max(1.0, abs(expected))
        self.worst = max(self.worst, error)
        self.first = loss if self.first is None else self.first
        self.last = loss
        if self.show and (i % self.every == 0 or i == self.steps - 1):
            print(f"step {i:3d}  loss {loss:.5f}  torch {expected:.5f}  rel. diff {error:.1e}")

    def finish(self) -> None:
        """Prints the largest difference and ``OK``; exits with status 1 (after saying
        why) when a difference is over the tolerance or the loss did not decrease."""
        if self.show:
            print(
                f"largest per-step loss difference vs torch: {self.worst:.1e} "
                f"(tolerance {self.tolerance:.0e})"
            )
        assert self.first is not None and self.last is not None
        if self.worst > self.tolerance or (self.steps > 1 and self.last >= self.first):
            if self.show:
                print("MISMATCH" if self.worst > self.tolerance else "the loss did not decrease")
            raise SystemExit(1)
        if self.show:
            print("OK")
