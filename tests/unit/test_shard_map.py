"""dist.shard_map: per-rank bodies with explicit collectives, on a dp x tp = 2 x 2 virtual
mesh, against torch computations of the global function in float64 (tolerance 1e-10:
the same sums in another order), their gradients against torch autograd, and the errors
the specs and collectives are checked for, at the user's line."""

from __future__ import annotations

import re

import pytest
import torch
from xdsl.context import Context
from xdsl.dialects.builtin import Builtin
from xdsl.dialects.func import Func
from xdsl.parser import Parser
from xdsl.utils.exceptions import VerifyException

import tessera as ts
from tessera import dist, op
from tessera.errors import ShardingError, TraceError
from tessera.ir.graph import Graph
from tessera.ir.verifier import verify_module

torch.set_num_threads(1)

MESH = dist.Mesh(axes=["dp", "tp"], shape=(2, 2))
S = dist.ShardSpec
BATCH = S(partition=(0,), mesh_axes=("dp",))
COLS = S(partition=(1,), mesh_axes=("tp",))
ROWS = S(partition=(0,), mesh_axes=("tp",))
BOTH = S(partition=(0, 1), mesh_axes=("dp", "tp"))
TOL = {"rtol": 1e-10, "atol": 1e-10}


def randn(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.float64)


def megatron(x, w1, w2):
    """A Megatron MLP written per rank: w1 by columns, w2 by rows, one tp all-reduce."""
    return dist.all_reduce(op.gelu(x @ w1) @ w2, "tp")


MLP = dist.shard_map(megatron, MESH, in_specs=(BATCH, COLS, ROWS), out_specs=BATCH)


def test_megatron_mlp_runs_per_rank_with_its_one_all_reduce():
    x, w1, w2 = randn(8, 16), randn(16, 32), randn(32, 16)
    f = ts.jit(lambda x, w1, w2: MLP(x, w1, w2) * 2.0, mesh=MESH)
    torch.testing.assert_close(f(x, w1, w2), torch.nn.functional.gelu(x @ w1) @ w2 * 2.0, **TOL)
    low = f.lower(x, w1, w2)
    assert [(c.kind, c.mesh_axes, c.shape) for c in low.collectives()] == [
        ("all_reduce", ("tp",), (4, 16))
    ]
    assert "attributes {graph.partitioned, graph.manual}" in low.as_text("graph")


def test_operands_are_resharded_to_the_in_specs():
    """Around the region automatic sharding runs: x enters split over tp by columns
    (in_shardings) and is resharded to the region's batch split; the result leaves
    split over dp and is consumed by ordinary ops."""
    x, w1, w2 = randn(8, 16), randn(16, 32), randn(32, 16)
    f = ts.jit(
        lambda x, w1, w2: op.tanh(MLP(x, w1, w2)).sum(axis=1),
        mesh=MESH,
        in_shardings=(COLS, None, None),
    )
    expected = torch.tanh(torch.nn.functional.gelu(x @ w1) @ w2).sum(1)
    torch.testing.assert_close(f(x, w1, w2), expected, **TOL)
    kinds = {c.kind for c in f.lower(x, w1, w2).collectives()}
    assert "all_gather" in kinds or "all_to_all" in kinds  # x's columns made whole


def test_ring_shift_and_axis_index():
    """ppermute shifts each tp block one rank along a ring; axis_index gives each rank
    its position; axis_size is the ring's length."""

    def ring(a):
        n = dist.axis_size("tp")
        shifted = dist.ppermute(a, "tp", perm=[(i, (i + 1) % n) for i in range(n)])
        return (
            shifted * 10.0
            + dist.axis_index("tp").astype(a.dtype)
            + dist.axis_index(("dp", "tp")).astype(a.dtype) * 100.0
        )

    x = randn(8, 12)
    f = ts.jit(dist.shard_map(ring, MESH, in_specs=BOTH, out_specs=BOTH), mesh=MESH)
    left, right = x.chunk(2, 1)
    expected = torch.cat([right * 10.0, left * 10.0 + 1.0], 1)
    expected[:, 6:] += 100.0  # position along (dp, tp), major dp: 2 d + t
    expected[4:] += 200.0
    torch.testing.assert_close(f(x), expected, **TOL)


