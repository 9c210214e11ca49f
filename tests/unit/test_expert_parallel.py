"""Expert parallelism on the virtual mesh: expert weights ``[E, ...]`` split over ``ep``,
token groups over ``dp × ep``; the sharding passes insert the dispatch and combine
all-to-alls over ``ep`` (and their transposes in the backward), nothing else moves the
tokens. Values and gradients against the float64 loop reference (1e-10); composes with
tp (the experts' hidden dim split inside each expert).
"""

from __future__ import annotations

import torch
from moe_reference import reference_moe
from xdsl.dialects import func

import tessera as ts
from tessera import dist, op, schedule
from tessera.ir import schedule as sched

F64 = 1e-10
E, K, CAPACITY = 4, 2, 3
GROUPS = dist.ShardSpec(partition=(0,), mesh_axes=(("dp", "ep"),))
EXPERTS = dist.ShardSpec(partition=(0,), mesh_axes=("ep",))


def layer(x, wr, w1, w2):
    weights, experts, _ = op.router(x @ wr, k=K)
    routing = op.route(experts, num_experts=E, capacity=CAPACITY)
    ye = op.relu(op.dispatch(x, routing) @ w1) @ w2
    return op.combine(ye, routing, weights)


def loss(x, wr, w1, w2, u):
    return op.sum(layer(x, wr, w1, w2) * u)


