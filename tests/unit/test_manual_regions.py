"""examples/manual_regions.py: the seed programs written per rank with ``dist.shard_map``.

Each port runs once (module fixture) and is compared by the script with torch in
float64 (tolerance 1e-10); here its numbers are checked: the manual Megatron MLP and
ring move exactly the bytes of their automatic versions, the async all-reduce has a
kernel between its start and its wait. ``main`` prints "OK" and exits 0, or names the
port that mismatches and exits 1. The ring is also checked here on its own against
torch's ``scaled_dot_product_attention`` on another shape (an independent reference).
"""

from __future__ import annotations

import math

import pytest
import torch
from example_modules import load_example

import tessera as ts
from tessera import dist

torch.set_num_threads(1)

manual_regions = load_example("manual_regions")
TOLERANCE = 1e-10


@pytest.fixture(scope="module")
def ports() -> dict[str, object]:
    return {
        name: port(torch.Generator().manual_seed(0)) for name, port in manual_regions.PORTS.items()
    }


def test_main_prints_ok_for_every_port(ports, monkeypatch, capsys) -> None:
    """``python examples/manual_regions.py`` (the README command), its ports' results
    reused from the fixture: every port within 1e-10 of torch, then "OK"."""
    monkeypatch.setattr(
        manual_regions, "PORTS", {name: (lambda g, p=p: p) for name, p in ports.items()}
    )
    assert manual_regions.main() == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == "OK"
    for name in ("megatron", "ring", "pipeline", "overlap"):
        (line,) = [line for line in lines if line.startswith(f"{name}: max |difference|")]
        assert float(line.split("torch ")[1].split()[0]) <= TOLERANCE, line


def test_a_mismatching_port_fails_the_script(monkeypatch, capsys) -> None:
    wrong = manual_regions.Port("wrong", 1e-3)
    monkeypatch.setattr(manual_regions, "PORTS", {"wrong": lambda g: wrong})
    assert manual_regions.main() == 1
    assert capsys.readouterr().out.splitlines()[-1] == "MISMATCH: wrong"


def test_every_port_matches_torch(ports) -> None:
    for name, port in ports.items():
        assert port.max_difference <= TOLERANCE, (name, port.max_difference)


def test_manual_programs_move_what_the_automatic_ones_move(ports) -> None:
    """One tp all-reduce of [4, 16] f64 (512 B) each; the ring: three k and three v
    blocks of [1, 2, 8, 8] f64 (6 x 1024 B), written by hand or by the automatic ring."""
    megatron = dict(ports["megatron"].measured)
    assert megatron["manual bytes"] == megatron["automatic bytes"] == 4 * 16 * 8
    ring = dict(ports["ring"].measured)
    for mask in ("full", "causal"):
        assert ring[f"{mask} manual bytes"] == ring[f"{mask} automatic bytes"] == 6 * 1024
        assert ring[f"{mask} manual step_s"] > 0 and ring[f"{mask} automatic step_s"] > 0


def test_the_async_all_reduce_overlaps_the_independent_kernel(ports) -> None:
    assert dict(ports["overlap"].measured)["kernels between"] >= 1


@pytest.mark.parametrize("causal", [False, True])
def test_ring_attention_alone_matches_torch(causal: bool) -> None:
    """2 heads of 3 sequences, 16 positions over cp 4, head dim 4."""
    generator = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(3, 2, 16, 4, dtype=torch.float64, generator=generator) for _ in "qkv")
    f = ts.jit(
        dist.shard_map(
            lambda q, k, v: manual_regions.ring_attention(q, k, v, causal),
            manual_regions.CP_MESH,
            in_specs=manual_regions.SEQ,
            out_specs=manual_regions.SEQ,
        ),
        mesh=manual_regions.CP_MESH,
    )
    expected = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, is_causal=causal, scale=1 / math.sqrt(4)
    )
    torch.testing.assert_close(f(q, k, v), expected, rtol=TOLERANCE, atol=TOLERANCE)
