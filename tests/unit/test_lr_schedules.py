"""Learning-rate schedules and weight-decay groups (issue 29): ``optim.schedules`` against
their closed forms, scheduled ``@graph.training_step`` runs against torch.optim with
``LambdaLR`` and parameter groups in float64, one compiled program for every step."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import tessera as ts
from tessera import dist, graph, op, optim
from tessera.frontend import pytree

S = optim.schedules


def closed_form(kind: str, t: int, peak: float, w: int = 0, total: int = 0, low: float = 0.0):
    """The issue's formulas, written out again (t: the updates already done)."""
    if kind == "constant":
        return peak
    if t < w:
        return peak * (t + 1) / w
    if kind == "linear_warmup":
        return peak
    if t >= total:
        return low
    progress = (t - w) / (total - w)
    if kind == "warmup_cosine":
        return low + 0.5 * (peak - low) * (1 + math.cos(math.pi * progress))
    return low + (peak - low) * (1 - progress)


CASES = {
    "constant": (S.constant(0.3), ("constant", 0.3)),
    "linear_warmup": (S.linear_warmup(0.1, 4), ("linear_warmup", 0.1, 4)),
    "warmup_cosine": (S.warmup_cosine(1e-2, 5, 20, 1e-4), ("warmup_cosine", 1e-2, 5, 20, 1e-4)),
    "warmup_linear_decay": (
        S.warmup_linear_decay(1e-2, 5, 20, 1e-3),
        ("warmup_linear_decay", 1e-2, 5, 20, 1e-3),
    ),
    "cosine_no_warmup": (S.warmup_cosine(1.0, 0, 10), ("warmup_cosine", 1.0, 0, 10, 0.0)),
    "warmup_only": (S.warmup_linear_decay(2.0, 3, 3, 0.5), ("warmup_linear_decay", 2.0, 3, 3, 0.5)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_schedule_values_at_the_boundaries(name: str) -> None:
    """t = 0, warmup - 1, warmup, total - 1, total, total + 5 (and in between): the Python
    value and the traced value (graph ops, float64) equal the closed form; the traced
    schedule compiles once for every step."""
    schedule, (kind, *args) = CASES[name]
    w = schedule.warmup_steps
    total = schedule.total_steps or 2 * w + 3
    steps = sorted({0, max(w - 1, 0), w, w + 1, max(total - 1, 0), total, total + 5, 1})
    traced = ts.jit(lambda t: schedule(t), kernels="reference")
    for t in steps:
        want = closed_form(kind, t, *args)
        assert schedule(t) == pytest.approx(want, rel=1e-15, abs=1e-18), t
        got = traced(torch.tensor(float(t), dtype=torch.float64)).item()
        assert got == pytest.approx(want, rel=1e-14, abs=1e-18), t
    assert traced.trace_count == 1
    if schedule.total_steps is not None:
        assert schedule(total) == schedule(total + 5) == schedule.min_lr
    assert schedule(max(w - 1, 0)) <= schedule.peak_lr


def _params(seed: int = 0) -> dict:
    """Nested float64 parameters: dotted names ``blocks.0.w``, ``blocks.0.bias``, ...,
    ``norm.weight``."""
    g = torch.Generator().manual_seed(seed)
    return {
        "blocks": [
            {"w": torch.randn(8, 16, generator=g, dtype=torch.float64) / 3,
             "bias": torch.randn(16, generator=g, dtype=torch.float64) / 10},
            {"w": torch.randn(16, 4, generator=g, dtype=torch.float64) / 4,
             "bias": torch.zeros(4, dtype=torch.float64)},
        ],
        "norm": {"weight": torch.ones(16, dtype=torch.float64)},
    }  # fmt: skip


def _batch(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(32, 8, generator=g, dtype=torch.float64),
        torch.randn(32, 4, generator=g, dtype=torch.float64),
    )


def _forward(p, x, gelu, y):
    b0, b1 = p["blocks"]
    h = gelu(x @ b0["w"] + b0["bias"]) * p["norm"]["weight"]
    out = h @ b1["w"] + b1["bias"]
    return ((out - y) * (out - y)).mean() if gelu is F.gelu else op.mean((out - y) * (out - y))


def _named(p: dict) -> dict[str, torch.Tensor]:
    return dict(zip(optim.path_names(p), pytree.flatten(p)[0], strict=True))


def _run(optimizer, torch_optimizer, lr_lambda, mesh=None, steps: int = 30, zero: int = 0) -> float:
    """``steps`` steps of a ``graph.training_step`` with ``optimizer`` and of torch with
    ``torch_optimizer(groups)`` and ``LambdaLR(lr_lambda)``; the largest parameter
    difference over the run. Every step runs the same compiled program."""

    @graph.training_step(optimizer=optimizer, mesh=mesh, zero=zero)
    def step(p, x, y):
        loss = _forward(p, x, op.gelu, y)
        return graph.backward(loss), {"loss": loss}

    params, (x, y) = _params(), _batch()
    ref = {k: v.clone().requires_grad_() for k, v in _named(params).items()}
    opt = torch_optimizer(ref)
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda)
    state = step.init(params)
    lowered = step.lower(state, x, y)
    worst = 0.0
    for _ in range(steps):
        metrics = step(state, x, y)
        opt.zero_grad()
        nested = {
            "blocks": [
                {"w": ref[f"blocks.{i}.w"], "bias": ref[f"blocks.{i}.bias"]} for i in (0, 1)
            ],
            "norm": {"weight": ref["norm.weight"]},
        }
        loss = _forward(nested, x, F.gelu, y)
        loss.backward()
        opt.step()
        schedule.step()
        assert float(metrics["loss"]) == pytest.approx(loss.item(), rel=1e-12)
        for name, value in _named(state.params).items():
            worst = max(worst, (value - ref[name].detach()).abs().max().item())
    # steps 2..30 reuse the program of step 1: one trace, one cached lowering
    assert [jitted.trace_count for jitted, _ in step._jit.values()] == [1]
    assert step.lower(state, x, y) is lowered
    assert int(state.opt_state.get("step", steps)) == state.step == steps
    print(f"max |tessera - torch| over {steps} steps: {worst:.3g}")
    return worst


MESHES = {"one_device": None, "dp2": {"dp": 2}}


@pytest.mark.parametrize("mesh", list(MESHES))
def test_adamw_with_warmup_cosine_matches_torch_lambdalr(mesh: str) -> None:
    """30 AdamW steps over a 5-step warmup and a cosine to step 20 (then min_lr)."""
    peak, w, total, low = 1e-2, 5, 20, 1e-4
    worst = _run(
        optim.AdamW(lr=S.warmup_cosine(peak, w, total, low), weight_decay=0.1),
        lambda ref: torch.optim.AdamW(ref.values(), lr=peak, weight_decay=0.1),
        lambda t: closed_form("warmup_cosine", t, peak, w, total, low) / peak,
        dist.mesh(MESHES[mesh]) if MESHES[mesh] else None,
    )
    assert worst <= 1e-12, worst


@pytest.mark.parametrize("mesh", list(MESHES))
def test_sgd_with_warmup_linear_decay_matches_torch_lambdalr(mesh: str) -> None:
    """30 SGD steps (momentum, weight decay): a 4-step warmup, linear decay to step 25
    (ZeRO-2 on dp=2). SGD keeps a step count in its state only when its lr is scheduled."""
    peak, w, total, low = 0.05, 4, 25, 0.005
    optimizer = optim.SGD(
        lr=S.warmup_linear_decay(peak, w, total, low), momentum=0.9, weight_decay=1e-2
    )
    assert list(optimizer.init(_params())) == ["step", "momentum"]
    assert list(optim.SGD(lr=0.1, momentum=0.9).init(_params())) == ["momentum"]
    worst = _run(
        optimizer,
        lambda ref: torch.optim.SGD(ref.values(), lr=peak, momentum=0.9, weight_decay=1e-2),
        lambda t: closed_form("warmup_linear_decay", t, peak, w, total, low) / peak,
        dist.mesh(MESHES[mesh]) if MESHES[mesh] else None,
        zero=2 if MESHES[mesh] else 0,  # the step count replicated, the momentum split over dp
    )
    assert worst <= 1e-12, worst


def test_lr_as_a_function_of_the_traced_step() -> None:
    """Any function of the step count built of tessera.op ops: an inverse square root
    after a warmup (op.minimum, op.rsqrt), on plain SGD (the state is only the count)."""
    w = 4

    def inverse_sqrt(step):
        return 0.1 * op.minimum((step + 1.0) / w, op.rsqrt((step + 1.0) / w))

    assert list(optim.SGD(lr=inverse_sqrt).init(_params())) == ["step"]
    worst = _run(
        optim.SGD(lr=inverse_sqrt),
        lambda ref: torch.optim.SGD(ref.values(), lr=0.1),
        lambda t: min((t + 1) / w, ((t + 1) / w) ** -0.5),
        steps=12,
    )
    assert worst <= 1e-12, worst


def test_weight_decay_groups_match_torch_param_groups() -> None:
    """AdamW decaying the matrices only (a predicate on dotted path names) is torch's
    AdamW with two parameter groups, decay and no decay, under a scheduled lr; the
    same mask as a pytree of bools gives the same parameters."""
    peak, w, total = 1e-2, 3, 12

    def groups(ref):
        decay = [v for k, v in ref.items() if k.endswith(".w")]
        rest = [v for k, v in ref.items() if not k.endswith(".w")]
        assert len(decay) == 2 and len(rest) == 3
        return torch.optim.AdamW(
            [{"params": decay, "weight_decay": 0.5}, {"params": rest, "weight_decay": 0.0}],
            lr=peak,
        )

    lr = S.warmup_cosine(peak, w, total)
    lam = lambda t: closed_form("warmup_cosine", t, peak, w, total) / peak  # noqa: E731
    by_name = optim.AdamW(lr=lr, weight_decay=0.5, weight_decay_mask=lambda p: p.endswith(".w"))
    assert _run(by_name, groups, lam, steps=15) <= 1e-12
    tree = {
        "blocks": [{"w": True, "bias": False}, {"w": True, "bias": False}],
        "norm": {"weight": False},
    }
    by_tree = optim.AdamW(lr=lr, weight_decay=0.5, weight_decay_mask=tree)
    assert _run(by_tree, groups, lam, steps=15) <= 1e-12
    assert optim.decay_mask(by_name.weight_decay_mask, _params()) == optim.decay_mask(
        tree, _params()
    )


def test_sgd_weight_decay_groups_match_torch_param_groups() -> None:
    def groups(ref):
        decay = [v for k, v in ref.items() if "bias" not in k]
        rest = [v for k, v in ref.items() if "bias" in k]
        return torch.optim.SGD(
            [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
            lr=0.05, momentum=0.9,
        )  # fmt: skip

    optimizer = optim.SGD(
        lr=0.05, momentum=0.9, weight_decay=0.1, weight_decay_mask=lambda p: "bias" not in p
    )
    assert _run(optimizer, groups, lambda t: 1.0, steps=8) <= 1e-12


def test_path_names() -> None:
    assert optim.path_names(_params()) == [
        "blocks.0.w", "blocks.0.bias", "blocks.1.w", "blocks.1.bias", "norm.weight",
    ]  # fmt: skip
    assert optim.path_names({"w1": 1, "b": (2, 3)}) == ["w1", "b.0", "b.1"]


def test_schedule_argument_errors() -> None:
    cases = [
        (lambda: S.warmup_cosine(1e-3, 10, 5), "warmup_steps=10 is more than total_steps=5"),
        (lambda: S.warmup_linear_decay(-1e-3, 1, 5), "peak_lr must be >= 0, found -0.001"),
        (lambda: S.constant(float("nan")), "lr must be a finite number"),
        (lambda: S.warmup_cosine(1e-3, 1, 5, min_lr=1e-2), "min_lr=0.01 is above peak_lr=0.001"),
        (lambda: S.warmup_cosine(1e-3, 1.5, 5), r"warmup_steps must be an int >= 0"),
        (lambda: S.warmup_cosine(1e-3, 0, 0), r"total_steps must be an int >= 1"),
        (lambda: S.linear_warmup(1e-3, -2), r"warmup_steps must be an int >= 0"),
        (lambda: S.constant(1.0)(-1), "the step must be a number >= 0"),
        (lambda: optim.AdamW(lr="fast"), "lr must be a number"),
        (lambda: optim.SGD(lr=-0.1), "lr must be a finite number >= 0"),
        (lambda: optim.AdamW(weight_decay_mask={"w": 1}), "pytree of bools"),
    ]
    for make, message in cases:
        with pytest.raises(ts.ArgumentError, match=message):
            make()


def _step(optimizer):
    @graph.training_step(optimizer=optimizer, kernels="reference")
    def step(p, x, y):
        return graph.backward(_forward(p, x, op.gelu, y)), {}

    return step


def test_lr_and_mask_errors() -> None:
    x, y = _batch()
    # a function of the step that is not built of tessera.op ops
    step = _step(optim.SGD(lr=lambda t: 0.1 * math.cos(t)))
    with pytest.raises(ts.TraceError, match=r"lr=<lambda> is called with the traced step count"):
        step(step.init(_params()), x, y)
    step = _step(optim.AdamW(lr=lambda t: op.full((2,), 0.1, t.dtype)))
    with pytest.raises(
        ts.ArgumentError, match=r"must return a 0-d float tensor, found f64 of shape \[2\]"
    ):
        step(step.init(_params()), x, y)
    # masks that do not fit the parameters: found by init, before any tracing
    wrong = {"blocks": [{"w": True, "bias": False}], "norm": {"weight": False}}
    with pytest.raises(ts.ArgumentError, match=r"no entry for \['blocks.1.w', 'blocks.1.bias'\]"):
        _step(optim.AdamW(weight_decay_mask=wrong)).init(_params())
    with pytest.raises(ts.ArgumentError, match=r"must return a bool .* found 1 for 'blocks.0.w'"):
        _step(optim.SGD(weight_decay=0.1, weight_decay_mask=lambda p: 1)).init(_params())
    # the functional form needs the step count in its state for a scheduled lr
    with pytest.raises(ts.ArgumentError, match=r"optim.sgd_state\(params, step=True\)"):
        ts.jit(lambda p, g: optim.sgd(p, g, lr=S.constant(0.1)))(torch.ones(2), torch.ones(2))


@pytest.mark.parametrize("kind", ["sgd", "adamw", "adamw-masked"])
def test_a_pipelined_step_follows_the_schedule(kind: str) -> None:
    """On a pp=2 mesh each pipeline rank's update program reads the shared step count
    (``tessera.pipeline.update.state_subset``) and evaluates the schedule, and applies the weight decay mask to
    the parameters it owns: the parameters equal the unpipelined step's."""
    lr = S.warmup_cosine(0.05, 2, 5, 0.01)
    mask = (lambda path: path != "w1") if kind == "adamw-masked" else None
    optimizer = (
        optim.SGD(lr=lr, momentum=0.9)
        if kind == "sgd"
        else optim.AdamW(lr=lr, weight_decay=0.1, weight_decay_mask=mask)
    )
    g = torch.Generator().manual_seed(3)
    params = {
        f"w{i}": torch.randn(16, 16, generator=g, dtype=torch.float64) * 0.3 for i in range(2)
    }
    x, y = (torch.randn(8, 16, generator=g, dtype=torch.float64) for _ in range(2))
    results = []
    for mesh in (None, dist.mesh({"pp": 2})):

        @graph.training_step(optimizer=optimizer, mesh=mesh)
        def step(p, x, y):
            h = op.tanh(x @ p["w0"])
            graph.stage()
            h = op.tanh(h @ p["w1"])
            loss = op.mean((h - y) * (h - y))
            return graph.backward(loss), {"loss": loss}

        state = step.init({k: v.clone() for k, v in params.items()})
        for _ in range(6):
            step(state, x, y)
        results.append(step.gather(state))
    for name in params:
        assert (results[0].params[name] - results[1].params[name]).abs().max().item() <= 1e-12
    assert int(results[1].opt_state["step"]) == 6
