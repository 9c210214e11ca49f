"""Vocab-parallel embedding and cross-entropy on a dp x tp mesh (issue 19): what moves.

The table [V, C] and the logits [N, V] are split over tp on the vocabulary. A lookup
all-reduces its [N, C] result (never gathers the table), a cross-entropy all-reduces
three per-row statistics (never gathers the logits), and their gradients stay split
the same way. Values are checked against torch eager in float64 (rtol, atol 1e-10);
random shapes and layouts are test_sharding_property.py's.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import tessera as ts
from tessera import dist, op
from tessera.jit_function import JitFunction

MESH = dist.Mesh(axes=["dp", "tp"], shape=(2, 4))
VOCAB_TP = dist.ShardSpec(partition=(0,), mesh_axes=("tp",))  # the table's rows
ROWS_DP = dist.ShardSpec(partition=(0,), mesh_axes=("dp",))  # ids, labels
LOGITS = dist.ShardSpec(partition=(0, 1), mesh_axes=("dp", "tp"))
V, C, N = 256, 32, 16
TOL = {"rtol": 1e-10, "atol": 1e-10}


def _data(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    table = torch.randn(V, C, dtype=torch.float64, generator=g)
    ids = torch.randint(-V, V, (N,), generator=g)
    ids[:4] = torch.tensor([0, V - 1, -1, -V])  # the ends of the table, from both sides
    logits = 3 * torch.randn(N, V, dtype=torch.float64, generator=g)
    return table, ids, logits


def _collectives(
    compiled: JitFunction, *args: torch.Tensor
) -> list[tuple[str, tuple[str, ...], tuple[int, ...]]]:
    return [(c.kind, c.mesh_axes, c.shape) for c in compiled.lower(*args).collectives()]


def test_lookup_all_reduces_the_result_not_the_table() -> None:
    table, ids, _ = _data()
    lookup = ts.jit(lambda t, i: op.embedding(i, t), mesh=MESH, in_shardings=(VOCAB_TP, ROWS_DP))
    torch.testing.assert_close(lookup(table, ids), table[ids], **TOL)
    assert _collectives(lookup, table, ids) == [("all_reduce", ("tp",), (N // 2, C))]
    partitioned = lookup.lower(table, ids).as_text("partitioned")
    assert "graph.axis_index {axes = [tp]} : tensor<i32>" in partitioned  # the rank's offset


def test_lookup_reduce_scatters_into_a_split_consumer() -> None:
    table, ids, _ = _data(1)
    rows_tp = dist.ShardSpec(partition=(0,), mesh_axes=("tp",))
    lookup = ts.jit(
        lambda t, i: op.embedding(i, t),
        mesh=MESH,
        in_shardings=(VOCAB_TP, None),
        out_shardings=rows_tp,
    )
    torch.testing.assert_close(lookup(table, ids), table[ids], **TOL)
    assert [k for k, *_ in _collectives(lookup, table, ids)] == ["reduce_scatter"]


def test_lookup_gradient_is_computed_per_vocabulary_slice() -> None:
    """ts.grad of a lookup: each tp rank computes the gradient rows of its slice of the
    vocabulary (a [V/tp, N/dp] one-hot times the [N/dp, C] cotangent); nothing the size of
    the table crosses tp, and dp only gathers the small one-hot and cotangent."""
    table, ids, _ = _data(2)
    weights = torch.randn(N, C, dtype=torch.float64)

    def loss(t: torch.Tensor, i: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return op.sum(op.embedding(i, t) * w)

    grad = ts.jit(
        ts.grad(loss), mesh=MESH, in_shardings=(VOCAB_TP, ROWS_DP, ROWS_DP), out_shardings=VOCAB_TP
    )
    eager = table.clone().requires_grad_()
    (eager[ids] * weights).sum().backward()
    torch.testing.assert_close(grad(table, ids, weights), eager.grad, **TOL)
    assert all(axes != ("tp",) for _, axes, _ in _collectives(grad, table, ids, weights))
    partitioned = grad.lower(table, ids, weights).as_text("partitioned")
    assert f"-> tensor<1x{V // 4}x{C}xf64>" in partitioned  # the local gradient's matmul


def test_ids_out_of_range_give_zero_rows_when_the_vocabulary_is_split() -> None:
    """As in Megatron, no rank holds an id outside [-V, V) or a label outside [0, V): the
    row is zero, the label picks no logit (the loss is the row's logsumexp). Unsplit,
    both are errors."""
    table, _, logits = _data(3)
    ids = torch.tensor([0, V, 5, -V - 1])
    lookup = ts.jit(lambda t, i: op.embedding(i, t), mesh=MESH, in_shardings=(VOCAB_TP, None))
    out = lookup(table, ids)
    torch.testing.assert_close(out[[0, 2]], table[[0, 5]], **TOL)
    assert not out[[1, 3]].any()
    with pytest.raises(ts.ExecutionError, match=r"indices must be in \[-256, 256\)"):
        ts.jit(lambda t, i: op.embedding(i, t))(table, ids)
    labels = torch.tensor([3, V, -1, 7] * (N // 4))
    ce = ts.jit(
        lambda x, y: op.cross_entropy(x, y, reduction="none"),
        mesh=MESH,
        in_shardings=(LOGITS, ROWS_DP),
    )
    expected = torch.logsumexp(logits, -1) - logits.gather(1, labels.clamp(0, V - 1)[:, None])[
        :, 0
    ] * (labels >= 0) * (labels < V)
    torch.testing.assert_close(ce(logits, labels), expected, **TOL)
    with pytest.raises(ts.ExecutionError, match=r"labels must be in \[0, 256\)"):
        ts.jit(lambda x, y: op.cross_entropy(x, y))(logits, labels)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_all_reduces_row_statistics_only(reduction: str) -> None:
    """Forward: the row max, the sum of exponentials and the label's logit, [N/dp, 1]
    each, all-reduced over tp (the mean or sum then over dp): about V/3 times fewer bytes
    than gathering the logits."""
    _, _, logits = _data(4)
    labels = torch.randint(0, V, (N,))
    labels[:2] = torch.tensor([0, V - 1])
    ce = ts.jit(
        lambda x, y: op.cross_entropy(x, y, reduction=reduction),
        mesh=MESH,
        in_shardings=(LOGITS, ROWS_DP),
    )
    torch.testing.assert_close(
        ce(logits, labels), F.cross_entropy(logits, labels, reduction=reduction), **TOL
    )
    statistic = ("all_reduce", ("tp",), (N // 2, 1))
    expected = [statistic] * 3 + ([] if reduction == "none" else [("all_reduce", ("dp",), ())])
    assert _collectives(ce, logits, labels) == expected


def test_cross_entropy_gradient_stays_split() -> None:
    """Backward: softmax(x) - one_hot(label) on each rank's slice of the vocabulary, from
    the all-reduced row max and sum of exponentials."""
    _, _, logits = _data(5)
    labels = torch.randint(0, V, (N,))
    grad = ts.jit(
        ts.grad(lambda x, y: op.cross_entropy(x, y)),
        mesh=MESH,
        in_shardings=(LOGITS, ROWS_DP),
        out_shardings=LOGITS,
    )
    eager = logits.clone().requires_grad_()
    F.cross_entropy(eager, labels).backward()
    torch.testing.assert_close(grad(logits, labels), eager.grad, **TOL)
    assert _collectives(grad, logits, labels) == [("all_reduce", ("tp",), (N // 2, 1))] * 2


def test_logsumexp_gradient_all_reduces_forward_statistics_only() -> None:
    """logsumexp's shift (its row max) carries no gradient (stop_gradient, as in JAX): its
    gradient, softmax, needs only the forward's two row statistics."""
    _, _, x = _data(6)
    grad = ts.jit(
        ts.grad(lambda v: op.sum(op.logsumexp(v, axis=-1))),
        mesh=MESH,
        in_shardings=(LOGITS,),
        out_shardings=LOGITS,
    )
    torch.testing.assert_close(grad(x), torch.softmax(x, -1), **TOL)
    assert _collectives(grad, x) == [("all_reduce", ("tp",), (N // 2, 1))] * 2


def test_tied_gpt_head_moves_no_table_over_tp() -> None:
    """Embedding, layer norm, the tied output projection and the mean cross-entropy, with
    the gradient of the tied table: no collective over tp carries more than the [N/dp, C]
    activations, and the result matches torch."""
    table, ids, _ = _data(7)
    labels = torch.randint(0, V, (N,))

    def head(t: torch.Tensor, i: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return op.cross_entropy(op.layer_norm(op.embedding(i, t)) @ op.transpose(t, (1, 0)), y)

    step = ts.jit(
        ts.value_and_grad(head),
        mesh=MESH,
        in_shardings=(VOCAB_TP, ROWS_DP, ROWS_DP),
        out_shardings=(None, VOCAB_TP),
    )
    eager = table.clone().requires_grad_()
    expected = F.cross_entropy(F.layer_norm(eager[ids], (C,)) @ eager.T, labels)
    expected.backward()
    value, grad = step(table, ids, labels)
    torch.testing.assert_close(value, expected.detach(), **TOL)
    torch.testing.assert_close(grad, eager.grad, **TOL)
    for kind, axes, shape in _collectives(step, table, ids, labels):
        if "tp" in axes:
            assert torch.Size(shape).numel() <= (N // 2) * C, (kind, axes, shape)


def test_tied_gpt_head_gathers_token_ids_not_the_one_hot_over_dp() -> None:
    """The tied table's gradient over dp: ``hoist-all-gathers`` gathers the embedding
    backward's one-hot [V/tp, N/dp] as its integer ids (what runs: the schedule's
    collectives; the partitioned program gathers the one-hot). The gradient still
    matches torch's in float64."""
    from tessera.backends.collective_info import collectives

    table, ids, _ = _data(7)
    labels = torch.randint(0, V, (N,))

    def head(t: torch.Tensor, i: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return op.cross_entropy(op.layer_norm(op.embedding(i, t)) @ op.transpose(t, (1, 0)), y)

    step = ts.jit(
        ts.grad(head), mesh=MESH, in_shardings=(VOCAB_TP, ROWS_DP, ROWS_DP), out_shardings=VOCAB_TP
    )
    eager = table.clone().requires_grad_()
    F.cross_entropy(F.layer_norm(eager[ids], (C,)) @ eager.T, labels).backward()
    torch.testing.assert_close(step(table, ids, labels), eager.grad, **TOL)
    lowered = step.lower(table, ids, labels)
    one_hot = ("all_gather", (V // 4, N // 2), "f64")
    partitioned = [(c.kind, c.shape, c.dtype) for c in lowered.collectives()]
    scheduled = [(c.kind, c.shape, c.dtype) for c in collectives(lowered.module_at("schedule"))]
    assert one_hot in partitioned and one_hot not in scheduled
    assert ("all_gather", (1, N // 2), "i64") in scheduled
    assert len(scheduled) == len(partitioned)
