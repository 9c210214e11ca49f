"""Sharded execution equals unsharded execution, for random programs and layouts.

Hypothesis draws a mesh, input tensors with random shardings, and a random program over
them (elementwise ops with broadcasting, matmuls, reductions, normalisations over any
axis, transposes, reshapes, sharding constraints, and chunks, splits, slices and concats
along any dim, sharded or not: their blocks move between ranks by collective permutes). The program runs twice: unsharded
through the reference executor, and sharded — shard-propagate, insert-collectives,
shard-partition, every rank on the virtual mesh, the global result assembled. Results
must agree to f32 rounding (rtol 1e-4, atol 1e-4: sharded sums add in another order).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from machines import BANDWIDTH_BOUND
from xdsl.context import Context
from xdsl.dialects.builtin import Builtin
from xdsl.dialects.func import Func
from xdsl.parser import Parser
from xdsl.rewriter import InsertPoint

import tessera as ts
from tessera import dist, op
from tessera.backends.virtual import run_partitioned
from tessera.ir.grad_builder import GradBuilder
from tessera.ir.graph import Graph
from tessera.ir.mesh import Mesh
from tessera.opdefs import op_def

MESHES = [(("x",), (4,)), (("x", "y"), (2, 2)), (("x", "y"), (2, 3)), (("x", "y"), (3, 2))]
SIZES = (12, 24)  # divisible by every axis size and product used here (4 and 6)


@dataclass
class Program:
    mesh: dist.Mesh
    inputs: list[torch.Tensor]
    specs: list[dist.ShardSpec | None]
    steps: list[tuple[str, Callable[[list[Any]], Any]]]
    constrain: bool = True  # apply dist.shard steps (the unsharded reference skips them)

    def __call__(self, *xs: Any) -> Any:
        values = list(xs)
        for name, step in self.steps:
            if name.startswith("shard") and not self.constrain:
                values.append(values[int(name.removeprefix("shard"))])  # the value, unconstrained
                continue
            values.append(step(values))
        return values[-1], values[len(xs)] if len(values) > len(xs) + 1 else values[-1]

    def __repr__(self) -> str:
        layout = ", ".join(
            f"{tuple(x.shape)}:{s}" for x, s in zip(self.inputs, self.specs, strict=True)
        )
        return f"Program({self.mesh}, inputs=[{layout}], steps={[n for n, _ in self.steps]})"


@st.composite
def specs(draw: st.DrawFn, mesh: dist.Mesh, rank: int) -> dist.ShardSpec | None:
    if draw(st.booleans()) and draw(st.booleans()):
        return None  # open: Tessera chooses
    partition, axes = [], []
    for axis in mesh.axis_names:
        dim = draw(st.integers(-1, rank - 1))
        if dim >= 0:
            partition.append(dim)
            axes.append(axis)
    return (
        dist.ShardSpec(partition=tuple(partition), mesh_axes=tuple(axes))
        if partition
        else dist.ShardSpec(replicate=True)
    )


@st.composite
def programs(draw: st.DrawFn) -> Program:
    names, shape = draw(st.sampled_from(MESHES))
    mesh = dist.Mesh(axes=list(names), shape=shape)
    m, k, n = (draw(st.sampled_from(SIZES)) for _ in range(3))
    inputs = [torch.randn(m, k), torch.randn(k, n), torch.randn(m, n)]
    input_specs = [draw(specs(mesh, 2)) for _ in inputs]
    steps: list[tuple[str, Callable[[list[Any]], Any]]] = []
    # values[0..2] are the inputs; each step appends one value; shapes tracked alongside
    shapes = [(m, k), (k, n), (m, n)]
    for _ in range(draw(st.integers(2, 6))):
        last = len(shapes) - 1
        choice = draw(st.sampled_from(
            ["matmul", "add", "mul", "unary", "reduce", "norm", "transpose", "reshape", "constrain", "bias",
             "chunk", "split", "rotate", "concat", "slice"]
        ))  # fmt: skip
        a = draw(st.integers(0, last))
        sa = shapes[a]
        if not sa and choice in (
            "bias",
            "reduce",
            "norm",
            "constrain",
            "chunk",
            "split",
            "rotate",
            "concat",
            "slice",
        ):
            continue  # a scalar (a whole reduction's result) has no axis to use
        if choice == "matmul":
            partners = [
                i for i, s in enumerate(shapes) if len(s) == 2 and len(sa) == 2 and s[0] == sa[1]
            ]
            if not partners:
                continue
            b = draw(st.sampled_from(partners))
            steps.append(("matmul", lambda v, a=a, b=b: op.matmul(v[a], v[b])))
            shapes.append((sa[0], shapes[b][1]))
        elif choice in ("add", "mul"):
            partners = [i for i, s in enumerate(shapes) if s == sa]
            b = draw(st.sampled_from(partners))
            fn = op.add if choice == "add" else op.multiply
            steps.append((choice, lambda v, a=a, b=b, fn=fn: fn(v[a], v[b])))
            shapes.append(sa)
        elif choice == "bias":
            steps.append(("bias", lambda v, a=a, n=sa[-1]: v[a] + op.full((n,), 0.5)))
            shapes.append(sa)
        elif choice == "unary":
            fn = draw(st.sampled_from([op.exp, op.tanh, op.gelu, op.relu, op.negative]))
            steps.append((fn.__name__, lambda v, a=a, fn=fn: fn(v[a] * 0.1)))
            shapes.append(sa)
        elif choice == "reduce":
            axis = draw(st.integers(0, len(sa) - 1))
            keep = draw(st.booleans())
            fn = draw(st.sampled_from([op.sum, op.mean, op.max, op.min]))
            steps.append(
                (
                    f"{fn.__name__}{axis}",
                    lambda v, a=a, axis=axis, keep=keep, fn=fn: fn(v[a], axis=axis, keepdims=keep),
                )
            )
            shapes.append(
                tuple(1 if d == axis else s for d, s in enumerate(sa))
                if keep
                else tuple(s for d, s in enumerate(sa) if d != axis)
            )
        elif choice == "norm":
            axis = draw(st.integers(0, len(sa) - 1))
            fn = draw(st.sampled_from([op.softmax, op.log_softmax, op.layer_norm, op.rms_norm]))
            steps.append(
                (f"{fn.__name__}{axis}", lambda v, a=a, axis=axis, fn=fn: fn(v[a], axis=axis))
            )
            shapes.append(sa)
        elif choice == "transpose" and len(sa) == 2:
            steps.append(("transpose", lambda v, a=a: v[a].T))
            shapes.append((sa[1], sa[0]))
        elif choice == "reshape" and len(sa) == 2:
            split_rows = sa[0] % 2 == 0 and draw(st.booleans())
            target = (2, sa[0] // 2, sa[1]) if split_rows else (sa[0] * sa[1],)
            steps.append(
                (f"reshape{target}", lambda v, a=a, target=target: op.reshape(v[a], target))
            )
            shapes.append(target)
        elif choice in ("chunk", "rotate"):  # a piece, or the pieces in another order
            axis = draw(st.integers(0, len(sa) - 1))
            pieces = draw(st.integers(2, 4))
            if sa[axis] % pieces:
                continue
            if choice == "chunk":
                index = draw(st.integers(0, pieces - 1))
                steps.append(
                    (
                        f"chunk{pieces}[{index}]@{axis}",
                        lambda v, a=a, n=pieces, i=index, axis=axis: op.chunk(v[a], n, axis=axis)[
                            i
                        ],
                    )
                )
                shapes.append(tuple(s // pieces if d == axis else s for d, s in enumerate(sa)))
            else:
                order = draw(st.permutations(range(pieces)))
                steps.append(
                    (
                        f"rotate{list(order)}@{axis}",
                        lambda v, a=a, n=pieces, order=order, axis=axis: op.concat(
                            [op.chunk(v[a], n, axis=axis)[i] for i in order], axis=axis
                        ),
                    )
                )
                shapes.append(sa)
        elif choice == "split":  # numpy's split points: uneven pieces
            axis = draw(st.integers(0, len(sa) - 1))
            if sa[axis] < 2:
                continue  # nothing to split
            points = sorted(draw(st.sets(st.integers(1, sa[axis] - 1), min_size=1, max_size=2)))
            index = draw(st.integers(0, len(points)))
            bounds = [0, *points, sa[axis]]
            steps.append(
                (
                    f"split{points}[{index}]@{axis}",
                    lambda v, a=a, p=points, i=index, axis=axis: op.split(v[a], p, axis=axis)[i],
                )
            )
            shapes.append(
                tuple(
                    bounds[index + 1] - bounds[index] if d == axis else s for d, s in enumerate(sa)
                )
            )
        elif choice == "concat":
            axis = draw(st.integers(0, len(sa) - 1))
            partners = [
                i
                for i, s in enumerate(shapes)
                if len(s) == len(sa)
                and all(x == y for d, (x, y) in enumerate(zip(s, sa, strict=True)) if d != axis)
            ]
            b = draw(st.sampled_from(partners))
            if sa[axis] + shapes[b][axis] > 48:
                continue  # keep the tensors small
            steps.append(
                (
                    f"concat@{axis}",
                    lambda v, a=a, b=b, axis=axis: op.concat([v[a], v[b]], axis=axis),
                )
            )
            shapes.append(tuple(x + shapes[b][axis] if d == axis else x for d, x in enumerate(sa)))
        elif choice == "slice":  # a contiguous range of one dim
            axis = draw(st.integers(0, len(sa) - 1))
            if sa[axis] < 1:
                continue
            low = draw(st.integers(0, sa[axis] - 1))
            high = draw(st.integers(low + 1, sa[axis]))
            index = (slice(None),) * axis + (slice(low, high),)
            steps.append((f"slice{low}:{high}@{axis}", lambda v, a=a, index=index: v[a][index]))
            shapes.append(tuple(high - low if d == axis else s for d, s in enumerate(sa)))
        elif choice == "constrain":
            spec = draw(specs(mesh, len(sa)))
            try:
                if spec is not None:
                    spec.to_sharding(mesh, sa)
            except ts.ShardingError:
                continue
            if spec is None:
                continue
            steps.append((f"shard{a}", lambda v, a=a, spec=spec: dist.shard(v[a], spec)))
            shapes.append(sa)
    if not steps:
        steps.append(("add", lambda v: v[0] + v[0]))
    return Program(mesh, inputs, input_specs, steps)


@settings(max_examples=220, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs())
def test_sharded_execution_equals_unsharded(program: Program) -> None:
    unconstrained = Program(
        program.mesh, program.inputs, program.specs, program.steps, constrain=False
    )
    reference = ts.jit(unconstrained)(*program.inputs)
    sharded = ts.jit(program, mesh=program.mesh, in_shardings=tuple(program.specs))
    result = sharded(*program.inputs)
    kinds = sorted({c.kind for c in sharded.lower(*program.inputs).collectives()})
    event(f"collectives: {kinds}")
    for got, want in zip(result, reference, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4, msg=repr(program))


# --- vocab-parallel ops: the vocabulary split over mesh axes (issue 19) -----------------------
# The embedding table [V, C] split on V, logits [..., V] split on V: each rank looks up
# (picks the label of) only what it holds. Checked in float64 against torch eager, forward
# and ts.grad (rtol, atol 1e-9: sharded sums add in another order), on random meshes,
# vocabulary splits (one axis or two), batch splits over the remaining axis, and ids drawn
# to include the first and last row of every rank's slice and negative ids.

TIGHT = {"rtol": 1e-9, "atol": 1e-9}


@dataclass
class VocabCase:
    mesh: dist.Mesh
    vocab_axes: tuple[str, ...]  # mesh axes splitting the vocabulary (major first)
    batch_axis: str | None  # the mesh axis splitting the ids / rows, if any
    vocab: int
    ids: torch.Tensor  # int64, in [-vocab, vocab) (labels: in [0, vocab))

    def rows_and_vocab(self) -> dist.ShardSpec:
        """A [rows, vocab] tensor's layout: the vocabulary split, the rows over the batch axis."""
        if self.batch_axis is None:
            return dist.ShardSpec(partition=(1,), mesh_axes=(self.vocab_axes,))
        return dist.ShardSpec(partition=(0, 1), mesh_axes=(self.batch_axis, self.vocab_axes))

    def batch(self) -> dist.ShardSpec:
        if self.batch_axis is None:
            return dist.ShardSpec(replicate=True)
        return dist.ShardSpec(partition=(0,), mesh_axes=(self.batch_axis,))


