"""Bytes a Llama-style layer moves under tensor and sequence parallelism, against the
analytic volumes of Megatron-LM (Shoeybi et al. 2019) and its sequence parallelism
(Korthikanti et al. 2022), and its values against the unsharded layer in float64.

The layer is ``tessera.plan.layer.transformer_layer``: grouped-query attention (fewer
k/v heads than query heads) and a SwiGLU MLP, weights split Megatron-style over ``tp``
(q, k, v and the MLP's first matmuls by columns, the output projections by rows). With
``B, T, C`` the residual stream's shape and ``e`` the item size, a collective's bytes
are ``CollectiveInfo.nbytes`` (an all-reduce's operand, an all-gather's gathered result,
a reduce-scatter's unscattered input: each ``B·T·C·e`` here):

- tensor parallelism, forward: two all-reduces of the activations, ``2·B·T·C·e``;
  forward and backward: four, ``4·B·T·C·e`` (the k/v projections' gradients join the
  all-reduce of the input gradient that q's already needs);
- sequence parallelism (the residual stream split over ``tp`` along the sequence),
  forward: per block an all-gather of the normed input and a reduce-scatter of the
  output, ``4·B·T·C·e``, and no weight moves.
"""

from __future__ import annotations

import pytest
import torch

import tessera as ts
from tessera import dist
from tessera.autodiff.api import grad
from tessera.backends.collective_info import CollectiveInfo
from tessera.plan.layer import LayerShape, layer_loss, layer_param_shapes, layer_shardings
from tessera.plan.layer import transformer_layer as layer

TP = 4
# B·T < C, where Megatron's layouts move the fewest bytes (above, gathering the weights
# moves fewer, and only their repeated compute, not priced in bytes, argues against it);
# a k/v weight moves as many bytes as the normed input's gather q needs: that move is
# made for q anyway, so k and v reuse it
SHAPE = dict(hidden=128, heads=8, kv_heads=4, head_dim=16, ffn=256, mlp="swiglu")
BATCH, SEQ = 2, 32


def _shape(sp: bool) -> LayerShape:
    return LayerShape(**SHAPE, seq=SEQ, micro_batch=BATCH, tp=TP, cp=1, sp=sp)  # type: ignore[arg-type]


def _inputs(shape: LayerShape) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    params = {
        n: torch.randn(s, generator=g, dtype=torch.float64) / s[0] ** 0.5
        for n, s in layer_param_shapes(shape).items()
    }
    x = torch.randn(shape.micro_batch, shape.seq, shape.hidden, generator=g, dtype=torch.float64)
    return x, params


def _jit(shape: LayerShape, backward: bool) -> ts.jit:
    x_spec, specs = layer_shardings(shape)
    fn = grad(layer_loss, argnums=(0, 1), has_aux=True) if backward else layer
    return ts.jit(
        fn, static_argnums=(2, 3, 4, 5), mesh=dist.mesh({"tp": TP}),
        in_shardings=(x_spec, specs, None, None, None, None),
    )  # fmt: skip


def _static(shape: LayerShape) -> tuple[object, ...]:
    x_spec, _ = layer_shardings(shape)
    return (shape.heads, shape.kv_heads, shape.mlp, x_spec if shape.sp else None)


def _collectives(shape: LayerShape, backward: bool) -> list[CollectiveInfo]:
    x, params = _inputs(shape)
    return _jit(shape, backward).lower(x, params, *_static(shape)).collectives()


def _activation_bytes(shape: LayerShape) -> int:
    return shape.micro_batch * shape.seq * shape.hidden * 8  # float64


def test_tensor_parallel_gqa_forward_and_backward_all_reduce_four_activations() -> None:
    """Megatron's volume: the k/v weights' input gradients are reduced with q's."""
    shape = _shape(sp=False)
    infos = _collectives(shape, backward=True)
    assert {i.kind for i in infos} == {"all_reduce"}, infos
    assert sum(i.nbytes for i in infos) == 4 * _activation_bytes(shape)


def test_sequence_parallel_forward_gathers_activations_never_weights() -> None:
    """Korthikanti et al.'s volume: two all-gathers and two reduce-scatters of the
    activations, along the sequence."""
    shape = _shape(sp=True)
    infos = _collectives(shape, backward=False)
    assert sorted(i.kind for i in infos) == ["all_gather"] * 2 + ["reduce_scatter"] * 2, infos
    local = {
        "all_gather": (BATCH, SEQ // TP, shape.hidden),
        "reduce_scatter": (BATCH, SEQ, shape.hidden),
    }
    assert all(tuple(i.shape) == local[i.kind] for i in infos), infos  # activations only
    assert sum(i.nbytes for i in infos) == 4 * _activation_bytes(shape)


@pytest.mark.parametrize("sp", [False, True], ids=["tp", "sp"])
def test_sharded_layer_gradients_equal_the_unsharded_ones(sp: bool) -> None:
    shape = _shape(sp)
    x, params = _inputs(shape)
    static = _static(shape)
    (dx, dp), out = _jit(shape, backward=True)(x, params, *static)
    reference = ts.jit(grad(layer_loss, argnums=(0, 1), has_aux=True), static_argnums=(2, 3, 4, 5))
    (rx, rp), rout = reference(x, params, shape.heads, shape.kv_heads, shape.mlp, None)
    torch.testing.assert_close(out, rout, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(dx, rx, rtol=1e-12, atol=1e-12)
    for name in params:
        torch.testing.assert_close(dp[name], rp[name], rtol=1e-12, atol=1e-12)