def _inputs(seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shapes = [(4, 6, 8), (8, E), (E, 8, 16), (E, 16, 8), (4, 6, 8)]
    return [torch.randn(s, generator=g, dtype=torch.float64) for s in shapes]


def _all_to_alls(lowered) -> list[tuple[str, ...]]:
    return [c.mesh_axes for c in lowered.collectives() if c.kind == "all_to_all"]


def test_forward_inserts_one_dispatch_and_one_combine_all_to_all() -> None:
    x, wr, w1, w2, _ = _inputs()
    mesh = dist.Mesh(axes=["dp", "ep"], shape=(2, 2))
    f = ts.jit(layer, mesh=mesh, in_shardings=(GROUPS, None, EXPERTS, EXPERTS))
    lowered = f.lower(x, wr, w1, w2)
    infos = lowered.collectives()
    assert [c.kind for c in infos] == ["all_to_all", "all_to_all"], infos
    assert all(c.mesh_axes == ("ep",) and c.group_size == 2 for c in infos)
    # each rank sends its group's [E, C, H] slots: one group of 4 / (dp * ep) per rank
    assert [c.nbytes for c in infos] == [E * CAPACITY * 8 * 8] * 2
    torch.testing.assert_close(
        f(x, wr, w1, w2), reference_moe(x, wr, w1, w2, K, CAPACITY), rtol=F64, atol=F64
    )


def test_gradients_on_dp_x_ep_match_torch_autograd() -> None:
    x, wr, w1, w2, u = _inputs(1)
    mesh = dist.Mesh(axes=["dp", "ep"], shape=(2, 2))
    step = ts.jit(
        ts.grad(loss, argnums=(0, 1, 2, 3)),
        mesh=mesh,
        in_shardings=(GROUPS, None, EXPERTS, EXPERTS, GROUPS),
    )
    grads = step(x, wr, w1, w2, u)
    leaves = [t.clone().requires_grad_() for t in (x, wr, w1, w2)]
    (reference_moe(*leaves, K, CAPACITY) * u).sum().backward()
    for name, got, leaf in zip(("x", "router", "w1", "w2"), grads, leaves, strict=True):
        torch.testing.assert_close(got, leaf.grad, rtol=F64, atol=F64, msg=name)
    # forward dispatch and combine, backward their two transposes: four all-to-alls over
    # ep, each of one group's [E, C, H] slots (the formula); w1's gradient transposes the
    # tokens as moved by the forward's dispatch all-to-all, not sends them again. The
    # expert weights' gradients are reduced over dp only (each ep rank holds its
    # experts'), the router's over dp and ep
    lowered = step.lower(x, wr, w1, w2, u)
    assert _all_to_alls(lowered) == [("ep",)] * 4
    a2a = [c.nbytes for c in lowered.collectives() if c.kind == "all_to_all"]
    assert a2a == [E * CAPACITY * 8 * 8] * 4
    reduced = [c.mesh_axes for c in lowered.collectives() if c.kind == "all_reduce"]
    assert sorted(reduced) == [("dp",), ("dp",), ("dp", "ep")], reduced


def test_expert_parallel_composes_with_tensor_parallel_experts() -> None:
    """dp × ep × tp: the experts' hidden dim F split over tp (Megatron inside an expert)."""
    x, wr, w1, w2, u = _inputs(2)
    mesh = dist.Mesh(axes=["dp", "ep", "tp"], shape=(2, 2, 2))
    cols = dist.ShardSpec(partition=(0, 2), mesh_axes=("ep", "tp"))
    rows = dist.ShardSpec(partition=(0, 1), mesh_axes=("ep", "tp"))
    f = ts.jit(layer, mesh=mesh, in_shardings=(GROUPS, None, cols, rows))
    torch.testing.assert_close(
        f(x, wr, w1, w2), reference_moe(x, wr, w1, w2, K, CAPACITY), rtol=F64, atol=F64
    )
    lowered = f.lower(x, wr, w1, w2)
    assert _all_to_alls(lowered) == [("ep",)] * 2
    step = ts.jit(
        ts.grad(loss, argnums=(2, 3)), mesh=mesh, in_shardings=(GROUPS, None, cols, rows, GROUPS)
    )
    leaves = [x, wr, *(t.clone().requires_grad_() for t in (w1, w2))]
    (reference_moe(*leaves, K, CAPACITY) * u).sum().backward()
    for got, leaf in zip(step(x, wr, w1, w2, u), leaves[2:], strict=True):
        torch.testing.assert_close(got, leaf.grad, rtol=F64, atol=F64)


def shared_layer(x, wr, w1, w2, s1, s2):
    weights, experts, _ = op.router(x @ wr, k=K)
    routing = op.route(experts, num_experts=E, capacity=CAPACITY)
    return op.moe_block(
        x,
        routing,
        weights,
        experts=lambda xe: op.relu(xe @ w1) @ w2,
        shared=lambda t: op.relu(t @ s1) @ s2,
    )


def test_shared_expert_runs_while_the_combine_all_to_all_is_in_flight() -> None:
    """moe_block traces the shared expert between the experts and combine: with
    overlap-comm its two matmuls sit between the combine all-to-all's start and wait;
    values and gradients against torch."""
    x, wr, w1, w2, u = _inputs(3)
    g = torch.Generator().manual_seed(4)
    s1, s2 = (torch.randn(s, generator=g, dtype=torch.float64) for s in ((8, 16), (16, 8)))
    mesh = dist.Mesh(axes=["dp", "ep"], shape=(2, 2))
    with schedule.all_reduce_overlap(True):
        shardings = (GROUPS, None, EXPERTS, EXPERTS, None, None)
        f = ts.jit(shared_layer, mesh=mesh, in_shardings=shardings)
        expected = reference_moe(x, wr, w1, w2, K, CAPACITY) + torch.relu(x @ s1) @ s2
        torch.testing.assert_close(f(x, wr, w1, w2, s1, s2), expected, rtol=F64, atol=F64)
        lowered = f.lower(x, wr, w1, w2, s1, s2)
        assert _all_to_alls(lowered) == [("ep",)] * 2
        assert _kernels_in_flight(lowered) == [0, 2]  # dispatch: none; combine: the shared expert's

        def shared_loss(x, wr, w1, w2, s1, s2, u):
            return op.sum(shared_layer(x, wr, w1, w2, s1, s2) * u)

        step = ts.jit(
            ts.grad(shared_loss, argnums=(0, 1, 2, 3, 4, 5)),
            mesh=mesh,
            in_shardings=(GROUPS, None, EXPERTS, EXPERTS, None, None, GROUPS),
        )
        leaves = [t.clone().requires_grad_() for t in (x, wr, w1, w2, s1, s2)]
        shared = torch.relu(leaves[0] @ leaves[4]) @ leaves[5]
        out = reference_moe(*leaves[:4], K, CAPACITY) + shared
        (out * u).sum().backward()
        for got, leaf in zip(step(x, wr, w1, w2, s1, s2, u), leaves, strict=True):
            torch.testing.assert_close(got, leaf.grad, rtol=F64, atol=F64)
        lowered = step.lower(x, wr, w1, w2, s1, s2, u)
        assert _all_to_alls(lowered) == [("ep",)] * 4
        hidden = _kernels_in_flight(lowered)
        assert hidden[1] >= 2, hidden  # the forward's combine all-to-all, as above


def _kernels_in_flight(lowered) -> list[int]:
    """For each all-to-all, how many kernels run between its start and its wait."""
    function = next(
        f for f in lowered.module_at("schedule").ops if isinstance(f, func.FuncOp) and f.body.blocks
    )
    counts: dict[object, int] = {}
    for o in function.body.block.ops:
        if isinstance(o, sched.StartOp) and o.collective_name == "all_to_all":
            counts[o.results[0]] = 0
        elif isinstance(o, sched.WaitOp) and o.operands[0] in counts:
            counts[o.operands[0]] = -counts[o.operands[0]] - 1  # done: stop counting
        elif isinstance(o, sched.KernelOp):
            for handle, n in counts.items():
                if n >= 0:
                    counts[handle] = n + 1
    return [-n - 1 for n in counts.values()]