@st.composite
def vocab_cases(draw: st.DrawFn, negative: bool = True, rows: int | None = None) -> VocabCase:
    names, shape = draw(st.sampled_from(MESHES))
    mesh = dist.Mesh(axes=list(names), shape=shape, topology=BANDWIDTH_BOUND)  # toy as large
    sizes = dict(zip(names, shape, strict=True))
    vocab_axes = tuple(draw(st.sampled_from([n for n in (names, names[:1], names[-1:]) if n])))
    free = [a for a in names if a not in vocab_axes]
    batch_axis = draw(st.sampled_from([None, *free]))
    ways = 1
    for axis in vocab_axes:
        ways *= sizes[axis]
    vocab = ways * draw(st.integers(1, 5))
    count = (
        (sizes[batch_axis] if batch_axis else 1) * draw(st.integers(1, 4)) if rows is None else rows
    )
    local = vocab // ways
    edges = [v for start in range(0, vocab, local) for v in (start, start + local - 1)]
    low = -vocab if negative else 0
    pool = st.one_of(
        st.sampled_from(edges + ([-1, -vocab] if negative else [])), st.integers(low, vocab - 1)
    )
    ids = torch.tensor(draw(st.lists(pool, min_size=count, max_size=count)), dtype=torch.int64)
    return VocabCase(mesh, vocab_axes, batch_axis, vocab, ids)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(vocab_cases(), st.integers(1, 5))
