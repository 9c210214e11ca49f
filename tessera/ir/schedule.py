"""The ``schedule`` dialect: the program one rank runs, as kernels and asynchronous collectives.

``lower-graph-to-schedule`` produces it from a partitioned graph function. Values are
still tensors with value semantics; what the schedule adds is *grouping* (which graph ops
become one generated kernel), *asynchrony* (a collective is started, other work runs, and
its result is waited for) and *placement* (streams, buffers, microbatches, stages)::

    %h = schedule.kernel @mlp_k0_matmul(%a = %x, %b = %w1) : (tensor<8x64xf32>, tensor<64x64xf32>) -> tensor<8x64xf32> {
      %0 = graph.matmul %a, %b : tensor<8x64xf32>, tensor<64x64xf32> -> tensor<8x64xf32>
      %1 = graph.gelu %0 {approximate = tanh} : tensor<8x64xf32>
      schedule.yield %1 : tensor<8x64xf32>
    }
    %t = schedule.start all_reduce %y {axes = [tp], kind = sum} : tensor<8x64xf32> -> !schedule.handle<tensor<8x64xf32>>
    %r = schedule.wait %t : !schedule.handle<tensor<8x64xf32>> -> tensor<8x64xf32>
    %b = schedule.alloc {offset = 0} : !schedule.buffer<2048>
    schedule.free %b : !schedule.buffer<2048>
    schedule.microbatch {index = 0, count = 4} { ... schedule.yield }
    %o = schedule.stage {index = 1, count = 2} -> tensor<8x64xf32> { ... schedule.yield %v : tensor<8x64xf32> }

- ``schedule.kernel``: a named group of graph ops with at least one result; its block
  arguments are bound to its inputs (``%a = %x``) and nothing inside uses a value from
  outside (isolated from above). ``stream`` is ``compute`` (the default when absent) or ``comm``.
- ``schedule.start`` / ``schedule.wait``: an asynchronous collective. The start names the
  collective (all_reduce, all_gather, reduce_scatter, all_to_all, broadcast,
  collective_permute, send, recv) and carries the properties of the matching graph op (``send``/``recv`` name their peer:
  one mesh axis in ``axes`` and an ``offset`` along it); its handle
  ``!schedule.handle<T>`` carries the type ``T`` the wait produces, which is checked with
  the graph op's shape rule and local (per-rank) semantics. Every handle is waited for
  exactly once; the wait of a ``send`` produces nothing. ``stream`` defaults to ``comm``.
  ``algorithm`` (optional, set by ``choose-collective-algorithms``) names how the
  collective runs: one of :data:`ALGORITHMS` (priced by ``tessera.perf.collective_cost``); with
  ``hierarchical`` (all_reduce, all_gather, reduce_scatter), ``domain`` is how many
  consecutive group members share an inner domain (it divides the group size, and
  ``2 <= domain < group size``). Like ``stream``, they are not in ``StartOp.attrs()``.
- ``schedule.alloc`` / ``schedule.free``: a buffer of ``!schedule.buffer<bytes>``, with
  an optional byte ``offset`` in the rank's arena; freed at most once.
- ``schedule.microbatch`` / ``schedule.stage``: regions for one microbatch ``index`` of
  ``count``, or one pipeline stage; they verify, print and parse (nothing lowers them yet).
- ``schedule.pipeline`` / ``schedule.pipeline_rank`` / ``schedule.action``: a pipeline
  schedule (``pipeline-schedule`` makes one; ``tessera.transforms.pipeline_schedules`` converts it to and
  from :class:`tessera.ir.pipeline_actions.Action` lists). The pipeline holds one
  ``pipeline_rank`` per rank, in rank order, each holding that rank's actions in the
  order it runs them; none has a terminator::

    schedule.pipeline {kind = "1f1b", ranks = 2, microbatches = 2, virtual = 1} {
      schedule.pipeline_rank {index = 0} {
        schedule.action forward {microbatch = 0, stage = 0}
        schedule.action send_activation {microbatch = 0, stage = 0, peer = 1}
        ...
      }
      schedule.pipeline_rank {index = 1} { ... }
    }

  The pipeline verifies the whole schedule (:func:`check_pipeline`): every (microbatch,
  stage) of ``microbatches`` x ``ranks * virtual`` has one ``forward`` and either one
  ``backward`` or one ``backward_input`` and one ``backward_weight``, on rank
  ``stage % ranks``; a stage receives from each neighbour stage on another rank what it
  needs; each send has exactly one matching receive (``send_activation`` of stage ``s``
  to ``s + 1`` with ``recv_activation`` of ``s + 1`` from ``s``, ``send_grad`` of ``s``
  to ``s - 1`` with ``recv_grad`` of ``s - 1`` from ``s``) and vice versa; and on its
  rank a stage's receive comes before the computation that needs it, its send after the
  one that makes it, its backward after its forward. ``kind`` only names the schedule
  (``gpipe``, ``1f1b``, ``interleaved``, ``zb-h1``...); it is not checked.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from xdsl.dialects.builtin import (
    ArrayAttr,
    BoolAttr,
    FunctionType,
    IntAttr,
    IntegerAttr,
    ModuleOp,
    StringAttr,
    SymbolRefAttr,
    TensorType,
)
from xdsl.dialects.func import FuncOp
from xdsl.ir import (
    Attribute,
    Block,
    Dialect,
    ParametrizedAttribute,
    Region,
    SSAValue,
    TypeAttribute,
)
from xdsl.irdl import (
    IRDLOperation,
    irdl_attr_definition,
    irdl_op_definition,
    lazy_traits_def,
    operand_def,
    opt_operand_def,
    opt_prop_def,
    opt_result_def,
    prop_def,
    region_def,
    result_def,
    traits_def,
    var_operand_def,
    var_result_def,
)
from xdsl.parser import AttrParser, Parser, UnresolvedOperand
from xdsl.printer import Printer
from xdsl.traits import HasParent, IsTerminator, NoTerminator
from xdsl.utils.exceptions import VerifyException

from tessera.errors import TesseraError
from tessera.ir import graph
from tessera.ir import pipeline_actions as actions
from tessera.ir.abstract import AbstractTensor
from tessera.ir.attr_values import parse_properties, print_properties, to_python
from tessera.ir.limits import MAX_BYTES

STREAMS = ("compute", "comm")
ALGORITHMS = ("ring", "tree", "hierarchical", "nvls")  # how a collective may run

# collective -> the graph op whose shape rule and properties it shares (None: send/recv)
COLLECTIVES: dict[str, type[graph.CollectiveOp] | None] = {
    "all_reduce": graph.AllReduceOp,
    "all_gather": graph.AllGatherOp,
    "reduce_scatter": graph.ReduceScatterOp,
    "all_to_all": graph.AllToAllOp,
    "broadcast": graph.BroadcastOp,
    "collective_permute": graph.CollectivePermuteOp,
    "send": None,
    "recv": None,
}
_PEER_PROPERTIES = ("axes", "offset")
_START_PROPERTIES = ("axes", "kind", "dim", "split_dim", "concat_dim", "src", "pairs", "offset")
# how a start runs, not what it computes: kept out of ``StartOp.attrs()``
_PLACEMENT_PROPERTIES = ("stream", "algorithm", "domain")
# collectives that a hierarchical (domain, then across domains) algorithm can run
HIERARCHICAL_COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")


# --- types ---------------------------------------------------------------------------------


@irdl_attr_definition
class HandleType(ParametrizedAttribute, TypeAttribute):
    """``!schedule.handle<T>``: an in-flight collective whose wait gives a ``T``."""

    name = "schedule.handle"
    tensor: TensorType

    def __init__(self, tensor: TensorType):
        super().__init__(tensor)

    def print_parameters(self, printer: Printer) -> None:
        with printer.in_angle_brackets():
            printer.print_attribute(self.tensor)

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> tuple[TensorType]:
        with parser.in_angle_brackets():
            start = parser.pos
            tensor = parser.parse_type()
            if not isinstance(tensor, TensorType):
                parser.raise_error(
                    f"expected a tensor type in !schedule.handle, found {tensor}", start
                )
        return (tensor,)


@irdl_attr_definition
class BufferType(ParametrizedAttribute, TypeAttribute):
    """``!schedule.buffer<bytes>``: a block of device memory."""

    name = "schedule.buffer"
    bytes: IntAttr

    def __init__(self, size: int):
        super().__init__(IntAttr(size))

    def print_parameters(self, printer: Printer) -> None:
        printer.print_string(f"<{self.bytes.data}>")

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> tuple[IntAttr]:
        with parser.in_angle_brackets():
            size = parser.parse_integer(
                allow_negative=True, context_msg=" for a buffer size in bytes"
            )
        return (IntAttr(size),)

    def verify(self) -> None:
        if not 0 < self.bytes.data <= MAX_BYTES:
            raise VerifyException(
                f"!schedule.buffer: expected a positive size in bytes of at most {MAX_BYTES} "
                f"(2**48, what can be addressed), found {self.bytes.data}"
            )


# --- shared syntax helpers ---------------------------------------------------------------


def _print_results(printer: Printer, types: Sequence[Attribute]) -> None:
    if len(types) == 1:
        printer.print_attribute(types[0])
    else:
        printer.print_string("(")
        printer.print_list(types, printer.print_attribute)
        printer.print_string(")")


def _parse_results(parser: Parser) -> list[Attribute]:
    if parser.parse_optional_punctuation("(") is None:
        return [parser.parse_type()]
    if parser.parse_optional_punctuation(")") is not None:
        return []
    types = parser.parse_comma_separated_list(parser.Delimiter.NONE, parser.parse_type)
    parser.parse_punctuation(")")
    return types


def _check_stream(op: IRDLOperation) -> None:
    stream = op.properties.get("stream")
    if stream is not None and to_python(stream) not in STREAMS:
        raise VerifyException(
            f"{op.name}: stream must be one of {STREAMS}, found {to_python(stream)!r}"
        )


def _check_yield(op: IRDLOperation, what: str) -> None:
    """The region's terminator is a schedule.yield of the op's result types."""
    block = op.regions[0].blocks.first
    if block is None:
        raise VerifyException(f"{what}: expected a body block, found an empty region")
    last = block.last_op
    if not isinstance(last, YieldOp):
        found = last.name if last is not None else "an empty block"
        raise VerifyException(f"{what}: expected the body to end in schedule.yield, found {found}")
    want = [r.type for r in op.results]
    got = [v.type for v in last.operands]
    if want != got:
        raise VerifyException(
            f"{what}: yield types mismatch: expected {_types(want)}, found {_types(got)}"
        )


def _types(types: Sequence[Attribute]) -> str:
    return "(" + ", ".join(str(t) for t in types) + ")"


def mesh_axis_sizes(op: IRDLOperation) -> dict[str, int]:
    """Axis sizes of the one ``graph.mesh`` of the module holding ``op``."""
    module = op.parent_op()
    while module is not None and not isinstance(module, ModuleOp):
        module = module.parent_op()
    meshes = [o for o in module.ops if isinstance(o, graph.MeshOp)] if module is not None else []
    if len(meshes) != 1:
        raise VerifyException(
            f"{op.name}: expected exactly one graph.mesh in the module, found {len(meshes)}"
        )
    return dict(meshes[0].axes)


# --- kernels ----------------------------------------------------------------------------


TILE_KERNEL = "schedule.tile_kernel"
"""Attribute of a ``schedule.kernel`` implemented by another kernel's ``tile.kernel``."""


