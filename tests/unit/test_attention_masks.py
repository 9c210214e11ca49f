"""``op.attention``'s masks (issue 31): a key padding mask, segment ids (packed
documents), a sliding window and logit soft-capping, alone and together, with causal
and grouped-query heads; values and ``ts.grad`` of q, k, v against torch's
``F.scaled_dot_product_attention`` with the equivalent boolean ``attn_mask`` (the soft
cap applied to scores by hand). The reference kernels in float64 (1e-10), the Triton
kernels in float32 in Triton's interpreter (1e-4), one device, dp x tp (heads over tp)
and the sequence over ``cp`` (all-gathered k/v and their masks, or a ring on cp = 2 and 4
carrying the key ids, skipping blocks outside the window), and the masks stored in
zig-zag order like the tokens.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import tessera as ts
from tessera import dist, op, schedule
from tessera.errors import TesseraError
from tessera.transforms.ring_attention import block_pairs

B, H, T, D = 2, 4, 16, 8
SEGMENTS = torch.tensor(
    [[0] * 5 + [1] * 7 + [2] * 4, [0] * 9 + [1] * 7], dtype=torch.int32
)  # [B, T]: packed documents
KEEP = torch.ones(B, T, dtype=torch.bool)
KEEP[0, 12:] = False  # right padding
KEEP[1, :3] = False  # left padding

OPTIONS = {
    "padding": {"key_padding_mask": KEEP},
    "segments": {"segment_ids": SEGMENTS},
    "window": {"window": 4},
    "softcap": {"softcap": 1.5},
    "all": {"key_padding_mask": KEEP, "segment_ids": SEGMENTS, "window": 5, "softcap": 2.0},
}


def _inputs(kv_heads: int = H, dtype: torch.dtype = torch.float64, seed: int = 0, t: int = T):
    g = torch.Generator().manual_seed(seed)
    shapes = ((B, H, t, D), (B, kv_heads, t, D), (B, kv_heads, t, D), (B, H, t, D))
    return [torch.randn(s, generator=g, dtype=torch.float64).to(dtype) for s in shapes]


def _mask(causal: bool, options: dict, t: int = T) -> torch.Tensor:
    """The boolean ``attn_mask`` [B, 1, t, t] (True = attend) of ``options``."""
    i, j = torch.arange(t)[:, None], torch.arange(t)[None, :]
    mask = torch.ones(B, 1, t, t, dtype=torch.bool)
    if causal:
        mask &= i >= j
    if "window" in options:
        mask &= (i - j).abs() < options["window"]
    if "segment_ids" in options:
        s = options["segment_ids"]
        mask &= (s[:, :, None] == s[:, None, :])[:, None]
    if "key_padding_mask" in options:
        mask &= options["key_padding_mask"][:, None, None, :]
    return mask


def _torch(q, k, v, causal: bool, options: dict) -> torch.Tensor:
    """Attention by torch in float64; a row that sees no key gives 0."""
    q, k, v = (t.double() for t in (q, k, v))
    k, v = (t.repeat_interleave(q.shape[1] // t.shape[1], dim=1) for t in (k, v))
    mask = _mask(causal, options, q.shape[-2])
    seen = mask.any(-1, keepdim=True)
    mask = mask | ~seen  # no NaN rows; zeroed below
    if "softcap" in options:
        cap = options["softcap"]
        scores = cap * torch.tanh(q @ k.transpose(-1, -2) / D**0.5 / cap)
        bias = torch.zeros_like(scores).masked_fill(~mask, float("-inf"))
        out = torch.softmax(scores + bias, -1) @ v
    else:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return out * seen


def _torch_grads(q, k, v, w, causal, options):
    leaves = [t.double().clone().requires_grad_() for t in (q, k, v)]
    (_torch(*leaves, causal, options) * w.double()).sum().backward()
    return [t.grad for t in leaves]


def _close(got, want, tolerance):
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g.double(), w.double(), rtol=tolerance, atol=tolerance)


def _attend(causal: bool, options: dict):
    masks = {n: x for n, x in options.items() if isinstance(x, torch.Tensor)}
    static = {n: x for n, x in options.items() if n not in masks}
    names = sorted(masks)

    def attend(q, k, v, *tensors):
        return op.attention(q, k, v, causal=causal, **static, **dict(zip(names, tensors, strict=True)))

    def loss(q, k, v, w, *tensors):
        return op.sum(attend(q, k, v, *tensors) * w)

    return attend, loss, [masks[n] for n in names]


def _check(causal, options, *, kv_heads=H, dtype=torch.float64, tolerance=1e-10, t=T, **jit):
    q, k, v, w = _inputs(kv_heads, dtype, t=t)
    attend, loss, masks = _attend(causal, options)
    spec = jit.pop("spec", None)
    mask_spec = jit.pop("mask_spec", None)
    if spec is not None:
        jit["in_shardings"] = (spec,) * 3 + (mask_spec,) * len(masks)
    f = ts.jit(attend, **jit)
    _close([f(q, k, v, *masks)], [_torch(q, k, v, causal, options)], tolerance)
    if spec is not None:
        jit["in_shardings"] = (spec,) * 4 + (mask_spec,) * len(masks)
    g = ts.jit(ts.grad(loss, argnums=(0, 1, 2)), **jit)
    _close(g(q, k, v, w, *masks), _torch_grads(q, k, v, w, causal, options), tolerance)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("name", list(OPTIONS))
def test_reference_matches_torch(name: str, causal: bool) -> None:
    _check(causal, OPTIONS[name], kernels="reference")


@pytest.mark.parametrize("name", ["segments", "all"])
def test_reference_grouped_query_heads(name: str) -> None:
    _check(True, OPTIONS[name], kv_heads=2, kernels="reference")


@pytest.fixture
def interpret(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("name", list(OPTIONS))
def test_triton_forward_matches_torch(interpret, name: str, causal: bool) -> None:
    q, k, v, _ = _inputs(2, torch.float32)
    attend, _, masks = _attend(causal, OPTIONS[name])
    f = ts.jit(attend, kernels="triton")
    _close([f(q, k, v, *masks)], [_torch(q, k, v, causal, OPTIONS[name])], 1e-4)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("name", list(OPTIONS))
def test_triton_gradients_match_torch(interpret, name: str, causal: bool) -> None:
    q, k, v, w = _inputs(2, torch.float32)
    _, loss, masks = _attend(causal, OPTIONS[name])
    g = ts.jit(ts.grad(loss, argnums=(0, 1, 2)), kernels="triton")
    want = _torch_grads(q, k, v, w, causal, OPTIONS[name])
    _close(g(q, k, v, w, *masks), want, 1e-4)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_triton_many_blocks(interpret, causal: bool) -> None:
    """72 tokens: three key blocks of 32 (the last one partial), a window of 20 keys
    crossing them (the loops skip blocks outside it), documents and padding."""
    t = 72
    ids = torch.tensor([[0] * 30 + [1] * 42, [0] * 50 + [1] * 22], dtype=torch.int32)
    keep = torch.ones(B, t, dtype=torch.bool)
    keep[0, 60:] = False
    options = {"key_padding_mask": keep, "segment_ids": ids, "window": 20, "softcap": 3.0}
    q, k, v, w = _inputs(2, torch.float32, t=t)
    attend, loss, masks = _attend(causal, options)
    f = ts.jit(attend, kernels="triton")
    _close([f(q, k, v, *masks)], [_torch(q, k, v, causal, options)], 1e-4)
    g = ts.jit(ts.grad(loss, argnums=(0, 1, 2)), kernels="triton")
    _close(g(q, k, v, w, *masks), _torch_grads(q, k, v, w, causal, options), 1e-4)


# --- sharded -----------------------------------------------------------------------------


def _spec(*axes_by_dim: tuple[int, str]) -> dist.ShardSpec:
    return dist.ShardSpec(
        partition=tuple(d for d, _ in axes_by_dim), mesh_axes=tuple(a for _, a in axes_by_dim)
    )


@pytest.mark.parametrize("name", ["padding", "segments", "all"])
def test_dp_x_tp_heads_on_tp(name: str) -> None:
    """Batch over dp (the masks with it), heads over tp, grouped k/v heads."""
    _check(
        True, OPTIONS[name], kv_heads=2, kernels="reference",
        mesh=dist.mesh({"dp": 2, "tp": 2}),
        spec=_spec((0, "dp"), (1, "tp")), mask_spec=_spec((0, "dp")),
    )  # fmt: skip


@pytest.mark.parametrize("context", ["auto", "ring", "all_gather"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("name", list(OPTIONS))
def test_context_parallel(name: str, causal: bool, context: str) -> None:
    """The sequence over cp (the masks and segment ids with it), batch over dp."""
    with schedule.options(context_parallel=context):
        _check(
            causal, OPTIONS[name], kernels="reference",
            mesh=dist.mesh({"dp": 2, "cp": 2}),
            spec=_spec((0, "dp"), (2, "cp")), mask_spec=_spec((0, "dp"), (1, "cp")),
        )  # fmt: skip


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_context_parallel_triton(interpret, causal: bool) -> None:
    """The generated kernels on dp x cp, as a ring: each rank's window from its position
    along cp, the key ids travelling with k and v."""
    with schedule.options(context_parallel="ring"):
        _check(
            causal, OPTIONS["all"], kv_heads=2, dtype=torch.float32, tolerance=1e-4,
            kernels="triton", mesh=dist.mesh({"dp": 2, "cp": 2}),
            spec=_spec((0, "dp"), (2, "cp")), mask_spec=_spec((0, "dp"), (1, "cp")),
        )  # fmt: skip


# --- ring attention ---------------------------------------------------------------------


def _ring_check(causal: bool, options: dict, cp: int, t: int = T):
    """``_check`` with the sequence over ``cp`` ranks run as a ring (reference kernels,
    1e-10); the gradient program's lowering."""
    mesh, spec, mask_spec = dist.mesh({"cp": cp}), _spec((2, "cp")), _spec((1, "cp"))
    with schedule.options(context_parallel="ring"):
        _check(
            causal, options, t=t, kernels="reference", mesh=mesh, spec=spec, mask_spec=mask_spec
        )
        q, k, v, w = _inputs(t=t)
        _, loss, masks = _attend(causal, options)
        shardings = (spec,) * 4 + (mask_spec,) * len(masks)
        grad = ts.grad(loss, argnums=(0, 1, 2))
        g = ts.jit(grad, mesh=mesh, in_shardings=shardings, kernels="reference")
        return g.lower(q, k, v, w, *masks)


