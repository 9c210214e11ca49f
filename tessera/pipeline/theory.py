"""Closed forms for the schedules of :mod:`tessera.transforms.pipeline_schedules`.

All assume every stage takes the same time for a forward (F), an input-gradient backward
(B) and a weight-gradient backward (W), F = B = W, a full backward B + W, and free
point-to-point transfers; ``p`` ranks, ``m`` microbatches, ``v`` model chunks per rank.
The bubble fraction is the idle share of all ranks' time, 1 − busy / (p · makespan):

- GPipe (Huang et al. 2019) and 1F1B (PipeDream-Flush, Narayanan et al. 2021):
  (p − 1) / (m + p − 1): a rank idles (p − 1)(F + B + W) of its 3m·F of work;
- interleaved 1F1B (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training
  on GPU Clusters Using Megatron-LM", §2.2): each chunk is 1/v of a rank's layers, so the
  bubble shrinks v-fold: (p − 1) / (v·m + p − 1);
- ZB-H1 (Qi et al. 2023, "Zero Bubble Pipeline Parallelism", §3.1): W passes fill the
  cool-down, a rank idles (p − 1)·F: (p − 1) / (3m + p − 1) for m ≥ p. With m < p the
  1F1B memory limit does not bind; rank 0 can start no B before the first microbatch has
  gone down and back up the pipeline (2p − 1), after which it still has 2m passes, so the
  makespan is 2m + 2p − 1 and the fraction (2p − 1 − m) / (2m + 2p − 1); the schedule
  reaches both bounds.

Peak activations count, per rank, the (microbatch, stage) activations held, from the
forward to the last backward piece that needs them (``backward``, or ``backward_weight``
when split), as :func:`tessera.perf.pipeline_simulate.simulate_pipeline` measures them.
"""

from __future__ import annotations

from tessera.errors import TesseraError
from tessera.transforms.pipeline_schedules import validate


def bubble_fraction(kind: str, ranks: int, microbatches: int, virtual: int = 1) -> float:
    """The idle share of all ranks' time for ``kind`` with F = B = W and free transfers."""
    validate(kind, ranks, microbatches, virtual)
    p, m, v = ranks, microbatches, virtual
    if kind == "zb-h1":
        idle = p - 1 + max(0, p - m)
        return idle / (3 * m + idle)
    if kind == "interleaved":
        return (p - 1) / (v * m + p - 1)
    return (p - 1) / (m + p - 1)


def peak_activations(kind: str, ranks: int, microbatches: int, rank: int, virtual: int = 1) -> int:
    """The most (microbatch, stage) activations ``rank`` holds at once.

    - GPipe: m (every forward runs before the first backward);
    - 1F1B: min(p − r, m) (warm-up p − r − 1, then one more forward per backward);
    - interleaved: Megatron's warm-up + 1 chunks, min(m·v, 2(p − r − 1) + (v − 1)p + 1);
      with v = 1 the schedule is 1F1B, and so is its peak;
    - ZB-H1: min(p, m) on every rank: rank r runs 1F1B's p − r forwards ahead of their B
      and holds r more awaiting their W (its W passes run r microbatches late). Counted
      until B instead, the peak is 1F1B's min(p − r, m): the paper's claim that ZB-H1
      keeps 1F1B's peak memory holds when a W-pending microbatch keeps only the W's inputs,
      smaller than a full activation; in full activations rank r holds r more than 1F1B,
      and the largest, p on rank 0, is 1F1B's.
    """
    validate(kind, ranks, microbatches, virtual)
    if not 0 <= rank < ranks:
        raise TesseraError(f"peak_activations: rank must be in [0, {ranks}), got {rank}")
    p, m, v, r = ranks, microbatches, virtual, rank
    if kind == "gpipe":
        return m
    if kind == "zb-h1":
        return min(p, m)
    if kind == "interleaved" and v > 1:
        return min(m * v, 2 * (p - r - 1) + (v - 1) * p + 1)
    return min(p - r, m)