@irdl_op_definition
class KernelOp(IRDLOperation):
    """A named fused group of graph ops: one generated kernel."""

    name = "schedule.kernel"
    inputs = var_operand_def()
    outputs = var_result_def()
    sym_name = prop_def(StringAttr)
    stream = opt_prop_def(StringAttr)
    body = region_def("single_block")

    @staticmethod
    def get(
        kernel_name: str,
        inputs: Sequence[SSAValue],
        result_types: Sequence[Attribute],
        body: Region,
    ) -> KernelOp:
        return KernelOp.create(
            operands=list(inputs),
            result_types=list(result_types),
            properties={"sym_name": StringAttr(kernel_name)},
            regions=[body],
        )

    @property
    def kernel_name(self) -> str:
        return self.sym_name.data

    @property
    def tile_kernel_name(self) -> str:
        """The ``tile.kernel`` that implements this kernel: its own name, or the name in
        its ``schedule.tile_kernel`` attribute when ``lower-schedule-to-tile`` found a
        structurally identical kernel lowered already."""
        shared = self.attributes.get(TILE_KERNEL)
        return shared.root_reference.data if isinstance(shared, SymbolRefAttr) else self.kernel_name

    def verify_(self) -> None:
        what = f"schedule.kernel @{self.kernel_name}"
        shared = self.attributes.get(TILE_KERNEL)
        if shared is not None and not isinstance(shared, SymbolRefAttr):
            raise VerifyException(
                f"{what}: {TILE_KERNEL} must be a symbol reference, found {shared}"
            )
        _check_stream(self)
        block = self.body.block
        want = [v.type for v in self.inputs]
        got = [a.type for a in block.args]
        if want != got:
            raise VerifyException(
                f"{what}: block argument types mismatch: expected {_types(want)} (the inputs), found {_types(got)}"
            )
        for inner in self.body.walk():
            for operand in inner.operands:
                if not self.is_ancestor(operand.owner):
                    raise VerifyException(
                        f"{what}: {inner.name} uses a value defined outside the kernel; "
                        f"pass it in as a kernel input"
                    )
        _check_yield(self, what)
        function = self.parent_op()
        if isinstance(function, FuncOp) and self._first_kernel_of_block():
            # kernel names are unique in a function: checked once per function, by its
            # first kernel (a walk per kernel made verification quadratic)
            counts: dict[str, int] = {}
            for o in function.walk():
                if isinstance(o, KernelOp):
                    counts[o.kernel_name] = counts.get(o.kernel_name, 0) + 1
            repeated = sorted(name for name, count in counts.items() if count > 1)
            if repeated:
                raise VerifyException(
                    f"schedule.kernel @{repeated[0]}: expected a unique kernel name, found "
                    f"{counts[repeated[0]]} kernels named so"
                )
        if not self.outputs:  # its ops are pure: without results it computes nothing
            raise VerifyException(
                f"{what}: expected at least one result (a kernel without results computes "
                f"nothing)"
            )

    def _first_kernel_of_block(self) -> bool:
        """Whether no kernel precedes this one in its block (the walk back stops at the
        previous kernel, so all kernels' walks together visit each op once)."""
        op = self.prev_op
        while op is not None:
            if isinstance(op, KernelOp):
                return False
            op = op.prev_op
        return True

    def print(self, printer: Printer) -> None:
        block = self.body.block
        printer.print_string(f" @{self.kernel_name}(")
        for i, (arg, value) in enumerate(zip(block.args, self.inputs, strict=False)):
            printer.print_string(", " if i else "")
            printer.print_block_argument(arg, print_type=False)
            printer.print_string(" = ")
            printer.print_operand(value)
        printer.print_string(")")
        print_properties(printer, self.properties, ["stream"])
        printer.print_op_attributes(self.attributes, print_keyword=True)
        printer.print_string(" : ")
        printer.print_attribute(
            FunctionType.from_lists([v.type for v in self.inputs], [r.type for r in self.results])
        )
        printer.print_string(" ")
        printer.print_region(self.body, print_entry_block_args=False)

    @classmethod
    def parse(cls, parser: Parser) -> KernelOp:
        kernel_name = parser.parse_symbol_name().data
        bindings: list[tuple[Parser.UnresolvedArgument, UnresolvedOperand]] = []

        def parse_binding() -> None:
            argument = parser.parse_argument(expect_type=False)
            parser.parse_punctuation("=")
            bindings.append((argument, parser.parse_unresolved_operand()))

        parser.parse_comma_separated_list(parser.Delimiter.PAREN, parse_binding)
        properties = parse_properties(parser)
        attributes = parser.parse_optional_attr_dict_with_keyword()
        parser.parse_punctuation(":")
        start = parser.pos
        signature = parser.parse_function_type()
        inputs = list(signature.inputs.data)
        if len(inputs) != len(bindings):
            parser.raise_error(f"expected {len(bindings)} input types, found {len(inputs)}", start)
        operands = [
            parser.resolve_operand(o, t) for (_, o), t in zip(bindings, inputs, strict=True)
        ]
        arguments = [a.resolve(t) for (a, _), t in zip(bindings, inputs, strict=True)]
        body = parser.parse_region(arguments)
        return cls.create(
            operands=operands,
            result_types=list(signature.outputs.data),
            properties={"sym_name": StringAttr(kernel_name), **properties},
            attributes=attributes.data if attributes else {},
            regions=[body],
        )


