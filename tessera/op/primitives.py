"""The primitive array operations: each binds graph ops directly (see :mod:`tessera.op`).

Every function takes traced tensors (and Python scalars or numpy arrays, which become
constants) and binds graph ops. Python scalars are weakly typed, as in JAX and torch:
``x * 2`` keeps ``x``'s dtype. Tensors of different dtypes are promoted as in numpy,
except that an integer or bool meeting a float gives that float (torch's and JAX's rule;
numpy widens int32 with float32 to float64), and true division and the mean of integers
give float32 (torch's default float; numpy gives float64): README "Dtypes". An explicit
``graph.cast`` is recorded for every promotion. Axes may be negative.
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import itertools
import math
import sys
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from typing import Any

import numpy as np
import torch
from xdsl.dialects.builtin import DenseIntOrFPElementsAttr

from tessera import precision
from tessera.dtypes import DType, as_dtype, promote
from tessera.errors import ShapeError, TesseraError, TraceError
from tessera.frontend.tracer import Tensor, current_trace, register_operators, user_location
from tessera.ir import graph
from tessera.ir.abstract import AbstractTensor
from tessera.ir.dense import dense_from_numpy, dense_to_numpy
from tessera.ir.shape_rules import FP8_FORMATS, normalize_axis
from tessera.ir.zigzag import check_zigzag

Operand = Tensor | float | int | bool | np.ndarray | torch.Tensor
Axis = int | Sequence[int] | None


# --- constants -------------------------------------------------------------------------


def _dense(value: np.ndarray, dtype: DType) -> DenseIntOrFPElementsAttr:
    return dense_from_numpy(value, AbstractTensor(tuple(value.shape), dtype).to_xdsl())


def constant(value: Any, dtype: Any = None) -> Tensor:
    """A constant tensor from a scalar, a (nested) list, a numpy array or a CPU torch
    tensor. Arrays keep their dtype (float64 included); Python floats and lists of them
    are f32, torch's default dtype."""
    if isinstance(value, torch.Tensor):
        dtype = value.dtype if dtype is None else dtype
        value = value.detach().cpu()
        value = (value.float() if value.dtype == torch.bfloat16 else value).numpy()
    array = np.asarray(value)
    if dtype is None and not isinstance(value, (np.ndarray, np.generic)):
        dtype = DType.f32 if array.dtype == np.float64 else None
    if array.dtype.kind not in "biuf":  # not bool, int or float: strings, objects...
        raise TraceError(
            f"a {type(value).__name__} cannot be used as a tensor: {value!r}, at {user_location()}"
        )
    target = _dtype_argument(dtype if dtype is not None else array.dtype)
    (result,) = current_trace().bind(graph.ConstantOp, [], value=_dense(array, target))
    return result


def full(shape: Sequence[int], fill_value: float | int | bool, dtype: Any = None) -> Tensor:
    """A tensor of ``shape`` filled with ``fill_value`` (a splat constant).

    Without ``dtype`` the fill value decides, as in numpy and torch: a float gives f32,
    an int i64 and a bool i1.
    """
    if dtype is None and isinstance(fill_value, float):
        dtype = DType.f32
    return constant(np.full(_shape_argument(shape, "shape"), fill_value), dtype)


def iota(shape: Sequence[int], dimension: int = 0, dtype: Any = "i64") -> Tensor:
    """Indices along ``dimension``, broadcast to ``shape`` (``jax.lax.broadcasted_iota``):
    ``iota((2, 3), 1)`` is ``[[0, 1, 2], [0, 1, 2]]``. Computed where it is read, so
    a large iota costs no memory and no constant in the program."""
    dims = _shape_argument(shape, "shape")
    if isinstance(dimension, bool) or not isinstance(dimension, (int, np.integer)):
        raise ShapeError(f"iota: dimension must be an int, found {dimension!r}, at {user_location()}")
    (result,) = current_trace().bind(
        graph.IotaOp,
        [],
        dimension=int(dimension) + len(dims) if -len(dims) <= dimension < 0 else int(dimension),
        shape=dims,
        dtype=_dtype_argument(dtype),
    )
    return result


def zeros(shape: Sequence[int], dtype: Any = "f32") -> Tensor:
    return full(shape, 0, dtype)


def ones(shape: Sequence[int], dtype: Any = "f32") -> Tensor:
    return full(shape, 1, dtype)


def _is_weak(x: Any) -> bool:
    return isinstance(x, (bool, int, float)) and not isinstance(x, Tensor)


def _weak_dtype(x: bool | int | float, other: DType) -> DType:
    """The dtype a Python scalar takes next to a tensor of dtype ``other``."""
    if isinstance(x, bool):
        return other
    if isinstance(x, int):
        return other if other != DType.i1 else DType.i64
    return other if other.is_float else DType.f32


def _tensors(*xs: Any) -> list[Tensor]:
    """Converts operands to tensors of one promoted dtype (inserting casts)."""
    items = [x if isinstance(x, Tensor) or _is_weak(x) else constant(x) for x in xs]
    if not any(isinstance(x, Tensor) for x in items):  # only Python scalars, or nothing
        if not items:
            raise ShapeError(f"expected at least one operand, found none, at {user_location()}")
        items[0] = constant(items[0])
    strong = [x for x in items if isinstance(x, Tensor)]
    dtype = strong[0].dtype
    for t in strong[1:]:
        dtype = promote(dtype, t.dtype)
    for weak in {_weak_dtype(x, dtype) for x in items if _is_weak(x)}:
        dtype = promote(dtype, weak)
    return [astype(x, dtype) if isinstance(x, Tensor) else constant(x, dtype) for x in items]


def _bind1(op_type: type[graph.GraphOp], operands: Sequence[Tensor], **attrs: Any) -> Tensor:
    (result,) = current_trace().bind(op_type, operands, **attrs)
    return result


