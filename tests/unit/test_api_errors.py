"""Bad inputs to the public API give a TesseraError subclass that says what is wrong.

Two tables: code traced by ``@ts.jit`` (the error names the user's ``file:line``: each
case's line ends in ``# <- its name``) and bad options and arguments at the API boundary
(``ts.jit``, ``dist.Mesh``, ``dist.ShardSpec``, ``dist.tensor``, ``ts.grad``,
``graph.training_step``, ``optim``, ``schedule``). Each case checks the error type and
the key phrase of its message. ``benchmarks/api_misuse.py`` runs the same kinds of cases
and prints the tally (issue 18: 67 of 133 clean before, 132 after).
"""

from __future__ import annotations

import traceback
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import tessera as ts
from tessera import dist, graph, op, optim, schedule

SOURCE = Path(__file__).read_text().splitlines()


def at(marker: str) -> str:
    """``file:line`` of the line of this file ending in ``# <- marker``."""
    (line,) = [i for i, text in enumerate(SOURCE, 1) if text.endswith(f"# <- {marker}")]
    return f"{__file__}:{line}"


v4, m44 = torch.randn(4), torch.randn(4, 4)

# name: (function, its arguments, error type, key phrase); the name ends the function's line
TRACED = {
    "torch.tanh": (lambda x: torch.tanh(x), (v4,), ts.TraceError, "use tessera.op.tanh"),  # <- torch.tanh
    "torch.matmul": (lambda x: torch.matmul(x, x), (m44,), ts.TraceError, "torch.matmul is not traceable"),  # <- torch.matmul
    "torch.add(tensor, traced)": (lambda x: torch.add(torch.ones(4), x), (v4,), ts.TraceError, "use tessera.op.add"),  # <- torch.add(tensor, traced)
    "F.relu": (lambda x: F.relu(x), (v4,), ts.TraceError, "use tessera.op.relu"),  # <- F.relu
    "torch.softmax": (lambda x: torch.softmax(x, 0), (v4,), ts.TraceError, "use tessera.op.softmax"),  # <- torch.softmax
    ".item()": (lambda x: x.sum().item(), (v4,), ts.TraceError, "not known while tracing"),  # <- .item()
    ".numpy()": (lambda x: x.numpy(), (v4,), ts.TraceError, "not known while tracing"),  # <- .numpy()
    ".tolist()": (lambda x: x.tolist(), (v4,), ts.TraceError, ".tolist() needs the value"),  # <- .tolist()
    ".cpu()": (lambda x: x.cpu(), (v4,), ts.TraceError, "no torch.Tensor method .cpu()"),  # <- .cpu()
    ".float()": (lambda x: x.float(), (v4,), ts.TraceError, "convert dtypes with x.astype(dtype)"),  # <- .float()
    ".unsqueeze()": (lambda x: x.unsqueeze(0), (v4,), ts.TraceError, "method .unsqueeze()"),  # <- .unsqueeze()
    "float()": (lambda x: float(x.sum()), (v4,), ts.TraceError, "a Python number"),  # <- float()
    "if on a tensor": (lambda x: x if x.sum() > 0 else -x, (v4,), ts.TraceError, "op.where"),  # <- if on a tensor
    "np.asarray": (lambda x: np.asarray(x), (v4,), ts.TraceError, "a numpy array needs"),  # <- np.asarray
    "tensor + str": (lambda x: x + "a", (v4,), ts.TraceError, "a str cannot be used as a tensor"),  # <- tensor + str
    "sum axis=1.5": (lambda x: op.sum(x, axis=1.5), (m44,), ts.ShapeError, "axis must be an integer"),  # <- sum axis=1.5
    "sum axis='a'": (lambda x: op.sum(x, axis="a"), (m44,), ts.ShapeError, "axis must be an integer"),  # <- sum axis='a'
    "softmax axis=None": (lambda x: op.softmax(x, axis=None), (m44,), ts.ShapeError, "axis must be an integer"),  # <- softmax axis=None
    "transpose ('a', 0)": (lambda x: op.transpose(x, ("a", 0)), (m44,), ts.ShapeError, "integer"),  # <- transpose ('a', 0)
    "reshape (-2, 8)": (lambda x: op.reshape(x, (-2, 8)), (m44,), ts.ShapeError, "sizes must be >= 0"),  # <- reshape (-2, 8)
    "reshape (2.5, 4)": (lambda x: op.reshape(x, (2.5, 4)), (m44,), ts.ShapeError, "must be an integer"),  # <- reshape (2.5, 4)
    "zeros((-1,))": (lambda x: x + op.zeros((-1,)), (v4,), ts.ShapeError, "negative size"),  # <- zeros((-1,))
    "zeros((2.5,))": (lambda x: x + op.zeros((2.5,)), (v4,), ts.ShapeError, "must be an integer"),  # <- zeros((2.5,))
    "full complex64": (lambda x: x + op.full((4,), 1.0, "complex64"), (v4,), ts.ShapeError, "unsupported dtype"),  # <- full complex64
    "astype complex64": (lambda x: op.astype(x, torch.complex64), (v4,), ts.ShapeError, "float64, float32"),  # <- astype complex64
    "broadcast_to (-1, 4)": (lambda x: op.broadcast_to(x, (-1, 4)), (v4,), ts.ShapeError, "negative size"),  # <- broadcast_to (-1, 4)
    "max over an empty axis": (lambda x: op.max(x, axis=1), (torch.ones(4, 0),), ts.ShapeError, "empty axis"),  # <- max over an empty axis
    "bool matmul": (lambda a: a @ a, (torch.ones(2, 2, dtype=torch.bool),), ts.ShapeError, "bool matmuls"),  # <- bool matmul
}  # fmt: skip


