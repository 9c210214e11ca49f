"""Delayed fp8 scaling (``graph.Precision(compute="fp8", fp8_scaling="delayed")``) against a
torch emulation written here: every fp8 tensor (each matmul's two e4m3 operands and its
e5m2 incoming gradient) is scaled by ``max(its amax history) / fp8 max · 2^margin`` (1
while the history is all zero, as Transformer Engine's ``DelayedScaling`` starts), and
after the step its amax enters the history (most recent first, the oldest dropped).

Tolerances: both sides quantise the same values with the same scales, so they differ
only where an f32 sum's last bit flips a bf16 and then an fp8 rounding (as in
``test_fp8``): after three AdamW steps (lr 1e-2) losses agree to 1e-3 relative, the
amax histories to 1e-2 relative (amaxes of bf16 values, themselves flipping by a bf16
step at most) and the f32 masters to 3e-3 in 99 % of the entries."""

from __future__ import annotations

import io

import pytest
import torch
import torch.nn.functional as F
from test_fp8 import init, make_step

from tessera import dist, graph, optim
from tessera.errors import TesseraError
from tessera.ir import graph as ir

E4M3, E5M2 = (torch.float8_e4m3fn, 448.0), (torch.float8_e5m2, 57344.0)


class History:
    """torch: the amax histories of the fp8 tensors, one row each, in the order the
    matmuls quantise them (lhs, rhs, incoming gradient)."""

    def __init__(self, tensors: int, length: int, margin: int = 0) -> None:
        self.rows = torch.zeros(tensors, length)
        self.margin = margin
        self.amax = torch.zeros(tensors)
        self.next = 0

    def scale(self, slot: int, largest: float) -> torch.Tensor:
        amax = self.rows[slot].max()
        return amax / largest * 2.0**self.margin if amax > 0 else torch.tensor(1.0)

    def quantize(
        self, x: torch.Tensor, slot: int, fmt: tuple[torch.dtype, float]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``x``'s fp8 values with the slot's delayed scale, and the scale; records its amax."""
        dtype, largest = fmt
        self.amax[slot] = x.abs().max()
        scale = self.scale(slot, largest)
        return (x / scale).clamp(-largest, largest).to(dtype).float(), scale

    def step(self) -> None:
        self.rows = torch.cat([self.amax[:, None], self.rows[:, :-1]], dim=1)
        self.next = 0


class DelayedMatmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a: torch.Tensor, b: torch.Tensor, h: History) -> torch.Tensor:  # type: ignore[override]
        slot = h.next
        h.next += 3
        (qa, sa), (qb, sb) = (
            h.quantize(a.float(), slot, E4M3),
            h.quantize(b.float(), slot + 1, E4M3),
        )
        ctx.save_for_backward(qa * sa, qb * sb)
        ctx.h, ctx.slot, ctx.dtypes = h, slot + 2, (a.dtype, b.dtype)
        return ((qa @ qb) * (sa * sb)).to(a.dtype)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        a, b = ctx.saved_tensors
        qg, sg = ctx.h.quantize(grad.float(), ctx.slot, E5M2)
        g = qg * sg
        return (g @ b.T).to(ctx.dtypes[0]), (a.T @ g).to(ctx.dtypes[1]), None


def torch_run(params, x, y, steps: int, length: int, margin: int = 0):
    masters = {k: v.clone().requires_grad_() for k, v in params.items()}
    opt = torch.optim.AdamW(masters.values(), lr=1e-2, weight_decay=0.0)
    history = History(6, length, margin)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        w1, w2 = (masters[k].to(torch.bfloat16) for k in ("w1", "w2"))
        hidden = F.relu(DelayedMatmul.apply(x.to(torch.bfloat16), w1, history))
        out = DelayedMatmul.apply(hidden, w2, history)
        loss = ((out - y.to(torch.bfloat16)) ** 2).float().mean()
        loss.backward()
        opt.step()
        history.step()
        losses.append(loss.item())
    return losses, masters, history.rows


@pytest.mark.parametrize("margin", [0, 1])
def test_delayed_scaling_tracks_a_torch_emulation(margin: int) -> None:
    """Three AdamW steps: losses, amax histories (the state's ``opt_state["fp8"]``) and
    f32 masters as torch's; the first step scales by 1 (empty histories), so its loss
    differs from current scaling's."""
    params, x, y = init()
    want_losses, masters, want_history = torch_run(params, x, y, 3, 4, margin)
    precision = graph.Precision(compute="fp8", fp8_scaling="delayed", amax_history=4,
                                fp8_margin=margin)  # fmt: skip
    step = make_step(precision)
    state = step.init({k: v.clone() for k, v in params.items()})
    assert state.opt_state["fp8"]["amax_history"].shape == (0, 4)  # sized at the first step
    losses = [step(state, x, y)["loss"].item() for _ in range(3)]
    for got, want in zip(losses, want_losses, strict=True):
        assert got == pytest.approx(want, rel=1e-3)
    history = state.opt_state["fp8"]["amax_history"]
    assert history.shape == (6, 4) and (history[:, 3] == 0).all() and (history[:, :3] > 0).all()
    torch.testing.assert_close(history, want_history, rtol=1e-2, atol=0)
    for name, value in state.params.items():
        error = (value - masters[name].detach()).abs()
        assert (error <= 3e-3).float().mean() >= 0.99, error.max()
    current = make_step("fp8")
    first = current(current.init({k: v.clone() for k, v in params.items()}), x, y)["loss"]
    assert abs(first.item() - losses[0]) > 1e-3  # scale 1 is not the current scale


def test_delayed_scaling_runs_in_triton_kernels(monkeypatch) -> None:
    """Two steps with the generated kernels (Triton's interpreter, fp8 dots forced on) as
    with the reference kernels: losses to 1e-4 relative (the triton fp8 rounding in f32
    arithmetic and its f32 sums, as in ``test_fp8``), histories to 1e-2."""
    monkeypatch.setenv("TESSERA_FP8_DOTS", "on")
    params, x, y = init()
    precision = graph.Precision(compute="fp8", fp8_scaling="delayed", amax_history=3)
    runs = []
    for kernels in ("reference", "triton"):
        step = make_step(precision, kernels)
        state = step.init({k: v.clone() for k, v in params.items()})
        losses = [step(state, x, y)["loss"].item() for _ in range(2)]
        runs.append((losses, state.opt_state["fp8"]["amax_history"]))
        if kernels == "triton":
            ops = list(step.lower(state, x, y).module_at("traced").walk())
            assert sum(isinstance(o, ir.Fp8GradDelayedOp) for o in ops) == 2
    (want, want_history), (got, history) = runs
    assert got == pytest.approx(want, rel=1e-4)
    torch.testing.assert_close(history, want_history, rtol=1e-2, atol=0)


def test_delayed_scaling_over_a_mesh_is_the_single_device_run() -> None:
    """Over dp × tp (batch and weights split) every amax is the whole tensor's: three SGD
    steps give exactly the single-device losses, histories and parameters."""
    cols = dist.ShardSpec(partition=(1,), mesh_axes=("tp",))
    rows = dist.ShardSpec(partition=(0,), mesh_axes=("tp",))
    params, x, y = init()
    precision = graph.Precision(compute="fp8", fp8_scaling="delayed", amax_history=3)
    runs = []
    for options in (
        {},
        {"mesh": dist.mesh({"dp": 2, "tp": 2}), "param_shardings": {"w1": cols, "w2": rows}},
    ):
        step = make_step(precision, optimizer=optim.SGD(lr=1.0), **options)
        state = step.init({k: v.clone() for k, v in params.items()})
        losses = [step(state, x, y)["loss"].item() for _ in range(3)]
        runs.append((losses, state.opt_state["fp8"]["amax_history"], state.params))
    (losses, history, single), (sharded_losses, sharded_history, sharded) = runs
    assert sharded_losses == losses
    torch.testing.assert_close(sharded_history, history, rtol=0, atol=0)
    for name in params:
        torch.testing.assert_close(sharded[name], single[name], rtol=0, atol=1e-6)


def test_delayed_scaling_histories_are_checkpointed() -> None:
    """The histories are optimizer state: ``state_dict`` holds them and a state loaded
    from it (through ``torch.save``) takes the same next step."""
    params, x, y = init()
    precision = graph.Precision(compute="fp8", fp8_scaling="delayed", amax_history=2)
    step = make_step(precision)
    state = step.init({k: v.clone() for k, v in params.items()})
    step(state, x, y)
    saved = step.state_dict(state)
    assert saved["opt_state"]["fp8"]["amax_history"].shape == (6, 2)
    buffer = io.BytesIO()
    torch.save(saved, buffer)
    buffer.seek(0)
    restored = step.load_state_dict(torch.load(buffer))
    a, b = step(state, x, y)["loss"], step(restored, x, y)["loss"]
    assert a.item() == b.item()
    torch.testing.assert_close(
        restored.opt_state["fp8"]["amax_history"], state.opt_state["fp8"]["amax_history"]
    )


def test_delayed_scaling_options() -> None:
    assert not graph.Precision("fp8").delayed  # current scaling is the default
    with pytest.raises(TesseraError, match="needs compute='fp8'"):
        graph.Precision(compute="bf16", fp8_scaling="delayed")
    with pytest.raises(TesseraError, match="fp8_scaling"):
        graph.Precision(compute="fp8", fp8_scaling="late")
    with pytest.raises(TesseraError, match="amax_history"):
        graph.Precision(compute="fp8", fp8_scaling="delayed", amax_history=0)
    with pytest.raises(TesseraError, match="accumulation"):
        make_step(graph.Precision(compute="fp8", fp8_scaling="delayed"), accumulate=2)