def astype(x: Tensor, dtype: Any) -> Tensor:
    """Converts ``x`` to ``dtype`` (no op when it already has it)."""
    target = _dtype_argument(dtype)
    if x.dtype == target:
        return x
    return _bind1(graph.CastOp, [x], dtype=target)


cast = astype


# --- elementwise -----------------------------------------------------------------------


def _binary(op_type: type[graph.GraphOp], a: Operand, b: Operand) -> Tensor:
    return _bind1(op_type, _tensors(a, b))


def _float_binary(op_type: type[graph.GraphOp], a: Operand, b: Operand) -> Tensor:
    lhs, rhs = _tensors(a, b)
    if not lhs.dtype.is_float:  # true division of integers gives floats: f32 (numpy: f64)
        lhs, rhs = astype(lhs, DType.f32), astype(rhs, DType.f32)
    return _bind1(op_type, [lhs, rhs])


def _negative_constant(x: Operand) -> int | None:
    """The least value of ``x`` if it is known while tracing (a Python number, an array, a
    constant tensor) and negative; None otherwise."""
    if isinstance(x, Tensor):
        owner = x.value.owner
        if not isinstance(owner, graph.ConstantOp):
            return None
        values = dense_to_numpy(owner.value)
    elif _is_weak(x):
        values = np.asarray(x)
    else:
        values = np.asarray(x.detach().cpu() if isinstance(x, torch.Tensor) else x)
    if values.size == 0 or values.dtype.kind not in "iuf":
        return None
    least = values.min()
    return least.item() if least < 0 else None


def add(a: Operand, b: Operand) -> Tensor:
    return _binary(graph.AddOp, a, b)


def subtract(a: Operand, b: Operand) -> Tensor:
    return _binary(graph.SubOp, a, b)


def multiply(a: Operand, b: Operand) -> Tensor:
    return _binary(graph.MulOp, a, b)


def divide(a: Operand, b: Operand) -> Tensor:
    return _float_binary(graph.DivOp, a, b)


def power(a: Operand, b: Operand) -> Tensor:
    """numpy ``power``: an integer to an integer power is an integer (wrapping on overflow,
    as in numpy and torch). A negative integer exponent known while tracing (a Python int,
    an array, a constant) is a ShapeError, as numpy raises; one known only at run time
    gives torch's result (``1 // x**-y``: 1 for x = 1, 1 or -1 for x = -1, else 0)."""
    lhs, rhs = _tensors(a, b)
    if lhs.dtype.is_int:
        least = _negative_constant(b)
        if least is not None:
            raise ShapeError(
                f"graph.pow: integers to negative integer powers are not allowed (numpy "
                f"raises too), found the exponent {least} for {lhs.aval}; cast the base to a "
                f"float first, at {user_location()}"
            )
    return _bind1(graph.PowOp, [lhs, rhs])


def maximum(a: Operand, b: Operand) -> Tensor:
    return _binary(graph.MaximumOp, a, b)


def minimum(a: Operand, b: Operand) -> Tensor:
    return _binary(graph.MinimumOp, a, b)


sub, mul, div, pow = subtract, multiply, divide, power


def _compare(predicate: str, a: Operand, b: Operand) -> Tensor:
    lhs, rhs = _tensors(a, b)
    return _bind1(graph.CompareOp, [lhs, rhs], predicate=predicate)


def equal(a: Operand, b: Operand) -> Tensor:
    return _compare("eq", a, b)


def not_equal(a: Operand, b: Operand) -> Tensor:
    return _compare("ne", a, b)


def less(a: Operand, b: Operand) -> Tensor:
    return _compare("lt", a, b)


def less_equal(a: Operand, b: Operand) -> Tensor:
    return _compare("le", a, b)


def greater(a: Operand, b: Operand) -> Tensor:
    return _compare("gt", a, b)


def greater_equal(a: Operand, b: Operand) -> Tensor:
    return _compare("ge", a, b)


def where(cond: Operand, x: Operand, y: Operand) -> Tensor:
    """``x`` where ``cond`` is true, else ``y`` (numpy ``where``, broadcasting)."""
    (condition,) = _tensors(cond)
    if condition.dtype != DType.i1:
        condition = not_equal(condition, 0)
    on_true, on_false = _tensors(x, y)
    return _bind1(graph.SelectOp, [condition, on_true, on_false])


select = where


def _unary(
    op_type: type[graph.GraphOp], x: Operand, *, floating: bool = False, **attrs: Any
) -> Tensor:
    (tensor,) = _tensors(x)
    if floating and not tensor.dtype.is_float:
        tensor = astype(tensor, DType.f32)
    return _bind1(op_type, [tensor], **attrs)


def negative(x: Operand) -> Tensor:
    return _unary(graph.NegOp, x)


neg = negative


def abs(x: Operand) -> Tensor:
    return _unary(graph.AbsOp, x)


def stop_gradient(x: Operand) -> Tensor:
    """``x``, as a constant to differentiation: no gradient flows through it
    (``jax.lax.stop_gradient``)."""
    return _unary(graph.StopGradientOp, x)


def relu(x: Operand) -> Tensor:
    return _unary(graph.ReluOp, x)


def exp(x: Operand) -> Tensor:
    return _unary(graph.ExpOp, x, floating=True)


def log(x: Operand) -> Tensor:
    return _unary(graph.LogOp, x, floating=True)


def tanh(x: Operand) -> Tensor:
    return _unary(graph.TanhOp, x, floating=True)


def sqrt(x: Operand) -> Tensor:
    return _unary(graph.SqrtOp, x, floating=True)


def rsqrt(x: Operand) -> Tensor:
    return _unary(graph.RsqrtOp, x, floating=True)


def silu(x: Operand) -> Tensor:
    return _unary(graph.SiluOp, x, floating=True)


def sigmoid(x: Operand) -> Tensor:
    return _unary(graph.SigmoidOp, x, floating=True)