@pytest.mark.parametrize("name", list(TRACED))
def test_traced_code_errors_name_the_users_line(name):
    fn, args, error, phrase = TRACED[name]
    with pytest.raises(error) as info:
        ts.jit(fn)(*args)
    message = str(info.value)
    assert phrase in message, message
    assert at(name) in message, message
    assert info.value.__cause__ is None  # no chained internal exception


def test_torch_function_error_is_raised_from_the_tracer_not_from_inside_torch():
    with pytest.raises(ts.TraceError) as info:
        ts.jit(lambda x: torch.tanh(x))(v4)  # <- short
    frames = traceback.extract_tb(info.tb)
    assert len(frames) <= 8 and not any("triton" in f.filename for f in frames)


# --- the API boundary ---------------------------------------------------------------------------

mesh = dist.Mesh(axes=["dp"], shape=(2,))
rows = dist.ShardSpec(partition=(0,), mesh_axes=("dp",))


def identity(x):
    return x


def two(a, b):
    return a + b


def step_fn(params, x):
    loss = op.sum(x @ params["w"])
    return graph.backward(loss), {"loss": loss}


SGD = optim.SGD(lr=0.1)

# name: (a call, error type, key phrase)
API = {
    "jit mesh='dp'": (lambda: ts.jit(identity, mesh="dp"), ts.ShardingError, "mesh must be a dist.Mesh"),
    "jit in_shardings=('dp',)": (lambda: ts.jit(identity, mesh=mesh, in_shardings=("dp",)), ts.ShardingError, "must hold dist.ShardSpec"),
    "jit in_shardings=5": (lambda: ts.jit(identity, mesh=mesh, in_shardings=5), ts.ShardingError, "found int 5"),
    "jit out_shardings='x'": (lambda: ts.jit(identity, mesh=mesh, out_shardings="x"), ts.ShardingError, "out_shardings must hold"),
    "jit in_shardings too long": (lambda: ts.jit(identity, mesh=mesh, in_shardings=(rows, rows))(v4), ts.ShardingError, "2 entries for 1"),
    "jit static_argnums=(5,)": (lambda: ts.jit(identity, static_argnums=(5,)), ts.ArgumentError, "takes 1 positional"),
    "jit static_argnums='0'": (lambda: ts.jit(identity, static_argnums="0"), ts.ArgumentError, "int or a sequence of ints"),
    "jit static_argnums=(1.5,)": (lambda: ts.jit(identity, static_argnums=(1.5,)), ts.ArgumentError, "must hold ints"),
    "jit static_argnums=(0, 0)": (lambda: ts.jit(identity, static_argnums=(0, 0)), ts.ArgumentError, "names an argument twice"),
    "jit static_argnums beyond *args": (lambda: ts.jit(lambda *xs: xs[0], static_argnums=3)(v4), ts.ArgumentError, "called with 1 positional"),
    "jit donate_argnums=(0, 0)": (lambda: ts.jit(identity, donate_argnums=(0, 0)), ts.ArgumentError, "names an argument twice"),
    "jit donate_argnums=(3,)": (lambda: ts.jit(identity, donate_argnums=(3,)), ts.ArgumentError, "takes 1 positional"),
    "jit donated and static": (lambda: ts.jit(identity, static_argnums=0, donate_argnums=0), ts.ArgumentError, "both static and donated"),
    "jit kernels='cuda'": (lambda: ts.jit(identity, kernels="cuda"), ts.ArgumentError, "kernels must be one of"),
    "jit of a non-function": (lambda: ts.jit(42), ts.ArgumentError, "expects a function"),
    "call with too few arguments": (lambda: ts.jit(two)(v4), ts.TraceError, "missing a required argument: 'b'"),
    "call with too many arguments": (lambda: ts.jit(identity)(v4, v4), ts.TraceError, "too many positional arguments"),
    "call with an unknown keyword": (lambda: ts.jit(identity)(v4, y=v4), ts.TraceError, "unexpected keyword argument 'y'"),
    "call with a complex tensor": (lambda: ts.jit(identity)(torch.ones(2, dtype=torch.complex64)), ts.ExecutionError, "argument 'x'"),
    "call with an unhashable static": (lambda: ts.jit(lambda x, s: x, static_argnums=1)(v4, [1]), ts.TraceError, "must be hashable"),
    "call with other shapes than lowered": (lambda: ts.jit(identity).lower(v4)(m44), ts.ExecutionError, "was compiled for arrays"),
    "mesh shape (2.7,)": (lambda: dist.Mesh(axes=["dp"], shape=(2.7,)), ts.ShardingError, "sizes must be ints"),
    "mesh shape (True,)": (lambda: dist.Mesh(axes=["dp"], shape=(True,)), ts.ShardingError, "sizes must be ints"),
    "mesh shape '2'": (lambda: dist.Mesh(axes=["dp"], shape="2"), ts.ShardingError, "sequence of ints"),
    "mesh shape (0,)": (lambda: dist.Mesh(axes=["dp"], shape=(0,)), ts.ShardingError, "must be positive"),
    "mesh shape (-2,)": (lambda: dist.Mesh(axes=["dp"], shape=(-2,)), ts.ShardingError, "must be positive"),
    "mesh shape huge": (lambda: dist.Mesh(axes=["dp", "tp"], shape=(10**6, 10**6)), ts.ShardingError, "more than"),
    "mesh shape length": (lambda: dist.Mesh(axes=["dp", "tp"], shape=2), ts.ShardingError, "2 axes"),
    "mesh duplicate axes": (lambda: dist.Mesh(axes=["dp", "dp"], shape=(2, 2)), ts.ShardingError, "distinct"),
    "mesh axes=5": (lambda: dist.Mesh(axes=5, shape=(2,)), ts.ShardingError, "sequence of names"),
    "mesh duplicate devices": (lambda: dist.Mesh(axes=["dp"], shape=(2,), devices=[0, 0]), ts.ShardingError, "devices must be distinct"),
    "dist.mesh({'dp': '2'})": (lambda: dist.mesh({"dp": "2"}), ts.ShardingError, "sizes must be ints"),
    "ShardSpec partition=(1.0,)": (lambda: dist.ShardSpec(partition=(1.0,), mesh_axes=("dp",)), ts.ShardingError, "dim index"),
    "ShardSpec partition=(True,)": (lambda: dist.ShardSpec(partition=(True,), mesh_axes=("dp",)), ts.ShardingError, "dim index"),
    "ShardSpec partition=('diag',)": (lambda: dist.ShardSpec(partition=("diag",), mesh_axes=("dp",)), ts.ShardingError, "'row' / 'col'"),
    "ShardSpec partition=None": (lambda: dist.ShardSpec(partition=None, mesh_axes=("dp",)), ts.ShardingError, "sequence of dims"),
    "ShardSpec mesh_axes=(1,)": (lambda: dist.ShardSpec(partition=(0,), mesh_axes=(1,)), ts.ShardingError, "axis name"),
    "ShardSpec mesh_axes=(('dp', 1),)": (lambda: dist.ShardSpec(partition=(0,), mesh_axes=(("dp", 1),)), ts.ShardingError, "tuple of them"),
    "ShardSpec replicate='yes'": (lambda: dist.ShardSpec(replicate="yes"), ts.ShardingError, "True or False"),
    "dist.tensor layout='dp'": (lambda: dist.tensor(v4, layout="dp", mesh=mesh), ts.ShardingError, "layout must be a dist.ShardSpec"),
    "dist.tensor mesh='dp'": (lambda: dist.tensor(v4, layout=rows, mesh="dp"), ts.ShardingError, "mesh must be a dist.Mesh"),
    "dist.tensor data='abc'": (lambda: dist.tensor("abc", layout=rows, mesh=mesh), ts.ArgumentError, "array data"),
    "dist.tensor shape (-2, 4)": (lambda: dist.tensor((-2, 4), layout=rows, mesh=mesh), ts.ArgumentError, "negative sizes"),
    "grad argnums='x'": (lambda: ts.grad(identity, argnums="x"), ts.ArgumentError, "argnums must be"),
    "grad argnums out of range": (lambda: ts.grad(identity, argnums=3)(v4), ts.ArgumentError, "out of range"),
    "grad w.r.t. an integer argument": (lambda: ts.grad(lambda x: op.sum(x))(torch.ones(2, dtype=torch.int64)), ts.ArgumentError, "only float arrays have gradients"),
    "training_step mesh='dp'": (lambda: graph.training_step(step_fn, optimizer=SGD, mesh="dp"), ts.ShardingError, "mesh must be a dist.Mesh"),
    "training_step param_shardings='dp'": (lambda: graph.training_step(step_fn, optimizer=SGD, mesh=mesh, param_shardings="dp"), ts.ShardingError, "param_shardings must hold"),
    "training_step batch_shardings=5": (lambda: graph.training_step(step_fn, optimizer=SGD, mesh=mesh, batch_shardings=5), ts.ShardingError, "batch_shardings must hold"),
    "training_step called with two batches": (lambda: (lambda s: s(s.init({"w": torch.ones(4, 4)}), m44, m44))(graph.training_step(step_fn, optimizer=SGD)), ts.TraceError, "too many positional arguments"),
    "mesh devices=5": (lambda: dist.Mesh(axes=["dp"], devices=5), ts.ShardingError, "devices must be a sequence"),
    "training_step optimizer='sgd'": (lambda: graph.training_step(step_fn, optimizer="sgd"), ts.TesseraError, "optimizer must be"),
    "training_step zero=5": (lambda: graph.training_step(step_fn, optimizer=SGD, zero=5), ts.TesseraError, "zero must be one of"),
    "training_step int params": (lambda: graph.training_step(step_fn, optimizer=SGD).init({"w": torch.ones(2, dtype=torch.int64)}), ts.TesseraError, "float tensors"),
    "optim.SGD(lr=-1)": (lambda: optim.SGD(lr=-1.0), ts.ArgumentError, "lr must be a finite number >= 0"),
    "optim.SGD(lr='x')": (lambda: optim.SGD(lr="x"), ts.ArgumentError, "lr must be a number"),
    "optim.AdamW(betas=(2, 0))": (lambda: optim.AdamW(betas=(2.0, 0.0)), ts.ArgumentError, "beta1 must be in [0, 1)"),
    "optim.AdamW(eps=nan)": (lambda: optim.AdamW(eps=float("nan")), ts.ArgumentError, "eps must be"),
    "schedule bucket_bytes=-1": (lambda: schedule.options(bucket_bytes=-1).__enter__(), ts.TesseraError, "must be >= 0"),
    "schedule overlap='yes'": (lambda: schedule.options(overlap="yes").__enter__(), ts.TesseraError, "must be a bool"),
    "schedule pipeline_schedule='x'": (lambda: schedule.options(pipeline_schedule="x").__enter__(), ts.TesseraError, "must be one of"),
}  # fmt: skip