# --- asynchronous collectives ----------------------------------------------------------------


@irdl_op_definition
class StartOp(IRDLOperation):
    """Starts a collective; ``schedule.wait`` of its handle gives the result."""

    name = "schedule.start"
    input = opt_operand_def(TensorType)
    handle = result_def(HandleType)
    collective = prop_def(StringAttr)
    axes = prop_def(ArrayAttr)
    kind = opt_prop_def(StringAttr)
    dim = opt_prop_def(IntegerAttr)
    split_dim = opt_prop_def(IntegerAttr)
    concat_dim = opt_prop_def(IntegerAttr)
    src = opt_prop_def(IntegerAttr)
    pairs = opt_prop_def(Attribute)
    offset = opt_prop_def(IntegerAttr)
    stream = opt_prop_def(StringAttr)
    algorithm = opt_prop_def(StringAttr)
    domain = opt_prop_def(IntegerAttr)

    @staticmethod
    def get(
        collective: str, value: SSAValue | None, result: TensorType, **properties: Attribute
    ) -> StartOp:
        return StartOp.create(
            operands=[value] if value is not None else [],
            result_types=[HandleType(result)],
            properties={"collective": StringAttr(collective), **properties},
        )

    @property
    def collective_name(self) -> str:
        return self.collective.data

    @property
    def stream_name(self) -> str:
        """The communication stream it runs on (``comm`` when absent)."""
        return self.stream.data if self.stream is not None else "comm"

    @property
    def algorithm_name(self) -> str | None:
        """The algorithm ``choose-collective-algorithms`` chose (None: the runtime's choice)."""
        return self.algorithm.data if self.algorithm is not None else None

    @property
    def domain_size(self) -> int | None:
        """For ``hierarchical``: how many consecutive group members share a domain."""
        return self.domain.value.data if self.domain is not None else None

    @property
    def label(self) -> str:
        """``kind[axes]``, how timelines name it (e.g. ``all_reduce[tp]``)."""
        return f"{self.collective_name}[{','.join(self.attrs()['axes'])}]"

    def attrs(self) -> dict[str, Any]:
        """The collective's properties as Python values (without ``collective`` and the
        placement properties ``stream``, ``algorithm``, ``domain``)."""
        return {n: to_python(self.properties[n]) for n in _START_PROPERTIES if n in self.properties}

    def verify_(self) -> None:
        what = f"schedule.start {self.collective_name}"
        if self.collective_name not in COLLECTIVES:
            raise VerifyException(
                f"schedule.start: collective must be one of {tuple(COLLECTIVES)}, found {self.collective_name!r}"
            )
        _check_stream(self)
        graph_op = COLLECTIVES[self.collective_name]
        expected = graph_op._property_names() if graph_op is not None else list(_PEER_PROPERTIES)
        found = list(self.attrs())
        if sorted(found) != sorted(expected):
            raise VerifyException(f"{what}: expected properties {expected}, found {found}")
        operands = 0 if self.collective_name == "recv" else 1
        if len(self.operands) != operands:
            raise VerifyException(
                f"{what}: expected {operands} operands, found {len(self.operands)}"
            )
        sizes = mesh_axis_sizes(self)
        attrs = self.attrs()
        unknown = [a for a in attrs["axes"] if a not in sizes]
        if unknown:
            raise VerifyException(
                f"{what}: unknown mesh axes {unknown}; the mesh has {list(sizes)}"
            )
        result = AbstractTensor.from_xdsl(self.handle.type.tensor)
        if graph_op is None:
            self._verify_peer(what, attrs, sizes)
            want = AbstractTensor.from_xdsl(self.input.type) if self.input is not None else result
        else:
            group_size = math.prod(sizes[a] for a in attrs["axes"])
            try:
                want = graph_op.infer(
                    AbstractTensor.from_xdsl(self.input.type), **attrs, group_size=group_size
                )[0]
            except TesseraError as error:
                raise VerifyException(f"{what}: {error}") from None
        if want != result:
            raise VerifyException(
                f"{what}: handle type mismatch: expected {HandleType(want.to_xdsl())}, found {self.handle.type}"
            )
        if self.algorithm is not None or self.domain is not None:
            group_size = math.prod(sizes[a] for a in attrs["axes"])
            self._verify_algorithm(what, group_size)
        waits = [u.operation for u in self.handle.uses if isinstance(u.operation, WaitOp)]
        if len(waits) != 1:
            raise VerifyException(
                f"{what}: expected exactly one schedule.wait of the handle, found {len(waits)}"
            )

    def _verify_algorithm(self, what: str, group_size: int) -> None:
        algorithm, domain = self.algorithm_name, self.domain_size
        if algorithm is None:
            raise VerifyException(f"{what}: a domain needs algorithm = hierarchical")
        if algorithm not in ALGORITHMS:
            raise VerifyException(
                f"{what}: algorithm must be one of {ALGORITHMS}, found {algorithm!r}"
            )
        if algorithm != "hierarchical":
            if domain is not None:
                raise VerifyException(
                    f"{what}: a domain needs algorithm = hierarchical, found {algorithm}"
                )
            return
        if self.collective_name not in HIERARCHICAL_COLLECTIVES:
            raise VerifyException(
                f"{what}: algorithm hierarchical applies only to {HIERARCHICAL_COLLECTIVES}"
            )
        if domain is None:
            raise VerifyException(f"{what}: algorithm hierarchical needs a domain")
        if not 2 <= domain < group_size or group_size % domain:
            raise VerifyException(
                f"{what}: expected a domain that divides the group size {group_size} with "
                f"2 <= domain < {group_size}, found {domain}"
            )

    def _verify_peer(self, what: str, attrs: dict[str, Any], sizes: dict[str, int]) -> None:
        if len(attrs["axes"]) != 1:
            raise VerifyException(
                f"{what}: expected one mesh axis for the peer, found {list(attrs['axes'])}"
            )
        size = sizes[attrs["axes"][0]]
        if not 0 < abs(attrs["offset"]) < size:
            raise VerifyException(
                f"{what}: expected a peer offset with 0 < |offset| < {size} (the axis size), found {attrs['offset']}"
            )

    def print(self, printer: Printer) -> None:
        printer.print_string(f" {self.collective_name}")
        if self.input is not None:
            printer.print_string(" ")
            printer.print_operand(self.input)
        print_properties(printer, self.properties, _START_PROPERTIES + _PLACEMENT_PROPERTIES)
        printer.print_op_attributes(self.attributes, print_keyword=True)
        printer.print_string(" : ")
        if self.input is not None:
            printer.print_attribute(self.input.type)
            printer.print_string(" -> ")
        printer.print_attribute(self.handle.type)

    @classmethod
    def parse(cls, parser: Parser) -> StartOp:
        collective = parser.parse_identifier(" for a collective name")
        operand = parser.parse_optional_unresolved_operand()
        properties = parse_properties(parser)
        attributes = parser.parse_optional_attr_dict_with_keyword()
        parser.parse_punctuation(":")
        first = parser.parse_type()
        operands: list[SSAValue] = []
        if operand is not None:
            operands.append(parser.resolve_operand(operand, first))
            parser.parse_punctuation("->")
            first = parser.parse_type()
        return cls.create(
            operands=operands,
            result_types=[first],
            properties={"collective": StringAttr(collective), **properties},
            attributes=attributes.data if attributes else {},
        )