def erf(x: Operand) -> Tensor:
    return _unary(graph.ErfOp, x, floating=True)


def cos(x: Operand) -> Tensor:
    """The cosine of ``x`` (radians), elementwise."""
    return _unary(graph.CosOp, x, floating=True)


def sin(x: Operand) -> Tensor:
    """The sine of ``x`` (radians), elementwise."""
    return _unary(graph.SinOp, x, floating=True)


def gelu(x: Operand, approximate: str | bool = "none") -> Tensor:
    """GELU; ``approximate="tanh"`` (or True) for the tanh form, as in torch."""
    mode = {True: "tanh", False: "none"}.get(approximate, approximate)  # type: ignore[call-overload]
    return _unary(graph.GeluOp, x, floating=True, approximate=mode)


# --- contractions ------------------------------------------------------------------------


def matmul(a: Operand, b: Operand) -> Tensor:
    """numpy ``matmul``: batched, batch dims broadcast; 1-d operands as numpy does."""
    lhs, rhs = _tensors(a, b)
    if lhs.ndim == 0 or rhs.ndim == 0:
        raise ShapeError(
            f"graph.matmul: expected operands of rank >= 1, found {lhs.aval} and {rhs.aval}\n"
            f"  at {user_location()}"
        )
    squeeze_lhs, squeeze_rhs = lhs.ndim == 1, rhs.ndim == 1
    if squeeze_lhs:
        lhs = reshape(lhs, (1, lhs.shape[0]))
    if squeeze_rhs:
        rhs = reshape(rhs, (rhs.shape[0], 1))
    result = fp8_matmul(lhs, rhs) if _FP8_MATMULS.get() else _bind1(graph.MatmulOp, [lhs, rhs])
    if squeeze_lhs or squeeze_rhs:
        shape = result.shape[:-2]
        shape += () if squeeze_lhs else (result.shape[-2],)
        shape += () if squeeze_rhs else (result.shape[-1],)
        result = reshape(result, shape)
    return result


# --- fp8 -------------------------------------------------------------------------------

_FP8_MATMULS: ContextVar[bool] = ContextVar("fp8_matmuls", default=False)


@contextlib.contextmanager
def fp8_matmuls(enabled: bool = True) -> Iterator[None]:
    """While tracing: ``matmul`` (and ``@``, ``einsum``) computes as :func:`fp8_matmul`."""
    token = _FP8_MATMULS.set(enabled)
    try:
        yield
    finally:
        _FP8_MATMULS.reset(token)


@dataclasses.dataclass
class Fp8History:
    """While a training step with delayed fp8 scaling traces (:func:`fp8_history`): the
    amax history ``[tensors, length]`` (None while the step counts its fp8 tensors: then
    the scales are current ones) and each fp8 tensor's amax of this step, in the order
    the fp8 matmuls quantise them (a matmul's lhs, rhs, then its incoming gradient, whose
    amax ``graph.backward`` fills in from the gradient of its ``probes`` entry)."""

    history: Tensor | None
    margin: int = 0
    amaxes: list[Tensor | None] = dataclasses.field(default_factory=list)
    probes: dict[int, Tensor] = dataclasses.field(default_factory=dict)

    def scale(self, slot: int, format: str) -> Tensor | None:
        """The delayed scale of fp8 tensor ``slot``: ``max(history) · 2^margin / max``
        (1 while its history is all zero); None while counting."""
        if self.history is None:
            return None
        tensors, length = self.history.shape
        if slot >= tensors:
            raise TesseraError(
                f"fp8 delayed scaling: the step quantises more fp8 tensors than its amax "
                f"history has rows ({tensors}); its state was made for another program"
            )
        amax = max(slice(self.history, (slot, 0), (slot + 1, length)))
        return where(greater(amax, 0.0), amax / FP8_FORMATS[format] * 2.0**self.margin, 1.0)

    def probe(self, slot: int) -> Tensor:
        """A zero scalar whose gradient will be fp8 tensor ``slot``'s amax."""
        assert self.history is not None
        entry = slice(self.history, (slot, 0), (slot + 1, 1))
        self.probes[slot] = reshape(entry, ()) * 0.0
        return self.probes[slot]


_FP8_HISTORY: ContextVar[Fp8History | None] = ContextVar("fp8_history", default=None)


@contextlib.contextmanager
def fp8_history(history: Fp8History | None) -> Iterator[Fp8History | None]:
    """While tracing: fp8 matmuls scale by ``history`` (delayed scaling) and record their
    amaxes in it; None: current scaling."""
    token = _FP8_HISTORY.set(history)
    try:
        yield history
    finally:
        _FP8_HISTORY.reset(token)


def current_fp8_history() -> Fp8History | None:
    """The delayed-scaling history being traced, if any (:func:`fp8_history`)."""
    return _FP8_HISTORY.get()


def fp8_scale(x: Tensor, format: str = "e4m3") -> Tensor:
    """Per-tensor current scale: ``amax(|x|) / max`` of ``format`` (1 where ``x`` is zero);
    no gradient flows through it."""
    amax = stop_gradient(max(abs(x)))
    return where(greater(amax, 0.0), amax / FP8_FORMATS[format], 1.0)


def fp8_quantize(x: Tensor, scale: Tensor | float | None = None, format: str = "e4m3") -> Tensor:
    """``x`` quantised to fp8 and dequantised: ``fp8(clamp(x / scale, ±max)) * scale``
    (saturating, nearest even; ``scale`` defaults to :func:`fp8_scale`); gradient straight through."""
    (tensor,) = _tensors(x)
    if scale is None:
        scale = fp8_scale(tensor, format)
    if not isinstance(scale, Tensor):
        scale = full((), scale, tensor.dtype)
    (scale,) = _tensors(astype(scale, tensor.dtype))
    return _bind1(graph.Fp8QuantizeOp, [tensor, scale], format=format)


