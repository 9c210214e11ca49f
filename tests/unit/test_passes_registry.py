"""The pass registry, and ``canonicalize`` + ``cse`` preserving what programs compute."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp

import tessera as ts
from tessera import op
from tessera.backends.reference import run_function
from tessera.frontend.tracer import Tensor, current_trace
from tessera.ir import graph
from tessera.passes import _PASSES, get_all_passes, pass_summaries

PASS_DIR = Path(__file__).resolve().parents[2] / "tessera" / "passes"


@pytest.mark.parametrize("flag", sorted(get_all_passes()))
def test_factory_name_is_its_flag(flag: str) -> None:
    assert get_all_passes()[flag]().name == flag


@pytest.mark.parametrize(
    "path",
    sorted(p for p in PASS_DIR.glob("*.py") if p.name != "__init__.py"),
    ids=lambda p: p.name,
)
def test_every_pass_file_is_registered_under_its_flag(path: Path) -> None:
    flag = path.stem.replace("_", "-")
    assert flag in _PASSES, (
        f"{path.name} is not registered as '{flag}' in tessera/passes/__init__.py"
    )
    assert _PASSES[flag][0] == f"tessera.passes.{path.stem}"


def test_every_pass_has_a_summary_for_help() -> None:
    assert all(pass_summaries().values()), pass_summaries()


# --- canonicalize + cse on random traced programs ------------------------------------------

SHAPE = (4, 6)


def _bind(op_type: type[graph.GraphOp], operands: list[Tensor], **attrs: object) -> Tensor:
    """Binds an op directly, also where ``tessera.op`` would skip it as a no-op."""
    (result,) = current_trace().bind(op_type, operands, **attrs)
    return result


def _constant_expression(rng: np.random.Generator) -> Tensor:
    c = op.constant(rng.standard_normal(SHAPE).astype(np.float32))
    return op.tanh(c * 2.0 + 1.0)


# Each move takes a random number generator and the tensors so far (all of SHAPE, f32)
# and returns a new one; several produce exactly what canonicalize or cse rewrites.
Move = Callable[[np.random.Generator, list[Tensor]], Tensor]
MOVES: list[Move] = [
    lambda rng, xs: op.exp(op.tanh(xs[-1])),
    lambda rng, xs: xs[-1] * xs[int(rng.integers(len(xs)))] - xs[0],
    lambda rng, xs: op.maximum(xs[-1], xs[0]) + _constant_expression(rng),
    lambda rng, xs: xs[-1].reshape(24).reshape(3, 8).reshape(*SHAPE),
    lambda rng, xs: xs[-1].T.T + op.sigmoid(xs[-1]) + op.sigmoid(xs[-1]),
    lambda rng, xs: op.transpose(
        op.transpose(xs[-1].reshape(2, 3, 4), (1, 2, 0)), (1, 0, 2)
    ).reshape(*SHAPE),
    lambda rng, xs: (xs[-1] @ xs[0].T) @ xs[-1] / 6.0,
    lambda rng, xs: op.add(op.multiply(xs[-1], op.ones(SHAPE)), op.zeros((6,))),
    lambda rng, xs: op.softmax(xs[-1], axis=1) - xs[-1].mean(axis=1, keepdims=True),
    lambda rng, xs: _bind(
        graph.ReshapeOp, [_bind(graph.CastOp, [xs[-1]], dtype=xs[-1].dtype)], shape=SHAPE
    ),
    lambda rng, xs: _bind(
        graph.ConcatOp, [_bind(graph.TransposeOp, [xs[-1]], perm=(0, 1))], axis=0
    ),
    lambda rng, xs: _bind(graph.SliceOp, [xs[-1]], starts=(0, 0), limits=SHAPE, strides=(1, 1)),
    lambda rng, xs: op.astype(op.astype(xs[-1], "bfloat16") * 2, "float32"),
]


def random_program(seed: int) -> Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]:
    """Every move once, in a random order, on randomly chosen earlier tensors."""

    def program(x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        rng = np.random.default_rng(seed)
        tensors = [x, y]
        for index in rng.permutation(len(MOVES)):
            tensors.append(MOVES[index](rng, tensors))
        return tensors[-1], tensors[-2]

    return program


def _count_ops(module: ModuleOp) -> int:
    return sum(isinstance(o, graph.GraphOp) for o in module.walk())


@pytest.mark.parametrize("seed", range(6))
def test_canonicalize_and_cse_preserve_results(seed: int) -> None:
    torch.manual_seed(seed)
    x, y = torch.randn(SHAPE), torch.randn(SHAPE)
    lowered = ts.jit(random_program(seed)).lower(x, y)
    before = lowered.module.clone()
    passes = get_all_passes()
    for flag in ("canonicalize", "cse"):
        passes[flag]()().apply(Context(), lowered.module)
    lowered.module.verify()

    assert _count_ops(lowered.module) < _count_ops(before), "nothing was simplified"
    expected = run_function(before, lowered.name, [x, y])
    found = run_function(lowered.module, lowered.name, [x, y])
    for want, got in zip(expected, found, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6, equal_nan=True)
