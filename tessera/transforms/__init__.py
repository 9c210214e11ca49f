"""Transformations of IR that several passes (and the cost model) share: each plans or
builds a rewrite, over the dialects of :mod:`tessera.ir`.

- :mod:`~tessera.transforms.reshard`: the collectives from one sharding to another;
- :mod:`~tessera.transforms.block_moves`: re-cutting a split dim without gathering it;
- :mod:`~tessera.transforms.ring_attention`: attention over a split sequence as ring steps;
- :mod:`~tessera.transforms.remat`: which forward values a backward pass recomputes;
- :mod:`~tessera.transforms.pipeline_schedules`: pipeline schedules (GPipe, 1F1B, ...)
  as per-rank action lists and as the ``schedule.pipeline`` op.
"""