USER_WAIT = "schedule.user_wait"  # a wait placed where the user called .wait()


@irdl_op_definition
class WaitOp(IRDLOperation):
    """Waits for a started collective and gives its result (nothing for a send). One
    marked ``schedule.user_wait`` stays where the user's ``h.wait()`` put it."""

    name = "schedule.wait"
    handle = operand_def(HandleType)
    result = opt_result_def(TensorType)

    def verify_(self) -> None:
        start = self.handle.owner
        is_send = isinstance(start, StartOp) and start.collective_name == "send"
        want = [] if is_send else [self.handle.type.tensor]
        got = [r.type for r in self.results]
        if want != got:
            raise VerifyException(
                f"schedule.wait: result types mismatch: expected {_types(want)}, found {_types(got)}"
            )

    def print(self, printer: Printer) -> None:
        printer.print_string(" ")
        printer.print_operand(self.handle)
        printer.print_op_attributes(self.attributes, print_keyword=True)
        printer.print_string(" : ")
        printer.print_attribute(self.handle.type)
        if self.result is not None:
            printer.print_string(" -> ")
            printer.print_attribute(self.result.type)

    @classmethod
    def parse(cls, parser: Parser) -> WaitOp:
        handle = parser.parse_unresolved_operand()
        attributes = parser.parse_optional_attr_dict_with_keyword()
        parser.parse_punctuation(":")
        handle_type = parser.parse_type()
        result_types = [parser.parse_type()] if parser.parse_optional_punctuation("->") else []
        return cls.create(
            operands=[parser.resolve_operand(handle, handle_type)],
            result_types=result_types,
            attributes=attributes.data if attributes else {},
        )


