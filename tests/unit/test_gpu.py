"""Generated Triton kernels compiled for a real GPU (skipped without CUDA).

Each program runs twice: Triton kernels on the GPU (tuned at their first call) and the
reference executor on the CPU (the oracle). Tolerances (max error relative to the largest
reference value): 1e-4 in f32, 2e-3 for f32 matmuls (tl.dot may use TF32), 2e-2 in bf16. The timeline test checks CUDA-event timings against wall time.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

import tessera as ts
from tessera import dist, op, perf

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _elementwise(x, y):
    return op.gelu(x * 2 + y) - op.exp(x) / 3


def _softmax_ln(x, y):
    return op.layer_norm(op.softmax(x + y, axis=-1), axis=-1) * y


def _reductions(x):
    return op.sum(x, axis=0), op.max(x, axis=1), op.mean(x * x)


def _mlp(x, w1, w2):
    return op.gelu(x @ w1) @ w2


def _attention(q, k, v):
    seq, dim = q.shape[-2], q.shape[-1]
    scores = (q @ op.transpose(k, (0, 1, 3, 2))) * (1.0 / dim**0.5)
    causal = np.tril(np.ones((seq, seq), dtype=bool))
    return op.softmax(op.where(causal, scores, -1e9), axis=-1) @ v


def _cross_entropy(x, labels):
    return op.cross_entropy(x, labels)


CASES = {
    "elementwise": (_elementwise, [(257, 129), (129,)], 1e-4),
    "softmax_layer_norm": (_softmax_ln, [(100, 4096), (4096,)], 1e-4),
    "reductions": (_reductions, [(120, 513)], 1e-4),  # a whole-tensor mean: <= 65536 elements
    "mlp": (_mlp, [(256, 512), (512, 1024), (1024, 256)], 2e-3),
    "attention": (_attention, [(2, 4, 256, 64)] * 3, 2e-3),
}


def _relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.double().cpu(), want.double().cpu()
    return float((got - want).abs().max() / want.abs().max().clamp_min(1e-6))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_triton_kernels_on_the_gpu_match_the_reference(case: str, dtype: torch.dtype) -> None:
    fn, shapes, tolerance = CASES[case]
    tolerance = 2e-2 if dtype == torch.bfloat16 else tolerance
    g = torch.Generator().manual_seed(0)
    args = [torch.randn(s, generator=g).to(dtype) for s in shapes]
    want = ts.jit(fn, kernels="reference")(*args)
    got = ts.jit(fn, kernels="triton")(*[a.cuda() for a in args])
    for w, o in zip(_leaves(want), _leaves(got), strict=True):
        assert o.is_cuda
        assert _relative_error(o, w) <= tolerance, case


def test_cross_entropy_on_the_gpu() -> None:
    g = torch.Generator().manual_seed(1)
    logits, labels = torch.randn(64, 1000, generator=g), torch.randint(0, 1000, (64,), generator=g)
    want = torch.nn.functional.cross_entropy(logits.double(), labels)
    got = ts.jit(_cross_entropy, kernels="triton")(logits.cuda(), labels.cuda())
    assert abs(float(got) - float(want)) <= 1e-4 * abs(float(want))


def test_sharded_mlp_on_the_virtual_mesh_runs_on_the_gpu_and_records_cuda_times() -> None:
    mesh = dist.mesh({"tp": 2})
    cols = dist.ShardSpec(partition=(1,), mesh_axes=("tp",))
    rows = dist.ShardSpec(partition=(0,), mesh_axes=("tp",))
    g = torch.Generator().manual_seed(2)
    x, w1, w2 = (torch.randn(s, generator=g) for s in ((512, 256), (256, 1024), (1024, 256)))
    f = ts.jit(_mlp, mesh=mesh, in_shardings=(dist.ShardSpec(replicate=True), cols, rows))
    f(x.cuda(), w1.cuda(), w2.cuda())  # compile and tune
    torch.cuda.synchronize()
    started = time.perf_counter()
    with perf.record_timeline() as timeline:
        got = f(x.cuda(), w1.cuda(), w2.cuda())
    torch.cuda.synchronize()
    wall = time.perf_counter() - started
    want = torch.nn.functional.gelu(x.double() @ w1.double()) @ w2.double()
    assert _relative_error(got, want) <= 2e-3
    events = timeline.events
    assert {e.rank for e in events} == {0, 1}
    assert all(e.duration_s > 0 for e in events if e.stream == "compute")
    assert sum(e.duration_s for e in events if e.stream == "compute") <= wall


def _leaves(tree):
    if isinstance(tree, (tuple, list)):
        return [leaf for t in tree for leaf in _leaves(t)]
    return [tree]
