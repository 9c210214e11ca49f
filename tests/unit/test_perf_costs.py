"""Topology presets and the alpha-beta collective cost model against hand computations."""

from __future__ import annotations

import dataclasses
import json

import pytest

from tessera.errors import TesseraError
from tessera.perf import (
    PRESETS,
    Device,
    Link,
    Topology,
    algorithms_for,
    collective_time,
    dgx_a100,
    dgx_h100,
    dgx_h800,
    gb200_nvl72,
    load_topology,
    single_gpu,
)

KiB, MiB = 1024, 1024**2
NVLINK_A, NVLINK_B = 3e-6, 450e9  # dgx_h100 intra-node
IB_A, IB_B = 6e-6, 50e9  # dgx_h100 inter-node


def approx(value: float):
    return pytest.approx(value, rel=1e-12)


@pytest.mark.parametrize("nbytes", [1 * KiB, 1 * MiB, 64 * MiB])
def test_dgx_h100_single_node_closed_forms(nbytes: int):
    topology, ranks, S = dgx_h100(), range(8), nbytes
    all_reduce = algorithms_for(topology, "all_reduce", S, ranks)
    assert all_reduce["ring"] == approx(14 * NVLINK_A + 2 * 7 / 8 * S / NVLINK_B)
    assert all_reduce["tree"] == approx(2 * 3 * NVLINK_A + 2 * S / NVLINK_B)
    assert "hierarchical" not in all_reduce
    if nbytes >= 256 * KiB:
        assert all_reduce["nvls"] == approx(2 * NVLINK_A + S / NVLINK_B)
    else:
        assert "nvls" not in all_reduce
    for kind in ("all_gather", "reduce_scatter"):
        assert algorithms_for(topology, kind, S, ranks) == {
            "ring": approx(7 * NVLINK_A + 7 / 8 * S / NVLINK_B)
        }
    assert collective_time(topology, "all_to_all", S, [0, 1, 2, 3]).time_s == approx(
        3 * NVLINK_A + 3 / 4 * S / NVLINK_B
    )
    broadcast = collective_time(topology, "broadcast", S, [0, 1, 2, 3, 4])
    assert (broadcast.algorithm, broadcast.time_s) == ("tree", approx(3 * NVLINK_A + S / NVLINK_B))


@pytest.mark.parametrize("kind", ["send", "recv"])
def test_point_to_point_uses_the_link_between_the_peers(kind: str):
    topology = dgx_h100(nodes=2)
    assert collective_time(topology, kind, 4 * MiB, [0, 9]).time_s == approx(IB_A + 4 * MiB / IB_B)
    assert collective_time(topology, kind, 4 * MiB, [2, 5]).time_s == approx(
        NVLINK_A + 4 * MiB / NVLINK_B
    )


def test_collective_permute_costs_one_message_over_the_ranks_of_its_pairs():
    """Every target receives its message at once: α + S/B on the smallest level holding
    the pairs' ranks; no pair that moves data (one rank) costs nothing."""
    topology = dgx_h100(nodes=2)
    inside = collective_time(topology, "collective_permute", 4 * MiB, [0, 1, 2, 3])
    assert (inside.algorithm, inside.time_s) == ("direct", approx(NVLINK_A + 4 * MiB / NVLINK_B))
    across = collective_time(topology, "collective_permute", 4 * MiB, [1, 9, 3, 11])
    assert across.time_s == approx(IB_A + 4 * MiB / IB_B)
    assert collective_time(topology, "collective_permute", 4 * MiB, [5]).time_s == 0.0


def test_hierarchical_closed_forms_on_four_nodes():
    topology, S = dgx_h100(nodes=4), 64 * MiB
    intra = 7 * NVLINK_A + 7 / 8 * S / NVLINK_B  # reduce_scatter or all_gather within a node
    outer_ring = 2 * 3 * IB_A + 2 * 3 / 4 * (S / 8) / IB_B
    outer_tree = 2 * 2 * IB_A + 2 * (S / 8) / IB_B
    all_reduce = algorithms_for(topology, "all_reduce", S, range(32))
    assert all_reduce["hierarchical"] == approx(2 * intra + min(outer_ring, outer_tree))
    assert all_reduce["ring"] == approx(2 * 31 * IB_A + 2 * 31 / 32 * S / IB_B)
    assert all_reduce["tree"] == approx(2 * 5 * IB_A + 2 * S / IB_B)
    assert "nvls" not in all_reduce  # NVLS reduces within a node only
    two_level = intra + 3 * IB_A + 3 / 4 * (S / 8) / IB_B
    for kind in ("all_gather", "reduce_scatter"):
        times = algorithms_for(topology, kind, S, range(32))
        assert times["hierarchical"] == approx(two_level)
        assert times["ring"] == approx(31 * IB_A + 31 / 32 * S / IB_B)


