"""Machines for tests whose toy tensors stand for large ones.

On a named real machine (``topology="dgx_h100"``) a collective's latency dominates a toy
tensor's bytes, so the sharding decisions for a few kilobytes are not those for
gigabytes: they gather rather than reduce partial sums. ``BANDWIDTH_BOUND`` is a DGX H100
whose link latency is negligible (1 fs: under one unit of ``ShardingClock``):
collectives cost their bytes, as large tensors' do, and as on a mesh naming no topology
(whose sharding clock leaves latency out). Tests that name a topology for another reason
use it, as do the lit tests of the sharding passes in their ``graph.mesh`` symbols.
"""

BANDWIDTH_BOUND = (
    '{"base": "dgx_h100", "levels": [{"latency_s": 1e-15}], "sharp": {"latency_s": 1e-15}}'
)
