"""The examples run and agree with torch, through the generated Triton kernels (Triton's
interpreter on a CPU), as users run them. The README's commands and Python blocks,
which run the examples too, are tested in test_readme.py."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest
import torch
from example_modules import load_example

import tessera as ts
from tessera import dist, schedule

ROOT = Path(__file__).resolve().parents[2]
RTOL, ATOL = 1e-5, 1e-5  # f32



@pytest.fixture(autouse=True)
def triton_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """Examples (and the scripts they start) run the generated kernels, the default."""
    monkeypatch.setenv("TESSERA_KERNELS", "triton")


mlp_example = load_example("mlp")
gpt_example = load_example("gpt_block")


@pytest.mark.parametrize(("batch", "d_in", "d_hidden", "d_out"), [(8, 32, 128, 16), (5, 7, 13, 3)])
def test_mlp_matches_torch(batch: int, d_in: int, d_hidden: int, d_out: int) -> None:
    args = mlp_example.random_inputs(batch, d_in, d_hidden, d_out, seed=1)
    out = mlp_example.mlp(*args)
    torch.testing.assert_close(out, mlp_example.torch_mlp(*args), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize(
    ("batch", "seq", "dim", "heads"),
    [(2, 16, 64, 4), (3, 7, 48, 3), (1, 1, 32, 2)],  # includes T not a power of two, and T = 1
)
def test_gpt_block_matches_torch(batch: int, seq: int, dim: int, heads: int) -> None:
    params = gpt_example.init_params(dim, seed=2)
    x = torch.randn((batch, seq, dim), generator=torch.Generator().manual_seed(3))
    out = gpt_example.gpt_block(x, params, heads)
    assert out.shape == (batch, seq, dim)
    torch.testing.assert_close(
        out, gpt_example.torch_gpt_block(x, params, heads), rtol=RTOL, atol=ATOL
    )


def test_gpt_block_is_causal() -> None:
    """Changing the last token leaves every earlier position's output unchanged."""
    params = gpt_example.init_params(32, seed=4)
    x = torch.randn((1, 6, 32), generator=torch.Generator().manual_seed(5))
    y = x.clone()
    y[:, -1] += 1.0
    a, b = gpt_example.gpt_block(x, params, 2), gpt_example.gpt_block(y, params, 2)
    torch.testing.assert_close(a[:, :-1], b[:, :-1], rtol=0, atol=0)
    assert not torch.allclose(a[:, -1], b[:, -1])


