"""``tessera-opt`` reports a failure inside a pass as an internal error naming the pass,
with one message and no traceback (the traceback only with ``TESSERA_DEBUG=1``)."""

from __future__ import annotations

import pytest

from tessera.passes.cse import CSEPass
from tessera.tools import opt

PROGRAM = """
func.func @f(%x: tensor<4xf32>) -> tensor<4xf32> {
  %0 = graph.neg %x : tensor<4xf32>
  func.return %0 : tensor<4xf32>
}
"""


@pytest.fixture
def broken_cse(monkeypatch, tmp_path):
    def apply(self, ctx, module):
        raise IndexError("list index out of range")

    monkeypatch.setattr(CSEPass, "apply", apply)
    path = tmp_path / "f.mlir"
    path.write_text(PROGRAM)
    return str(path)


def test_an_exception_in_a_pass_is_an_internal_error_naming_it(broken_cse, capsys, monkeypatch):
    monkeypatch.delenv("TESSERA_DEBUG", raising=False)
    assert opt.main([broken_cse, "-p", "canonicalize,cse"]) == 1
    err = capsys.readouterr().err
    assert "tessera-opt: internal error in pass 'cse': IndexError: list index out of range" in err
    assert "Traceback" not in err and "TESSERA_DEBUG=1" in err


def test_the_traceback_on_request(broken_cse, capsys, monkeypatch):
    monkeypatch.setenv("TESSERA_DEBUG", "1")
    assert opt.main([broken_cse, "-p", "cse"]) == 1
    err = capsys.readouterr().err
    assert "internal error in pass 'cse'" in err and "Traceback" in err


def test_ir_a_pass_made_that_does_not_verify_is_its_internal_error(tmp_path, capsys, monkeypatch):
    def apply(self, ctx, module):  # moves the return above the op it returns: a dominance error
        function = next(iter(module.ops))
        block = function.body.block
        ret = block.last_op
        ret.detach()
        block.insert_op_before(ret, block.first_op)

    monkeypatch.setattr(CSEPass, "apply", apply)
    path = tmp_path / "f.mlir"
    path.write_text(PROGRAM)
    assert opt.main([str(path), "-p", "cse"]) == 1
    err = capsys.readouterr().err
    assert "tessera-opt: internal error in pass 'cse': it made IR that does not verify:" in err
    assert f"{path}:4:3: error: func.return: operand #0 is used before its definition" in err
    assert "Traceback" not in err
