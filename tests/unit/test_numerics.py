"""The numerics policy (``tessera.numerics``): in deterministic mode a sum over ranks is
added in mesh order, ``((x0 + x1) + x2) + x3``, checked bit for bit against that sum
done by numpy in float32 (and bf16 terms in f32, rounded once); a training step is
bit-identical run to run; the simulator prices the ordered reduction as an all-gather.
Bit identity between the virtual mesh and gloo processes is checked in
``test_distributed.py::test_remat_clipping_and_accumulation_over_processes_equal_the_virtual_mesh``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tessera as ts
from tessera import dist, graph, numerics, op, optim
from tessera.environment import EnvironmentVariableError
from tessera.errors import TesseraError
from tessera.perf.collective_cost import collective_time
from tessera.perf.simulate import default_topology


def summed(dtype: torch.dtype):
    mesh = dist.mesh({"dp": 4})

    @ts.jit(mesh=mesh, in_shardings=(dist.ShardSpec(partition=(0,), mesh_axes=("dp",)),),
            kernels="reference")  # fmt: skip
    def f(x):
        return op.sum(x, axis=0)

    return f


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_deterministic_sum_over_ranks_is_added_in_mesh_order(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(4, 4096, generator=g) * torch.logspace(-4, 4, 4).unsqueeze(1)).to(dtype)
    with numerics.mode_of("deterministic"):
        got = summed(dtype)(x)
    terms = x.float().numpy()
    want = terms[0].copy()
    for term in terms[1:]:
        want = (want + term).astype(np.float32)
    assert torch.equal(got, torch.from_numpy(want).to(dtype))


def test_a_deterministic_training_step_is_bit_identical_run_to_run() -> None:
    mesh = dist.mesh({"dp": 2, "tp": 2})
    cols = dist.ShardSpec(partition=(1,), mesh_axes=("tp",))
    rows = dist.ShardSpec(partition=(0,), mesh_axes=("tp",))

    def run() -> list[torch.Tensor]:
        @graph.training_step(optimizer=optim.AdamW(lr=1e-2), mesh=mesh, kernels="reference",
                             param_shardings={"w1": cols, "w2": rows}, numerics="deterministic")  # fmt: skip
        def step(p, x, y):
            loss = op.mean((op.gelu(x @ p["w1"]) @ p["w2"] - y) ** 2)
            return graph.backward(loss), {"loss": loss}

        g = torch.Generator().manual_seed(1)
        params = {"w1": torch.randn(8, 32, generator=g), "w2": torch.randn(32, 8, generator=g)}
        x, y = torch.randn(16, 8, generator=g), torch.randn(16, 8, generator=g)
        state = step.init(params)
        losses = [step(state, x, y)["loss"] for _ in range(3)]
        return [*losses, *state.params.values()]

    for a, b in zip(run(), run(), strict=True):
        assert torch.equal(a, b)


def test_the_simulator_prices_the_ordered_sum_as_an_all_gather() -> None:
    mesh = dist.mesh({"dp": 8})

    @ts.jit(mesh=mesh, in_shardings=(dist.ShardSpec(partition=(0,), mesh_axes=("dp",)),),
            kernels="reference")  # fmt: skip
    def f(x):
        return op.sum(x, axis=0)

    lowered = f.lower(torch.randn(8, 1 << 20))
    fast = lowered.simulate()
    with numerics.mode_of("deterministic"):
        ordered = lowered.simulate()
    (event,) = [e for e in ordered.events if e.args.get("algorithm") == "ordered" and e.rank == 0]
    assert event.args["bytes"] == 4 << 20
    # each rank receives the 7 other operands: an all-gather of 8 S (the ring all-reduce
    # moves 2(n-1)/n S; NVLS less)
    gather = collective_time(default_topology(mesh), "all_gather", 8 * (4 << 20), range(8))
    assert ordered.comm_time_s == pytest.approx(gather.time_s)
    assert ordered.comm_time_s > 3.5 * fast.comm_time_s


def test_numerics_errors_name_the_problem(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(TesseraError, match="training_step: numerics must be one of"):
        graph.training_step(optimizer=optim.SGD(lr=0.1), numerics="exact")(lambda p, x: None)
    monkeypatch.setenv("TESSERA_NUMERICS", "exact")
    with pytest.raises(EnvironmentVariableError, match="TESSERA_NUMERICS='exact'"):
        numerics.mode()
    monkeypatch.setenv("TESSERA_NUMERICS", "deterministic")
    assert numerics.deterministic()
    with numerics.mode_of("fast"):
        assert numerics.mode() == "fast"