@pytest.mark.parametrize("ranks", [[0, 8, 16, 24], [0, 1, 8], [0, 1, 2, 8, 9]])
def test_hierarchical_needs_equal_inner_groups_of_several(ranks: list[int]):
    assert "hierarchical" not in algorithms_for(dgx_h100(nodes=4), "all_reduce", 64 * MiB, ranks)


def test_algorithm_choice_by_message_size():
    nvl72 = gb200_nvl72()
    assert collective_time(nvl72, "all_reduce", 1 * KiB, range(8)).algorithm in ("ring", "tree")
    assert collective_time(nvl72, "all_reduce", 1 * KiB, range(72)).algorithm != "nvls"
    for ranks in (range(8), range(72)):
        assert collective_time(nvl72, "all_reduce", 64 * MiB, ranks).algorithm == "nvls"
        # above the SHARP window the switch is not used
        assert "nvls" not in algorithms_for(nvl72, "all_reduce", 128 * MiB + 1, ranks)
    assert "nvls" in algorithms_for(nvl72, "all_reduce", 256 * KiB, range(8))
    assert "nvls" in algorithms_for(nvl72, "all_reduce", 128 * MiB, range(8))
    nvls = collective_time(nvl72, "all_reduce", 64 * MiB, range(72))
    assert nvls.time_s == approx(2 * 5e-6 + 64 * MiB / 900e9)
    assert (
        collective_time(dgx_h100(nodes=4), "all_reduce", 64 * MiB, range(32)).algorithm
        == "hierarchical"
    )


def test_explicit_algorithm_and_trivial_groups():
    topology = dgx_h100()
    ring = collective_time(topology, "all_reduce", 1 * MiB, range(8), algorithm="ring")
    assert (ring.algorithm, ring.time_s) == (
        "ring",
        approx(14 * NVLINK_A + 2 * 7 / 8 * MiB / NVLINK_B),
    )
    for kind in ("all_reduce", "all_gather", "broadcast"):
        cost = collective_time(topology, kind, 1 * MiB, [3])
        assert (cost.time_s, cost.algorithm) == (0.0, "direct")
    assert collective_time(single_gpu(), "all_reduce", 1 * MiB, [0]).time_s == 0.0


def test_level_of_and_group_counts():
    topology = dgx_h100(nodes=4)
    assert topology.level_of(range(8)) == 0
    assert topology.level_of([8, 15]) == 0
    assert topology.level_of([7, 8]) == 1
    assert topology.level_of(range(32)) == 1
    assert gb200_nvl72().level_of([64, 71]) == 0
    assert gb200_nvl72().level_of([0, 71]) == 1
    assert topology.group_counts(range(8)) == [8]
    assert topology.group_counts([0, 1, 8, 9, 10]) == [2, 3]
    assert topology.group_counts(range(32)) == [8, 8, 8, 8]


@pytest.mark.parametrize(
    "name", ["single_gpu", "dgx_h100", "dgx_h100x4", "dgx_h100(nodes=2)", "gb200_nvl72"]
)
def test_json_round_trip(name: str, tmp_path):
    topology = load_topology(name)
    assert Topology.from_json(topology.to_json()) == topology
    path = tmp_path / "topology.json"
    path.write_text(topology.to_json())
    assert load_topology(str(path)) == topology
    assert Topology.from_json(path) == topology


def test_preset_names():
    assert load_topology("dgx_h100x4") == dgx_h100(nodes=4)
    assert load_topology("dgx_h100(nodes=4)") == dgx_h100(4)
    assert load_topology("dgx_h100x4").num_devices == 32
    assert set(PRESETS) == {"single_gpu", "dgx_h100", "gb200_nvl72", "dgx_a100", "dgx_h800"}
    assert load_topology("dgx_a100x2") == dgx_a100(nodes=2)