def fp8_grad(x: Tensor, format: str = "e5m2") -> Tensor:
    """``x``; its cotangent is quantised to ``format`` with its current per-tensor scale."""
    return _bind1(graph.Fp8GradOp, list(_tensors(x)), format=format)


def fp8_matmul(a: Operand, b: Operand) -> Tensor:
    """An fp8 matmul: both operands quantised per tensor to e4m3 (current scaling), their
    fp8 values multiplied with f32 accumulation and the product rescaled by both scales,
    the result's incoming gradient quantised to e5m2; the result has the operands' dtype.
    The fp8 values are held in f32 (quantise–dequantise with scale 1); the matmul's
    ``fp8`` property lets the generated kernel dot them in fp8 where
    :func:`tessera.precision.fp8_dots` says the GPU can."""
    lhs, rhs = _tensors(a, b)
    dtype = promote(lhs.dtype, rhs.dtype)
    if dtype not in (DType.f32, DType.bf16, DType.f16):
        raise TesseraError(
            f"fp8 matmul: operands must be f32, bf16 or f16, found {lhs.aval} and {rhs.aval}\n"
            f"  at {user_location()}"
        )
    history = _FP8_HISTORY.get()
    (lhs, lhs_scale), (rhs, rhs_scale) = (
        _fp8_values(astype(t, DType.f32), history) for t in (lhs, rhs)
    )
    attrs = {"fp8": "e4m3"} if precision.fp8_dots() else {}
    product = _bind1(graph.MatmulOp, [lhs, rhs], **attrs) * (lhs_scale * rhs_scale)
    if history is None:
        return astype(fp8_grad(product, "e5m2"), dtype)
    slot = len(history.amaxes)
    history.amaxes.append(None)  # the backward's
    scale = history.scale(slot, "e5m2")
    if scale is None:  # counting
        return astype(fp8_grad(product, "e5m2"), dtype)
    delayed = _bind1(graph.Fp8GradDelayedOp, [product, scale, history.probe(slot)], format="e5m2")
    return astype(delayed, dtype)


def _fp8_values(x: Tensor, history: Fp8History | None = None) -> tuple[Tensor, Tensor]:
    """``x``'s e4m3 values (in ``x``'s dtype, with its scale: ``fp8(x / scale)``) and that
    scale, current or (``history``) delayed; the gradient passes straight through to ``x``."""
    scale = None
    if history is not None:
        history.amaxes.append(stop_gradient(max(abs(x))))
        scale = history.scale(len(history.amaxes) - 1, "e4m3")
    if scale is None:
        scale = fp8_scale(x, "e4m3")
    return fp8_quantize(x / scale, 1.0, "e4m3"), scale


def attention(
    q: Operand,
    k: Operand,
    v: Operand,
    *,
    causal: bool = False,
    scale: float | None = None,
    q_offset: Operand | None = None,
    k_offset: Operand | None = None,
    zigzag: int | None = None,
    key_padding_mask: Operand | None = None,
    segment_ids: Operand | None = None,
    q_segment_ids: Operand | None = None,
    kv_segment_ids: Operand | None = None,
    window: int | None = None,
    softcap: float | None = None,
) -> Tensor:
    """Scaled dot-product attention, ``softmax(scale · q kᵀ) v`` over the keys, as one
    fused op (torch's ``F.scaled_dot_product_attention``, ``jax.nn.dot_product_attention``).

    ``q [..., Tq, D]``, ``k [..., Tk, D]``, ``v [..., Tk, Dv]`` -> ``[..., Tq, Dv]``; k
    and v may have fewer heads (dim -3) than q, each serving a group of query heads
    (grouped-query attention). ``scale`` defaults to ``1 / sqrt(D)``. With ``causal``,
    query ``i`` sees key ``j`` iff ``q_offset + i >= k_offset + j`` (offsets: ints or
    traced i32 scalars, 0 by default: torch's ``is_causal`` for ``Tq == Tk``); a query
    that sees no key gives 0. Neither direction materialises the ``[Tq, Tk]`` scores
    (flash attention forward and backward), and with the sequence split over a mesh
    axis it runs context-parallel (see ``graph.attention``).

    Masks (``batch``: q's dims before the heads), combined with ``causal``:

    - ``key_padding_mask [batch, Tk]`` (bool, True = keep): padded keys are hidden;
    - ``q_segment_ids [batch, Tq]``, ``kv_segment_ids [batch, Tk]`` (integers), or one
      ``segment_ids`` when ``Tq == Tk``: query ``i`` sees key ``j`` only in its own
      segment (packed documents);
    - ``window=w``: a sliding window (Mistral), ``|i - j| < w`` on the positions above
      (with ``causal``: ``i - w < j <= i``);
    - ``softcap=c``: scores become ``c · tanh(scores / c)`` before masking (Gemma 2).

    ``zigzag=n``: the sequences arrive in zig-zag order over ``n`` ranks, as a data loader
    stores them with ``x[..., dist.zigzag_order(T, n), :]`` (Megatron-LM's load-balanced
    context parallelism), the masks and segment ids likewise (``ids[:, order]``); the
    causal mask and the window compare true positions. With the sequence
    split over ``n`` ranks every rank then has the same causal work and ring attention
    moves no token but k and v.
    """
    tensors = _tensors(q, k, v)  # one dtype: mixed floats promote as in torch
    if scale is None:
        head = tensors[0].shape[-1] if tensors[0].ndim else 0
        scale = 1.0 / math.sqrt(head) if head else 1.0
    elif isinstance(scale, bool) or not isinstance(scale, (int, float, np.integer, np.floating)):
        raise ShapeError(
            f"graph.attention: scale must be a Python number, found {scale!r}, at {user_location()}"
        )
    masking: dict[str, Any] = {}
    if window is not None:
        if isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window < 1:
            raise ShapeError(
                f"graph.attention: window must be a positive int, found {window!r}, at "
                f"{user_location()}"
            )
        masking["window"] = int(window)
    if softcap is not None:
        number = isinstance(softcap, (int, float, np.integer, np.floating))
        if isinstance(softcap, bool) or not number or not 0 < softcap < math.inf:
            raise ShapeError(
                f"graph.attention: softcap must be a positive number, found {softcap!r}, at "
                f"{user_location()}"
            )
        masking["softcap"] = float(softcap)
    segments = _segment_ids(
        tensors, key_padding_mask, segment_ids, q_segment_ids, kv_segment_ids
    )
    if segments:
        masking["segments"] = True
    positions = []
    if q_offset is not None or k_offset is not None or window is not None:
        positions = [
            _position(q_offset, "graph.attention: q_offset"),
            _position(k_offset, "graph.attention: k_offset"),
        ]
    order = {} if zigzag is None else {"zigzag": _zigzag_ranks(zigzag, *tensors[:2])}
    out, _ = current_trace().bind(
        graph.AttentionOp,
        [*tensors, *segments, *positions],
        causal=bool(causal),
        scale=float(scale),
        **order,
        **masking,
    )
    return out