@pytest.mark.parametrize("cp", [2, 4])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("name", ["padding", "segments", "window", "all"])
def test_ring_carries_the_masks(name: str, causal: bool, cp: int) -> None:
    """The key ids travel round the ring with k and v, the window takes each block's
    positions: forward and gradients equal torch's, and nothing is gathered."""
    lowered = _ring_check(causal, OPTIONS[name], cp)
    assert {c.kind for c in lowered.collectives()} == {"collective_permute"}


def test_ring_skips_blocks_outside_the_window() -> None:
    """cp = 4, 32 tokens (8 a rank, zig-zag halves of 4), causal with a window of 3: of
    the 4 steps x 3 pairs only 5 calls are left (step 2 computes nothing), and the
    forward and backward equal torch's."""
    assert [len(p) for p in block_pairs(4, 8, True, True, 3)] == [3, 1, 0, 1]
    assert [len(p) for p in block_pairs(4, 8, True, True, None)] == [3, 3, 3, 3]
    assert [len(p) for p in block_pairs(4, 4, False, False, 2)] == [1, 1, 0, 1]
    options = {"window": 3, "segment_ids": torch.cat([SEGMENTS, SEGMENTS + 3], 1)}
    lowered = _ring_check(True, options, 4, t=2 * T)
    text = lowered.as_text("partitioned")
    assert text.count("graph.attention ") == 5
    assert text.count("graph.attention_backward ") == 5