def test_gather_scatter_and_all_to_all():
    def body(a):
        whole = dist.all_gather(a, "tp", dim=1)  # this dp block, every column
        summed = dist.reduce_scatter(whole, "tp", dim=1)  # the two ranks' sum: 2 blocks
        moved = dist.all_to_all(a, "tp", split_dim=0, concat_dim=1)  # rows split, columns whole
        return whole, summed, moved

    x = randn(8, 12)
    rows_over_both = S(partition=(0,), mesh_axes=(("dp", "tp"),))
    f = ts.jit(
        dist.shard_map(body, MESH, in_specs=BOTH, out_specs=(BATCH, BOTH, rows_over_both)),
        mesh=MESH,
    )
    whole, summed, moved = f(x)
    torch.testing.assert_close(whole, x, **TOL)
    torch.testing.assert_close(summed, 2 * x, **TOL)
    torch.testing.assert_close(moved, x, **TOL)


def test_outside_jit_a_shard_map_compiles_and_runs():
    x, w1, w2 = randn(8, 16), randn(16, 32), randn(32, 16)
    torch.testing.assert_close(MLP(x, w1, w2), torch.nn.functional.gelu(x @ w1) @ w2, **TOL)


def test_outside_a_region_collectives_keep_their_global_meaning():
    x = randn(8, 16)
    f = ts.jit(lambda x: dist.all_gather(x * 2.0, "tp", dim=1), mesh=MESH, in_shardings=(COLS,))
    torch.testing.assert_close(f(x), 2 * x, **TOL)


# --- errors -------------------------------------------------------------------------


def _run(body, in_specs, out_specs, *args):
    return ts.jit(dist.shard_map(body, MESH, in_specs=in_specs, out_specs=out_specs), mesh=MESH)(
        *args
    )


@pytest.mark.parametrize(
    ("body", "in_specs", "out_specs", "shape", "message"),
    [
        (lambda a: dist.all_reduce(a, "pp"), BOTH, BOTH, (8, 12), "unknown mesh axis 'pp'"),
        (
            lambda a: a,
            S(partition=(0,), mesh_axes=("pp",)),
            None,
            (8, 12),
            "unknown mesh axis 'pp'",
        ),
        (
            lambda a: dist.ppermute(a, "tp", perm=[(0, 1), (1, 1)]),
            BOTH,
            BOTH,
            (8, 12),
            "not a permutation",
        ),
        (
            lambda a: dist.ppermute(a, "tp", perm=[(0, 2)]),
            BOTH,
            BOTH,
            (8, 12),
            "out of range for the 2 ranks",
        ),
        (lambda a: a, BATCH, BATCH, (7, 3), "not divisible"),
        (lambda a: a * 2.0, BOTH, BATCH, (8, 12), "claims the result is replicated over 'tp'"),
        (
            lambda a: a + dist.axis_index("dp").astype(a.dtype),
            COLS,
            COLS,
            (8, 12),
            "replicated over 'dp'",
        ),
        (
            lambda a: dist.reduce_scatter(dist.all_gather(a, "tp", 1), "tp", 1),
            COLS,
            None,
            (8, 12),
            "over 'tp'",
        ),
    ],
    ids=[
        "axis",
        "spec-axis",
        "perm",
        "perm-range",
        "divide",
        "out-replicated",
        "axis-index",
        "reduce-scatter",
    ],
)
def test_errors_name_the_users_line(body, in_specs, out_specs, shape, message):
    with pytest.raises(ShardingError, match=message) as error:
        _run(body, in_specs, out_specs, randn(*shape))
    assert "test_shard_map.py" in str(error.value)


def test_a_replication_claim_kept_by_a_reduction_is_accepted():
    x = randn(8, 12)
    f = lambda a: dist.all_reduce(a.sum(axis=1, keepdims=True), "tp")  # noqa: E731
    torch.testing.assert_close(_run(f, BOTH, BATCH, x), x.sum(1, keepdim=True), **TOL)


def test_per_rank_ops_outside_a_region_are_errors():
    with pytest.raises(TraceError, match="per-rank meaning"):
        ts.jit(lambda a: a + dist.axis_index("tp").astype(a.dtype), mesh=MESH)(randn(4))


_MODULE = """
graph.mesh @mesh axes = [tp = 2]
func.func @f(%x: tensor<8xf32>) -> tensor<8xf32> {
  %y = graph.call @body(%x) : (tensor<8xf32>) -> (tensor<8xf32>)
  func.return %y : tensor<8xf32>
}
func.func private @body(%a: tensor<4xf32> {graph.sharding = #graph.sharding<@mesh, [[tp]]>}) -> (tensor<8xf32> {graph.sharding = #graph.sharding<@mesh, [[]]>}) attributes {graph.partitioned, graph.manual} {
  %g = graph.all_gather %a {axes = [tp], dim = 0} : tensor<4xf32> -> tensor<8xf32>
  %h = graph.exp %g : tensor<8xf32>
  func.return %h : tensor<8xf32>
}
"""