def _mask_argument(x: Operand, what: str, shape: tuple[int, ...], kind: str) -> Tensor:
    """``attention``'s mask or segment ids ``x``, checked to be of ``shape``, bool
    (``kind`` "b") or integer ("i")."""
    (tensor,) = _tensors(x)
    ok = tensor.dtype == DType.i1 if kind == "b" else tensor.dtype.is_int and tensor.dtype != DType.i1
    if not ok or tuple(tensor.shape) != shape:
        want = "a bool" if kind == "b" else "an integer"
        raise ShapeError(
            f"graph.attention: {what} must be {want} tensor of shape {list(shape)} "
            f"([batch, {'Tq' if what.startswith('q_') else 'Tk'}]), found {tensor.aval}, "
            f"at {user_location()}"
        )
    return astype(tensor, DType.i32) if kind == "i" else tensor


def _segment_ids(
    tensors: Sequence[Tensor],
    key_padding_mask: Operand | None,
    segment_ids: Operand | None,
    q_segment_ids: Operand | None,
    kv_segment_ids: Operand | None,
) -> list[Tensor]:
    """The query and key segment ids (i32) of ``attention``'s masks, or ``[]``: a key
    padding mask becomes ids no query has (``2 · id`` for the queries, ``2 · id + 1`` for
    padded keys)."""
    q, k = tensors[:2]
    batch = tuple(q.shape[:-3])
    tq, tk = (q.shape[-2], k.shape[-2]) if q.ndim >= 2 and k.ndim >= 2 else (0, 0)
    if segment_ids is not None:
        if q_segment_ids is not None or kv_segment_ids is not None:
            raise ShapeError(
                "graph.attention: give segment_ids or q_segment_ids and kv_segment_ids, not "
                f"both, at {user_location()}"
            )
        if tq != tk:
            raise ShapeError(
                f"graph.attention: segment_ids needs as many queries as keys, found {tq} and "
                f"{tk}; give q_segment_ids and kv_segment_ids, at {user_location()}"
            )
        q_segment_ids = kv_segment_ids = segment_ids
    if (q_segment_ids is None) != (kv_segment_ids is None):
        raise ShapeError(
            "graph.attention: q_segment_ids and kv_segment_ids go together, found only "
            f"{'q' if kv_segment_ids is None else 'kv'}_segment_ids, at {user_location()}"
        )
    ids: list[Tensor] = []
    if q_segment_ids is not None:
        name = "segment_ids" if segment_ids is not None else None
        ids = [
            _mask_argument(q_segment_ids, name or "q_segment_ids", (*batch, tq), "i"),
            _mask_argument(kv_segment_ids, name or "kv_segment_ids", (*batch, tk), "i"),
        ]
    if key_padding_mask is None:
        return ids
    keep = _mask_argument(key_padding_mask, "key_padding_mask", (*batch, tk), "b")
    padded = 1 - astype(keep, DType.i32)
    if not ids:
        return [full((*batch, tq), 0, DType.i32), padded]
    return [ids[0] * 2, ids[1] * 2 + padded]


def _zigzag_ranks(zigzag: Any, q: Tensor, k: Tensor) -> int:
    """``attention``'s ``zigzag``: a number of ranks whose ``2n`` chunks cut both sequences."""
    try:
        check_zigzag(0, zigzag)
        for role, x in (("query", q), ("key", k)):
            check_zigzag(x.shape[-2] if x.ndim >= 2 else 0, zigzag, f"{role} sequence")
    except ShapeError as error:
        raise ShapeError(f"graph.attention: {error}, at {user_location()}") from None
    return int(zigzag)


def _position(offset: Operand | None, what: str) -> Tensor:
    """A causal position offset as an i32 scalar tensor (an int becomes a constant)."""
    if offset is None:
        offset = 0
    if isinstance(offset, (int, np.integer)) and not isinstance(offset, bool):
        return constant(np.int32(offset))
    if isinstance(offset, Tensor) and offset.ndim == 0 and offset.dtype.is_int:
        return astype(offset, DType.i32)
    raise ShapeError(
        f"{what} must be an int or an integer scalar tensor, found "
        f"{getattr(offset, 'aval', offset)!r}, at {user_location()}"
    )


# --- reductions ------------------------------------------------------------------------------


def _dtype_argument(dtype: Any) -> DType:
    """``dtype`` (a DType, its name, a torch or numpy dtype) as a DType; a ShapeError
    naming the user's line otherwise."""
    try:
        return as_dtype(dtype)
    except TesseraError as error:
        raise ShapeError(f"{error}, at {user_location()}") from None


