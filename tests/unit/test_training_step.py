"""A whole training step in one program: forward, ``graph.backward`` and an optimizer
update (``optim.adamw`` / ``optim.sgd``), against torch.optim in float64."""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import tessera as ts
from tessera import dist, graph, op, optim
from tessera.frontend import pytree
from tessera.perf.compute_cost import runs_as_view


def model(p, x):
    return op.gelu(x @ p["w1"] + p["b1"]) @ p["w2"]


def torch_loss(p, x, y):
    return ((F.gelu(x @ p["w1"] + p["b1"]) @ p["w2"] - y) ** 2).mean()


def setup(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    params = {
        "w1": torch.randn(8, 16, generator=g) / 3,
        "b1": torch.zeros(16),
        "w2": torch.randn(16, 4, generator=g) / 4,
    }
    return params, torch.randn(32, 8, generator=g), torch.randn(32, 4, generator=g)


@pytest.mark.parametrize("kernels", ["reference", "triton"])
def test_adamw_steps_match_torch(kernels: str) -> None:
    @ts.jit(kernels=kernels)
    def step(p, state, x, y):
        loss = op.mean((model(p, x) - y) ** 2)
        grads = graph.backward(loss, p)
        p, state = optim.adamw(p, grads, state, lr=1e-2)
        return p, state, loss

    params, x, y = setup()
    state = optim.adamw_state(params)
    ref = {k: v.double().clone().requires_grad_() for k, v in params.items()}
    opt = torch.optim.AdamW(ref.values(), lr=1e-2, weight_decay=1e-2)
    losses = []
    for _ in range(4):
        params, state, loss = step(params, state, x, y)
        opt.zero_grad()
        want = torch_loss(ref, x.double(), y.double())
        want.backward()
        opt.step()
        assert abs(loss.item() - want.item()) <= 1e-5 * max(1.0, want.item())
        losses.append(loss.item())
    assert losses == sorted(losses, reverse=True)  # the loss decreases
    for name in params:
        assert (params[name].double() - ref[name]).abs().max().item() <= 1e-5
    assert step.trace_count == 1  # state and parameters keep their signature


def test_sgd_with_momentum_on_a_data_parallel_mesh() -> None:
    """Data split over dp: the weight gradients are partial over dp and the sharding
    passes all-reduce them; no synchronisation is written in the step."""
    mesh = dist.Mesh(axes=["dp"], shape=(2,))
    rows = dist.ShardSpec(partition=(0,), mesh_axes=("dp",))

    def step(p, state, x, y):
        loss = op.mean((model(p, x) - y) ** 2)
        p, state = optim.sgd(p, graph.backward(loss, p), state, lr=0.1, momentum=0.9)
        return p, state, loss

    f = ts.jit(step, mesh=mesh, in_shardings=(None, None, rows, rows), kernels="reference")
    params, x, y = setup(1)
    state = optim.sgd_state(params)
    kinds = {(c.kind, c.mesh_axes) for c in f.lower(params, state, x, y).collectives()}
    assert ("all_reduce", ("dp",)) in kinds
    ref = {k: v.double().clone().requires_grad_() for k, v in params.items()}
    opt = torch.optim.SGD(ref.values(), lr=0.1, momentum=0.9)
    for _ in range(3):
        params, state, _ = f(params, state, x, y)
        opt.zero_grad()
        torch_loss(ref, x.double(), y.double()).backward()
        opt.step()
    for name in params:
        assert (params[name].double() - ref[name]).abs().max().item() <= 1e-5


def test_backward_errors() -> None:
    with pytest.raises(ts.TraceError, match="float scalar"):
        ts.jit(lambda x: graph.backward(x * 2, x))(torch.ones(3))


def _gpt_step(layers: int, heads: int, mesh: dist.Mesh | None, kernels: str):
    """benchmarks/compile_time.py's step: pre-LN layers (Megatron layouts over tp), a
    mean-square loss, ``graph.backward`` and AdamW."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    try:
        import comm_volume
    finally:
        sys.path.pop(0)
    layout = comm_volume.layouts(mesh, False)[1] if mesh is not None else {}
    names = ("wq", "wk", "wv", "wo", "w1", "w2", "ln1_w", "ln1_b", "ln2_w", "ln2_b")
    specs = {f"{n}{i}": spec for i in range(layers) for n, spec in layout.items()} or None

    def step(p, x):
        for i in range(layers):
            x = comm_volume.transformer_layer(x, {n: p[f"{n}{i}"] for n in names}, heads)
        loss = op.mean(x * x)
        return graph.backward(loss), {"loss": loss}

    return (
        graph.training_step(
            step, optimizer=optim.AdamW(lr=1e-3), mesh=mesh, param_shardings=specs, kernels=kernels
        ),
        comm_volume.layer_params,
    )


def _torch_gpt_step(params: dict, x: torch.Tensor, layers: int, heads: int) -> float:
    """The same step in torch (float64 in place on ``params``); returns the loss."""
    batch, seq, dim = x.shape
    causal = torch.tril(torch.ones(seq, seq, dtype=torch.bool))

    def split(t: torch.Tensor) -> torch.Tensor:
        return t.reshape(batch, seq, heads, dim // heads).transpose(1, 2)

    h = x
    for i in range(layers):
        p = {n: params[f"{n}{i}"] for n in ("wq", "wk", "wv", "wo", "w1", "w2")}
        a = F.layer_norm(h, (dim,), params[f"ln1_w{i}"], params[f"ln1_b{i}"])
        q, k, v = split(a @ p["wq"]), split(a @ p["wk"]), split(a @ p["wv"])
        scores = torch.where(causal, (q @ k.transpose(-1, -2)) / (dim // heads) ** 0.5, -1e9)
        merged = (scores.softmax(-1) @ v).transpose(1, 2).reshape(batch, seq, dim)
        h = h + merged @ p["wo"]
        a = F.layer_norm(h, (dim,), params[f"ln2_w{i}"], params[f"ln2_b{i}"])
        h = h + F.gelu(a @ p["w1"]) @ p["w2"]
    loss = (h * h).mean()
    opt = torch.optim.AdamW(params.values(), lr=1e-3, weight_decay=1e-2)
    loss.backward()
    opt.step()
    return loss.item()


@pytest.mark.parametrize(
    ("mesh", "layers"), [(None, 2), ({"dp": 2, "tp": 2}, 1)], ids=["one_device", "dp2_tp2"]
)
def test_gpt_training_step_through_triton_matches_torch(mesh: dict | None, layers: int) -> None:
    """The GPT-like step of benchmarks/compile_time.py (fused kernels: multi-output
    optimizer updates, matmul prologues, several reductions per kernel) run by the Triton
    kernels matches torch in float64: the loss (relative 1e-5) and every updated
    parameter (absolute 1e-5; one AdamW step moves a parameter by about lr = 1e-3)."""
    heads = 2
    step, layer_params = _gpt_step(layers, heads, dist.mesh(mesh) if mesh else None, "triton")
    params = layer_params(16, layers)
    x = torch.randn(4, 8, 16, generator=torch.Generator().manual_seed(3))
    state = step.init({k: v.clone() for k, v in params.items()})
    metrics = step(state, x)
    ref = {k: v.double().clone().requires_grad_() for k, v in params.items()}
    want = _torch_gpt_step(ref, x.double(), layers, heads)
    assert abs(float(metrics["loss"]) - want) <= 1e-5 * max(1.0, want)
    for name, value in state.params.items():
        error = (value.double() - ref[name].detach()).abs().max().item()
        assert error <= 1e-5, f"{name}: {error:.3g}"


def test_gpt_training_step_fits_the_kernel_budget() -> None:
    """Issue 17: at most 50 launched kernels per layer for a whole training step on a dp x
    tp = 2 x 2 mesh (matmuls included; views launch nothing), they lower to Triton source,
    and identical layers share their kernels (a third layer adds no distinct kernel)."""
    distinct = {}
    for layers in (1, 2, 3):
        step, layer_params = _gpt_step(layers, 4, dist.mesh({"dp": 2, "tp": 2}), "triton")
        shapes = {k: torch.empty(v.shape) for k, v in layer_params(64, layers, False).items()}
        lowered = step.lower(step.init(shapes), torch.empty(4, 16, 64))
        kernels = [o for o in lowered.module_at("schedule").walk() if o.name == "schedule.kernel"]
        launched = [k for k in kernels if not runs_as_view(k)]  # views: no code, no launch
        assert len(launched) <= 50 * layers, len(launched)
        sources = lowered.triton_source()  # lowering a kernel that cannot raises here
        assert sources and all("@triton.jit" in s for s in sources.values())
        tiles = {k.kernel_name for k in lowered.module_at("tile").walk() if k.name == "tile.kernel"}
        assert len(tiles) == len(sources) <= len(launched)
        distinct[layers] = len(sources)
    assert distinct[3] == distinct[2], distinct


def test_a_state_dict_resumes_training_where_it_stopped() -> None:
    """state_dict / load_state_dict on the virtual mesh: the state's own tensors (no
    collective), and a state loaded from them trains on exactly as the original does.
    (Under processes: tests/unit/test_distributed.py, test_a_saved_state_dict_...)."""
    mesh = dist.mesh({"dp": 2})

    @graph.training_step(optimizer=optim.AdamW(lr=1e-2), mesh=mesh, zero=1, kernels="reference")
    def step(p, x, y):
        loss = op.mean((model(p, x) - y) ** 2)
        return graph.backward(loss), {"loss": loss}

    params, x, y = setup()
    state = step.init(params)
    step(state, x, y)
    saved = step.state_dict(state)
    assert saved["step"] == 1 and saved["params"]["w1"] is params["w1"]  # updated in place
    leaves, tree = pytree.flatten(saved)
    resumed = step.load_state_dict(
        pytree.unflatten(
            tree, [torch.clone(t) if isinstance(t, torch.Tensor) else t for t in leaves]
        )
    )
    step(state, x, y)
    step(resumed, x, y)
    assert resumed.step == state.step == 2
    for name in params:
        assert torch.equal(resumed.params[name], state.params[name])
    with pytest.raises(ts.TesseraError, match=r"has no \['step'\]"):
        step.load_state_dict({"params": params, "opt_state": {}})
    with pytest.raises(ts.TesseraError, match="does not match AdamW's state"):
        step.load_state_dict({"params": params, "opt_state": {"m": {}}, "step": 0})


def test_the_training_step_options_are_defined_once() -> None:
    """``graph.training_step``, ``graph.TrainingStep`` and the pipelined step take the
    same options, with the same defaults and annotations (``TrainingStep``'s, the one
    definition), and the decorator's docstring documents each of them."""
    from tessera.pipeline.step import PipelinedTrainingStep

    def options(entry) -> list[inspect.Parameter]:
        fn, *rest = inspect.signature(entry).parameters.values()
        assert fn.name == "fn"
        return rest

    expected = options(graph.TrainingStep)
    assert [p.name for p in expected] == [
        "optimizer", "mesh", "param_shardings", "batch_shardings", "zero", "dp_axis",
        "kernels", "module", "pp_axis", "remat", "clip_grad_norm", "accumulate",
        "precision", "numerics", "cuda_graphs", "scan_layers",
    ]  # fmt: skip
    assert options(graph.training_step) == expected
    assert options(PipelinedTrainingStep) == expected
    assert inspect.signature(graph.training_step).parameters["fn"].default is None
    doc = graph.training_step.__doc__ or ""
    assert all(f"``{p.name}``" in doc for p in expected)
    with pytest.raises(TypeError, match=r"training_step: .*'zeros'"):
        graph.training_step(optimizer=optim.SGD(lr=0.1), zeros=1)
