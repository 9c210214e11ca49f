"""Nothing foreign runs from a cache or a checkpoint: files planted as an attacker would
(pickles naming ``os.system``, ``subprocess`` or a module that imports it, a cache entry
with a recomputed plain SHA-256 header, rewritten Triton source, a checkpoint whose DCP
``.metadata`` is a malicious pickle, with and without a forged manifest) never run their
payload (a marker file never appears), and the error or warning names the problem."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import stat
from pathlib import Path

import pytest
import torch

import tessera as ts
from tessera import cache_location, op, program_cache
from tessera.errors import TesseraError
from tessera.ir import serialize


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(root))
    monkeypatch.setenv("TESSERA_PROGRAM_CACHE", "1")
    _forget()
    yield root
    _forget()


def _forget() -> None:
    cache_location._usable.cache_clear()
    cache_location._key.cache_clear()
    program_cache._warned.clear()


def _call(module: str, name: str, *args: object) -> bytes:
    """A pickle that calls ``module.name(*args)`` when loaded (``name`` may be dotted)."""

    def text(value: str) -> bytes:
        data = value.encode()
        return b"\x8c" + bytes([len(data)]) + data  # SHORT_BINUNICODE

    arguments = pickle.dumps(args, protocol=2)[2:-1]  # without PROTO and STOP
    return b"\x80\x04" + text(module) + text(name) + b"\x93" + arguments + b"R."


def _payloads(marker: Path) -> dict[str, bytes]:
    touch = f"touch {marker}"
    return {
        "xdsl.utils-subprocess": _call(
            "xdsl.utils.dialect_codegen", "subprocess.check_call", ["touch", str(marker)]
        ),
        "subprocess": _call("subprocess", "check_call", ["touch", str(marker)]),
        "os.system": _call("os", "system", touch),
    }


def test_the_payloads_are_real(tmp_path):
    """The planted pickles do run under a plain unpickler (so the tests below mean it)."""
    for kind, data in _payloads(tmp_path / "marker").items():
        pickle.loads(data)
        assert (tmp_path / "marker").exists(), kind
        (tmp_path / "marker").unlink()


@pytest.mark.parametrize("kind", ["xdsl.utils-subprocess", "subprocess", "os.system"])
def test_the_module_unpickler_refuses_any_name_off_its_table(kind, tmp_path):
    marker = tmp_path / "marker"
    data = _payloads(marker)[kind]
    with pytest.raises(serialize.SerializeError, match=r"stored data names .*(subprocess|system)"):
        serialize.loads(data)
    assert not marker.exists()


def _small(x, w):
    return op.softmax(op.gelu(x @ w), axis=-1)


def _run(x, w):
    lowered = ts.jit(_small, kernels="triton").lower(x, w)
    return lowered, lowered(x, w)


@pytest.mark.parametrize("magic", [program_cache._MAGIC, b"tessera-program\n"])
@pytest.mark.parametrize("kind", ["xdsl.utils-subprocess", "subprocess", "os.system"])
def test_a_planted_cache_pickle_is_not_loaded(cache, tmp_path, kind, magic):
    x, w = torch.randn(8, 16), torch.randn(16, 32)
    first = _run(x, w)[1]
    marker = tmp_path / "marker"
    payload = _payloads(marker)[kind]
    for path in (cache / "programs").rglob("*.bin"):
        if path.name != "triton.bin":  # every stage (and the layouts, where stored)
            path.write_bytes(magic + hashlib.sha256(payload).digest() + payload)
    with pytest.warns(UserWarning, match="HMAC does not verify"):
        again = _run(x, w)[1]
    assert not marker.exists()
    torch.testing.assert_close(again, first)


def test_rewritten_triton_source_is_not_run(cache, tmp_path):
    x, w = torch.randn(8, 16), torch.randn(16, 32)
    lowered, first = _run(x, w)
    sources = lowered.triton_source()
    (path,) = (cache / "programs").rglob("triton.bin")
    stored = json.loads(path.read_bytes()[len(program_cache._MAGIC) + 32 :])
    assert stored and all(isinstance(s, str) for s in stored.values())
    marker = tmp_path / "marker"
    evil = {k: f"import os\nos.system('touch {marker}')\n{s}" for k, s in stored.items()}
    payload = json.dumps(evil).encode()
    path.write_bytes(program_cache._MAGIC + hashlib.sha256(payload).digest() + payload)
    with pytest.warns(UserWarning, match=r"triton\.bin: its HMAC does not verify"):
        lowered, again = _run(x, w)
    assert not marker.exists()
    assert lowered.triton_source() == sources
    torch.testing.assert_close(again, first)


def test_an_entry_moved_to_another_program_does_not_verify(cache):
    x, w = torch.randn(8, 16), torch.randn(16, 32)
    _run(x, w)
    entries = {p.parent for p in (cache / "programs").rglob("triton.bin")}
    _run(torch.randn(4, 16), w)  # another program (shape): another key
    (other,) = {p.parent for p in (cache / "programs").rglob("triton.bin")} - entries
    (mine,) = entries
    (mine / "triton.bin").write_bytes((other / "triton.bin").read_bytes())
    with pytest.warns(UserWarning, match=r"triton\.bin: its HMAC does not verify"):
        _run(x, w)


def test_the_key_is_private_and_a_readable_one_is_refused(cache):
    key = cache_location.secret_key()
    path = cache / "keys" / cache_location.KEY_FILE
    assert len(key) == 32 and stat.S_IMODE(path.stat().st_mode) == 0o600
    _forget()
    assert cache_location.secret_key() == key  # read back, not made again
    os.chmod(path, 0o644)
    _forget()
    with pytest.raises(cache_location.SecretKeyError, match="readable or writable by group"):
        cache_location.secret_key()
    with pytest.warns(UserWarning, match="program cache is off: .*readable or writable by group"):
        _run(torch.randn(8, 16), torch.randn(16, 32))
    assert not list((cache / "programs").rglob("*.bin"))


# --- checkpoints ---------------------------------------------------------------------


def _step():
    from tessera import dist, graph, optim

    @graph.training_step(optimizer=optim.AdamW(lr=1e-2), mesh=dist.mesh({"dp": 2}),
                         kernels="reference")  # fmt: skip
    def step(p, x, y):
        return graph.backward(op.mean((x @ p["w"] - y) ** 2)), {}

    return step


@pytest.fixture
def saved(cache, tmp_path):
    step = _step()
    state = step.init({"w": torch.randn(8, 4)})
    step.save(state, tmp_path / "ckpt")
    return step, state, tmp_path / "ckpt"


def _fresh(step):
    return step.init({"w": torch.zeros(8, 4)})


def _plant_metadata(where: Path, marker: Path, *, forge: str | None) -> None:
    """Replaces ``.metadata`` with a pickle running ``os.system``; ``forge``: rewrite the
    manifest's hashes to match, keeping its old HMAC ("keep") or dropping it ("drop")."""
    evil = _call("os", "system", f"touch {marker}")
    (where / ".metadata").write_bytes(evil)
    if forge is not None:
        manifest_path = where / "tessera-manifest.json"
        manifest = json.loads(manifest_path.read_text())
        manifest["files"][".metadata"] = {
            "size": len(evil),
            "sha256": hashlib.sha256(evil).hexdigest(),
        }
        if forge == "drop":
            del manifest["hmac"]
        manifest_path.write_text(json.dumps(manifest))