def test_vocab_parallel_embedding_equals_unsharded(case: VocabCase, width: int) -> None:
    """op.embedding with the table split on the vocabulary: forward and ts.grad."""
    generator = torch.Generator().manual_seed(len(case.ids) * 31 + case.vocab)
    table = torch.randn(case.vocab, width, dtype=torch.float64, generator=generator)
    weights = torch.randn(len(case.ids), width, dtype=torch.float64, generator=generator)
    table_spec = dist.ShardSpec(partition=(0,), mesh_axes=(case.vocab_axes,))
    specs = (table_spec, case.batch(), case.batch())

    def loss(t: Any, ids: Any, w: Any) -> Any:
        return op.sum(op.embedding(ids, t) * w)

    lookup = ts.jit(lambda t, ids: op.embedding(ids, t), mesh=case.mesh, in_shardings=specs[:2])
    torch.testing.assert_close(lookup(table, case.ids), table[case.ids], **TIGHT)
    kinds = sorted({c.kind for c in lookup.lower(table, case.ids).collectives()})
    event(
        f"lookup: {'masked local lookup' if 'axis_index' in lookup.lower(table, case.ids).as_text('partitioned') else 'gathered table'} {kinds}"
    )
    grad = ts.jit(ts.grad(loss), mesh=case.mesh, in_shardings=specs, out_shardings=table_spec)
    eager = table.clone().requires_grad_()
    (eager[case.ids] * weights).sum().backward()
    torch.testing.assert_close(grad(table, case.ids, weights), eager.grad, **TIGHT)
    event(
        f"gradient: {sorted({c.kind for c in grad.lower(table, case.ids, weights).collectives()})}"
    )


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(vocab_cases(negative=False), st.sampled_from(["mean", "sum", "none"]))
def test_vocab_parallel_cross_entropy_equals_unsharded(case: VocabCase, reduction: str) -> None:
    """op.cross_entropy with the classes split: forward and ts.grad (of the mean or sum,
    or of a weighted sum of the per-row losses)."""
    generator = torch.Generator().manual_seed(len(case.ids) * 17 + case.vocab)
    logits = 3 * torch.randn(len(case.ids), case.vocab, dtype=torch.float64, generator=generator)
    weights = torch.randn(len(case.ids), dtype=torch.float64, generator=generator)
    specs = (case.rows_and_vocab(), case.batch())

    def loss(x: Any, labels: Any) -> Any:
        losses = op.cross_entropy(x, labels, reduction=reduction)
        return op.sum(losses * weights) if reduction == "none" else losses

    forward = ts.jit(
        lambda x, labels: op.cross_entropy(x, labels, reduction=reduction),
        mesh=case.mesh,
        in_shardings=specs,
    )
    expected = torch.nn.functional.cross_entropy(logits, case.ids, reduction=reduction)
    torch.testing.assert_close(forward(logits, case.ids), expected, **TIGHT)
    grad = ts.jit(ts.grad(loss), mesh=case.mesh, in_shardings=specs, out_shardings=specs[0])
    eager = logits.clone().requires_grad_()
    losses = torch.nn.functional.cross_entropy(eager, case.ids, reduction=reduction)
    (losses * weights).sum().backward() if reduction == "none" else losses.backward()
    torch.testing.assert_close(grad(logits, case.ids), eager.grad, **TIGHT)
    kinds = {c.kind for c in forward.lower(logits, case.ids).collectives()}
    assert "all_gather" not in kinds, kinds  # the logits never move, only row statistics


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(vocab_cases())
def test_logsumexp_over_a_split_axis_equals_unsharded(case: VocabCase) -> None:
    """op.logsumexp over the split axis (a composite: max, exp, sum, log): forward and
    ts.grad (softmax); only row statistics are all-reduced, in both directions."""
    generator = torch.Generator().manual_seed(len(case.ids) * 7 + case.vocab)
    x = 3 * torch.randn(len(case.ids), case.vocab, dtype=torch.float64, generator=generator)
    spec = case.rows_and_vocab()
    forward = ts.jit(lambda v: op.logsumexp(v, axis=-1), mesh=case.mesh, in_shardings=(spec,))
    torch.testing.assert_close(forward(x), torch.logsumexp(x, -1), **TIGHT)
    grad = ts.jit(
        ts.grad(lambda v: op.sum(op.logsumexp(v, axis=-1))),
        mesh=case.mesh,
        in_shardings=(spec,),
        out_shardings=spec,
    )
    torch.testing.assert_close(grad(x), torch.softmax(x, -1), **TIGHT)
    for compiled, args in ((forward, (x,)), (grad, (x,))):
        kinds = {c.kind for c in compiled.lower(*args).collectives()}
        assert kinds <= {"all_reduce"}, kinds


