"""Tracing: running a Python function on abstract tensors to record graph ops.

As in JAX, a :class:`Tensor` carries an abstract value (shape, dtype) and an SSA value;
every operation on it binds a graph op through :func:`bind`, which asks the op's shape
rule for the result type and appends the op to the function being traced. Shape errors
are reported at the user's source line.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Sequence
from contextlib import contextmanager
from types import FrameType
from typing import Any

from xdsl.dialects import func
from xdsl.dialects.builtin import (
    ArrayAttr,
    DictionaryAttr,
    FileLineColLoc,
    IntAttr,
    ModuleOp,
    StringAttr,
)
from xdsl.ir import Attribute, Block, Operation, Region, SSAValue

from tessera.dtypes import DType
from tessera.errors import ShapeError, TesseraError, TraceError, describe_location
from tessera.ir import graph
from tessera.ir.abstract import AbstractTensor
from tessera.ir.function_table import FunctionTable, register
from tessera.ir.verifier import verify_module

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@functools.cache
def _is_internal(filename: str) -> bool:
    """Whether ``filename`` is Tessera's, or torch's (whose functions call a traced
    tensor's ``__torch_function__``)."""
    path = os.path.abspath(filename)
    torch = sys.modules.get("torch")
    torch_dir = os.path.dirname(os.path.abspath(torch.__file__)) if torch else None
    return path.startswith(_PACKAGE_DIR + os.sep) or (
        torch_dir is not None and path.startswith(torch_dir + os.sep)
    )


def _user_frame() -> FrameType | None:
    """The innermost frame outside Tessera (and torch): the user's line that called into it."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and _is_internal(frame.f_code.co_filename):
        frame = frame.f_back
    return frame


def user_location() -> str:
    """``file:line`` and source text of the innermost frame outside Tessera."""
    frame = _user_frame()
    if frame is None:
        return "<unknown location>"
    return describe_location(frame.f_code.co_filename, frame.f_lineno)


class Trace:
    """One function being traced: a block of graph ops under construction."""

    def __init__(
        self,
        name: str,
        inputs: Sequence[AbstractTensor],
        mesh: Any = None,
        functions: FunctionTable | None = None,
        region: str | None = None,
    ):
        self.name = name
        self.mesh = mesh  # a tessera.dist.Mesh when traced with ts.jit(..., mesh=...)
        self.block = Block(arg_types=[a.to_xdsl() for a in inputs])
        self.stage_marks: list[int] = []  # graph.stage(): op counts where stages begin
        self.checkpoints = 0  # graph.checkpoint() blocks traced so far: numbers them
        # graph.region bodies (shared by the regions traced inside this trace)
        self.functions = functions if functions is not None else FunctionTable(reserved=frozenset({name}))
        self.regions: dict[Any, Any] = {}  # graph.region's traced calls, by signature
        self.region = region  # the region this trace is the body of, if any
        self.manual = False  # a dist.shard_map body: per-rank types and collectives
        self.sends: list[Any] = []  # its dist.send calls no dist.recv has matched yet
        # gathers a graph.scan moved into its step: gradients of the gathered value are
        # the gathered one's (graph.backward differentiates with respect to it)
        self.moved_gathers: dict[SSAValue, SSAValue] = {}
        # slices of stacks not traced yet (see lazy_slices), by their placeholder values
        self.slices: dict[SSAValue, SliceTensor] = {}
        register(self.block, self.functions)

    def lazy_slices(self, stack: Tensor) -> list[SliceTensor]:
        """``stack[0]``, ``stack[1]``, …, traced only when an op reads one: until then each
        is a placeholder value of a block of its own, which :meth:`materialize_slices`
        replaces by the slice's ops. A step of stacked layers hands these to its function:
        the region calls that read them become one ``graph.scan`` over the stack
        (:mod:`tessera.frontend.roll_regions`), so the slices cost no ops at all."""
        length, *shape = stack.aval.shape
        element = AbstractTensor(tuple(shape), stack.aval.dtype).to_xdsl()
        placeholders = Block(arg_types=[element] * length)
        slices = [SliceTensor(self, stack, i, v) for i, v in enumerate(placeholders.args)]
        self.slices.update((t.value, t) for t in slices)
        return slices

    def materialize_slices(self) -> None:
        """Traces each lazy slice an op reads, before its first reader."""
        pending = {v: t for v, t in self.slices.items() if v.first_use is not None}
        if not pending:
            return
        first: dict[SSAValue, Operation] = {}
        for op in self.block.ops:
            for operand in op.operands:
                if operand in pending and operand not in first:
                    first[operand] = op
        for placeholder, reader in first.items():
            piece = pending[placeholder]
            shape = piece.stack.aval.shape
            cut = graph.build(
                graph.SliceOp, [piece.stack.value], starts=(piece.index, *(0 for _ in shape[1:])),
                limits=(piece.index + 1, *shape[1:]), strides=(1,) * len(shape),
            )  # fmt: skip
            value = graph.build(graph.ReshapeOp, [cut.results[0]], shape=tuple(shape[1:]))
            self.block.insert_ops_before([cut, value], reader)
            placeholder.replace_all_uses_with(value.results[0])
            piece.value = value.results[0]
            del self.slices[placeholder]

    def bind(
        self, op_type: type[graph.GraphOp], operands: Sequence[Tensor], **attrs: Any
    ) -> list[Tensor]:
        for operand in operands:
            if operand.trace is not self:
                if self.region is not None:
                    raise TraceError(
                        f"graph.region {self.region} uses a tensor it was not given as an "
                        f"argument (in {op_type.name} at {user_location()}); pass every "
                        f"tensor the region reads as an argument"
                    )
                raise TraceError(
                    f"a tensor from another traced function was used in {op_type.name} "
                    f"at {user_location()}"
                )
        try:
            op = graph.build(op_type, [t.value for t in operands], **attrs)
        except ShapeError as error:
            shapes = ", ".join(str(t.aval) for t in operands)
            raise ShapeError(
                f"{op_type.name}: {error}\n  operands: {shapes or 'none'}\n  at {user_location()}"
            ) from None
        if (frame := _user_frame()) is not None:  # run-time errors name the user's line
            op.location = FileLineColLoc(
                StringAttr(frame.f_code.co_filename), IntAttr(frame.f_lineno), IntAttr(0)
            )
        self.block.add_op(op)
        return [Tensor(self, result) for result in op.results]

    def finish(
        self,
        outputs: Sequence[Tensor],
        arg_attrs: Sequence[dict[str, Attribute]] | None = None,
        result_attrs: Sequence[dict[str, Attribute]] | None = None,
    ) -> ModuleOp:
        """Closes the function with a return of ``outputs`` and wraps it in a module
        (after a ``graph.mesh`` symbol when the trace has a mesh), followed by the
        functions of the regions it calls."""
        function = self.finish_function(outputs, arg_attrs, result_attrs)
        ops: list[Operation] = [function, *self.functions.functions.values()]
        if self.mesh is not None:
            mesh_axes = list(zip(self.mesh.axis_names, self.mesh.shape, strict=True))
            ops.insert(0, graph.MeshOp.get("mesh", mesh_axes, self.mesh.topology_spec))
        module = ModuleOp(ops)
        verify_module(module)
        return module

    def finish_function(
        self,
        outputs: Sequence[Tensor],
        arg_attrs: Sequence[dict[str, Attribute]] | None = None,
        result_attrs: Sequence[dict[str, Attribute]] | None = None,
        private: bool = False,
    ) -> func.FuncOp:
        """Closes the function with a return of ``outputs``: the ``func.func``."""
        self.block.add_op(func.ReturnOp(*[t.value for t in outputs]))
        self.materialize_slices()
        arg_types = [a.type for a in self.block.args]

        def attrs(per_value: Sequence[dict[str, Attribute]] | None) -> ArrayAttr | None:
            if per_value is None or not any(per_value):
                return None
            return ArrayAttr([DictionaryAttr(dict(d)) for d in per_value])

        return func.FuncOp(
            self.name,
            (arg_types, [t.value.type for t in outputs]),
            Region(self.block),
            visibility="private" if private else None,
            arg_attrs=attrs(arg_attrs),
            res_attrs=attrs(result_attrs),
        )


_active: list[Trace] = []


@contextmanager
def tracing(trace: Trace):
    _active.append(trace)
    try:
        yield trace
    finally:
        _active.pop()


def is_tracing() -> bool:
    """Whether a function is being traced (an op called now is recorded)."""
    return bool(_active)


def current_trace() -> Trace:
    if not _active:
        raise TraceError(
            f"tessera.op functions can only be called inside a @ts.jit function, "
            f"at {user_location()}"
        )
    return _active[-1]


class MissingMethodError(TraceError, AttributeError):
    """A torch.Tensor method called on a traced tensor (an AttributeError too, so that
    ``hasattr`` stays False)."""


class Tensor:
    """A traced tensor: an abstract value standing for data known only at run time."""

    __array_priority__ = 1000  # numpy scalars defer to our reflected operators

    def __init__(self, trace: Trace, value: SSAValue):
        self.trace = trace
        self.value = value
        self.aval = AbstractTensor.from_xdsl(value.type)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.aval.shape

    @property
    def dtype(self) -> DType:
        return self.aval.dtype

    @property
    def ndim(self) -> int:
        return self.aval.rank

    @property
    def size(self) -> int:
        return self.aval.size

    def __repr__(self) -> str:
        return f"Tensor({self.aval})"

    def __len__(self) -> int:
        if not self.shape:
            raise TraceError(f"len() of a 0-d tensor {self.aval}, at {user_location()}")
        return self.shape[0]

    # --- values are not known while tracing (JAX's ConcretizationTypeError) ---------------

    def _concrete(self, what: str, instead: str) -> TraceError:
        return TraceError(
            f"{what} needs the value of the traced tensor {self.aval}, which is not known "
            f"while tracing: @ts.jit runs the function once per argument shapes and dtypes, "
            f"on abstract tensors; {instead}, at {user_location()}"
        )

    def __bool__(self) -> bool:
        raise self._concrete(
            "Python control flow (if, while, and, or, not)",
            "use op.where instead, or pass the condition as a static argument (static_argnums)",
        )

    def _python_number(self, *args: Any) -> Any:
        raise self._concrete(
            "a Python number (float(), int(), an index)",
            "keep computing with tensors, or pass the value as a static argument",
        )

    __float__ = __int__ = __index__ = __complex__ = _python_number

    def __array__(self, *args: Any, **kwargs: Any) -> Any:
        raise self._concrete(
            "a numpy array", "compute with tessera.op, and convert the jitted function's result"
        )

    def item(self) -> Any:
        raise self._concrete(
            ".item()", "return the tensor and call .item() on the jitted function's result"
        )

    def tolist(self) -> Any:
        raise self._concrete(
            ".tolist()", "return the tensor and call .tolist() on the jitted function's result"
        )

    def numpy(self) -> Any:
        raise self._concrete(
            ".numpy()", "return the tensor and call .numpy() on the jitted function's result"
        )

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        """torch functions cannot trace: a TraceError naming the tessera.op equivalent. A
        torch tensor's operator (``torch_tensor + traced``) gives way to the traced
        tensor's reflected one, as Python does for NotImplemented."""
        name = getattr(func, "__name__", str(func))
        torch = sys.modules["torch"]
        receiver = args[0] if args else None
        if (
            isinstance(receiver, torch.Tensor)
            and func is getattr(torch.Tensor, name, None)
            and (name in _OPERATOR_METHODS or name.startswith("__"))
        ):
            return NotImplemented
        module = getattr(func, "__module__", None) or "torch"
        module = "torch" if module.startswith("torch._C") else module
        equivalent = getattr(_op(), name, None) if _operators is not None else None
        instead = (
            f"use tessera.op.{name}"
            if callable(equivalent)
            else "use the tessera.op functions (numpy names) and Python operators"
        )
        raise TraceError(
            f"{module}.{name} is not traceable: inside @ts.jit, tensors are traced tensors, "
            f"which torch functions cannot take; {instead}, at {user_location()}"
        )

    def __getattr__(self, name: str) -> Any:
        """A torch.Tensor method that traced tensors lack: a TraceError saying what to use."""
        if name.startswith("__") or not _is_torch_tensor_attribute(name):
            raise AttributeError(f"'Tensor' object has no attribute {name!r}")
        equivalent = getattr(_op(), name, None) if _operators is not None else None
        instead = (
            f"use tessera.op.{name}(x, ...)"
            if callable(equivalent)
            else "use the tessera.op functions (numpy names) and Python operators"
        )
        if name in _DEVICE_AND_DTYPE_METHODS:
            instead = "they have no device or autograd state; convert dtypes with x.astype(dtype)"
        raise MissingMethodError(
            f"traced tensors have no torch.Tensor method .{name}() (the tensor {self.aval} is "
            f"traced by @ts.jit); {instead}, at {user_location()}"
        )

    def __iter__(self) -> Any:
        return (self[i] for i in range(len(self)))

    # Operators delegate to tessera.op (see register_operators).
    def __add__(self, other: Any) -> Tensor:
        return _op().add(self, other)

    def __radd__(self, other: Any) -> Tensor:
        return _op().add(other, self)

    def __sub__(self, other: Any) -> Tensor:
        return _op().subtract(self, other)

    def __rsub__(self, other: Any) -> Tensor:
        return _op().subtract(other, self)

    def __mul__(self, other: Any) -> Tensor:
        return _op().multiply(self, other)

    def __rmul__(self, other: Any) -> Tensor:
        return _op().multiply(other, self)

    def __truediv__(self, other: Any) -> Tensor:
        return _op().divide(self, other)

    def __rtruediv__(self, other: Any) -> Tensor:
        return _op().divide(other, self)

    def _no_floor_division(self, symbol: str) -> TraceError:
        return TraceError(
            f"{symbol} of traced tensors (floor division, remainder) is not supported yet: "
            f"Tessera has no floor division or remainder op; {self.aval}, at {user_location()}"
        )

    def __floordiv__(self, other: Any) -> Tensor:
        raise self._no_floor_division("//")

    __rfloordiv__ = __floordiv__

    def __mod__(self, other: Any) -> Tensor:
        raise self._no_floor_division("%")

    __rmod__ = __mod__

    def __divmod__(self, other: Any) -> Tensor:
        raise self._no_floor_division("divmod")

    __rdivmod__ = __divmod__

    def __pow__(self, other: Any) -> Tensor:
        return _op().power(self, other)

    def __rpow__(self, other: Any) -> Tensor:
        return _op().power(other, self)

    def __matmul__(self, other: Any) -> Tensor:
        return _op().matmul(self, other)

    def __rmatmul__(self, other: Any) -> Tensor:
        return _op().matmul(other, self)

    def __neg__(self) -> Tensor:
        return _op().negative(self)

    def __pos__(self) -> Tensor:
        return self

    def __abs__(self) -> Tensor:
        return _op().abs(self)

    def __lt__(self, other: Any) -> Tensor:
        return _op().less(self, other)

    def __le__(self, other: Any) -> Tensor:
        return _op().less_equal(self, other)

    def __gt__(self, other: Any) -> Tensor:
        return _op().greater(self, other)

    def __ge__(self, other: Any) -> Tensor:
        return _op().greater_equal(self, other)

    def __eq__(self, other: Any) -> Tensor:  # type: ignore[override]
        return _op().equal(self, other)

    def __ne__(self, other: Any) -> Tensor:  # type: ignore[override]
        return _op().not_equal(self, other)

    __hash__ = object.__hash__

    def __getitem__(self, index: Any) -> Tensor:
        return _op().getitem(self, index)

    @property
    def T(self) -> Tensor:
        return _op().transpose(self)

    def reshape(self, *shape: Any) -> Tensor:
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        return _op().reshape(self, shape)

    def transpose(self, *axes: Any) -> Tensor:
        if len(axes) == 1 and isinstance(axes[0], (tuple, list)):
            axes = tuple(axes[0])
        return _op().transpose(self, axes or None)

    def astype(self, dtype: Any) -> Tensor:
        return _op().astype(self, dtype)

    def sum(self, axis: Any = None, keepdims: bool = False) -> Tensor:
        return _op().sum(self, axis=axis, keepdims=keepdims)

    def mean(self, axis: Any = None, keepdims: bool = False) -> Tensor:
        return _op().mean(self, axis=axis, keepdims=keepdims)

    def max(self, axis: Any = None, keepdims: bool = False) -> Tensor:
        return _op().max(self, axis=axis, keepdims=keepdims)

    def min(self, axis: Any = None, keepdims: bool = False) -> Tensor:
        return _op().min(self, axis=axis, keepdims=keepdims)

    def prod(self, axis: Any = None, keepdims: bool = False) -> Tensor:
        return _op().prod(self, axis=axis, keepdims=keepdims)


# the torch.Tensor methods behind Python's operators (``torch_tensor + traced`` calls add)
_OPERATOR_METHODS = frozenset(
    {"add", "sub", "mul", "div", "true_divide", "matmul", "pow", "gt", "lt", "ge", "le",
     "eq", "ne", "neg", "abs"}
)  # fmt: skip
_DEVICE_AND_DTYPE_METHODS = frozenset(
    {"cpu", "cuda", "to", "detach", "clone", "contiguous", "requires_grad_", "float",
     "double", "half", "bfloat16", "long", "int", "bool", "type"}
)  # fmt: skip


@functools.cache
def _is_torch_tensor_attribute(name: str) -> bool:
    """Whether ``name`` is an attribute of ``torch.Tensor`` (torch already imported)."""
    torch = sys.modules.get("torch")
    return torch is not None and hasattr(torch.Tensor, name)


_operators: Any = None  # the tessera.op module, which registers itself when imported


def register_operators(module: Any) -> None:
    """Makes ``module`` (``tessera.op``) implement the traced tensor's operators. The op
    library builds on this module, so it registers itself rather than being imported
    here (``tessera.jit_function`` imports it before tracing anything)."""
    global _operators
    _operators = module


class SliceTensor(Tensor):
    """``stack[index]`` traced lazily (:meth:`Trace.lazy_slices`): its value is a
    placeholder until an op reads it, then the slice's."""

    def __init__(self, trace: Trace, stack: Tensor, index: int, placeholder: SSAValue):
        self.trace = trace
        self.stack = stack
        self.index = index
        self.value = placeholder
        self.aval = AbstractTensor.from_xdsl(placeholder.type)


def _op() -> Any:
    if _operators is None:
        raise TraceError("tensor operators need tessera.op: import tessera.op first")
    return _operators


__all__ = [
    "Tensor",
    "TesseraError",
    "Trace",
    "current_trace",
    "is_tracing",
    "tracing",
    "user_location",
]
