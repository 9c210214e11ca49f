"""The feature matrix (benchmarks/feature_matrix.py): training-step options x layouts.

Each covering cell trains the Llama-style model three steps and matches a torch loop
implementing the same option (float64: losses and parameters within 1e-9; bf16/fp16
with f32 masters: losses within 3e-2 relative), or is refused when the step is built
with an error naming both features. A second test checks that no option is a no-op:
turning it on changes the compiled programs (or, for the numerics mode, the way
collectives add)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import feature_matrix as fm

from tessera import TesseraError
from tessera.opdefs import collective

# refusals the matrix expects, with words each must contain (both features named)
EXPECTED_REFUSALS = {
    ("pp2 x dp2 1f1b", "zero=3"): ("zero=3", "pipeline axis 'pp'", "use zero=2"),
}


@pytest.fixture(autouse=True)
def _reference_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TESSERA_KERNELS", "reference")  # options do not change the kernels


def test_the_pairwise_subset_covers_every_option_and_layout() -> None:
    assert {layout for layout, _ in fm.PAIRWISE} == set(fm.LAYOUTS)
    assert {option for _, option in fm.PAIRWISE} == set(fm.OPTIONS)


@pytest.mark.parametrize(
    ("layout", "option"), fm.PAIRWISE, ids=[f"{a}-{b}" for a, b in fm.PAIRWISE]
)
def test_cell_matches_torch_or_is_refused_by_name(layout: str, option: str) -> None:
    """One cell of ``benchmarks/feature_matrix.py --pairwise`` (the README's command)."""
    cell = fm.run_cell(layout, option)
    if (layout, option) in EXPECTED_REFUSALS:
        assert cell.status == "refused", cell
        for words in EXPECTED_REFUSALS[layout, option]:
            assert words in cell.reason
        return
    assert cell.status == "ok", f"{layout} x {option}: {cell.reason}"
    assert cell.deviation <= cell.tolerance


def _fingerprint(layout_name: str, option: str) -> str:
    """The text of every program the step compiles (stage and update programs when
    pipelined), after sharding."""
    layout = fm.LAYOUTS[layout_name]
    dtype = torch.float32 if "precision" in fm.OPTIONS[option] else torch.float64
    params = fm.init_params(layout, dtype)
    step = fm.make_step(layout, fm.OPTIONS[option], params)
    state = step.init(params)
    tokens, targets = fm.batches(layout)[0]
    with fm.options_context(layout):
        if not layout.schedule:
            return step.lower(state, tokens, targets).as_text("partitioned")
        compiled = step.pipeline().compiled(state, (tokens, targets))
    programs = [p.lowered for s in compiled.stages for p in (s.forward, s.backward, s.backward_input,
                s.backward_weight) if p is not None]  # fmt: skip
    programs += [*compiled.updates, *(r for r in compiled.reductions if r is not None)]
    return "\n".join(p.as_text("partitioned") for p in programs)


@pytest.mark.parametrize("layout", ["dp2 x tp2", "pp2 x dp2 1f1b"])
def test_no_option_is_a_no_op(layout: str) -> None:
    baseline = _fingerprint(layout, "baseline")
    for option in ("zero=1", "zero=2", "zero=3", "bf16", "fp16", "clip", "accumulate=2", "remat"):
        try:
            changed = _fingerprint(layout, option)
        except TesseraError:
            assert (layout, option) in EXPECTED_REFUSALS
            continue
        assert changed != baseline, f"{option} changes nothing in the programs on {layout}"


@pytest.mark.parametrize("layout", ["dp2 x tp2", "pp2 x dp2 1f1b"])
def test_the_numerics_option_orders_the_sums(layout: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``numerics="deterministic"`` adds the ranks' terms in mesh order (on the virtual
    mesh as over processes); the default does not."""
    calls = []
    ordered = collective.ordered_reduce

    def counting(*args, **kwargs):
        calls.append(1)
        return ordered(*args, **kwargs)

    monkeypatch.setattr(collective, "ordered_reduce", counting)
    for option, expected in (("baseline", False), ("deterministic", True)):
        calls.clear()
        layout_ = fm.LAYOUTS[layout]
        params = fm.init_params(layout_, torch.float64)
        step = fm.make_step(layout_, fm.OPTIONS[option], params)
        state = step.init(params)
        with fm.options_context(layout_):
            step(state, *fm.batches(layout_)[0])
        assert bool(calls) == expected, option


@pytest.mark.parametrize("layout", ["dp2 x tp2", "dp2 x tp2 +SP"])
def test_every_option_at_once_with_zero3(layout: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The "all" column's configuration (bf16, clipping, two microbatches, remat,
    deterministic sums, warmup-cosine) with ZeRO-3 instead of ZeRO-2 matches torch: each
    microbatch's backward gathers every parameter again, inside checkpointed blocks."""
    monkeypatch.setattr(fm, "ALL_ZERO", 3)
    cell = fm.run_cell(layout, "all")
    assert cell.status == "ok", f"{layout} x all, ZeRO-3: {cell.reason}"
    assert cell.deviation <= cell.tolerance
