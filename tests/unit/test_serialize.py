"""The binary module form of the program cache (``tessera.ir.serialize``): every stage of
a sharded training program round-trips to the same text, and bad data is refused without
running anything."""

from __future__ import annotations

import pickle

import pytest
import torch

import tessera as ts
from tessera import dist, op
from tessera.driver import STAGES
from tessera.ir import serialize


def _mlp(x, w1, w2):
    return op.mean(op.gelu(x @ w1) @ w2)


def _lowered():
    mesh = dist.mesh({"dp": 2, "tp": 2})
    columns = dist.ShardSpec(partition=(1,), mesh_axes=("tp",))
    rows = dist.ShardSpec(partition=(0,), mesh_axes=("tp",))
    batch = dist.ShardSpec(partition=(0,), mesh_axes=("dp",))
    f = ts.jit(ts.grad(_mlp, argnums=(1, 2)), mesh=mesh, in_shardings=(batch, columns, rows))
    return f.lower(torch.randn(8, 16), torch.randn(16, 32), torch.randn(32, 16))


@pytest.mark.parametrize("stage", STAGES)
def test_every_stage_round_trips_to_the_same_text(stage):
    module = _lowered().module_at(stage)
    loaded = serialize.loads(serialize.dumps(module))
    loaded.verify()
    assert str(loaded) == str(module)


class _Exploit:
    def __reduce__(self):
        return (print, ("this must not run",))


@pytest.mark.parametrize(
    "data",
    [b"", b"not a pickle", pickle.dumps(_Exploit()), pickle.dumps((99, [], {}, ()))],
    ids=["empty", "garbage", "foreign-callable", "other-format"],
)
def test_bad_data_is_refused(data, capsys):
    with pytest.raises(serialize.SerializeError):
        serialize.loads(data)
    assert "must not run" not in capsys.readouterr().out


def test_truncated_data_is_refused():
    data = serialize.dumps(_lowered().module_at("graph"))
    with pytest.raises(serialize.SerializeError, match="not a stored module"):
        serialize.loads(data[: len(data) // 2])