def _verify(text: str) -> None:
    context = Context()
    for dialect in (Builtin, Func, Graph):
        context.load_dialect(dialect)
    verify_module(Parser(context, text).parse_module())


def test_the_ir_verifier_checks_the_out_specs_and_the_calls():
    _verify(_MODULE)  # gathered: the same on both tp ranks
    varying = _MODULE.replace(
        "%h = graph.exp %g : tensor<8xf32>",
        "%i = graph.axis_index {axes = [tp]} : tensor<i32>\n  %c = graph.cast %i : tensor<i32> -> tensor<f32>\n  %h = graph.add %g, %c : tensor<8xf32>, tensor<f32> -> tensor<8xf32>",
    )
    with pytest.raises(VerifyException, match="claims the result is replicated over 'tp'"):
        _verify(varying)
    with pytest.raises(VerifyException, match="gives per-rank blocks tensor<8xf32>"):
        _verify(_MODULE.replace("[[tp]]>}) ->", "[[]]>}) ->"))


# --- gradients ----------------------------------------------------------------------


def _torch_grads(fn, *args):
    leaves = [a.clone().requires_grad_() for a in args]
    fn(*leaves).backward()
    return [leaf.grad for leaf in leaves]


def test_grad_of_the_megatron_mlp():
    x, w1, w2, c = randn(8, 16), randn(16, 32), randn(32, 16), randn(8, 16)
    loss = lambda x, w1, w2: (MLP(x, w1, w2) * c).sum()  # noqa: E731
    grads = ts.jit(ts.grad(loss, argnums=(0, 1, 2)), mesh=MESH)(x, w1, w2)
    expected = _torch_grads(
        lambda x, w1, w2: ((torch.nn.functional.gelu(x @ w1) @ w2) * c).sum(), x, w1, w2
    )
    for got, want in zip(grads, expected, strict=True):
        torch.testing.assert_close(got, want, **TOL)


def _mixed(a, w):
    """all_gather, a tp-varying factor, ppermute, reduce_scatter and all_to_all: per
    rank (d, t), 4 (x_d @ w)^2, its rows d * 4 + t * 2 on (d, t)."""
    h = dist.all_gather(a, "tp", dim=1) @ w  # w is replicated: the same on every rank
    varying = h * (dist.axis_index("tp").astype(h.dtype) + 1.0)
    swapped = dist.ppermute(varying, "tp", perm=[(0, 1), (1, 0)])
    summed = dist.reduce_scatter(swapped * varying, "tp", dim=1)
    return dist.all_to_all(summed, "tp", split_dim=0, concat_dim=1)


def test_mixed_collectives_forward_and_grad():
    x, w, c = randn(8, 12), randn(12, 6), randn(8, 6)
    region = dist.shard_map(
        _mixed, MESH, in_specs=(BOTH, None), out_specs=S(partition=(0,), mesh_axes=(("dp", "tp"),))
    )
    torch.testing.assert_close(ts.jit(region, mesh=MESH)(x, w), 4 * (x @ w) ** 2, **TOL)
    grads = ts.jit(ts.grad(lambda x, w: (region(x, w) * c).sum(), argnums=(0, 1)), mesh=MESH)(x, w)
    expected = _torch_grads(lambda x, w: (4 * (x @ w) ** 2 * c).sum(), x, w)
    for got, want in zip(grads, expected, strict=True):
        torch.testing.assert_close(got, want, **TOL)


def test_grad_of_an_all_reduce_of_a_replicated_value_counts_every_rank():
    """all_reduce over tp of a value the same on both tp ranks doubles it: so does its
    gradient."""
    x, c = randn(6), randn(6)
    region = dist.shard_map(
        lambda a: dist.all_reduce(a * 3.0, "tp"), MESH, in_specs=None, out_specs=None
    )
    (grad,) = ts.jit(ts.grad(lambda x: (region(x) * c).sum(), argnums=(0,)), mesh=MESH)(x)
    torch.testing.assert_close(grad, 6.0 * c, **TOL)