# --- zig-zag order -------------------------------------------------------------------------


def _zigzag_check(causal: bool, options: dict, ranks: int, **jit) -> None:
    """``options`` over q, k, v and masks stored in zig-zag order (as a data loader stores
    them) equal torch on the natural order, stored the same way."""
    t = 2 * T
    order = torch.from_numpy(dist.zigzag_order(t, ranks))
    q, k, v, w = _inputs(t=t)
    stored = {n: x[:, order] if isinstance(x, torch.Tensor) else x for n, x in options.items()}
    attend, loss, masks = _attend(causal, {**stored, "zigzag": ranks})
    want = _torch(q, k, v, causal, options)[..., order, :]
    grads = [g[..., order, :] for g in _torch_grads(q, k, v, w, causal, options)]
    q, k, v, w = (x[..., order, :] for x in (q, k, v, w))
    spec, mask_spec = jit.pop("spec", None), jit.pop("mask_spec", None)
    if spec is not None:
        jit["in_shardings"] = (spec,) * 3 + (mask_spec,) * len(masks)
    _close([ts.jit(attend, **jit)(q, k, v, *masks)], [want], 1e-10)
    if spec is not None:
        jit["in_shardings"] = (spec,) * 4 + (mask_spec,) * len(masks)
    _close(ts.jit(ts.grad(loss, argnums=(0, 1, 2)), **jit)(q, k, v, w, *masks), grads, 1e-10)


