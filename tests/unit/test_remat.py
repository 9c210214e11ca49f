"""Activation checkpointing: ``graph.checkpoint`` blocks recomputed in the backward as the
remat policy says. Gradients are checked bit for bit against the unrecomputed program
(reference kernels: the same ops on the same values) and against torch in float64
(1e-5 relative); the per-rank peak of the compiled program's memory plan falls by the
activation bytes each policy stops keeping (exact per-layer slopes)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import tessera as ts
from tessera import dist, graph, op, optim
from tessera.errors import TesseraError, TraceError

POLICIES = ["everything", "nothing", "matmuls", graph.Remat("nothing", every=2)]


@graph.checkpoint
def block(p, x):
    return x + op.gelu(op.layer_norm(x) @ p["w1"]) @ p["w2"]


def torch_block(p, x):
    return x + F.gelu(F.layer_norm(x, x.shape[-1:]) @ p["w1"]) @ p["w2"]


def params_for(layers: int, d: int, h: int, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [
        {
            "w1": torch.randn(d, h, generator=g) / d**0.5,
            "w2": torch.randn(h, d, generator=g) / h**0.5,
        }
        for _ in range(layers)
    ]


def grad_fn(remat, kernels: str = "reference"):
    @ts.jit(kernels=kernels)
    def f(params, x, y):
        for p in params:
            x = block(p, x)
        loss = op.mean((x - y) ** 2)
        return loss, graph.backward(loss, params, remat=remat)

    return f


def flat(grads):
    return [g for layer in grads for g in layer.values()]


@pytest.mark.parametrize("remat", POLICIES, ids=str)
def test_recomputed_gradients_equal_the_saved_ones_and_torch(remat) -> None:
    params = params_for(4, 16, 32)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(24, 16, generator=g), torch.randn(24, 16, generator=g)
    loss, grads = grad_fn(remat)(params, x, y)
    base_loss, base = grad_fn("everything")(params, x, y)
    assert torch.equal(loss, base_loss)
    for got, want in zip(flat(grads), flat(base), strict=True):
        assert torch.equal(got, want)  # the same ops on the same values: bit for bit
    ref = [{k: v.double().requires_grad_() for k, v in p.items()} for p in params]
    h = x.double()
    for p in ref:
        h = torch_block(p, h)
    ((h - y.double()) ** 2).mean().backward()
    for got, want in zip(flat(grads), [t.grad for p in ref for t in p.values()], strict=True):
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)


def test_recomputation_is_in_the_backward_program() -> None:
    params = params_for(2, 16, 32)
    x = torch.randn(8, 16)
    text = grad_fn("nothing").lower(params, x, x).as_text("graph")
    recomputed = [line for line in text.splitlines() if "graph.remat = 0" in line]
    assert any("graph.layer_norm" in line for line in recomputed)
    assert any("graph.gelu" in line for line in recomputed)
    assert "graph.checkpoint" not in text  # the forward's tags are consumed
    saved = grad_fn("everything").lower(params, x, x).as_text("graph")
    assert "graph.remat" not in saved


def test_triton_kernels_agree_with_and_without_recomputation() -> None:
    params = params_for(2, 16, 32)
    g = torch.Generator().manual_seed(2)
    x, y = torch.randn(16, 16, generator=g), torch.randn(16, 16, generator=g)
    _, grads = grad_fn("nothing", "triton")(params, x, y)
    _, base = grad_fn("everything", "triton")(params, x, y)
    for got, want in zip(flat(grads), flat(base), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_peak_memory_falls_by_the_activations_not_saved() -> None:
    # per layer: parameters 2·D·H floats, and what the backward keeps of the block:
    # everything: x, layer_norm(x), h = ·w1 and gelu(h); matmuls: x and h; nothing: x
    b, d, h = 512, 32, 128
    x, y = torch.randn(b, d), torch.randn(b, d)

    def per_layer(remat) -> int:
        peaks = [
            grad_fn(remat).lower(params_for(n, d, h), x, y).memory().peak_bytes for n in (4, 8)
        ]
        return (peaks[1] - peaks[0]) // 4

    weights, row, hidden = 2 * d * h * 4, b * d * 4, b * h * 4
    assert per_layer("everything") == weights + 2 * row + 2 * hidden
    assert per_layer("matmuls") == weights + row + hidden
    assert per_layer("nothing") == weights + row


def test_training_step_remat_option_on_a_mesh() -> None:
    mesh = dist.mesh({"dp": 2, "tp": 2})
    cols = dist.ShardSpec(partition=(1,), mesh_axes=("tp",))
    rows = dist.ShardSpec(partition=(0,), mesh_axes=("tp",))

    def make(remat):
        @graph.training_step(optimizer=optim.AdamW(lr=1e-2), mesh=mesh, kernels="reference",
                             param_shardings=[{"w1": cols, "w2": rows}] * 3, remat=remat)  # fmt: skip
        def step(params, x, y):
            for p in params:
                x = block(p, x)
            loss = op.mean((x - y) ** 2)
            return graph.backward(loss), {"loss": loss}

        return step

    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(256, 16, generator=g), torch.randn(256, 16, generator=g)
    runs = {}
    for remat in ("everything", "nothing"):
        step = make(remat)
        state = step.init(params_for(3, 16, 64))
        runs[remat] = ([step(state, x, y)["loss"].item() for _ in range(3)], state.params)
        runs[remat] += (step.memory(state, x, y).peak_bytes,)
    assert runs["nothing"][0] == runs["everything"][0]
    for got, want in zip(flat(runs["nothing"][1]), flat(runs["everything"][1]), strict=True):
        assert torch.equal(got, want)
    assert runs["nothing"][2] < runs["everything"][2]


def test_remat_errors_name_the_problem() -> None:
    with pytest.raises(TraceError, match=r"graph\.checkpoint expects a function"):
        graph.checkpoint(3)
    with pytest.raises(TesseraError, match="save must be one of"):
        graph.training_step(optimizer=optim.SGD(lr=0.1), remat="some")(lambda p, x: None)
    with pytest.raises(TesseraError, match="every must be a positive int"):
        graph.Remat("nothing", every=0)
    with pytest.raises(
        TraceError,
        match=r"graph.backward: remat: save must be one of .* found 'all', at .*test_remat.py",
    ):
        grad_fn("all")(params_for(1, 4, 4), torch.randn(2, 4), torch.randn(2, 4))


def test_pipelined_step_keeps_fewer_activations_between_its_programs() -> None:
    mesh = dist.mesh({"pp": 2})

    def make(remat):
        @graph.training_step(
            optimizer=optim.SGD(lr=0.1), mesh=mesh, kernels="reference", remat=remat
        )
        def step(params, x, y):
            for i, p in enumerate(params):
                if i == 2:
                    graph.stage()
                x = block(p, x)
            loss = op.mean((x - y) ** 2)
            return graph.backward(loss), {"loss": loss}

        return step

    g = torch.Generator().manual_seed(4)
    x, y = torch.randn(32, 16, generator=g), torch.randn(32, 16, generator=g)
    runs = {}
    for remat in ("everything", "nothing"):
        step = make(remat)
        state = step.init(params_for(4, 16, 64))
        losses = [step(state, x, y)["loss"].item() for _ in range(2)]
        compiled = step.pipeline().compiled(state, (x, y))
        saved = [
            leaf.shape
            for stage in compiled.stages
            if stage.backward is not None
            for leaf, source in zip(
                stage.backward.lowered.signature.leaves, stage.backward.inputs, strict=True
            )
            if source[0] == "saved"
        ]
        runs[remat] = losses, flat(step.gather(state).params), saved
    assert runs["nothing"][0] == runs["everything"][0]
    for got, want in zip(runs["nothing"][1], runs["everything"][1], strict=True):
        assert torch.equal(got, want)
    # per block the backward keeps only its input (16 wide), not its 64-wide activations
    assert len(runs["nothing"][2]) < len(runs["everything"][2])
    assert all(shape[-1] == 16 for shape in runs["nothing"][2] if shape)
