"""Gradient clipping by global norm and gradient accumulation in ``graph.training_step``,
against torch in float64 (``torch.nn.utils.clip_grad_norm_``, a full-batch step):
losses and parameters to 1e-5 relative / 1e-6 absolute (float32 program)."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
import torch.nn.functional as F

from tessera import dist, graph, op, optim
from tessera.errors import TesseraError, TraceError

COLS = dist.ShardSpec(partition=(1,), mesh_axes=("tp",))
ROWS = dist.ShardSpec(partition=(0,), mesh_axes=("tp",))


def init(seed: int = 0, rows: int = 32):
    g = torch.Generator().manual_seed(seed)
    params = {
        "w1": torch.randn(8, 32, generator=g),
        "b1": torch.randn(32, generator=g),
        "w2": torch.randn(32, 8, generator=g),
    }
    return params, torch.randn(rows, 8, generator=g), torch.randn(rows, 8, generator=g)


def make_step(mesh, zero=0, **options):
    @graph.training_step(optimizer=optim.AdamW(lr=1e-2), mesh=mesh, zero=zero, kernels="reference",
                         param_shardings={"w1": COLS, "b1": ROWS, "w2": ROWS} if mesh and "tp" in mesh.axis_names else None,
                         **options)  # fmt: skip
    def step(p, x, y):
        out = op.gelu(x @ p["w1"] + p["b1"]) @ p["w2"]
        loss = op.mean((out - y) ** 2)
        return graph.backward(loss), {"loss": loss}

    return step


def torch_run(params, x, y, steps: int, max_norm: float | None):
    ref = {k: v.double().clone().requires_grad_() for k, v in params.items()}
    opt = torch.optim.AdamW(ref.values(), lr=1e-2)
    losses, norms = [], []
    for _ in range(steps):
        opt.zero_grad()
        out = F.gelu(x.double() @ ref["w1"] + ref["b1"]) @ ref["w2"]
        loss = ((out - y.double()) ** 2).mean()
        loss.backward()
        if max_norm is not None:
            norms.append(torch.nn.utils.clip_grad_norm_(ref.values(), max_norm).item())
        opt.step()
        losses.append(loss.item())
    return losses, norms, ref


MESHES = {"single": None, "dp2xtp2": {"dp": 2, "tp": 2}}


@pytest.mark.parametrize("mesh", MESHES, ids=str)
@pytest.mark.parametrize("zero", [0, 3])
def test_clipping_by_global_norm_matches_torch(mesh: str, zero: int) -> None:
    if mesh == "single" and zero:
        pytest.skip("ZeRO needs a dp axis")
    params, x, y = init()
    losses, norms, ref = torch_run(params, x, y, 3, max_norm=0.5)
    assert min(norms) > 0.5  # the clipping is active at every step
    step = make_step(dist.mesh(MESHES[mesh]) if MESHES[mesh] else None, zero, clip_grad_norm=0.5)
    state = step.init(params)
    for want_loss, want_norm in zip(losses, norms, strict=True):
        metrics = step(state, x, y)
        assert metrics["loss"].item() == pytest.approx(want_loss, rel=1e-5)
        assert metrics["grad_norm"].item() == pytest.approx(want_norm, rel=1e-5)
    for name, value in state.params.items():
        torch.testing.assert_close(value.double(), ref[name].detach(), rtol=1e-5, atol=1e-6)


def test_the_norm_is_one_reduction_of_scalars_not_a_gather() -> None:
    params, x, y = init()
    mesh = dist.mesh({"dp": 2, "tp": 2})
    plain = make_step(mesh, 3)
    clipped = make_step(mesh, 3, clip_grad_norm=1.0)

    def kinds(step):
        state = step.init({k: v.clone() for k, v in params.items()})
        return Counter(
            (c.kind, c.mesh_axes, c.shape) for c in step.lower(state, x, y).collectives()
        )

    added = kinds(clipped) - kinds(plain)
    # the gradients are split over dp and tp (ZeRO-3): their squared sums are reduced once
    assert added == Counter({("all_reduce", ("dp", "tp"), ()): 1}), added


@pytest.mark.parametrize("mesh", MESHES, ids=str)
def test_accumulated_microbatches_equal_the_full_batch_step(mesh: str) -> None:
    params, x, y = init(1, rows=64)
    losses, _, ref = torch_run(params, x, y, 2, max_norm=None)
    the_mesh = dist.mesh(MESHES[mesh]) if MESHES[mesh] else None
    step = make_step(the_mesh, accumulate=4)
    state = step.init(params)
    for want in losses:
        assert step(state, x, y)["loss"].item() == pytest.approx(want, rel=1e-5)
    for name, value in state.params.items():
        torch.testing.assert_close(value.double(), ref[name].detach(), rtol=1e-5, atol=1e-6)
    # only a quarter of the activations is live at a time
    whole = make_step(the_mesh)
    whole_state = whole.init({k: v.clone() for k, v in params.items()})
    assert step.memory(state, x, y).peak_bytes < whole.memory(whole_state, x, y).peak_bytes


def test_accumulation_moves_no_batch_rows_between_ranks() -> None:
    params, x, y = init(rows=64)
    mesh = dist.mesh({"dp": 2, "tp": 2})
    plain, accumulated = make_step(mesh), make_step(mesh, accumulate=4)
    count = {}
    for name, step in (("plain", plain), ("accumulated", accumulated)):
        state = step.init({k: v.clone() for k, v in params.items()})
        count[name] = Counter(c.kind for c in step.lower(state, x, y).collectives())
    # the forward's tp reductions run per microbatch; nothing else is added, and the
    # gradients are reduced over dp once
    dp_reductions = Counter(
        c.kind
        for c in accumulated.lower(accumulated.init(params), x, y).collectives()
        if "dp" in c.mesh_axes
    )
    assert set(count["accumulated"]) == set(count["plain"])
    assert dp_reductions == Counter(
        c.kind for c in plain.lower(plain.init(params), x, y).collectives() if "dp" in c.mesh_axes
    )


def test_clip_and_accumulate_errors_name_the_problem() -> None:
    with pytest.raises(TesseraError, match="clip_grad_norm must be a positive number"):
        make_step(None, clip_grad_norm=-1.0)
    with pytest.raises(TesseraError, match="accumulate must be a positive int"):
        make_step(None, accumulate=0)
    params, x, y = init(rows=30)
    step = make_step(dist.mesh({"dp": 2}), accumulate=4)
    with pytest.raises(TraceError, match="30 rows does not split into 4 microbatches over 2"):
        step(step.init(params), x, y)
