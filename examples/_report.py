"""The loss check of the training examples (train_gpt.py, train_moe.py): each step's
loss against a torch loop's, then the largest difference and a verdict.

A helper module, not an example: the examples import it from their own directory (the
first entry of ``sys.path`` when run as ``python examples/train_gpt.py``).
"""

from __future__ import annotations

import sys
import threading
import time

_PRINTING = threading.Lock()
QUIET_S = 10.0  # the longest a run stays silent: a step line, or a line saying what runs


class LossCheck:
    """Per-step losses of steps ``first`` .. ``steps - 1`` against torch's (``first`` > 0:
    a resumed run): each relative
    difference within ``tolerance``, the last loss below the first. With ``show`` (rank 0)
    it prints every ``every``-th step's losses (and the last step's) and the verdict, and
    says what runs, so that a slow run (Triton's interpreter on a CPU) is never silent for
    more than about ``quiet`` seconds: that step 0 compiles the training step, each
    step's time, a step's line when ``quiet`` seconds have passed since the last line,
    and, while a step takes longer, a line every ``quiet`` seconds (then the step's line
    when it ends). Create it just before the first step."""

    def __init__(
        self, steps: int, tolerance: float, every: int, show: bool, quiet: float = QUIET_S,
        first: int = 0,
    ) -> None:  # fmt: skip
        self.steps, self.tolerance, self.every, self.show = steps, tolerance, every, show
        self.quiet, self.first_step = quiet, first
        self.worst = 0.0
        self.first: float | None = None
        self.last: float | None = None
        self.step_started = self.printed = time.perf_counter()
        self.running = first  # the step under way
        self.waited = False  # a line said that the step under way runs: say when it ends
        self.done = threading.Event()
        if show and steps > first:
            self._say(
                f"step {first:3d}: compiling the training step (trace, shardings, schedule, "
                f"kernels), then running it; {steps - first} steps"
            )
            threading.Thread(target=self._heartbeat, name="progress", daemon=True).start()

    def _say(self, line: str) -> None:
        with _PRINTING:  # one write per line: the heartbeat's lines never split a step's
            sys.stdout.write(line + "\n")
            sys.stdout.flush()
            self.printed = time.perf_counter()

    def _heartbeat(self) -> None:
        """While a step runs longer than ``quiet`` seconds, a line whenever ``quiet``
        seconds pass without one (between steps, :meth:`add` prints the step's line)."""
        while not self.done.wait(min(1.0, self.quiet / 4)):
            now = time.perf_counter()
            if now - self.printed >= self.quiet and now - self.step_started >= self.quiet:
                what = "compiling and running" if self.running == self.first_step else "running"
                self._say(f"step {self.running:3d}: {what}, {now - self.step_started:.0f} s so far")
                self.waited = True

    def add(self, i: int, loss: float, expected: float) -> None:
        """Step ``i``'s loss and torch's."""
        now = time.perf_counter()
        took, self.step_started, self.running = now - self.step_started, now, i + 1
        error = abs(loss - expected) / max(1.0, abs(expected))
        self.worst = max(self.worst, error)
        self.first = loss if self.first is None else self.first
        self.last = loss
        if i == self.steps - 1:
            self.done.set()
        due = (
            (self.every > 0 and i % self.every == 0)
            or i == self.steps - 1
            or now - self.printed >= self.quiet
        )
        due, self.waited = due or self.waited, False
        if self.show and due:
            self._say(
                f"step {i:3d}  loss {loss:.5f}  torch {expected:.5f}  rel. diff {error:.1e}  "
                f"({took:.1f} s)"
            )

    def finish(self) -> None:
        """Prints the largest difference and ``OK``; exits with status 1 (after saying
        why) when a difference is over the tolerance or the loss did not decrease."""
        self.done.set()
        if self.show:
            print(
                f"largest per-step loss difference vs torch: {self.worst:.1e} "
                f"(tolerance {self.tolerance:.0e})"
            )
        assert self.first is not None and self.last is not None
        if self.worst > self.tolerance or (
            self.steps - self.first_step > 1 and self.last >= self.first
        ):
            if self.show:
                print("MISMATCH" if self.worst > self.tolerance else "the loss did not decrease")
            raise SystemExit(1)
        if self.show:
            print("OK")
