"""A mesh's ``topology=``: validated where the mesh is made, carried on the ``graph.mesh``
symbol into every cost-model pass, part of the compile configuration's identity."""

from __future__ import annotations

import re
import traceback
from pathlib import Path

import pytest
import torch
from test_driver import replay

import tessera as ts
from tessera import dist, op, schedule
from tessera.driver import CompileConfig
from tessera.errors import ShardingError, TesseraError
from tessera.ir.mesh_symbol import module_mesh
from tessera.perf import collective_time, dgx_h100, gb200_nvl72, load_topology
from tessera.program_cache import ProgramCache

COLS = dist.ShardSpec(partition=(1,), mesh_axes=("tp",))
ROWS = dist.ShardSpec(partition=(0,), mesh_axes=("tp",))
# a matmul whose contraction is split over 72 ranks: one 256 KiB all-reduce of the result
X, W = torch.randn(256, 72 * 64), torch.randn(72 * 64, 256)


def _lowered(topology: str | None) -> ts.Lowered:
    mesh = dist.mesh({"tp": 72}, topology=topology)
    return ts.jit(op.matmul, mesh=mesh, in_shardings=(COLS, ROWS)).lower(X, W)


def _all_reduce(topology: str | None) -> str:
    lowered = _lowered(topology)
    (start,) = re.findall(r"all_reduce %\S+ \{[^}]*\}", lowered.as_text("schedule"))
    return start


def test_a_72_rank_nvl72_mesh_compiles_for_the_rack() -> None:
    """NVLink SHARP over one NVL72 rack; without a topology, the mesh is priced on 9
    DGX H100 nodes (hierarchical), each as the cost model picks."""
    nbytes, group = 256 * 256 * 4, range(72)
    assert collective_time(gb200_nvl72(), "all_reduce", nbytes, group).algorithm == "nvls"
    assert collective_time(dgx_h100(nodes=9), "all_reduce", nbytes, group).algorithm == (
        "hierarchical"
    )
    assert _all_reduce("gb200_nvl72") == "all_reduce %0 {axes = [tp], kind = sum, algorithm = nvls}"
    assert _all_reduce(None) == (
        "all_reduce %0 {axes = [tp], kind = sum, algorithm = hierarchical, domain = 8}"
    )


def test_the_mesh_symbol_carries_the_topology() -> None:
    mesh = dist.mesh({"dp": 8, "tp": 9}, topology="nvl72")  # an alias: stored by its name
    assert mesh.topology == gb200_nvl72() and mesh.topology_spec == "gb200_nvl72"
    f = ts.jit(op.add, mesh=mesh, in_shardings=(dist.ShardSpec((0,), ("dp",)),) * 2)
    lowered = f.lower(torch.randn(16, 4), torch.randn(16, 4))
    assert 'graph.mesh @mesh axes = [dp = 8, tp = 9] topology = "gb200_nvl72"' in (
        lowered.as_text("graph")
    )
    found = module_mesh(lowered.module_at("schedule"))
    assert found is not None and found[1] == mesh
    assert lowered.simulate().topology == "gb200_nvl72"  # the simulator's default too


def test_tessera_opt_replays_price_the_mesh_symbols_machine(tmp_path: Path) -> None:
    """The schedule stage's passes name no topology: replayed from the partitioned text,
    they read the graph.mesh symbol's and choose as the compile did."""
    lowered = _lowered("gb200_nvl72")
    assert "topology" not in lowered.pipeline("schedule")
    replayed = replay(lowered.as_text("partitioned"), lowered.pipeline("schedule"), tmp_path)
    assert replayed.strip() == lowered.as_text("schedule").strip()
    assert "algorithm = nvls" in replayed


def test_a_custom_topology_round_trips_as_json() -> None:
    custom = dgx_h100(nodes=2).with_overrides({"name": "my_pod"})
    mesh = dist.mesh({"dp": 16}, topology=custom)
    assert mesh.topology is custom and mesh.topology_spec.startswith("{")
    assert load_topology(mesh.topology_spec) == custom
    assert "my_pod" in repr(mesh)


def test_an_unknown_topology_lists_the_presets_at_the_users_line() -> None:
    with pytest.raises(ShardingError, match=r"unknown topology 'nvl73'.*presets: .*gb200_nvl72") as info:
        dist.mesh({"dp": 8, "tp": 9}, topology="nvl73")  # the user's line
    first = traceback.extract_tb(info.tb)[0]
    assert first.filename == __file__ and 'topology="nvl73"' in (first.line or "")
    assert info.value.__cause__ is None and info.value.__suppress_context__  # no internal chain


def test_bad_topologies() -> None:
    with pytest.raises(ShardingError, match=r"topology must be a preset name.*found 72 \(int\)"):
        dist.mesh({"dp": 72}, topology=72)
    with pytest.raises(ShardingError, match=r"72 devices does not fit topology 'dgx_h100'.*dgx_h100x9"):
        dist.Mesh(["dp"], [72], topology="dgx_h100")


def test_an_explicit_schedule_topology_must_agree_with_the_mesh() -> None:
    mesh = dist.mesh({"tp": 8}, topology="gb200_nvl72")
    assert CompileConfig(mesh=mesh).machine() == gb200_nvl72()
    with schedule.options(topology="gb200_nvl72"):  # the same machine: fine
        assert CompileConfig(mesh=mesh, schedule=schedule.current()).machine() == gb200_nvl72()
    with schedule.options(topology="dgx_h100"), pytest.raises(
        TesseraError, match=r"topology='dgx_h100' names another machine than the mesh's"
    ):
        CompileConfig(mesh=mesh, schedule=schedule.current())
    plain = dist.mesh({"tp": 8})  # a mesh naming none: the option decides
    with schedule.options(topology="dgx_h100x2"):
        assert CompileConfig(mesh=plain, schedule=schedule.current()).machine().num_devices == 16


def test_meshes_differing_only_in_topology_do_not_share_programs() -> None:
    nvl72, dgx = dist.mesh({"tp": 72}, topology="gb200_nvl72"), dist.mesh({"tp": 72})
    assert nvl72 != dgx and hash(nvl72) != hash(dgx)
    assert nvl72 == dist.mesh({"tp": 72}, topology="nvl72")
    configs = [CompileConfig(mesh=m) for m in (nvl72, dgx)]
    assert configs[0] != configs[1]
    traced = ts.jit(op.matmul, mesh=nvl72, in_shardings=(COLS, ROWS)).lower(X, W).module_at(
        "traced"
    )
    keys = {ProgramCache(traced, config).key for config in configs}
    assert len(keys) == 2