# --- blocks along a sharded dim, and collective permutes ----------------------------------------

BLOCK_MESHES = [
    (("x",), (2,)),
    (("x",), (3,)),
    (("x",), (4,)),
    (("x",), (6,)),
    (("x", "y"), (2, 3)),
    (("x", "y"), (2, 2)),
]


@st.composite
def block_programs(
    draw: st.DrawFn,
) -> tuple[dist.Mesh, list[torch.Tensor], list[dist.ShardSpec], Callable[..., Any], str]:
    """One chunk / split / concat / slice (or a chunk rotated and concatenated back) along
    a dim split over one or two mesh axes, the other dim maybe split too."""
    names, sizes = draw(st.sampled_from(BLOCK_MESHES))
    mesh = dist.Mesh(axes=list(names), shape=sizes)
    axes = tuple(draw(st.permutations(names))[: draw(st.integers(1, len(names)))])
    ways = 1
    for a in axes:
        ways *= mesh.axis_size(a)
    axis = draw(st.integers(0, 1))
    pieces = draw(st.integers(1, 4))
    size = ways * pieces * draw(st.integers(1, 2))
    other = draw(st.sampled_from([2, 6]))
    shape = (size, other) if axis == 0 else (other, size)
    spec = dist.ShardSpec(partition=(axis,), mesh_axes=(axes,))
    kind = draw(st.sampled_from(["chunk", "split", "rotate", "concat", "slice"]))
    inputs = [torch.randn(shape, dtype=torch.float64)]
    specs = [spec]
    if kind == "chunk":
        index = draw(st.integers(0, pieces - 1))
        fn = lambda x: op.chunk(x, pieces, axis=axis)[index]  # noqa: E731
        label = f"chunk({pieces})[{index}]"
    elif kind == "split":
        points = sorted(draw(st.sets(st.integers(1, size - 1), min_size=1, max_size=3)))
        fn = lambda x: op.split(x, points, axis=axis)  # noqa: E731
        label = f"split({points})"
    elif kind == "rotate":
        order = draw(st.permutations(range(pieces)))
        fn = lambda x: op.concat([op.chunk(x, pieces, axis=axis)[i] for i in order], axis=axis)  # noqa: E731
        label = f"rotate({list(order)})"
    elif kind == "concat":
        second = list(shape)
        second[axis] = ways * draw(st.integers(1, 3))
        inputs.append(torch.randn(second, dtype=torch.float64))
        specs.append(draw(st.sampled_from([spec, dist.ShardSpec(replicate=True)])))
        fn = lambda x, y: op.concat([y, x, y], axis=axis)  # noqa: E731
        label = "concat(y, x, y)"
    else:
        low = draw(st.integers(0, size - 1))
        high = draw(st.integers(low + 1, size))
        index = (slice(None),) * axis + (slice(low, high),)
        fn = lambda x: x[index]  # noqa: E731
        label = f"slice({low}:{high})"
    return mesh, inputs, specs, fn, f"{label} of {shape} on axis {axis} split over {axes} of {mesh}"


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(block_programs(), st.booleans())
def test_blocks_along_a_sharded_dim_equal_unsharded(case: tuple, keep_split: bool) -> None:
    """The result (kept split when it can be, else whole) equals the unsharded result
    exactly: blocks only move (whether they move or the dim is gathered is the cost
    model's choice; tests/unit/test_jit_sharding.py checks it on model-sized cases)."""
    mesh, inputs, specs, fn, label = case
    reference = ts.jit(fn)(*inputs)
    out = specs[0] if keep_split else dist.ShardSpec(replicate=True)
    flat = reference if isinstance(reference, torch.Tensor) else reference[0]
    try:
        out.to_sharding(mesh, tuple(flat.shape))
    except ts.ShardingError:
        out = dist.ShardSpec(replicate=True)
    outs = out if isinstance(reference, torch.Tensor) else None
    sharded = ts.jit(fn, mesh=mesh, in_shardings=tuple(specs), out_shardings=outs)
    result = sharded(*inputs)
    kinds = sorted({c.kind for c in sharded.lower(*inputs).collectives()})
    event(f"collectives: {kinds}")
    for got, want in zip(
        result if isinstance(result, tuple) else (result,),
        reference if isinstance(reference, tuple) else (reference,),
        strict=True,
    ):
        torch.testing.assert_close(got, want, rtol=0, atol=0, msg=label)