def test_overrides_file_changes_exactly_the_overridden_numbers(tmp_path):
    path = tmp_path / "measured.json"
    overrides = {
        "base": "dgx_h100x2",
        "device": {"memory_bandwidth": 3.0e12, "matmul_flops": {"bf16": 8.0e14}},
        "levels": [{"bandwidth": 4.0e11}],
    }
    path.write_text(json.dumps(overrides))
    base, measured = dgx_h100(nodes=2), load_topology(str(path))
    device = dataclasses.replace(
        base.device,
        memory_bandwidth=3.0e12,
        matmul_flops={**base.device.matmul_flops, "bf16": 8.0e14},
    )
    levels = (dataclasses.replace(base.levels[0], bandwidth=4.0e11), base.levels[1])
    expected = dataclasses.replace(base, device=device, levels=levels, sources=measured.sources)
    assert measured == expected
    changed = {key for key in measured.sources if measured.sources[key] != base.sources.get(key)}
    assert changed == {"device.memory_bandwidth", "device.matmul_flops.bf16", "levels[0].bandwidth"}
    assert str(path) in measured.sources["levels[0].bandwidth"]


def _number_paths(topology: Topology) -> list[str]:
    paths = ["num_devices"]
    for name, value in dataclasses.asdict(topology.device).items():
        if isinstance(value, dict):
            paths += [f"device.{name}.{dtype}" for dtype in value]
        elif not isinstance(value, str):
            paths.append(f"device.{name}")
    for index in range(len(topology.levels)):
        paths += [f"levels[{index}].{name}" for name in ("group_size", "latency_s", "bandwidth")]
    if topology.sharp is not None:
        paths += [f"sharp.{f.name}" for f in dataclasses.fields(topology.sharp)]
    return paths


@pytest.mark.parametrize(
    "topology",
    [
        single_gpu(),
        dgx_h100(),
        dgx_h100(nodes=3),
        gb200_nvl72(),
        dgx_a100(nodes=2),
        dgx_h800(nodes=2),
    ],
    ids=str,
)
def test_every_preset_number_has_a_source(topology: Topology):
    missing = [path for path in _number_paths(topology) if not topology.sources.get(path)]
    assert not missing


def test_bad_input_errors(tmp_path):
    topology = dgx_h100()
    with pytest.raises(TesseraError, match=r"unknown topology 'dgx_v100'.*presets: single_gpu"):
        load_topology("dgx_v100")
    with pytest.raises(TesseraError, match=r"unknown override key 'device\.memory_bw'"):
        topology.with_overrides({"device": {"memory_bw": 1e12}})
    with pytest.raises(TesseraError, match="unknown override key 'flops'"):
        topology.with_overrides({"flops": 1e12})
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"base": "dgx_h100", "levels": [{"latency": 1e-6}]}))
    with pytest.raises(TesseraError, match=r"unknown override key 'levels\[0\]\.latency'"):
        load_topology(str(path))
    with pytest.raises(TesseraError, match=r"rank 8 is outside \[0, 8\)"):
        topology.level_of([0, 8])
    with pytest.raises(TesseraError, match=r"rank -1 is outside"):
        collective_time(topology, "all_reduce", 1024, [-1])
    device = topology.device
    with pytest.raises(
        TesseraError,
        match=r"levels\[1\]\.group_size 8 is not a multiple of levels\[0\]\.group_size 3",
    ):
        Topology("bad", 8, device, (Link("a", 3, 1e-6, 1e9), Link("b", 8, 1e-6, 1e9)))
    with pytest.raises(TesseraError, match=r"levels\[-1\]\.group_size 8 must equal num_devices 16"):
        Topology("bad", 16, device, (Link("a", 8, 1e-6, 1e9),))
    with pytest.raises(TesseraError, match="bandwidth must be positive"):
        Link("a", 8, 1e-6, 0.0)
    with pytest.raises(TesseraError, match="unknown dtype 'f64'"):
        dataclasses.replace(device, matmul_flops={"f64": 1e12})
    with pytest.raises(TesseraError, match="memory_efficiency must be in"):
        Device("d", {"bf16": 1e12}, 0.5, 1e12, 1.5, 10**9, 0.0)


def test_bad_collective_errors():
    topology = dgx_h100()
    with pytest.raises(TesseraError, match="unknown collective 'allreduce'; valid: all_reduce"):
        collective_time(topology, "allreduce", 1024, range(8))
    with pytest.raises(TesseraError, match=r"'nvls' does not apply.*applicable: ring, tree"):
        collective_time(topology, "all_reduce", 1024, range(8), algorithm="nvls")
    with pytest.raises(TesseraError, match="'butterfly' is unknown"):
        collective_time(topology, "all_reduce", 1024, range(8), algorithm="butterfly")
    with pytest.raises(TesseraError, match="two peers"):
        collective_time(topology, "send", 1024, [0, 1, 2])
    with pytest.raises(TesseraError, match="repeat a rank"):
        collective_time(topology, "all_reduce", 1024, [0, 0])