def test_gpt_block_main_exits_nonzero_on_mismatch(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    reference = gpt_example.torch_gpt_block
    monkeypatch.setattr(gpt_example, "torch_gpt_block", lambda *a: reference(*a) + 1e-3)
    with pytest.raises(SystemExit) as exit_info:
        gpt_example.main(["--seq", "4", "--dim", "32", "--heads", "2"])
    assert exit_info.value.code == 1
    assert "MISMATCH" in capsys.readouterr().out


def test_mlp_main_prints_ir_and_ok(capsys: pytest.CaptureFixture[str]) -> None:
    mlp_example.main()
    out = capsys.readouterr().out
    assert "graph.gelu" in out
    assert out.rstrip().endswith("OK")


def test_train_gpt_with_a_vocab_parallel_embedding(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``examples/train_gpt.py --vocab-parallel``: the tied embedding split over tp by
    vocabulary rows; each step's loss matches torch (float64) and the loss decreases. The
    reference kernels keep it short (the README's run covers the Triton kernels)."""
    monkeypatch.setenv("TESSERA_KERNELS", "reference")
    train_gpt = load_example("train_gpt")
    train_gpt.main(["--steps", "3", "--vocab-parallel"])
    out = capsys.readouterr().out
    assert out.rstrip().endswith("OK"), out[-2000:]
    assert (
        "all_gather[dp]" not in out
    )  # (the default gathers the lookup gradient's one-hot over dp)
    params = train_gpt.init_params(64, 8, 32, 2)
    layout = train_gpt.megatron_layout(params, vocab_parallel=True)
    assert layout["wte"] is not None and train_gpt.megatron_layout(params)["wte"] is None


CP_PERMUTES = re.compile(
    r"sequence over cp in (\S+) order: (\d+) collective permutes over cp, (\d+) ring shifts "
    r"\(rank i to i \+ 1\) and (\d+) relayouts"
)


@pytest.mark.parametrize(
    "mesh",
    [["--dp", "1", "--tp", "1"], ["--dp", "2", "--tp", "1"], ["--dp", "1", "--tp", "1", "--no-zigzag"]],
    ids=["cp2", "dp2xcp2", "cp2-natural-order"],
)  # fmt: skip
def test_train_gpt_with_context_parallelism(
    mesh: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``examples/train_gpt.py --cp 2`` (alone and with dp): the sequence split over cp,
    attention as ring attention (k/v blocks by collective permutes); each step's loss
    matches torch (float64, natural order) and the loss decreases. The batch arrives in
    zig-zag order, so every permute over cp is a ring shift; with ``--no-zigzag`` the
    ring also relayouts q, k, v and the results. Reference kernels keep it short."""
    monkeypatch.setenv("TESSERA_KERNELS", "reference")
    load_example("train_gpt").main(["--steps", "2", "--cp", "2", "--layers", "1", *mesh])
    out = capsys.readouterr().out
    assert out.rstrip().endswith("OK"), out[-2000:]
    assert "collective_permute[cp]" in out, out[-2000:]
    found = CP_PERMUTES.search(out)
    assert found is not None, out[-2000:]
    order, permutes, shifts, relayouts = found[1], *map(int, found.groups()[1:])
    assert shifts > 0 and permutes == shifts + relayouts, found[0]
    if "--no-zigzag" in mesh:
        assert order == "natural" and relayouts > 0, found[0]
    else:
        assert order == "zig-zag" and relayouts == 0, found[0]


def test_train_gpt_zigzag_batch_moves_only_k_and_v(monkeypatch: pytest.MonkeyPatch) -> None:
    """The step of ``train_gpt.py --cp 4`` lowered (not run) for a batch in zig-zag order:
    every collective permute over cp passes blocks from rank i to i + 1 (ring attention's
    k/v and dk/dv steps, no relayout of q, k, v or the results); the natural-order step
    moves the same ring blocks plus relayout permutes."""
    monkeypatch.setenv("TESSERA_KERNELS", "reference")
    train_gpt = load_example("train_gpt")
    cp, seq = 4, 8
    ring = {(i, (i + 1) % cp) for i in range(cp)}
    mesh = dist.Mesh(axes=["dp", "cp", "tp"], shape=(1, cp, 1))
    params = train_gpt.init_params(64, seq, 32, 1)
    tokens = torch.randint(0, 64, (2, seq), generator=torch.Generator().manual_seed(0))
    pairs = {}
    for zigzag in (True, False):
        args = argparse.Namespace(lr=1e-3, zero=0, heads=2, layers=1, cp=cp, zigzag=zigzag)
        with schedule.options(context_parallel="ring"):
            step = train_gpt.make_step(mesh, params, args)
            lowered = step.lower(
                step.init({k: v.clone() for k, v in params.items()}), tokens, tokens
            )
        pairs[zigzag] = [
            set(c.pairs) for c in lowered.collectives() if c.kind == "collective_permute" and c.mesh_axes == ("cp",)
        ]  # fmt: skip
    assert pairs[True] and all(p == ring for p in pairs[True]), pairs[True]
    assert sum(p == ring for p in pairs[False]) == len(pairs[True]) < len(pairs[False])
    assert all(
        train_gpt.is_ring_shift(tuple(p), cp) == (p == ring) for p in pairs[True] + pairs[False]
    )


@pytest.mark.parametrize("extra", [[], ["--shared-expert"]], ids=["routed", "shared-expert"])
def test_train_moe_on_dp_x_ep(
    extra: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``examples/train_moe.py``: top-2 of 8 experts on a 2 x 2 (dp x ep) virtual mesh,
    with and without a shared expert; each step's loss matches the float64 torch loop and
    decreases (reference kernels: short; the generated kernels of the layer are tested in
    test_moe_ops.py)."""
    monkeypatch.setenv("TESSERA_KERNELS", "reference")
    load_example("train_moe").main(["--steps", "2", "--layers", "1", *extra])
    out = capsys.readouterr().out
    assert out.rstrip().endswith("OK"), out[-2000:]
    assert "all_to_all[ep]" in out


@pytest.mark.parametrize("shared_expert", [False, True], ids=["routed", "shared-expert"])
def test_train_moe_torch_loop_is_the_same_model(
    shared_expert: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``train_moe.py``'s torch loop computes the model Tessera traces: in float64 the
    loss and every gradient agree to 1e-10 (each RMSNorm's eps included: with 1e-5 in the
    loop and ``op.rms_norm``'s 1e-6, they differed by 2e-5; Adam then turned gradients
    near zero into updates of opposite signs and the f32 run left the tolerance at step
    15 of 20). Given the program's choices, the loop keeps its own unless they differ
    only by near-ties of scores: choices in the wrong order are a mismatch."""
    monkeypatch.setenv("TESSERA_KERNELS", "reference")
    train_moe = load_example("train_moe")
    args = argparse.Namespace(
        batch=4, seq=8, dim=16, hidden=16, heads=2, layers=2, vocab=32, experts=4, top_k=2,
        capacity_factor=1.0, shared_expert=shared_expert,
    )  # fmt: skip
    params = {k: v.double() for k, v in train_moe.init_params(args).items()}
    stream = torch.randint(0, args.vocab, (4, 9), generator=torch.Generator().manual_seed(1))
    tokens, targets = stream[:, :-1], stream[:, 1:]

    def loss(p, tokens, targets):
        return train_moe.moe_loss(p, tokens, targets, args)

    def loss_and_choices(p, tokens, targets):
        choices = []
        return train_moe.moe_loss(p, tokens, targets, args, choices), choices

    got, choices = ts.jit(loss_and_choices)(params, tokens, targets)
    grads = ts.grad(loss)(params, tokens, targets)
    leaves = {k: v.clone().requires_grad_() for k, v in params.items()}
    want = train_moe.torch_loss(leaves, tokens, targets, args, choices)
    want.backward()
    # the loop follows the program's choices only where they are near-ties of its scores
    with pytest.raises(SystemExit, match="routing MISMATCH in layer 0"):
        train_moe.torch_loss(params, tokens, targets, args, [c.flip(-1) for c in choices])
    torch.testing.assert_close(got, want.detach(), rtol=1e-10, atol=1e-10)
    for name, leaf in leaves.items():
        torch.testing.assert_close(grads[name], leaf.grad, rtol=1e-10, atol=1e-10, msg=name)


def test_train_moe_matches_torch_for_twenty_steps(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The example as run by default (2 layers, top-2 of 8 experts with capacity factor
    1.25, dp x ep = 2 x 2) for its 20 steps: every step's loss within 2e-4 of the float64
    torch loop's (reference kernels: short). It failed from step 15, which the 2-step
    test above never reached."""
    monkeypatch.setenv("TESSERA_KERNELS", "reference")
    load_example("train_moe").main(["--steps", "20"])
    out = capsys.readouterr().out
    assert out.rstrip().endswith("OK"), out[-2000:]


def test_train_gpt_saves_and_resumes_on_another_mesh(
    tmp_path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``examples/train_gpt.py --save DIR`` on dp 2 x tp 2, then ``--resume DIR`` on dp 4
    with ``--deterministic`` and ``--remat nothing``: the resumed run starts at step 2
    and each of its losses matches the torch loop resumed from the same weights and
    AdamW moments."""
    monkeypatch.setenv("TESSERA_KERNELS", "reference")
    train_gpt = load_example("train_gpt")
    train_gpt.main(["--steps", "2", "--save", str(tmp_path / "ckpt")])
    out = capsys.readouterr().out
    assert "saved step 2 to" in out and out.rstrip().endswith("OK"), out[-2000:]
    train_gpt.main(["--steps", "2", "--resume", str(tmp_path / "ckpt"), "--dp", "4", "--tp", "1",
                    "--deterministic", "--remat", "nothing"])  # fmt: skip
    out = capsys.readouterr().out
    assert "resumed from" in out and "at step 2" in out, out[-2000:]
    assert out.rstrip().endswith("OK"), out[-2000:]


def test_training_progress_is_never_silent_for_long(capsys: pytest.CaptureFixture[str]) -> None:
    """``_report.LossCheck`` (both training examples' report) says that step 0 compiles,
    prints a line while a step runs longer than ``quiet`` seconds (then that step's line
    when it ends), and a step's line (with its time) when ``quiet`` seconds passed since
    the last, besides every ``every``-th."""
    import time

    report = load_example("_report")
    check = report.LossCheck(steps=5, tolerance=1e-3, every=100, show=True, quiet=1.0)
    time.sleep(2.5)  # step 0, compiling: heartbeat lines
    check.add(0, 2.0, 2.0)
    check.add(1, 1.9, 1.9)  # fast: no line
    time.sleep(1.1)
    check.add(2, 1.8, 1.8)  # quiet seconds since the last line: its line
    time.sleep(1.6)  # a heartbeat line after about 1 s: step 3's line when it ends
    check.add(3, 1.7, 1.7)
    check.add(4, 1.6, 1.6)  # the last step: its line
    check.finish()
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("step   0: compiling the training step"), lines
    assert any(
        re.match(r"step   0: compiling and running, \d+ s so far", line) for line in lines
    ), lines
    steps = [int(line.split()[1]) for line in lines if re.match(r"step +\d+  loss", line)]
    assert steps in ([0, 2, 4], [0, 2, 3, 4]), lines  # step 1 was fast
    for i, line in enumerate(lines):  # a step said to be running is said to end
        if waiting := re.match(r"step +(\d+): .*so far$", line):
            step = int(waiting.group(1))
            assert any(re.match(rf"step +{step}  loss", later) for later in lines[i:]), lines
    assert re.search(r"rel\. diff 0\.0e\+00  \(\d+\.\d s\)$", lines[-3]), lines
    assert lines[-1] == "OK"


@pytest.mark.parametrize(
    "mesh",
    [
        ["--pp", "2", "--precision", "bf16"],  # the seeds' LLM configuration: pp x dp x tp
        ["--pp", "2", "--precision", "fp16", "--schedule", "gpipe"],
        ["--pp", "2", "--schedule", "zb-h1"],  # f32: the tight tolerance
        ["--precision", "fp8"],  # dp x tp
        ["--pp", "2", "--precision", "fp8"],  # fp8 through the pipeline's stage programs
        [],  # dp x tp
    ],
)
def test_train_gpt_takes_every_option_together(
    mesh: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``examples/train_gpt.py`` with clipping, ZeRO-1, full recomputation, 2 accumulation
    rounds, deterministic numerics and a warmup-cosine schedule, pipelined or not, in f32,
    bf16, fp16 or fp8 (pipelined too): every step's loss matches the torch loop implementing the same options
    (``clip_grad_norm_``, ``LambdaLR``, GradScaler's overflow skip) within the example's
    tolerance (2e-4 f32, 5e-2 mixed)."""
    monkeypatch.setenv("TESSERA_KERNELS", "reference")
    train_gpt = load_example("train_gpt")
    options = ["--clip", "1.0", "--zero", "1", "--remat", "nothing", "--accumulate", "2",
               "--deterministic", "--lr-schedule", "warmup_cosine", "--warmup", "1", "--steps", "4"]  # fmt: skip
    train_gpt.main([*mesh, *options])
    out = capsys.readouterr().out
    assert out.rstrip().endswith("OK"), out[-2000:]


def test_train_moe_takes_every_option_with_the_pipeline(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``examples/train_moe.py --pp 2`` (pp x dp x ep = 2 x 2 x 2, the batch's rows over
    dp and ep) with bf16, clipping, ZeRO-1, full recomputation, 2 accumulation rounds and a
    warmup-cosine schedule: every step's loss matches the float64 torch loop averaging
    the microbatches' losses (5e-2, the mixed-precision tolerance)."""
    monkeypatch.setenv("TESSERA_KERNELS", "reference")
    train_moe = load_example("train_moe")
    train_moe.main(["--pp", "2", "--microbatches", "2", "--batch", "16", "--precision", "bf16",
                    "--clip", "1.0", "--zero", "1", "--remat", "nothing", "--accumulate", "2",
                    "--lr-schedule", "warmup_cosine", "--warmup", "1", "--steps", "3"])  # fmt: skip
    out = capsys.readouterr().out
    assert "mesh pp 2 x dp 2 x ep 2 x tp 1" in out and out.rstrip().endswith("OK"), out[-2000:]