@st.composite
def permutes(draw: st.DrawFn) -> tuple[Any, tuple[str, ...], list[list[int]]]:
    names, sizes = draw(st.sampled_from(BLOCK_MESHES))
    mesh = Mesh(list(names), sizes)
    axes = tuple(draw(st.permutations(names))[: draw(st.integers(1, len(names)))])
    n = 1
    for a in axes:
        n *= mesh.axis_size(a)
    sources = draw(st.permutations(range(n)))
    targets = draw(st.permutations(range(n)))
    count = draw(st.integers(0, n))
    return mesh, axes, [[sources[i], targets[i]] for i in range(count)]


@settings(max_examples=60, deadline=None)
@given(permutes())
def test_collective_permute_and_its_vjp(case: tuple) -> None:
    """A random partial permutation on the virtual mesh equals numpy's, and its VJP (the
    inverse permutation) is its adjoint: <P x, y> = <x, Pᵀ y> summed over all ranks."""
    mesh, axes, pairs = case
    mesh_text = ", ".join(f"{a} = {s}" for a, s in zip(mesh.axis_names, mesh.shape, strict=True))
    text = f"""
    graph.mesh @mesh axes = [{mesh_text}]
    func.func @f(%x: tensor<3x2xf64>, %y: tensor<3x2xf64>) -> (tensor<3x2xf64>, tensor<3x2xf64>) attributes {{graph.partitioned}} {{
      %p = graph.collective_permute %x {{axes = [{", ".join(axes)}], pairs = {pairs}}} : tensor<3x2xf64>
      func.return %p, %y : tensor<3x2xf64>, tensor<3x2xf64>
    }}
    """
    context = Context()
    for dialect in (Builtin, Func, Graph):
        context.load_dialect(dialect)
    module = Parser(context, text).parse_module()
    function = next(o for o in module.ops if o.name == "func.func")
    permute = next(o for o in function.walk() if o.name == "graph.collective_permute")
    (transposed,) = op_def(permute).vjp(
        GradBuilder(InsertPoint.before(function.body.block.last_op)), permute, [function.args[1]]
    )
    function.body.block.last_op.operands[1] = transposed
    module.verify()
    rng = np.random.default_rng(len(pairs))
    xs = [rng.standard_normal((3, 2)) for _ in range(mesh.size)]
    ys = [rng.standard_normal((3, 2)) for _ in range(mesh.size)]
    results = run_partitioned(
        module,
        "f",
        mesh,
        [[torch.from_numpy(x), torch.from_numpy(y)] for x, y in zip(xs, ys, strict=True)],
    )
    expected = [np.zeros((3, 2)) for _ in xs]
    for group in mesh.groups(axes):
        for source, target in pairs:
            expected[group[target]] = xs[group[source]]
    for rank, (permuted, _) in enumerate(results):
        np.testing.assert_array_equal(permuted.numpy(), expected[rank])
    forward = sum(float((p.numpy() * y).sum()) for (p, _), y in zip(results, ys, strict=True))
    backward = sum(float((x * t.numpy()).sum()) for x, (_, t) in zip(xs, results, strict=True))
    assert forward == pytest.approx(backward, rel=1e-12, abs=1e-12)