def _integer(value: Any, what: str) -> int:
    """``value`` as an int (a Python or numpy integer, not a bool); a ShapeError naming
    the user's line otherwise."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        return int(value)
    raise ShapeError(
        f"{what} must be an integer, found {value!r} ({type(value).__name__}), "
        f"at {user_location()}"
    )


def _integers(values: Any, what: str) -> tuple[int, ...]:
    """An int or a sequence of ints, as a tuple (see :func:`_integer`)."""
    if isinstance(values, (int, np.integer)) and not isinstance(values, (bool, np.bool_)):
        return (int(values),)
    if isinstance(values, (str, bytes)) or not isinstance(values, (Sequence, np.ndarray)):
        raise ShapeError(
            f"{what} must be an integer or a sequence of integers, found {values!r}, "
            f"at {user_location()}"
        )
    return tuple(_integer(v, f"each entry of {what}") for v in values)


def _shape_argument(shape: Any, what: str = "shape") -> tuple[int, ...]:
    """A shape argument (an int or a sequence of ints, none negative) as a tuple."""
    dims = _integers(shape, what)
    if any(d < 0 for d in dims):
        raise ShapeError(f"{what} {list(dims)} has a negative size, at {user_location()}")
    return dims


def _axes(x: Tensor, axis: Axis) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(x.ndim))
    axes = _integers(axis, "axis")
    try:
        return tuple(sorted(normalize_axis(a, x.ndim) for a in axes))
    except ShapeError as error:
        raise ShapeError(f"{error} (tensor {x.aval}) at {user_location()}") from None


def _axis(x: Tensor, axis: int) -> int:
    """``axis`` (one int) of ``x`` in ``range(x.ndim)``; a ShapeError naming the user's
    line if invalid."""
    return _axes(x, _integer(axis, "axis"))[0]


def _reduce(
    op_type: type[graph.GraphOp], x: Operand, axis: Axis, keepdims: bool, floating: bool = False
) -> Tensor:
    (tensor,) = _tensors(x)
    if floating and not tensor.dtype.is_float:
        tensor = astype(tensor, DType.f32)
    return _bind1(op_type, [tensor], axes=_axes(tensor, axis), keepdims=bool(keepdims))


def sum(x: Operand, axis: Axis = None, keepdims: bool = False, dtype: Any = None) -> Tensor:
    """Sum over ``axis``; bools and int32 are summed in int64 (the kernel accumulates in
    int64), as numpy does on 64-bit Linux and torch does. ``dtype`` (numpy's) sums in
    that dtype instead: ``dtype=x.dtype`` keeps int32 (wrapping on overflow); a sum in
    bool is the logical or, as in numpy."""
    (tensor,) = _tensors(x)
    target = _dtype_argument(dtype) if dtype is not None else None
    if target == DType.i1:  # numpy: x cast to bool, then added (or-ed) in bool
        count = sum(astype(tensor, DType.i1), axis, keepdims)
        return not_equal(count, 0)
    if target is None:
        target = DType.i64 if tensor.dtype in (DType.i1, DType.i32) else tensor.dtype
    return _reduce(graph.SumOp, astype(tensor, target), axis, keepdims)


def prod(x: Operand, axis: Axis = None, keepdims: bool = False) -> Tensor:
    """Product over ``axis``; bools and int32 are multiplied in int64 (wrapping on
    overflow), as numpy does on 64-bit Linux and torch does."""
    (tensor,) = _tensors(x)
    target = DType.i64 if tensor.dtype in (DType.i1, DType.i32) else tensor.dtype
    return _reduce(graph.ProdOp, astype(tensor, target), axis, keepdims)


def mean(x: Operand, axis: Axis = None, keepdims: bool = False) -> Tensor:
    """Mean over ``axis``. The mean of bools or integers is float32 (torch's default
    float; numpy gives float64), computed as numpy does, in float64, and rounded once."""
    (tensor,) = _tensors(x)
    if tensor.dtype.is_float:
        return _reduce(graph.MeanOp, tensor, axis, keepdims)
    wide = _reduce(graph.MeanOp, astype(tensor, DType.f64), axis, keepdims)
    return astype(wide, DType.f32)


def max(x: Operand, axis: Axis = None, keepdims: bool = False) -> Tensor:
    return _reduce(graph.MaxOp, x, axis, keepdims)


def min(x: Operand, axis: Axis = None, keepdims: bool = False) -> Tensor:
    return _reduce(graph.MinOp, x, axis, keepdims)


def softmax(x: Operand, axis: int = -1) -> Tensor:
    (tensor,) = _tensors(x)
    return _unary(graph.SoftmaxOp, tensor, floating=True, axis=_axis(tensor, axis))


def log_softmax(x: Operand, axis: int = -1) -> Tensor:
    (tensor,) = _tensors(x)
    return _unary(graph.LogSoftmaxOp, tensor, floating=True, axis=_axis(tensor, axis))


def layer_norm(
    x: Operand,
    axis: Axis = -1,
    eps: float = 1e-5,
    weight: Operand | None = None,
    bias: Operand | None = None,
) -> Tensor:
    """Normalizes over ``axis`` (biased variance); optional elementwise affine."""
    (tensor,) = _tensors(x)
    y = _unary(graph.LayerNormOp, tensor, floating=True, axes=_axes(tensor, axis), eps=float(eps))
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y


def rms_norm(
    x: Operand, axis: Axis = -1, eps: float = 1e-6, weight: Operand | None = None
) -> Tensor:
    """``x / sqrt(mean(x^2) + eps)`` over ``axis``; optional elementwise scale."""
    (tensor,) = _tensors(x)
    y = _unary(graph.RmsNormOp, tensor, floating=True, axes=_axes(tensor, axis), eps=float(eps))
    return y * weight if weight is not None else y


def cross_entropy(logits: Operand, labels: Operand, reduction: str = "mean") -> Tensor:
    """Softmax cross-entropy; classes on the last axis of ``logits``, integer labels."""
    (scores,) = _tensors(logits)
    targets = labels if isinstance(labels, Tensor) else constant(labels)
    return _bind1(graph.CrossEntropyOp, [scores, targets], reduction=reduction)


# --- layout ------------------------------------------------------------------------------------


def reshape(x: Operand, shape: Sequence[int] | int) -> Tensor:
    """Row-major reshape; one entry may be -1."""
    (tensor,) = _tensors(x)
    dims = list(_integers(shape, "shape"))
    if any(d < -1 for d in dims):
        raise ShapeError(
            f"graph.reshape: sizes must be >= 0 (or -1 for one inferred size), found {dims} "
            f"at {user_location()}"
        )
    if dims.count(-1) > 1:
        raise ShapeError(
            f"graph.reshape: at most one -1 is allowed, found {dims} at {user_location()}"
        )
    if -1 in dims:
        known = math.prod(d for d in dims if d != -1)
        if known == 0 or tensor.size % known:
            raise ShapeError(
                f"graph.reshape: cannot reshape {tensor.aval} to {dims} at {user_location()}"
            )
        dims[dims.index(-1)] = tensor.size // known
    if tuple(dims) == tensor.shape:
        return tensor
    return _bind1(graph.ReshapeOp, [tensor], shape=tuple(dims))


def transpose(x: Operand, axes: Sequence[int] | None = None) -> Tensor:
    """Permutes dimensions (reverses them when ``axes`` is None, like numpy)."""
    (tensor,) = _tensors(x)
    perm = (
        tuple(reversed(range(tensor.ndim)))
        if axes is None
        else tuple(_axis(tensor, a) for a in axes)
    )
    if perm == tuple(range(tensor.ndim)):
        return tensor
    return _bind1(graph.TransposeOp, [tensor], perm=perm)


def permute_dims(x: Operand, axes: Sequence[int]) -> Tensor:
    return transpose(x, axes)


def swapaxes(x: Operand, axis1: int, axis2: int) -> Tensor:
    (tensor,) = _tensors(x)
    perm = list(range(tensor.ndim))
    a, b = _axis(tensor, axis1), _axis(tensor, axis2)
    perm[a], perm[b] = perm[b], perm[a]
    return transpose(tensor, perm)


def broadcast_to(x: Operand, shape: Sequence[int]) -> Tensor:
    (tensor,) = _tensors(x)
    dims = _shape_argument(shape)
    if dims == tensor.shape:
        return tensor
    return _bind1(graph.BroadcastToOp, [tensor], shape=dims)


def concat(xs: Sequence[Operand], axis: int = 0) -> Tensor:
    """Concatenates along ``axis`` (numpy ``concatenate``, torch ``cat``)."""
    tensors = _tensors(*xs)
    ax = _axis(tensors[0], axis)
    if len(tensors) == 1:
        return tensors[0]
    return _bind1(graph.ConcatOp, tensors, axis=ax)


cat = concatenate = concat


def _split_sizes(x: Operand, sizes: int | Sequence[int], axis: int = 0) -> list[Tensor]:
    """torch-style split (internal): pieces of ``sizes`` (an int: equal pieces, the last
    smaller)."""
    (tensor,) = _tensors(x)
    ax = _axis(tensor, axis)
    length = tensor.shape[ax]
    if isinstance(sizes, (int, np.integer)):
        if sizes <= 0:
            raise ShapeError(
                f"graph.split: expected a positive piece size, found {sizes} at {user_location()}"
            )
        pieces = [int(sizes)] * (length // sizes) + ([length % sizes] if length % sizes else [])
    else:
        pieces = [int(s) for s in sizes]
    return current_trace().bind(graph.SplitOp, [tensor], axis=ax, sizes=tuple(pieces))


def split(x: Operand, indices_or_sections: int | Sequence[int], axis: int = 0) -> list[Tensor]:
    """numpy ``split``: an int ``N`` gives ``N`` equal pieces along ``axis`` (a ShapeError
    when the dimension is not divisible by ``N``); a sequence gives the split points, so
    ``split(x, [2, 5])`` is ``[x[:2], x[2:5], x[5:]]`` (points past the end give empty
    pieces, negative points count from the end, as in numpy).

    torch's ``split`` takes piece sizes instead: ``torch.split(x, 3)`` is
    ``op.split(x, n // 3)`` when 3 divides ``n``, and ``op.chunk`` gives torch's pieces.
    """
    (tensor,) = _tensors(x)
    ax = _axis(tensor, axis)
    length = tensor.shape[ax]
    if isinstance(indices_or_sections, (int, np.integer)) and not isinstance(
        indices_or_sections, bool
    ):
        sections = int(indices_or_sections)
        if sections <= 0 or length % sections:
            raise ShapeError(
                f"split: {sections} sections do not divide dimension {ax} of {tensor.aval} "
                f"(size {length}) into equal pieces; give split points for unequal pieces, "
                f"at {user_location()}"
            )
        return _split_sizes(tensor, [length // sections] * sections, ax)
    bounds = [0, *(int(i) for i in indices_or_sections), length]
    ranges = [builtins.slice(lo, hi).indices(length)[:2] for lo, hi in itertools.pairwise(bounds)]
    ranges = [(lo, builtins.max(lo, hi)) for lo, hi in ranges]
    if all(prev[1] == cur[0] for prev, cur in itertools.pairwise(ranges)):
        return _split_sizes(tensor, [hi - lo for lo, hi in ranges], ax)
    pieces = []  # overlapping pieces (decreasing split points): one slice each
    for lo, hi in ranges:
        starts, limits = [0] * tensor.ndim, list(tensor.shape)
        starts[ax], limits[ax] = lo, hi
        pieces.append(slice(tensor, starts, limits))
    return pieces


def chunk(x: Operand, chunks: int, axis: int = 0) -> list[Tensor]:
    """torch ``chunk``: ``chunks`` pieces of size ceil(n / chunks)."""
    (tensor,) = _tensors(x)
    length = tensor.shape[_axis(tensor, axis)]
    return _split_sizes(tensor, -(-length // chunks) if chunks > 0 else 0, axis)


def slice(
    x: Operand, starts: Sequence[int], limits: Sequence[int], strides: Sequence[int] | None = None
) -> Tensor:
    (tensor,) = _tensors(x)
    steps = tuple(strides) if strides is not None else (1,) * tensor.ndim
    return _bind1(
        graph.SliceOp, [tensor], starts=tuple(starts), limits=tuple(limits), strides=steps
    )


def getitem(x: Tensor, index: Any) -> Tensor:
    """Basic indexing: ints, slices with positive steps, ``None`` and ``...``."""
    items = index if isinstance(index, tuple) else (index,)
    if any(isinstance(i, Tensor) for i in items):
        if len(items) == 1:
            return take(x, items[0], axis=0)
        raise TraceError(f"only one tensor index is supported, at {user_location()}")
    explicit = [i for i in items if i is not None and i is not Ellipsis]
    if len(explicit) > x.ndim:
        raise ShapeError(f"too many indices {index!r} for {x.aval} at {user_location()}")
    if items.count(Ellipsis) > 1:
        raise TraceError(f"an index can only have one ellipsis, at {user_location()}")
    if Ellipsis in items:
        at = items.index(Ellipsis)
        items = items[:at] + (builtins.slice(None),) * (x.ndim - len(explicit)) + items[at + 1 :]
    items = items + (builtins.slice(None),) * (x.ndim - len([i for i in items if i is not None]))
    starts, limits, strides, shape = [], [], [], []
    dim = 0
    for item in items:
        if item is None:
            shape.append(1)
            continue
        size = x.shape[dim]
        if isinstance(item, builtins.slice):
            start, stop, step = item.indices(size)
            if step < 1:
                raise TraceError(
                    f"negative slice steps are not supported: {item} at {user_location()}"
                )
            stop = builtins.max(stop, start)
            starts.append(start), limits.append(stop), strides.append(step)
            shape.append(-(-(stop - start) // step))
        elif isinstance(item, (int, np.integer)) and not isinstance(item, bool):
            position = int(item) + size if item < 0 else int(item)
            if not 0 <= position < size:
                raise ShapeError(
                    f"index {item} is out of bounds for dimension {dim} of {x.aval} at {user_location()}"
                )
            starts.append(position), limits.append(position + 1), strides.append(1)
        else:
            raise TraceError(f"unsupported index {item!r}, at {user_location()}")
        dim += 1
    result = x
    if (tuple(starts), tuple(limits)) != ((0,) * x.ndim, x.shape) or builtins.max(
        strides, default=1
    ) != 1:
        result = slice(x, starts, limits, strides)
    return reshape(result, shape)


def take(x: Operand, indices: Operand, axis: int = 0) -> Tensor:
    """numpy ``take``: ``x`` indexed by integer ``indices`` along ``axis``."""
    (tensor,) = _tensors(x)
    index = indices if isinstance(indices, Tensor) else constant(indices)
    return _bind1(graph.GatherOp, [tensor, index], axis=_axis(tensor, axis))


gather = take


def dynamic_update_slice(x: Operand, update: Operand, start: Operand, axis: int) -> Tensor:
    """``x`` with ``update`` written along ``axis`` from ``start`` (an int or a traced
    integer scalar, clamped so that the update fits), as ``jax.lax.dynamic_update_slice``
    along one axis: a KV cache's write at a runtime position."""
    tensor, written = _tensors(x, update)
    position = _position(start, "dynamic_update_slice: start")
    return _bind1(
        graph.DynamicUpdateSliceOp, [tensor, written, position], axis=_axis(tensor, axis)
    )


def top_k(x: Operand, k: int) -> tuple[Tensor, Tensor]:
    """The ``k`` largest entries of the last dim, largest first, and their i32 indices
    (``torch.topk``, ``jax.lax.top_k``); the values are differentiable."""
    (tensor,) = _tensors(x)
    values, indices = current_trace().bind(graph.TopKOp, [tensor], k=_integer(k, "top_k: k"))
    return values, indices


def embedding(ids: Operand, table: Operand) -> Tensor:
    """Rows of ``table`` (``[vocab, dim]``) for integer ``ids`` (torch's argument order)."""
    return take(table, ids, axis=0)


__all__ = [
    "Axis",
    "Fp8History",
    "Operand",
    "abs",
    "add",
    "astype",
    "attention",
    "broadcast_to",
    "cast",
    "cat",
    "chunk",
    "concat",
    "concatenate",
    "constant",
    "cos",
    "cross_entropy",
    "current_fp8_history",
    "div",
    "divide",
    "dynamic_update_slice",
    "embedding",
    "equal",
    "erf",
    "exp",
    "fp8_grad",
    "fp8_history",
    "fp8_matmul",
    "fp8_matmuls",
    "fp8_quantize",
    "fp8_scale",
    "full",
    "gather",
    "gelu",
    "getitem",
    "greater",
    "greater_equal",
    "iota",
    "layer_norm",
    "less",
    "less_equal",
    "log",
    "log_softmax",
    "matmul",
    "max",
    "maximum",
    "mean",
    "min",
    "minimum",
    "mul",
    "multiply",
    "neg",
    "negative",
    "not_equal",
    "ones",
    "permute_dims",
    "pow",
    "power",
    "prod",
    "relu",
    "reshape",
    "rms_norm",
    "rsqrt",
    "select",
    "sigmoid",
    "silu",
    "sin",
    "slice",
    "softmax",
    "split",
    "sqrt",
    "stop_gradient",
    "sub",
    "subtract",
    "sum",
    "swapaxes",
    "take",
    "tanh",
    "top_k",
    "transpose",
    "where",
    "zeros",
]

register_operators(sys.modules[__name__])  # traced tensors' operators (+, @, [], ...) call these