# --- buffers -----------------------------------------------------------------------------------


@irdl_op_definition
class AllocOp(IRDLOperation):
    """Allocates a buffer, at byte ``offset`` of the rank's arena when planned."""

    name = "schedule.alloc"
    buffer = result_def(BufferType)
    offset = opt_prop_def(IntegerAttr)

    def print(self, printer: Printer) -> None:
        print_properties(printer, self.properties, ["offset"])
        printer.print_op_attributes(self.attributes, print_keyword=True)
        printer.print_string(" : ")
        printer.print_attribute(self.buffer.type)

    @classmethod
    def parse(cls, parser: Parser) -> AllocOp:
        properties = parse_properties(parser)
        attributes = parser.parse_optional_attr_dict_with_keyword()
        parser.parse_punctuation(":")
        return cls.create(
            result_types=[parser.parse_type()],
            properties=properties,
            attributes=attributes.data if attributes else {},
        )

    def verify_(self) -> None:
        if self.offset is not None:
            offset, size = self.offset.value.data, self.buffer.type.bytes.data
            if offset < 0:
                raise VerifyException(
                    f"schedule.alloc: expected a non-negative offset, found {offset}"
                )
            if offset + size > MAX_BYTES:
                raise VerifyException(
                    f"schedule.alloc: the buffer ends at byte {offset + size}, beyond the "
                    f"{MAX_BYTES} (2**48) that can be addressed"
                )
        frees = [u.operation for u in self.buffer.uses if isinstance(u.operation, FreeOp)]
        if len(frees) > 1:
            raise VerifyException(
                f"schedule.alloc: expected the buffer to be freed at most once, found {len(frees)} frees"
            )


@irdl_op_definition
class FreeOp(IRDLOperation):
    """Frees a buffer made by ``schedule.alloc``."""

    name = "schedule.free"
    buffer = operand_def(BufferType)
    assembly_format = "$buffer attr-dict `:` type($buffer)"

    def verify_(self) -> None:
        if not isinstance(self.buffer.owner, AllocOp):
            raise VerifyException(
                "schedule.free: expected a buffer made by schedule.alloc, found a block argument"
            )


# --- regions: terminator, microbatches, pipeline stages -----------------------------------------


