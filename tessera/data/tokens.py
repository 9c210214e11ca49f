"""A memory-mapped token stream cut into windows, and a loader that draws them in a
deterministic shuffled order from a resumable position."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tessera.errors import ArgumentError


def write_tokens(path: str | Path, tokens: np.ndarray | list[int]) -> Path:
    """Writes ``tokens`` to the ``.npy`` file ``path`` (uint16 when every id fits, else
    uint32), atomically: a reader never sees a partial file. Returns ``path``."""
    array = np.asarray(tokens)
    if array.ndim != 1 or (array.size and array.min() < 0):
        raise ArgumentError("write_tokens: expected a 1-d stream of non-negative token ids")
    dtype = np.uint16 if not array.size or array.max() < 2**16 else np.uint32
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial.npy")
    np.save(partial, array.astype(dtype))
    os.replace(partial, path)
    return path


def open_tokens(path: str | Path) -> np.ndarray:
    """The token stream of ``path`` (from :func:`write_tokens`), memory-mapped read-only."""
    return np.load(path, mmap_mode="r")


@dataclass(frozen=True)
class Windows:
    """The windows ``tokens[start + i * seq : start + i * seq + seq + 1]`` of a stream
    that lie inside ``[start, stop)``: inputs are a window's first ``seq`` tokens, targets
    its last ``seq`` (consecutive windows share one token)."""

    tokens: np.ndarray
    seq: int
    start: int = 0
    stop: int | None = None

    def __len__(self) -> int:
        stop = len(self.tokens) if self.stop is None else self.stop
        return max(0, (stop - self.start - 1) // self.seq)

    def span(self, i: int) -> tuple[int, int]:
        """The token range ``[begin, end)`` of window ``i``."""
        if not 0 <= i < len(self):
            raise IndexError(f"window {i} of {len(self)}")
        begin = self.start + i * self.seq
        return begin, begin + self.seq + 1

    def __getitem__(self, i: int) -> np.ndarray:
        begin, end = self.span(i)
        return np.asarray(self.tokens[begin:end], dtype=np.int64)


def split(tokens: np.ndarray, seq: int, held_out: float) -> tuple[Windows, Windows]:
    """The training and held-out windows of ``tokens``: the last ``held_out`` fraction of
    the stream is held out; no token lies in windows of both."""
    if not 0.0 <= held_out < 1.0:
        raise ArgumentError(f"split: held_out must be in [0, 1), found {held_out}")
    cut = len(tokens) - round(len(tokens) * held_out)
    train, val = Windows(tokens, seq, 0, cut), Windows(tokens, seq, cut, len(tokens))
    if not len(train) or (held_out and not len(val)):
        raise ArgumentError(
            f"split: {len(tokens)} tokens with {held_out:.0%} held out leave no window of "
            f"{seq + 1} tokens in each part"
        )
    return train, val


class Loader:
    """Batches of ``batch`` windows: sample ``k`` is window ``order(k // n)[k % n]`` of
    the ``n`` windows, each epoch's order a permutation drawn from ``(seed, epoch)`` (or
    the natural order without ``shuffle``). ``position`` counts the samples drawn: a
    loader made with the same windows, seed and a saved position continues the same
    stream."""

    def __init__(
        self, windows: Windows, batch: int, seed: int = 0, position: int = 0, shuffle: bool = True
    ) -> None:
        if not len(windows):
            raise ArgumentError("Loader: no windows to draw")
        if batch < 1 or position < 0:
            raise ArgumentError(f"Loader: batch {batch} must be >= 1, position {position} >= 0")
        self.windows, self.batch, self.seed, self.shuffle = windows, batch, seed, shuffle
        self.position = position
        self._epoch: tuple[int, np.ndarray] | None = None

    def order(self, epoch: int) -> np.ndarray:
        """The window indices of ``epoch``, in the order they are drawn."""
        if not self.shuffle:
            return np.arange(len(self.windows))
        if self._epoch is None or self._epoch[0] != epoch:
            rng = np.random.default_rng([self.seed, epoch])
            self._epoch = (epoch, rng.permutation(len(self.windows)))
        return self._epoch[1]

    def sample_index(self, k: int) -> int:
        """The window of sample ``k``."""
        epoch, i = divmod(k, len(self.windows))
        return int(self.order(epoch)[i])

    def next_batch(self) -> tuple[np.ndarray, np.ndarray]:
        """Inputs and targets ``[batch, seq]`` (int64) of the next ``batch`` samples."""
        rows = np.stack(
            [
                self.windows[self.sample_index(k)]
                for k in range(self.position, self.position + self.batch)
            ]
        )
        self.position += self.batch
        return rows[:, :-1], rows[:, 1:]

    def __iter__(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        while True:
            yield self.next_batch()

    def state_dict(self) -> dict[str, int]:
        """What to save with a checkpoint."""
        return {"position": self.position, "seed": self.seed, "batch": self.batch}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continues from a :meth:`state_dict` (same windows; the seed must match)."""
        if int(state["seed"]) != self.seed:
            raise ArgumentError(
                f"Loader: the saved position is for seed {state['seed']}, this loader's is {self.seed}"
            )
        self.position = int(state["position"])