def test_training_step_with_a_manual_mlp_equals_the_automatic_one():
    """One SGD step of a Megatron MLP written with shard_map updates the parameters as
    the automatically sharded MLP does, and as torch does."""
    from tessera import graph, optim

    def make(manual: bool):
        @graph.training_step(
            optimizer=optim.SGD(lr=0.1), mesh=MESH, param_shardings={"w1": COLS, "w2": ROWS}
        )
        def step(params, x, y):
            w1, w2 = params["w1"], params["w2"]
            out = MLP(x, w1, w2) if manual else op.gelu(x @ w1) @ w2
            loss = op.mean((out - y) * (out - y))
            return graph.backward(loss), {"loss": loss}

        return step

    w1, w2 = randn(16, 32) / 4, randn(32, 16) / 4
    x, y = randn(8, 16), randn(8, 16)
    results = []
    for manual in (True, False):
        params = {"w1": w1.clone(), "w2": w2.clone()}
        step = make(manual)
        state = step.init(params)
        loss = step(state, x, y)["loss"]
        results.append((loss, params["w1"], params["w2"]))
    leaves = [w1.clone().requires_grad_(), w2.clone().requires_grad_()]
    out = torch.nn.functional.gelu(x @ leaves[0]) @ leaves[1]
    expected_loss = ((out - y) ** 2).mean()
    expected_loss.backward()
    expected = (expected_loss.detach(), w1 - 0.1 * leaves[0].grad, w2 - 0.1 * leaves[1].grad)
    for result in results:
        for got, want in zip(result, expected, strict=True):
            torch.testing.assert_close(got, want, **TOL)
    # the manual step moves what the automatic one does: its backward computes no
    # gradient for the batch (not differentiated), so it all-reduces none over tp
    tp, total = [], []
    for manual in (True, False):
        step = make(manual)
        infos = step.lower(step.init({"w1": w1.clone(), "w2": w2.clone()}), x, y).collectives()
        tp.append([(c.kind, c.nbytes) for c in infos if "tp" in c.mesh_axes])
        total.append(sum(c.nbytes for c in infos))
    assert tp[0] == tp[1] == [("all_reduce", 4 * 16 * 8)], tp  # the forward's, one
    assert total[0] == total[1], total


def test_grad_through_a_checkpointed_shard_map():
    x, w1, w2, c = randn(8, 16), randn(16, 32), randn(32, 16), randn(8, 16)
    from tessera import graph

    block = graph.checkpoint(lambda x, w1, w2: op.tanh(MLP(x, w1, w2)))
    loss = lambda x, w1, w2: (block(x, w1, w2) * c).sum()  # noqa: E731
    grads = ts.jit(ts.grad(loss, argnums=(0, 1, 2)), mesh=MESH)(x, w1, w2)
    reference = lambda x, w1, w2: (torch.tanh(torch.nn.functional.gelu(x @ w1) @ w2) * c).sum()  # noqa: E731
    for got, want in zip(grads, _torch_grads(reference, x, w1, w2), strict=True):
        torch.testing.assert_close(got, want, **TOL)


def test_an_async_collective_overlaps_the_work_before_its_wait():
    def body(a, b):
        gathered = dist.all_gather_async(a, "tp", dim=1)
        other = op.tanh(b @ op.transpose(b, (1, 0)))  # independent of the gather
        return gathered.wait() * 2.0, other

    rows_over_both = S(partition=(0,), mesh_axes=(("dp", "tp"),))
    region = dist.shard_map(body, MESH, in_specs=(BOTH, BOTH), out_specs=(BATCH, rows_over_both))
    f = ts.jit(region, mesh=MESH)
    a, b = randn(8, 12), randn(8, 12)
    gathered, other = f(a, b)
    torch.testing.assert_close(gathered, 2 * a, **TOL)
    blocks = [blk for rows in b.chunk(2, 0) for blk in rows.chunk(2, 1)]  # ranks (d, t), major d
    torch.testing.assert_close(other, torch.cat([torch.tanh(k @ k.T) for k in blocks]), **TOL)
    text = f.lower(a, b).as_text("schedule")
    start, kernel, wait = (
        text.index(s) for s in ("schedule.start all_gather", "_matmul(", "schedule.wait")
    )
    assert start < kernel < wait