class IndexedRegionOp(IRDLOperation):
    """A region op for item ``index`` of ``count`` (a microbatch, a pipeline stage)."""

    outputs = var_result_def()
    index = prop_def(IntegerAttr)
    count = prop_def(IntegerAttr)
    body = region_def("single_block")

    def verify_(self) -> None:
        index, count = self.index.value.data, self.count.value.data
        if not 0 <= index < count:
            raise VerifyException(
                f"{self.name}: expected 0 <= index < count, found index {index} and count {count}"
            )
        if self.body.block.args:
            raise VerifyException(
                f"{self.name}: expected a body without arguments, found {len(self.body.block.args)}"
            )
        _check_yield(self, self.name)

    def print(self, printer: Printer) -> None:
        print_properties(printer, self.properties, ["index", "count"])
        printer.print_op_attributes(self.attributes, print_keyword=True)
        if self.results:
            printer.print_string(" -> ")
            _print_results(printer, [r.type for r in self.results])
        printer.print_string(" ")
        printer.print_region(self.body, print_entry_block_args=False)

    @classmethod
    def parse(cls, parser: Parser) -> IndexedRegionOp:
        properties = parse_properties(parser)
        attributes = parser.parse_optional_attr_dict_with_keyword()
        result_types = _parse_results(parser) if parser.parse_optional_punctuation("->") else []
        body = parser.parse_region()
        return cls.create(
            result_types=result_types,
            properties=properties,
            attributes=attributes.data if attributes else {},
            regions=[body],
        )


@irdl_op_definition
class MicrobatchOp(IndexedRegionOp):
    """The work of microbatch ``index`` of ``count``."""

    name = "schedule.microbatch"


@irdl_op_definition
class StageOp(IndexedRegionOp):
    """The work of pipeline stage ``index`` of ``count``."""

    name = "schedule.stage"


@irdl_op_definition
class YieldOp(IRDLOperation):
    """Ends a kernel, microbatch or stage body, giving the op's results."""

    name = "schedule.yield"
    values = var_operand_def()
    traits = traits_def(IsTerminator(), HasParent(KernelOp, MicrobatchOp, StageOp))
    assembly_format = "attr-dict ($values^ `:` type($values))?"


def kernel_body(arg_types: Sequence[Attribute]) -> Region:
    """An empty kernel body with one block argument per input type."""
    return Region(Block(arg_types=arg_types))


# --- pipeline schedules: what each pipeline rank runs, in order ---------------------------


def _int(op: IRDLOperation, name: str) -> int:
    return op.properties[name].value.data  # type: ignore[attr-defined]


def _print_body(printer: Printer, body: Region) -> None:
    printer.print_string(" ")
    printer.print_region(body, print_entry_block_args=False, print_empty_block=False)


def _parse_body(parser: Parser) -> Region:
    body = parser.parse_region()
    if not body.blocks:  # `{\n}`: an empty block
        body.add_block(Block())
    return body


@irdl_op_definition
class ActionOp(IRDLOperation):
    """One step of a pipeline rank: ``schedule.action <kind> {microbatch, stage[, peer]}``.

    ``kind`` is one of ``tessera.ir.pipeline_actions.ACTION_KINDS``; transfers (and only
    they) name their ``peer`` stage."""

    name = "schedule.action"
    kind = prop_def(StringAttr)
    microbatch = prop_def(IntegerAttr)
    stage = prop_def(IntegerAttr)
    peer = opt_prop_def(IntegerAttr)
    traits = lazy_traits_def(lambda: (HasParent(PipelineRankOp),))

    @staticmethod
    def get(kind: str, microbatch: int, stage: int, peer: int | None = None) -> ActionOp:
        properties: dict[str, Attribute] = {
            "kind": StringAttr(kind),
            "microbatch": IntegerAttr(microbatch, 64),
            "stage": IntegerAttr(stage, 64),
        }
        if peer is not None:
            properties["peer"] = IntegerAttr(peer, 64)
        return ActionOp.create(properties=properties)

    @property
    def kind_name(self) -> str:
        return self.kind.data

    @property
    def microbatch_index(self) -> int:
        return self.microbatch.value.data

    @property
    def stage_index(self) -> int:
        return self.stage.value.data

    @property
    def peer_stage(self) -> int | None:
        return self.peer.value.data if self.peer is not None else None

    def verify_(self) -> None:
        if self.kind_name not in actions.ACTION_KINDS:
            raise VerifyException(
                f"schedule.action: kind must be one of {actions.ACTION_KINDS}, found {self.kind_name!r}"
            )
        what = f"schedule.action {self.kind_name}"
        for name in ("microbatch", "stage"):
            if _int(self, name) < 0:
                raise VerifyException(
                    f"{what}: expected a non-negative {name}, found {_int(self, name)}"
                )
        if self.kind_name in actions.TRANSFER_KINDS and self.peer is None:
            raise VerifyException(f"{what}: expected a peer stage (a transfer names its peer)")
        if self.kind_name in actions.COMPUTE_KINDS and self.peer is not None:
            raise VerifyException(
                f"{what}: expected no peer (a computation has none), found {self.peer_stage}"
            )

    def print(self, printer: Printer) -> None:
        printer.print_string(f" {self.kind_name}")
        print_properties(printer, self.properties, ["microbatch", "stage", "peer"])
        printer.print_op_attributes(self.attributes, print_keyword=True)

    @classmethod
    def parse(cls, parser: Parser) -> ActionOp:
        kind = parser.parse_identifier(" for a pipeline action kind")
        properties = parse_properties(parser)
        attributes = parser.parse_optional_attr_dict_with_keyword()
        return cls.create(
            properties={"kind": StringAttr(kind), **properties},
            attributes=attributes.data if attributes else {},
        )


