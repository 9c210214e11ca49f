"""Bad inputs to Tessera's public API, as an adversarial user writes them: how many get
a clean :class:`tessera.TesseraError`.

    python benchmarks/api_misuse.py [--verbose] [NAME ...]

Each case runs in a forked child process (a case may crash the interpreter) and is
classified:

- ``clean``: a ``TesseraError`` subclass, with the user's ``file:line`` in the message when
  the case is traced code (``@ts.jit`` bodies below are defined in this file);
- ``unlocated``: a ``TesseraError`` for traced code whose message does not name this file;
- ``accepted``: no error at all (a bad input silently accepted);
- ``other``: another exception type (``AttributeError``, ``AssertionError`` from inside...);
- ``crash``: the child died (segmentation fault, abort) or hung past ``--timeout``.

The tests assert every case precisely (``tests/unit/test_api_errors.py``); this script
gives the tally recorded in issue 18.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import traceback
from collections.abc import Callable

import numpy as np
import torch

import tessera as ts
from tessera import dist, graph, op, optim, schedule

THIS_FILE = os.path.abspath(__file__)
mesh2 = dist.Mesh(axes=["dp"], shape=(2,))
rows = dist.ShardSpec(partition=(0,), mesh_axes=("dp",))
x22, x44, x4 = torch.randn(2, 2), torch.randn(4, 4), torch.randn(4)


def traced(fn: Callable, *args) -> Callable[[], object]:
    """A case: ``fn`` jitted and called on ``args`` (its error is at a line of this file)."""
    return lambda: ts.jit(fn)(*args)


def on_mesh(fn: Callable, *args, **options) -> Callable[[], object]:
    return lambda: ts.jit(fn, mesh=mesh2, **options)(*args)


def identity(x):
    return x


def two(a, b):
    return a + b


def loss_of_vector(x):
    return x * 2  # not a scalar


def int_loss(x):
    return op.sum(x)


def step_fn(params, x):
    loss = op.sum(x @ params["w"])
    return graph.backward(loss), {"loss": loss}


def no_backward(params, x):
    return op.sum(x @ params["w"])


TRACED = {  # code traced by @ts.jit: the error must name this file's line
    "torch.tanh(traced)": traced(lambda x: torch.tanh(x), x4),
    "torch.matmul(traced, traced)": traced(lambda x: torch.matmul(x, x), x44),
    "torch.nn.functional.relu(traced)": traced(lambda x: torch.nn.functional.relu(x), x4),
    "traced.item()": traced(lambda x: x.sum().item(), x4),
    "traced.numpy()": traced(lambda x: x.numpy(), x4),
    "traced.tolist()": traced(lambda x: x.tolist(), x4),
    "traced.cpu()": traced(lambda x: x.cpu(), x4),
    "float(traced)": traced(lambda x: float(x.sum()), x4),
    "bool(traced) in if": traced(lambda x: x if x.sum() > 0 else -x, x4),
    "len(0-d traced)": traced(lambda x: len(x.sum()), x4),
    "np.exp(traced)": traced(lambda x: np.exp(x), x4),
    "traced + str": traced(lambda x: x + "a", x4),
    "traced @ python int": traced(lambda x: x @ 3, x44),
    "traced[1.5]": traced(lambda x: x[1.5], x4),
    "traced[..., ...]": traced(lambda x: x[..., ...], x44),
    "traced[5] out of range": traced(lambda x: x[5], x4),
    "op.sum axis=5": traced(lambda x: op.sum(x, axis=5), x44),
    "op.sum axis=1.5": traced(lambda x: op.sum(x, axis=1.5), x44),
    "op.sum axis='a'": traced(lambda x: op.sum(x, axis="a"), x44),
    "op.sum axis=(0, 0)": traced(lambda x: op.sum(x, axis=(0, 0)), x44),
    "op.softmax axis=2": traced(lambda x: op.softmax(x, axis=2), x44),
    "op.softmax axis=None": traced(lambda x: op.softmax(x, axis=None), x44),
    "op.reshape (-2, 8)": traced(lambda x: op.reshape(x, (-2, 8)), x44),
    "op.reshape (-1, -1)": traced(lambda x: op.reshape(x, (-1, -1)), x44),
    "op.reshape (2.5, 4)": traced(lambda x: op.reshape(x, (2.5, 4)), x44),
    "op.reshape to other size": traced(lambda x: op.reshape(x, (3, 5)), x44),
    "op.transpose (0, 0)": traced(lambda x: op.transpose(x, (0, 0)), x44),
    "op.transpose ('a', 0)": traced(lambda x: op.transpose(x, ("a", 0)), x44),
    "op.zeros((-1,))": traced(lambda x: x + op.zeros((-1,)), x4),
    "op.zeros((2.5,))": traced(lambda x: x + op.zeros((2.5,)), x4),
    "op.full with dtype complex64": traced(lambda x: x + op.full((4,), 1.0, "complex64"), x4),
    "op.astype complex64": traced(lambda x: op.astype(x, torch.complex64), x4),
    "op.astype 'bogus'": traced(lambda x: op.astype(x, "bogus"), x4),
    "op.concat([])": traced(lambda x: op.concat([], axis=0), x4),
    "op.concat axis=3": traced(lambda x: op.concat([x, x], axis=3), x44),
    "op.split(x, 0)": traced(lambda x: op.split(x, 0), x44),
    "op.split(x, 3) not dividing": traced(lambda x: op.split(x, 3), x44),
    "op.chunk(x, 0)": traced(lambda x: op.chunk(x, 0), x44),
    "op.chunk(x, -1)": traced(lambda x: op.chunk(x, -1), x44),
    "op.take float indices": traced(lambda x: op.take(x, np.array([0.5])), x44),
    "op.embedding float ids": traced(lambda t: op.embedding(np.array([0.5]), t), x44),
    "op.one_hot num_classes=-1": traced(lambda x: op.one_hot(np.array([0]), -1) + x, x4),
    "op.one_hot num_classes=2.5": traced(lambda x: op.one_hot(np.array([0]), 2.5) + x, x4),
    "op.tril of 1-d": traced(lambda x: op.tril(x), x4),
    "op.broadcast_to smaller": traced(lambda x: op.broadcast_to(x, (2,)), x4),
    "op.broadcast_to (-1, 4)": traced(lambda x: op.broadcast_to(x, (-1, 4)), x4),
    "op.cross_entropy float labels": traced(lambda x: op.cross_entropy(x, x[:, 0]), x44),
    "op.cross_entropy reduction='avg'": traced(
        lambda x: op.cross_entropy(x, np.zeros(4, np.int64), reduction="avg"), x44
    ),
    "op.layer_norm axis=5": traced(lambda x: op.layer_norm(x, axis=5), x44),
    "op.gelu approximate='fast'": traced(lambda x: op.gelu(x, approximate="fast"), x4),
    "op.einsum bad equation": traced(lambda x: op.einsum("ij,jk->", x), x44),
    "op.arange(-5)": traced(lambda x: x + op.arange(-5), x4),
    "dist.shard(x, 'dp')": on_mesh(lambda x: dist.shard(x, "dp"), x44),
    "op.where missing operand": traced(lambda x: op.where(x > 0, x), x4),
    "matmul bool": traced(
        lambda a, b: a @ b, torch.ones(2, 2, dtype=torch.bool), torch.ones(2, 2, dtype=torch.bool)
    ),
    "einsum bool": traced(
        lambda a: op.einsum("ij,jk->ik", a, a), torch.ones(2, 2, dtype=torch.bool)
    ),
    "matmul k mismatch": traced(lambda a, b: a @ b, x22, x44),
    "ts.grad of a vector": lambda: ts.grad(loss_of_vector)(x4),
    "ts.grad of an integer loss": lambda: ts.grad(int_loss)(torch.ones(4, dtype=torch.int64)),
    "ts.grad w.r.t. an integer argument": lambda: ts.grad(lambda x, n: op.sum(x * n), argnums=1)(
        x4, torch.ones(4, dtype=torch.int64)
    ),
    "ts.grad has_aux without a tuple": lambda: ts.grad(lambda x: op.sum(x), has_aux=True)(x4),
    "ts.grad returning a tuple without has_aux": lambda: ts.grad(lambda x: (op.sum(x), x))(x4),
}

API = {  # bad inputs at the API boundary (no traced code)
    "jit mesh='dp'": lambda: ts.jit(identity, mesh="dp")(x4),
    "jit in_shardings=('dp',)": lambda: ts.jit(identity, mesh=mesh2, in_shardings=("dp",))(x4),
    "jit in_shardings=5": lambda: ts.jit(identity, mesh=mesh2, in_shardings=5)(x4),
    "jit in_shardings too long": lambda: ts.jit(identity, mesh=mesh2, in_shardings=(rows, rows))(
        x4
    ),
    "jit in_shardings dict for a tensor": lambda: ts.jit(
        identity, mesh=mesh2, in_shardings=({"a": rows},)
    )(x4),
    "jit out_shardings='x'": lambda: ts.jit(identity, mesh=mesh2, out_shardings="x")(x4),
    "jit out_shardings too many": lambda: ts.jit(identity, mesh=mesh2, out_shardings=(rows, rows))(
        x4
    ),
    "jit in_shardings without mesh": lambda: ts.jit(identity, in_shardings=(rows,)),
    "jit static_argnums=(5,)": lambda: ts.jit(identity, static_argnums=(5,))(x4),
    "jit static_argnums='0'": lambda: ts.jit(identity, static_argnums="0"),
    "jit static_argnums=(1.5,)": lambda: ts.jit(identity, static_argnums=(1.5,)),
    "jit static_argnums=(0, 0)": lambda: ts.jit(identity, static_argnums=(0, 0)),
    "jit donate_argnums=(0, 0)": lambda: ts.jit(identity, donate_argnums=(0, 0)),
    "jit donate_argnums=(3,)": lambda: ts.jit(identity, donate_argnums=(3,))(x4),
    "jit donate and static": lambda: ts.jit(identity, static_argnums=0, donate_argnums=0),
    "jit kernels='cuda'": lambda: ts.jit(identity, kernels="cuda"),
    "jit of a non-function": lambda: ts.jit(42),
    "call with too few arguments": lambda: ts.jit(two)(x4),
    "call with too many arguments": lambda: ts.jit(identity)(x4, x4),
    "call with an unknown keyword": lambda: ts.jit(identity)(x4, y=x4),
    "call with a complex tensor": lambda: ts.jit(identity)(torch.ones(2, dtype=torch.complex64)),
    "call with a uint8 tensor": lambda: ts.jit(identity)(torch.ones(2, dtype=torch.uint8)),
    "call with an unhashable static": lambda: ts.jit(lambda x, s: x, static_argnums=1)(x4, [1]),
    "lowered.as_text('bogus')": lambda: ts.jit(identity).lower(x4).as_text("bogus"),
    "mesh shape (2.7,)": lambda: dist.Mesh(axes=["dp"], shape=(2.7,)),
    "mesh shape (0,)": lambda: dist.Mesh(axes=["dp"], shape=(0,)),
    "mesh shape (-2,)": lambda: dist.Mesh(axes=["dp"], shape=(-2,)),
    "mesh shape (True,)": lambda: dist.Mesh(axes=["dp"], shape=(True,)),
    "mesh shape '2'": lambda: dist.Mesh(axes=["dp"], shape="2"),
    "mesh shape 2 (an int)": lambda: dist.Mesh(axes=["dp", "tp"], shape=2),
    "mesh shape huge": lambda: dist.Mesh(axes=["dp"], shape=(10**12,)),
    "mesh shape length mismatch": lambda: dist.Mesh(axes=["dp", "tp"], shape=(2,)),
    "mesh duplicate axes": lambda: dist.Mesh(axes=["dp", "dp"], shape=(2, 2)),
    "mesh no axes": lambda: dist.Mesh(axes=[], shape=()),
    "mesh axis 1": lambda: dist.Mesh(axes=[1], shape=(2,)),
    "mesh duplicate devices": lambda: dist.Mesh(axes=["dp"], shape=(2,), devices=[0, 0]),
    "mesh devices count": lambda: dist.Mesh(axes=["dp"], shape=(2,), devices=[0, 1, 2]),
    "dist.mesh({'dp': 0})": lambda: dist.mesh({"dp": 0}),
    "dist.mesh({'dp': '2'})": lambda: dist.mesh({"dp": "2"}),
    "ShardSpec partition=(1.0,)": lambda: dist.ShardSpec(partition=(1.0,), mesh_axes=("dp",)),
    "ShardSpec partition=(True,)": lambda: dist.ShardSpec(partition=(True,), mesh_axes=("dp",)),
    "ShardSpec partition=('diag',)": lambda: dist.ShardSpec(partition=("diag",), mesh_axes=("dp",)),
    "ShardSpec partition=None": lambda: dist.ShardSpec(partition=None, mesh_axes=("dp",)),
    "ShardSpec mesh_axes=(1,)": lambda: dist.ShardSpec(partition=(0,), mesh_axes=(1,)),
    "ShardSpec mesh_axes=(('dp', 1),)": lambda: dist.ShardSpec(
        partition=(0,), mesh_axes=(("dp", 1),)
    ),
    "ShardSpec mesh_axes length": lambda: dist.ShardSpec(partition=(0,), mesh_axes=("dp", "tp")),
    "ShardSpec replicate='yes'": lambda: dist.ShardSpec(replicate="yes"),
    "ShardSpec dim out of range": lambda: ts.jit(
        identity, mesh=mesh2, in_shardings=(dist.ShardSpec(partition=(5,), mesh_axes=("dp",)),)
    )(x4),
    "ShardSpec unknown axis": lambda: ts.jit(
        identity, mesh=mesh2, in_shardings=(dist.ShardSpec(partition=(0,), mesh_axes=("zz",)),)
    )(x4),
    "ShardSpec non-dividing split": lambda: ts.jit(identity, mesh=mesh2, in_shardings=(rows,))(
        torch.randn(3)
    ),
    "dist.tensor layout='dp'": lambda: dist.tensor(x4, layout="dp", mesh=mesh2),
    "dist.tensor mesh='dp'": lambda: dist.tensor(x4, layout=rows, mesh="dp"),
    "dist.tensor non-dividing": lambda: dist.tensor(torch.randn(3), layout=rows, mesh=mesh2),
    "dist.tensor shape (-2, 4)": lambda: dist.tensor((-2, 4), layout=rows, mesh=mesh2),
    "dist.tensor data='abc'": lambda: dist.tensor("abc", layout=rows, mesh=mesh2),
    "training_step optimizer='sgd'": lambda: graph.training_step(step_fn, optimizer="sgd"),
    "training_step zero=5": lambda: graph.training_step(
        step_fn, optimizer=optim.SGD(lr=0.1), zero=5
    ),
    "training_step mesh='dp'": lambda: graph.training_step(
        step_fn, optimizer=optim.SGD(lr=0.1), mesh="dp"
    ),
    "training_step without backward": lambda: graph.training_step(
        no_backward, optimizer=optim.SGD(lr=0.1)
    )(graph.training_step(no_backward, optimizer=optim.SGD(lr=0.1)).init({"w": x44}), x44),
    "training_step init(params=5)": lambda: graph.training_step(
        step_fn, optimizer=optim.SGD(lr=0.1)
    ).init(5),
    "training_step int params": lambda: graph.training_step(
        step_fn, optimizer=optim.SGD(lr=0.1)
    ).init({"w": torch.ones(4, 4, dtype=torch.int64)}),
    "training_step param_shardings='dp'": lambda: graph.training_step(
        step_fn, optimizer=optim.SGD(lr=0.1), mesh=mesh2, param_shardings="dp"
    ),
    "training_step called with two batches": lambda: (lambda s: s(s.init({"w": x44}), x44, x44))(
        graph.training_step(step_fn, optimizer=optim.SGD(lr=0.1))
    ),
    "mesh devices=5": lambda: dist.Mesh(axes=["dp"], devices=5),
    "optim.SGD(lr=-1)": lambda: optim.SGD(lr=-1.0),
    "optim.SGD(lr='x')": lambda: optim.SGD(lr="x"),
    "optim.AdamW(betas=(2, 0))": lambda: optim.AdamW(lr=1e-3, betas=(2.0, 0.0)),
    "schedule.pipeline_microbatches(0)": lambda: schedule.pipeline_microbatches(0),
    "schedule.pipeline_microbatches kind='x'": lambda: schedule.pipeline_microbatches(2, kind="x"),
    "schedule.options(bucket_bytes=-1)": lambda: schedule.options(bucket_bytes=-1).__enter__(),
    "schedule.options(unknown=1)": lambda: schedule.options(unknown=1).__enter__(),
}


def classify(name: str, case: Callable[[], object], traced_code: bool) -> tuple[str, str]:
    """(outcome, detail) of one case, run in this process."""
    try:
        case()
    except ts.TesseraError as error:
        if traced_code and THIS_FILE not in str(error):
            return "unlocated", f"{type(error).__name__}: {error}"
        return "clean", f"{type(error).__name__}: {str(error).splitlines()[0]}"
    except Exception as error:
        frames = len(traceback.extract_tb(error.__traceback__))
        return "other", f"{type(error).__name__} ({frames} frames): {error}"
    return "accepted", "no error"


def _child(name: str, traced_code: bool, queue: multiprocessing.Queue) -> None:
    cases = TRACED if traced_code else API
    queue.put(classify(name, cases[name], traced_code))


def run(name: str, traced_code: bool, timeout: float) -> tuple[str, str]:
    """Runs one case in a forked child, so that a crash is recorded, not suffered."""
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_child, args=(name, traced_code, queue))
    child.start()
    child.join(timeout)
    if child.is_alive():
        child.kill()
        child.join()
        return "crash", f"hung for {timeout:.0f} s"
    if not queue.empty():
        return queue.get()
    return "crash", f"exit code {child.exitcode}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="run only these cases")
    parser.add_argument("--verbose", action="store_true", help="print every case's outcome")
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args()
    cases = [(n, True) for n in TRACED] + [(n, False) for n in API]
    if args.names:
        cases = [(n, t) for n, t in cases if n in args.names]
    tally: dict[str, int] = {}
    for name, traced_code in cases:
        outcome, detail = run(name, traced_code, args.timeout)
        tally[outcome] = tally.get(outcome, 0) + 1
        if args.verbose or outcome != "clean":
            print(f"{outcome:10} {name:45} {detail[:200]}", flush=True)
    print(f"{len(cases)} cases: " + ", ".join(f"{k} {v}" for k, v in sorted(tally.items())))


if __name__ == "__main__":
    sys.exit(main())
