"""``plan-memory``: place every tensor of a scheduled function in one per-rank arena.

Runs after ``lower-graph-to-schedule``. Buffers are the tensors that live between
kernels: function arguments (caller-owned, live throughout), kernel results and wait
results; values inside a kernel are registers or tiles and take no arena space.

1. *Liveness*: a buffer lives from the op that makes it to its last top-level use; a
   returned value lives to the end; a collective's operand lives until its wait (the
   transfer reads it while in flight). Arguments live throughout, except *donated* ones
   (``graph.donated``, from ``ts.jit(donate_argnums=...)``), which die at their last use.
2. *Placement*: in order of definition, first fit: the lowest offset (aligned to
   ``alignment`` bytes) whose span overlaps no live buffer's, so dead buffers' space is
   reused. A kernel result takes the place of a donated argument that the kernel reads
   last, when both have the same type and the kernel reads it only elementwise (each
   element is read at the index the result is written at, by the program that writes it,
   before it stores anything): an in-place update, as an optimizer step's parameters and
   moments are, and a KV cache's ``graph.dynamic_update_slice`` (which reads the cache
   at the index it writes).
3. *Annotation*: ``schedule.offsets`` (one byte offset per result) on each kernel and wait,
   ``schedule.arg_offsets`` and ``schedule.peak_bytes`` (the arena's high-water mark,
   the per-rank peak) on the function.

A region call (``func.call``, ``schedule.scan``) makes its results where it is, and while it runs the
callee's own buffers (its peak less its arguments, which are the caller's) take a
scratch span of the caller's arena, placed before the call's results (the results, a
forward call's residuals, then fill the gaps the span leaves: on
``benchmarks/scan_zero.py``'s region calls this fragments the arena less); callees are
planned before their callers.
"""

from __future__ import annotations

import bisect
import heapq
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import DenseArrayBase, IntegerAttr, ModuleOp, i64
from xdsl.ir import Operation, SSAValue
from xdsl.passes import ModulePass

from tessera.ir import graph, schedule
from tessera.ir.abstract import AbstractTensor
from tessera.ir.graph import DONATED
from tessera.ir.limits import MAX_BYTES
from tessera.ir.located_error import LocatedPassFailure
from tessera.opdefs import Fusion, fusion_of

PEAK_BYTES = "schedule.peak_bytes"


@dataclass(frozen=True)
class PlanMemoryPass(ModulePass):
    """Assigns arena offsets to a scheduled function's tensors and records its peak bytes."""

    name = "plan-memory"
    alignment: int = 256

    def __post_init__(self) -> None:
        if self.alignment < 1 or self.alignment & (self.alignment - 1):
            raise ValueError(
                f"alignment must be a positive power of two (bytes), found {self.alignment}"
            )

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        functions = {
            f.sym_name.data: f for f in op.ops if isinstance(f, func.FuncOp) and f.body.blocks
        }
        planned: dict[str, int] = {}  # name -> scratch bytes a call of it needs

        def plan(name: str, calling: tuple[str, ...] = ()) -> None:
            if name in planned:
                return
            if name in calling:
                raise LocatedPassFailure(functions[name], f"plan-memory: @{name} calls itself")
            function = functions[name]
            for callee in _callees(function):
                if callee in functions:
                    plan(callee, (*calling, name))
            peak = _plan(function, self.alignment, planned)
            arguments = sum(_bytes(a, self.alignment) for a in function.body.block.args)
            planned[name] = max(0, peak - arguments)

        for name in functions:
            plan(name)


def _callees(function: func.FuncOp) -> list[str]:
    return [
        op.callee.root_reference.data  # type: ignore[union-attr]
        for op in function.body.block.ops
        if isinstance(op, func.CallOp | schedule.ScanOp)
    ]