@pytest.mark.parametrize("name", list(API))
def test_bad_api_inputs_are_tessera_errors(name):
    call, error, phrase = API[name]
    with pytest.raises(error) as info:
        call()
    assert phrase in str(info.value), str(info.value)


def test_dist_shard_with_a_mesh_axis_name_instead_of_a_spec():
    def f(x):
        return dist.shard(x, "dp")  # <- shard "dp"

    with pytest.raises(ts.ShardingError, match=r"dist\.shard takes a dist\.ShardSpec") as info:
        ts.jit(f, mesh=mesh)(m44)
    assert at('shard "dp"') in str(info.value)


def test_grad_of_a_non_scalar_names_where_the_loss_was_computed():
    def loss(x):
        return x * 2  # <- vector loss

    with pytest.raises(ts.TraceError, match="must be a float scalar") as info:
        ts.grad(loss)(v4)
    assert at("vector loss") in str(info.value)


def test_grad_of_an_integer_loss_names_where_it_was_computed():
    def loss(x):
        return op.sum(op.astype(x, "int64"))  # <- integer loss

    with pytest.raises(ts.TraceError, match="must be a float scalar") as info:
        ts.grad(loss)(v4)
    assert at("integer loss") in str(info.value)


def test_hasattr_of_a_torch_method_on_a_traced_tensor_is_false():
    seen = []

    def f(x):
        seen.append((hasattr(x, "device"), hasattr(x, "shape")))
        return x

    ts.jit(f)(v4)
    assert seen == [(False, True)]


def test_wrong_call_names_the_function_definition():
    def f(a, b):  # <- definition
        return a + b

    with pytest.raises(ts.TraceError) as info:
        ts.jit(f)(v4)
    assert f"defined at {at('definition')}" in str(info.value)


def test_type_error_inside_the_function_is_not_reported_as_a_wrong_call():
    def f(x):
        return len(5)  # a bug in the user's code, not a wrong call

    with pytest.raises(TypeError, match="has no len"):
        ts.jit(f)(v4)


def test_valid_inputs_next_to_the_bad_ones_still_work():
    """The checks reject only what is wrong: numpy ints, a one-axis int shape, named dims."""
    assert dist.Mesh(axes="dp", shape=np.int64(2)).shape == (2,)
    assert dist.ShardSpec(partition=("row", np.int64(1)), mesh_axes=("dp", ("tp",))).partition == (
        "row",
        1,
    )
    f = ts.jit(lambda x, n: x * n, static_argnums=-1)
    torch.testing.assert_close(f(v4, 3), v4 * 3)
    assert ts.jit(lambda *xs: xs[0] + xs[1], static_argnums=())(v4, v4).shape == (4,)