@irdl_op_definition
class PipelineRankOp(IRDLOperation):
    """The actions pipeline rank ``index`` runs, in order."""

    name = "schedule.pipeline_rank"
    index = prop_def(IntegerAttr)
    body = region_def("single_block")
    traits = lazy_traits_def(lambda: (NoTerminator(), HasParent(PipelineOp)))

    @staticmethod
    def get(index: int, actions: Sequence[ActionOp] = ()) -> PipelineRankOp:
        return PipelineRankOp.create(
            properties={"index": IntegerAttr(index, 64)}, regions=[Region(Block(actions))]
        )

    @property
    def rank(self) -> int:
        return self.index.value.data

    @property
    def actions(self) -> list[ActionOp]:
        return [o for o in self.body.block.ops if isinstance(o, ActionOp)]

    def verify_(self) -> None:
        for inner in self.body.block.ops:
            if not isinstance(inner, ActionOp):
                raise VerifyException(
                    f"schedule.pipeline_rank {self.rank}: expected only schedule.action ops, found {inner.name}"
                )

    def print(self, printer: Printer) -> None:
        print_properties(printer, self.properties, ["index"])
        printer.print_op_attributes(self.attributes, print_keyword=True)
        _print_body(printer, self.body)

    @classmethod
    def parse(cls, parser: Parser) -> PipelineRankOp:
        properties = parse_properties(parser)
        attributes = parser.parse_optional_attr_dict_with_keyword()
        return cls.create(
            properties=properties,
            attributes=attributes.data if attributes else {},
            regions=[_parse_body(parser)],
        )


# (earlier, later): two actions of one (microbatch, stage) that its rank runs in this order
_ORDER = (
    ("recv_activation", "forward"),
    ("forward", "send_activation"),
    ("forward", "backward"),
    ("forward", "backward_input"),
    ("backward_input", "backward_weight"),
    ("recv_grad", "backward"),
    ("recv_grad", "backward_input"),
    ("backward", "send_grad"),
    ("backward_input", "send_grad"),
)
# transfer -> (its counterpart, peer - stage)
_TRANSFERS = {
    "send_activation": ("recv_activation", 1),
    "recv_activation": ("send_activation", -1),
    "send_grad": ("recv_grad", -1),
    "recv_grad": ("send_grad", 1),
}


@irdl_op_definition
class PipelineOp(IRDLOperation):
    """A pipeline schedule: one ``schedule.pipeline_rank`` per rank, in rank order."""

    name = "schedule.pipeline"
    kind = prop_def(StringAttr)
    ranks = prop_def(IntegerAttr)
    microbatches = prop_def(IntegerAttr)
    virtual = prop_def(IntegerAttr)
    body = region_def("single_block")
    traits = traits_def(NoTerminator())

    @staticmethod
    def get(
        kind: str,
        ranks: int,
        microbatches: int,
        virtual: int,
        rank_ops: Sequence[PipelineRankOp],
    ) -> PipelineOp:
        return PipelineOp.create(
            properties={
                "kind": StringAttr(kind),
                "ranks": IntegerAttr(ranks, 64),
                "microbatches": IntegerAttr(microbatches, 64),
                "virtual": IntegerAttr(virtual, 64),
            },
            regions=[Region(Block(rank_ops))],
        )

    @property
    def schedule_kind(self) -> str:
        return self.kind.data

    @property
    def rank_ops(self) -> list[PipelineRankOp]:
        return [o for o in self.body.block.ops if isinstance(o, PipelineRankOp)]

    def verify_(self) -> None:
        what = "schedule.pipeline"
        for name in ("ranks", "microbatches", "virtual"):
            if _int(self, name) < 1:
                raise VerifyException(f"{what}: expected {name} >= 1, found {_int(self, name)}")
        ranks = _int(self, "ranks")
        for inner in self.body.block.ops:
            if not isinstance(inner, PipelineRankOp):
                raise VerifyException(
                    f"{what}: expected only schedule.pipeline_rank ops, found {inner.name}"
                )
        rank_ops = self.rank_ops
        if len(rank_ops) != ranks:
            raise VerifyException(
                f"{what}: expected {ranks} schedule.pipeline_rank ops (one per rank), found {len(rank_ops)}"
            )
        for position, rank_op in enumerate(rank_ops):
            if rank_op.rank != position:
                raise VerifyException(
                    f"{what}: expected the ranks in order, found index {rank_op.rank} at position {position}"
                )
        lists = []
        for rank_op in rank_ops:
            try:
                lists.append(
                    [
                        actions.Action(a.kind_name, a.microbatch_index, a.stage_index, a.peer_stage)
                        for a in rank_op.actions
                    ]
                )
            except ValueError as error:
                raise VerifyException(f"{what}: rank {rank_op.rank}: {error}") from None
        error = check_pipeline(lists, ranks, _int(self, "microbatches"), _int(self, "virtual"))
        if error is not None:
            raise VerifyException(f"{what}: {error}")

    def print(self, printer: Printer) -> None:
        print_properties(printer, self.properties, ["kind", "ranks", "microbatches", "virtual"])
        printer.print_op_attributes(self.attributes, print_keyword=True)
        _print_body(printer, self.body)

    @classmethod
    def parse(cls, parser: Parser) -> PipelineOp:
        properties = parse_properties(parser)
        attributes = parser.parse_optional_attr_dict_with_keyword()
        return cls.create(
            properties=properties,
            attributes=attributes.data if attributes else {},
            regions=[_parse_body(parser)],
        )


def check_pipeline(
    lists: Sequence[Sequence[Any]], ranks: int, microbatches: int, virtual: int
) -> str | None:
    """What is wrong with a schedule (one list of :class:`tessera.ir.pipeline_actions.Action`
    per rank), as ``schedule.pipeline`` reports it, or None if nothing is.

    See the module docstring for the rules; messages name the rank and the action."""
    stages = ranks * virtual
    position: dict[Any, tuple[int, int]] = {}  # action -> (its rank, its index there)
    for rank, rank_actions in enumerate(lists):
        for index, action in enumerate(rank_actions):
            error = _check_action(action, rank, ranks, microbatches, stages)
            if error is None and action in position:
                error = f"duplicated (also at position {position[action][1]} of this rank)"
            if error is not None:
                return f"rank {rank}: {action}: {error}"
            position[action] = (rank, index)
    return (
        _check_transfers(position, ranks)
        or _check_complete(position, ranks, microbatches, stages)
        or _check_order(position, ranks, microbatches, stages)
    )


