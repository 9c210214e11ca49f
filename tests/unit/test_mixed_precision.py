"""Mixed precision in ``graph.training_step`` against ``torch.autocast`` (+
``torch.amp.GradScaler`` for fp16) with f32 master parameters and torch.optim.AdamW.

Tolerances: bf16 has 8 bits of mantissa (relative rounding 2^-9 ≈ 2e-3) and the two
programs round at different points (torch keeps layer_norm in f32 under autocast), so
losses agree to 2e-2 relative and parameters after three AdamW steps (lr 1e-2) to 3e-3
absolute; an f32 run is further than that from the bf16 reference in the loss
(checked, so the tolerance can tell the precisions apart). fp16 loss scaling is checked
exactly: the same steps are skipped and the scales are equal."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tessera import dist, graph, op, optim
from tessera.errors import TesseraError

COLS = dist.ShardSpec(partition=(1,), mesh_axes=("tp",))
ROWS = dist.ShardSpec(partition=(0,), mesh_axes=("tp",))


def make_step(precision, lr: float = 1e-2):
    @graph.training_step(optimizer=optim.AdamW(lr=lr, weight_decay=0.0), mesh=dist.mesh({"dp": 2, "tp": 2}),
                         kernels="reference", param_shardings={"w1": COLS, "w2": ROWS}, precision=precision)  # fmt: skip
    def step(p, x, y):
        out = op.gelu(op.layer_norm(x) @ p["w1"]) @ p["w2"]
        loss = op.mean(op.astype((out - y) ** 2, "float32"))
        return graph.backward(loss), {"loss": loss}

    return step


def init(scale: float = 1.0):
    g = torch.Generator().manual_seed(0)
    params = {
        "w1": torch.randn(16, 64, generator=g) / 4,
        "w2": torch.randn(64, 16, generator=g) / 8,
    }
    return params, scale * torch.randn(32, 16, generator=g), torch.randn(32, 16, generator=g)


def assert_close_masters(got: torch.Tensor, want: torch.Tensor) -> None:
    """Within 3e-3 in 99 % of the entries, and within 2·lr per step (3 steps) in all."""
    error = (got - want.detach()).abs()
    assert (error <= 3e-3).float().mean() >= 0.99, error.max()
    assert error.max() <= 6 * 1e-2


def torch_run(params, x, y, dtype, steps: int, scaler=None, lr: float = 1e-2):
    ref = {k: v.clone().requires_grad_() for k, v in params.items()}
    opt = torch.optim.AdamW(ref.values(), lr=lr, weight_decay=0.0)
    losses, scales = [], []
    for _ in range(steps):
        opt.zero_grad()
        with torch.autocast("cpu", dtype=dtype):
            out = F.gelu(F.layer_norm(x, (16,)) @ ref["w1"]) @ ref["w2"]
            loss = ((out.float() - y) ** 2).mean()
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            scales.append(scaler.get_scale())
        losses.append(loss.item())
    return losses, ref, scales


def test_bf16_step_matches_torch_autocast_with_f32_masters() -> None:
    params, x, y = init()
    want_losses, ref, _ = torch_run(params, x, y, torch.bfloat16, 3)
    step = make_step("bf16")
    state = step.init({k: v.clone() for k, v in params.items()})
    losses = [step(state, x, y)["loss"].item() for _ in range(3)]
    for got, want in zip(losses, want_losses, strict=True):
        assert got == pytest.approx(want, rel=2e-2)
    for name, value in state.params.items():
        assert value.dtype == torch.float32  # the master copy
        assert_close_masters(value, ref[name])
    assert all(m.dtype == torch.float32 for m in state.opt_state["m"].values())
    f32 = make_step("f32")
    f32_losses = [f32(f32.init({k: v.clone() for k, v in params.items()}), x, y)["loss"].item()]
    assert losses[0] != f32_losses[0]  # the bf16 step really computes in bf16


@pytest.mark.parametrize(("reduce", "dtype"), [("f32", "f32"), ("compute", "bf16")])
def test_gradient_reductions_run_in_the_chosen_dtype(reduce: str, dtype: str) -> None:
    params, x, y = init()
    step = make_step(graph.Precision("bf16", reduce=reduce))
    state = step.init(params)
    dp = [c for c in step.lower(state, x, y).collectives() if c.mesh_axes == ("dp",) and c.shape]
    assert len(dp) == 2 and all(c.dtype == dtype for c in dp), dp  # the w1 and w2 gradients
    tp = [c for c in step.lower(state, x, y).collectives() if c.mesh_axes == ("tp",)]
    assert tp and all(c.dtype == "bf16" for c in tp)  # the forward's reductions: compute dtype


def test_fp16_dynamic_loss_scaling_matches_grad_scaler() -> None:
    # the first scales overflow fp16: those steps are skipped and the scale backs off
    params, x, y = init()
    options = {"init_scale": 2.0**30, "backoff_factor": 2.0**-10, "growth_interval": 2}
    scaler = torch.amp.GradScaler("cpu", growth_factor=2.0, **options)
    want_losses, ref, want_scales = torch_run(params, x, y, torch.float16, 6, scaler)
    step = make_step(graph.Precision("fp16", loss_scale="dynamic", **options))
    state = step.init({k: v.clone() for k, v in params.items()})
    scales, losses = [], []
    for _ in range(6):
        losses.append(step(state, x, y)["loss"].item())
        scales.append(state.opt_state["loss_scale"]["scale"].item())
    assert scales == want_scales
    assert scales[:2] == [2.0**20, 2.0**10]  # two skipped steps, then growth every 2 steps
    for got, want in zip(losses, want_losses, strict=True):
        assert got == pytest.approx(want, rel=1e-2)
    for name, value in state.params.items():
        assert_close_masters(value, ref[name])


def test_a_skipped_step_leaves_parameters_and_state_as_they_were() -> None:
    params, x, y = init()
    step = make_step(graph.Precision("fp16", init_scale=2.0**40))
    state = step.init({k: v.clone() for k, v in params.items()})
    step(state, x, y)
    for name, value in state.params.items():
        assert torch.equal(value, params[name])
    assert state.opt_state["optimizer"]["step"].item() == 0.0
    assert state.opt_state["loss_scale"]["scale"].item() == 2.0**39


def test_precision_errors_name_the_problem() -> None:
    with pytest.raises(TesseraError, match="compute must be one of"):
        make_step("fp4")
    with pytest.raises(TesseraError, match="reduce must be one of"):
        graph.Precision("bf16", reduce="f16")