def test_a_checkpoint_restores_and_carries_a_signed_manifest(saved):
    step, state, where = saved
    manifest = json.loads((where / "tessera-manifest.json").read_text())
    assert manifest["format"] == 1 and manifest["step"] == 0 and len(manifest["hmac"]) == 64
    assert set(manifest["files"]) == {p.name for p in where.iterdir()} - {"tessera-manifest.json"}
    again = step.restore(_fresh(step), where)
    torch.testing.assert_close(again.params["w"], state.params["w"])


def test_a_malicious_metadata_without_a_forged_manifest_fails_its_hash(saved, tmp_path):
    step, _, where = saved
    _plant_metadata(where, tmp_path / "marker", forge=None)
    with pytest.raises(TesseraError, match=r"\.metadata (is truncated or changed|does not match)"):
        step.restore(_fresh(step), where)
    assert not (tmp_path / "marker").exists()


@pytest.mark.parametrize("forge", ["keep", "drop"])
def test_a_malicious_metadata_with_a_forged_manifest_fails_the_hmac(saved, tmp_path, forge):
    step, _, where = saved
    _plant_metadata(where, tmp_path / "marker", forge=forge)
    with pytest.raises(TesseraError, match=r"HMAC of tessera-manifest\.json does not verify"):
        step.restore(_fresh(step), where)
    assert not (tmp_path / "marker").exists()


def test_trusting_an_unverified_manifest_still_runs_no_pickled_code(saved, tmp_path):
    """``trust_unverified=True`` with a forged manifest: the hashes match the evil file,
    but DCP's metadata is read by an unpickler that resolves only its own classes."""
    step, _, where = saved
    _plant_metadata(where, tmp_path / "marker", forge="drop")
    with pytest.raises(TesseraError, match=r"\.metadata names (os|posix)\.system.*refused"):
        step.restore(_fresh(step), where, trust_unverified=True)
    assert not (tmp_path / "marker").exists()


def test_another_users_checkpoint_needs_trust_unverified(saved, tmp_path, monkeypatch):
    step, state, where = saved
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path / "another-user"))
    _forget()
    with pytest.raises(TesseraError, match="saved by another user or machine; refused"):
        step.restore(_fresh(step), where)
    again = step.restore(_fresh(step), where, trust_unverified=True)
    torch.testing.assert_close(again.params["w"], state.params["w"])


def test_a_checkpoint_without_a_manifest_is_refused(saved, tmp_path):
    step, _, where = saved
    _plant_metadata(where, tmp_path / "marker", forge=None)
    (where / "tessera-manifest.json").unlink()
    for trust in (False, True):
        with pytest.raises(TesseraError, match=r"has no tessera-manifest\.json: refused"):
            step.restore(_fresh(step), where, trust_unverified=trust)
    assert not (tmp_path / "marker").exists()


def test_unlisted_files_are_refused(saved, tmp_path):
    step, _, where = saved
    (where / "__1_0.distcp").write_bytes(_call("os", "system", f"touch {tmp_path / 'marker'}"))
    with pytest.raises(TesseraError, match=r"does not list: \['__1_0\.distcp'\]"):
        step.restore(_fresh(step), where)
    assert not (tmp_path / "marker").exists()