ZIGZAG_MASKS = {
    "padding": {"key_padding_mask": torch.cat([KEEP, KEEP], 1)},
    "all": {
        "key_padding_mask": torch.cat([KEEP, KEEP], 1),
        "segment_ids": torch.cat([SEGMENTS, SEGMENTS + 3], 1),
        "window": 5,
    },
    "window": {"window": 3},
}


@pytest.mark.parametrize("context", ["one device", "ring", "all_gather"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("name", list(ZIGZAG_MASKS))
def test_zigzag_order_with_masks(name: str, causal: bool, context: str) -> None:
    """The masks stored in zig-zag order like the tokens: on one device, and over cp = 2
    as a ring (no relayout) or all-gathered (chunks put in true order locally)."""
    if context == "one device":
        _zigzag_check(causal, ZIGZAG_MASKS[name], 2, kernels="reference")
        return
    with schedule.options(context_parallel=context):
        _zigzag_check(
            causal, ZIGZAG_MASKS[name], 2, kernels="reference", mesh=dist.mesh({"cp": 2}),
            spec=_spec((2, "cp")), mask_spec=_spec((1, "cp")),
        )  # fmt: skip


# --- errors ------------------------------------------------------------------------------


def _trace_error(error: type[Exception], **options) -> str:
    q, k, v, _ = _inputs()
    f = ts.jit(lambda q, k, v: op.attention(q, k, v, **options))  # the user's line
    with pytest.raises(error) as info:
        f(q, k, v)
    return str(info.value)


def test_wrongly_shaped_mask_names_the_argument_and_line() -> None:
    message = _trace_error(TesseraError, key_padding_mask=torch.ones(B, T + 1, dtype=torch.bool))
    assert "key_padding_mask" in message and "[2, 16]" in message
    assert "test_attention_masks.py" in message


def test_wrong_mask_dtype_names_the_argument_and_line() -> None:
    message = _trace_error(TesseraError, key_padding_mask=torch.ones(B, T, dtype=torch.int32))
    assert "key_padding_mask must be a bool tensor" in message
    assert "test_attention_masks.py" in message
    message = _trace_error(TesseraError, q_segment_ids=SEGMENTS.float(), kv_segment_ids=SEGMENTS)
    assert "q_segment_ids must be an integer tensor" in message


def test_unsupported_combinations_are_errors() -> None:
    assert "only q_segment_ids" in _trace_error(TesseraError, q_segment_ids=SEGMENTS)
    assert "window must be a positive int" in _trace_error(TesseraError, window=0)
    assert "softcap must be a positive" in _trace_error(TesseraError, softcap=-1.0)