def _check_action(action: Any, rank: int, ranks: int, microbatches: int, stages: int) -> str | None:
    """What is wrong with one action of ``rank``'s list, on its own."""
    if not 0 <= action.microbatch < microbatches:
        return f"expected 0 <= microbatch < {microbatches}, found {action.microbatch}"
    if not 0 <= action.stage < stages:
        return f"expected 0 <= stage < {stages} (ranks * virtual), found {action.stage}"
    if actions.rank_of(action.stage, ranks) != rank:
        return f"stage {action.stage} runs on rank {actions.rank_of(action.stage, ranks)}"
    if action.kind in _TRANSFERS:
        step = _TRANSFERS[action.kind][1]
        if action.peer != action.stage + step:
            sign = "+" if step > 0 else "-"
            return f"expected peer {action.stage + step} (stage {sign} 1), found {action.peer}"
        if not 0 <= action.peer < stages:
            return f"expected 0 <= peer < {stages}, found {action.peer}"
    return None


def _check_transfers(position: dict[Any, tuple[int, int]], ranks: int) -> str | None:
    """Every send has its receive and every receive its send."""
    for action, (rank, _) in position.items():
        if action.kind in _TRANSFERS:
            other_kind = _TRANSFERS[action.kind][0]
            other = actions.Action(other_kind, action.microbatch, action.peer, action.stage)
            if other not in position:
                other_rank = actions.rank_of(action.peer, ranks)
                return f"rank {rank}: {action}: no matching {other} on rank {other_rank}"
    return None


def _check_complete(
    position: dict[Any, tuple[int, int]], ranks: int, microbatches: int, stages: int
) -> str | None:
    """Every (microbatch, stage) is computed, forward and backward, and receives from its
    neighbour stages on other ranks what it needs."""
    for microbatch in range(microbatches):
        for stage in range(stages):
            rank = actions.rank_of(stage, ranks)
            here = f"rank {rank}: microbatch {microbatch}, stage {stage}"
            found = [
                kind
                for kind in actions.COMPUTE_KINDS
                if actions.Action(kind, microbatch, stage) in position
            ]
            backward = [k for k in found if k != actions.FORWARD]
            if actions.FORWARD not in found:
                return f"{here}: expected a forward, found none"
            if backward not in (
                [actions.BACKWARD],
                [actions.BACKWARD_INPUT, actions.BACKWARD_WEIGHT],
            ):
                return (
                    f"{here}: expected a backward or a backward_input and a backward_weight, "
                    f"found {' and '.join(backward) or 'none'}"
                )
            for kind, neighbour in (
                (actions.RECV_ACTIVATION, stage - 1),
                (actions.RECV_GRAD, stage + 1),
            ):
                if not 0 <= neighbour < stages:
                    continue
                other_rank = actions.rank_of(neighbour, ranks)
                received = actions.Action(kind, microbatch, stage, neighbour) in position
                if other_rank != rank and not received:
                    return (
                        f"{here}: expected a {kind} from stage {neighbour} "
                        f"(rank {other_rank}), found none"
                    )
    return None


def _check_order(
    position: dict[Any, tuple[int, int]], ranks: int, microbatches: int, stages: int
) -> str | None:
    """On its rank, what a (microbatch, stage) receives comes before the computation that
    needs it, what it sends after the one that makes it, its backward after its forward."""

    def action(kind: str, microbatch: int, stage: int) -> Any:
        peer = stage + _TRANSFERS[kind][1] if kind in _TRANSFERS else None
        return actions.Action(kind, microbatch, stage, peer)

    for microbatch in range(microbatches):
        for stage in range(stages):
            for earlier_kind, later_kind in _ORDER:
                earlier = action(earlier_kind, microbatch, stage)
                later = action(later_kind, microbatch, stage)
                if (
                    earlier in position
                    and later in position
                    and position[later] < position[earlier]
                ):
                    return f"rank {position[later][0]}: {later}: expected after {earlier}"
    return None


@irdl_op_definition
class ScanOp(graph.ScanLike, IRDLOperation):
    """``graph.scan`` in a scheduled function: ``length`` steps of the scheduled
    ``@callee``, its carries threaded through, the other operands sliced on dim 0 and
    the other results stacked on dim 0 (from the last step with ``reverse``)::

        %h, %ys = schedule.scan @layer(%x, %w) {carries = 1, length = 4, reverse = false} : (...) -> (...)
    """

    name = "schedule.scan"
    callee = prop_def(SymbolRefAttr)
    length = prop_def(IntegerAttr)
    carries = prop_def(IntegerAttr)
    reverse = prop_def(BoolAttr)
    args = var_operand_def(TensorType)
    res = var_result_def(TensorType)

    @staticmethod
    def of(op: graph.ScanOp, operands: Sequence[SSAValue]) -> ScanOp:
        return ScanOp.create(
            operands=list(operands),
            result_types=[r.type for r in op.results],
            properties={k: op.properties[k] for k in ("callee", "length", "carries", "reverse")},
        )

    def verify_(self) -> None:
        self.verify_scan()


Schedule = Dialect(
    "schedule",
    [
        KernelOp,
        ScanOp,
        StartOp,
        WaitOp,
        AllocOp,
        FreeOp,
        YieldOp,
        MicrobatchOp,
        StageOp,
        PipelineOp,
        PipelineRankOp,
        ActionOp,
    ],
    [HandleType, BufferType],
)