def test_send_and_recv_pairs():
    """A send over dp from position 0 to 1, received as like; position 0 receives zeros."""

    def body(a):
        dist.send(a * 2.0, "dp", to=[(0, 1)])
        return dist.recv("dp", frm=[(0, 1)], like=a) + a

    x, c = randn(8, 12), randn(8, 12)
    y = _run(body, BOTH, BOTH, x)
    reference = lambda x: torch.cat([x[:4], x[4:] + 2 * x[:4]])  # noqa: E731
    torch.testing.assert_close(y, reference(x), **TOL)
    region = dist.shard_map(body, MESH, in_specs=BOTH, out_specs=BOTH)
    (grad,) = ts.jit(ts.grad(lambda x: (region(x) * c).sum(), argnums=(0,)), mesh=MESH)(x)
    (expected,) = _torch_grads(lambda x: (reference(x) * c).sum(), x)
    torch.testing.assert_close(grad, expected, **TOL)  # the recv transposes to a send back


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (lambda a: dist.send(a, "dp", to=[(0, 1)]) or a, "a dist.send has no matching dist.recv"),
        (
            lambda a: dist.send(a, "dp", to=[(0, 1)]) or dist.recv("dp", frm=[(1, 0)], like=a),
            "has no matching dist.send",
        ),
        (
            lambda a: dist.send(a, "dp", to=[(0, 1)]) or dist.recv("dp", frm=[(0, 1)], like=a[0]),
            "the matching dist.send",
        ),
    ],
    ids=["unreceived", "other-pairs", "other-shape"],
)
def test_mismatched_send_and_recv_are_errors(body, message):
    with pytest.raises(ShardingError, match=message) as error:
        _run(body, BOTH, BOTH, randn(8, 12))
    assert "test_shard_map.py" in str(error.value)


def _schedule_order(text: str) -> list[str]:
    """The manual function's kernels (by kind: ``@<function>_k<N>_<kind>``), starts and
    waits, in order; a wait where the user called ``h.wait()`` is ``user wait``."""
    region = text.split("graph.manual", 1)[1].split("func.return", 1)[0]
    order = []
    for line in region.splitlines():
        if "schedule.start" in line:
            order.append("start")
        elif "schedule.wait" in line:
            order.append("user wait" if "schedule.user_wait" in line else "wait")
        elif kernel := re.search(r"schedule\.kernel @\w+?_k\d+_(\w+)\(", line):
            order.append(kernel.group(1))
    return order


def _waited(early: bool):
    """An all-reduce of a partial matmul started, a tanh kernel, h.wait(), an exp kernel
    (independent of the reduction); ``early``: h.wait() right after the start."""

    def body(x, w, b, c):
        handle = dist.all_reduce_async(x @ w, "tp")
        reduced = handle.wait() if early else None
        first = op.tanh(b @ c)
        reduced = handle.wait() if reduced is None else reduced
        second = op.exp(b @ op.transpose(c, (1, 0)))
        return reduced * 2.0, first, second

    return dist.shard_map(body, MESH, in_specs=(BOTH, ROWS, BATCH, None), out_specs=BATCH)


@pytest.mark.parametrize("early", [False, True], ids=["after-tanh", "at-start"])
def test_the_wait_stays_where_the_user_called_it(early: bool):
    """overlap-comm alone would wait just before the reduction's first use (the mul),
    after both independent kernels; the wait stays at h.wait(): after the tanh kernel,
    before the exp kernel (or right after the start). The values are torch's."""
    x, w, b, c = randn(8, 12), randn(12, 8), randn(8, 8), randn(8, 8)
    f = ts.jit(_waited(early), mesh=MESH)
    for got, want in zip(
        f(x, w, b, c), (2 * x @ w, torch.tanh(b @ c), torch.exp(b @ c.T)), strict=True
    ):
        torch.testing.assert_close(got, want, **TOL)
    order = _schedule_order(f.lower(x, w, b, c).as_text("schedule"))
    middle = ["user wait", "matmul", "matmul"] if early else ["matmul", "user wait", "matmul"]
    assert order == ["matmul", "start", *middle, "mul"], order


def test_a_user_wait_is_the_identity_to_gradients():
    x, w, b, c = randn(8, 12), randn(12, 8), randn(8, 8), randn(8, 8)
    cts = [randn(8, 8) for _ in range(3)]
    region = _waited(False)
    loss = lambda *a: sum((r * ct).sum() for r, ct in zip(region(*a), cts, strict=True))  # noqa: E731
    grads = ts.jit(ts.grad(loss, argnums=(0, 1, 2, 3)), mesh=MESH)(x, w, b, c)
    expected = _torch_grads(
        lambda x, w, b, c: (2 * x @ w * cts[0]).sum()
        + (torch.tanh(b @ c) * cts[1]).sum()
        + (torch.exp(b @ c.T) * cts[2]).sum(),
        x, w, b, c,
    )  # fmt: skip
    for got, want in zip(grads, expected, strict=True):
        torch.testing.assert_close(got, want, **TOL)