def _bytes(value: SSAValue, alignment: int) -> int:
    size = AbstractTensor.from_xdsl(value.type).nbytes
    return max(alignment, -(-size // alignment) * alignment)


def donated_args(function: func.FuncOp) -> list[int]:
    """Indices of the arguments marked ``graph.donated``."""
    attrs = function.arg_attrs.data if function.arg_attrs else []
    return [i for i, a in enumerate(attrs) if DONATED in a.data]


def _reads_elementwise(kernel: schedule.KernelOp, index: int) -> bool:
    """Whether the kernel reads its input ``index`` only elementwise, at the shape it has."""
    arg = kernel.body.block.args[index]
    return all(
        (
            fusion_of(use.operation) is Fusion.ELEMENTWISE
            # a KV cache's write reads x at the index it writes (the update elsewhere)
            or (isinstance(use.operation, graph.DynamicUpdateSliceOp) and use.index == 0)
        )
        and all(r.type == arg.type for r in use.operation.results)
        for use in arg.uses
    )


class _Scratch:
    """The span a call's callee uses while it runs (a key of the placement)."""


def _plan(function: func.FuncOp, alignment: int, scratch: dict[str, int]) -> int:
    """Places ``function``'s buffers (``scratch``: the bytes a call of each planned
    callee needs while it runs); returns the peak."""
    block = function.body.block
    ops = list(block.ops)
    position = {op: i for i, op in enumerate(ops)}
    end = len(ops)
    born: dict[SSAValue | _Scratch, int] = {a: -1 for a in block.args}
    sizes: dict[_Scratch, int] = {}
    for index, op in enumerate(ops):
        if isinstance(op, func.CallOp | schedule.ScanOp):
            span = _Scratch()
            born[span] = index
            sizes[span] = scratch.get(op.callee.root_reference.data, 0)
        if isinstance(op, (schedule.KernelOp, schedule.WaitOp, func.CallOp, schedule.ScanOp)):
            born.update((r, index) for r in op.results)
    donated = {block.args[i] for i in donated_args(function)}
    arguments = set(block.args)
    # arguments are caller-owned and live throughout, unless donated
    last = {v: end if v in arguments and v not in donated else i for v, i in born.items()}
    # (a call's scratch dies where it is born: with the call)
    for index, op in enumerate(ops):
        for operand in op.operands:
            if operand in last:
                last[operand] = end if isinstance(op, func.ReturnOp) else max(last[operand], index)
        if isinstance(op, schedule.StartOp) and op.input is not None and op.input in last:
            (wait,) = [u.operation for u in op.handle.uses]
            last[op.input] = max(last[op.input], position[wait])
    arena = _Arena()
    offsets: dict[SSAValue | _Scratch, int] = {}
    in_place = _in_place(ops, donated, last, alignment)  # type: ignore[arg-type]
    for value in sorted(born, key=lambda v: born[v]):
        arena.free_dead(born[value])
        if isinstance(value, _Scratch):
            if sizes[value]:
                offsets[value] = arena.allocate(sizes[value], last[value])
            continue
        size = _bytes(value, alignment)
        if value in in_place:
            offset = arena.take_over(offsets[in_place[value]], size, last[value])
        else:
            offset = arena.allocate(size, last[value])
        offsets[value] = offset
    if arena.peak > MAX_BYTES:
        raise LocatedPassFailure(
            function,
            f"plan-memory: @{function.sym_name.data} needs an arena of {arena.peak} bytes, "
            f"more than the {MAX_BYTES} (2**48) that can be addressed",
        )
    for op in ops:
        if isinstance(op, (schedule.KernelOp, schedule.WaitOp)) and op.results:
            op.attributes["schedule.offsets"] = DenseArrayBase.from_list(
                i64, [offsets[r] for r in op.results]
            )
    function.attributes["schedule.arg_offsets"] = DenseArrayBase.from_list(
        i64, [offsets[a] for a in block.args]
    )
    function.attributes[PEAK_BYTES] = IntegerAttr(arena.peak, i64)
    return arena.peak


class _Arena:
    """First-fit placement over the free gaps between live buffers (kept sorted and
    merged), with buffers freed in order of last use: each placement looks at the gaps,
    not at every live buffer, so planning stays linear in the program's length."""

    def __init__(self) -> None:
        self.gaps: list[list[int]] = [[0, _UNBOUNDED]]  # [start, end) free, by start
        self.live: dict[int, tuple[int, int]] = {}  # offset -> (size, buffer number)
        self.dying: list[tuple[int, int, int, int]] = []  # (last use, number, offset, size)
        self.placed = 0  # buffers placed so far: numbers them
        self.peak = 0

    def allocate(self, size: int, last: int) -> int:
        for gap in self.gaps:
            if gap[1] - gap[0] >= size:
                offset = gap[0]
                gap[0] += size
                if gap[0] == gap[1]:
                    self.gaps.remove(gap)
                self._occupy(offset, size, last)
                return offset
        raise AssertionError("the last gap is unbounded")

    def take_over(self, offset: int, size: int, last: int) -> int:
        """A buffer of the same size in place of the live one at ``offset``."""
        assert self.live[offset][0] == size
        self._occupy(offset, size, last)
        return offset

    def _occupy(self, offset: int, size: int, last: int) -> None:
        self.placed += 1
        self.live[offset] = (size, self.placed)
        heapq.heappush(self.dying, (last, self.placed, offset, size))
        self.peak = max(self.peak, offset + size)

    def free_dead(self, now: int) -> None:
        """Frees the buffers whose last use is before ``now``."""
        while self.dying and self.dying[0][0] < now:
            _, number, offset, size = heapq.heappop(self.dying)
            if self.live.get(offset) == (size, number):  # not taken over since
                del self.live[offset]
                self._free(offset, size)

    def _free(self, offset: int, size: int) -> None:
        index = bisect.bisect_left(self.gaps, [offset, offset])
        gap = [offset, offset + size]
        if index < len(self.gaps) and self.gaps[index][0] == gap[1]:  # merge the next
            gap[1] = self.gaps.pop(index)[1]
        if index > 0 and self.gaps[index - 1][1] == gap[0]:  # merge into the previous
            self.gaps[index - 1][1] = gap[1]
        else:
            self.gaps.insert(index, gap)


_UNBOUNDED = 1 << 62


def _in_place(
    ops: list[Operation], donated: set[SSAValue], last: dict[SSAValue, int], alignment: int
) -> dict[SSAValue, SSAValue]:
    """Kernel results that take the place of a donated argument (see the module doc)."""
    taken: set[SSAValue] = set()
    aliases: dict[SSAValue, SSAValue] = {}
    for index, op in enumerate(ops):
        if not isinstance(op, schedule.KernelOp):
            continue
        for result in op.results:
            for position, source in enumerate(op.inputs):
                if (
                    source in donated
                    and source not in taken
                    and last[source] == index
                    and _bytes(source, alignment) == _bytes(result, alignment)
                    and source.type == result.type
                    and _reads_elementwise(op, position)
                ):
                    aliases[result] = source
                    taken.add(source)
                    break
    return aliases


def peak_bytes(module: ModuleOp) -> dict[str, int]:
    """Per-rank peak bytes of each planned function, by name (for ``lowered.memory()``)."""
    return {
        f.sym_name.data: f.attributes[PEAK_BYTES].value.data
        for f in module.ops
        if isinstance(f, func.FuncOp) and PEAK_BYTES in f.attributes
    }
