"""lower-graph-to-schedule on partitioned programs from ts.jit: every graph op of the input
lands in exactly one kernel (constants: in every kernel that uses them) and every
collective in exactly one start/wait pair; the result verifies and re-parses."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import pytest
import torch
from xdsl.context import Context
from xdsl.dialects.builtin import Builtin, ModuleOp
from xdsl.dialects.func import Func, FuncOp
from xdsl.parser import Parser

import tessera as ts
from tessera import dist, op
from tessera.ir import graph, schedule
from tessera.opdefs import Fusion, fusion_of
from tessera.passes.lower_graph_to_schedule import LowerGraphToSchedulePass

MESH = dist.Mesh(axes=["dp", "tp"], shape=(2, 4))
ROWS_DP = dist.ShardSpec(partition=(0,), mesh_axes=("dp",))
COLS_TP = dist.ShardSpec(partition=(1,), mesh_axes=("tp",))
ROWS_TP = dist.ShardSpec(partition=(0,), mesh_axes=("tp",))


def megatron_mlp(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    return op.gelu(op.matmul(x, w1)) @ w2


def split_normalizations(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    h = op.matmul(x, w)  # columns split over tp: softmax and layer_norm expand
    return op.layer_norm(op.softmax(h * 0.5, axis=-1) + h, axis=-1) * 2.0


def residual_block(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    h = op.relu(op.matmul(x, w1))
    y = op.matmul(h, w2)
    return op.transpose(y + x, (1, 0)) * 3.0


def _weights(*shapes: tuple[int, ...]) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    return tuple(torch.randn(*s, generator=g) for s in shapes)


PROGRAMS: dict[
    str,
    tuple[
        Callable[..., torch.Tensor], tuple[dist.ShardSpec | None, ...], tuple[tuple[int, ...], ...]
    ],
] = {
    "megatron_mlp": (megatron_mlp, (ROWS_DP, COLS_TP, ROWS_TP), ((16, 64), (64, 32), (32, 64))),
    "split_normalizations": (split_normalizations, (ROWS_DP, COLS_TP), ((16, 64), (64, 32))),
    "residual_block": (residual_block, (ROWS_DP, COLS_TP, ROWS_TP), ((16, 64), (64, 32), (32, 64))),
}


def _partitioned(name: str) -> ModuleOp:
    fn, shardings, shapes = PROGRAMS[name]
    lowered = ts.jit(fn, mesh=MESH, in_shardings=shardings).lower(*_weights(*shapes))
    return lowered.module_at("partitioned").clone()


def _key(op_: graph.GraphOp) -> tuple[str, str]:
    """An op's identity across the rewrite: its name, properties and types."""
    return op_.name, str(
        [op_.properties, [v.type for v in op_.operands], [r.type for r in op_.results]]
    )


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_every_op_in_one_kernel_and_every_collective_in_one_pair(name: str) -> None:
    module = _partitioned(name)
    function = next(o for o in module.ops if isinstance(o, FuncOp))
    before = [o for o in function.body.block.ops if isinstance(o, graph.GraphOp)]
    collectives = [o for o in before if fusion_of(o) is Fusion.COLLECTIVE]
    computed = Counter(
        _key(o) for o in before if fusion_of(o) not in (Fusion.CONSTANT, Fusion.COLLECTIVE)
    )
    constants = {_key(o) for o in before if isinstance(o, graph.ConstantOp)}

    LowerGraphToSchedulePass().apply(Context(), module)
    module.verify()

    top = list(function.body.block.ops)
    assert not [o.name for o in top if isinstance(o, graph.GraphOp)], (
        "graph ops left outside kernels"
    )
    kernels = [o for o in top if isinstance(o, schedule.KernelOp)]
    inside = [o for k in kernels for o in k.body.block.ops if isinstance(o, graph.GraphOp)]
    assert Counter(_key(o) for o in inside if not isinstance(o, graph.ConstantOp)) == computed
    assert {_key(o) for o in inside if isinstance(o, graph.ConstantOp)} <= constants
    assert len({k.kernel_name for k in kernels}) == len(kernels)

    starts = [o for o in top if isinstance(o, schedule.StartOp)]
    waits = [o for o in top if isinstance(o, schedule.WaitOp)]
    assert Counter(c.name.removeprefix("graph.") for c in collectives) == Counter(
        s.collective_name for s in starts
    )
    assert len(waits) == len(starts)
    for start in starts:  # one wait per start, after it
        (use,) = start.handle.uses
        assert top.index(use.operation) > top.index(start)

    ctx = Context()
    for dialect in (Builtin, Func, graph.Graph, schedule.Schedule):
        ctx.load_dialect(dialect)
    assert str(Parser(ctx, str(module)).parse_module()) == str(module)


def test_megatron_mlp_is_two_kernels_and_one_all_reduce() -> None:
    module = _partitioned("megatron_mlp")
    LowerGraphToSchedulePass().apply(Context(), module)
    function = next(o for o in module.ops if isinstance(o, FuncOp))
    names = [
        o.name if not isinstance(o, schedule.KernelOp) else o.kernel_name
        for o in function.body.block.ops
    ]
    assert names[:2] == ["megatron_mlp_k0_matmul", "megatron_mlp_k1_matmul"]
    assert names[2:] == ["schedule.start", "schedule.wait", "func.return"]
