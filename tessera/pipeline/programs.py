"""The programs a pipeline stage runs: forward, backward (or its two halves), update.

For each stage, :func:`stage_programs` builds one *joint* function — the stage's forward
ops followed by their reverse-mode derivative, seeded with the gradients of what the
stage sends on (``backprop(..., seeds=...)``, a vector-Jacobian product) or, on the last
stage, with the loss — and slices it into the functions the schedule calls:

- ``forward``: what the stage sends (the last stage: loss and metrics), plus the
  *residuals* its backward reads (intermediates saved for the backward pass);
- ``backward``: the gradients of what the stage received, to send back, and of its
  parameters, to accumulate; or, split for zero-bubble schedules,
- ``backward_input`` (the received values' gradients, plus the residuals the weight
  half reads) and ``backward_weight`` (the parameter gradients).

Slicing follows data flow: a function holds the ops its outputs need that an earlier
function did not already compute; what it reads from an earlier one becomes an input.
Constants are recomputed rather than passed. Each function is a Graph IR module
compiled like any other (``Lowered``), over the whole mesh: its shardings name only the
axes inside a stage (tensor parallelism), while the pipeline and data-parallel axes are
*manual* — every (pp, dp) slice runs the stage's program on its own data, as in
``shard_map``. The shardings of values crossing stages, and of residuals, are those the
producing program gives them, so sender and receiver agree on every local shape.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Attribute, Block, Operation, SSAValue
from xdsl.rewriter import InsertPoint

from tessera.dist.collectives import MESH_SYMBOL, shard
from tessera.driver import CompileConfig
from tessera.frontend import pytree
from tessera.frontend.tracer import Tensor, Trace, tracing
from tessera.ir import graph
from tessera.ir.abstract import AbstractTensor, aval
from tessera.ir.function_table import FunctionTable, register, table_of
from tessera.ir.grad_builder import GradBuilder
from tessera.ir.mesh import Mesh
from tessera.ir.sharding import SHARDING_KEY, Sharding, ShardingAttr
from tessera.passes.autodiff import backprop
from tessera.pipeline.split import StagePlan, is_free
from tessera.program import Lowered, Signature
from tessera.transforms.remat import RematPolicy


@dataclass
class Program:
    """One compiled function of a stage and where its inputs come from.

    ``inputs`` name each argument: ``("param", i)``, ``("batch", i)``, ``("received", i)``
    (the i-th value received from the previous stage), ``("seed", i)`` (the gradient of
    the i-th value sent on), or ``("saved", name, i)`` (output i of the stage's program
    ``name``, kept for this microbatch)."""

    name: str
    lowered: Lowered
    inputs: list[tuple]

    def layouts(self) -> tuple[list[Sharding], list[Sharding]]:
        """The local layouts of the arguments and results."""
        return self.lowered.layouts()


@dataclass
class StagePrograms:
    """The compiled programs of one stage and the shape of its traffic."""

    index: int
    params: list[int]  # parameter leaves the stage uses
    batch: list[int]  # batch leaves the stage reads
    forward: Program
    backward: Program | None  # the whole backward (one of backward / split halves)
    backward_input: Program | None
    backward_weight: Program | None
    sent: list[AbstractTensor]  # values sent on, per microbatch
    received: list[AbstractTensor]
    received_grads: list[int]  # which received values get a gradient back (floats)
    sent_grads: list[int]  # which sent values get a gradient back
    metric_outputs: int = 0  # last stage: loss and metrics lead the forward outputs
    sent_layouts: list[Sharding] = field(default_factory=list)
    received_layouts: list[Sharding] = field(default_factory=list)
    # outputs of the backward programs: received-value gradients, then parameter gradients
    param_grad_layouts: list[Sharding] = field(default_factory=list)


def _closure(wanted: Sequence[SSAValue], ops: set[Operation]) -> set[Operation]:
    """The ops among ``ops`` that ``wanted`` depends on."""
    found: set[Operation] = set()
    stack = [v.owner for v in wanted if isinstance(v.owner, Operation)]
    while stack:
        op = stack.pop()
        if op in found or op not in ops:
            continue
        found.add(op)
        stack.extend(v.owner for v in op.operands if isinstance(v.owner, Operation))
    return found


class _Joint:
    """One stage's forward and backward ops in one block (values of the joint function)."""

    def __init__(
        self,
        plan: StagePlan,
        stage: int,
        params: Sequence[SSAValue],
        batch: Sequence[SSAValue],
        outputs: Sequence[SSAValue],
        split_backward: bool,
        remat: RematPolicy | None = None,
    ):
        last = stage == plan.count - 1
        ops = plan.ops[stage]
        used = {v for op in ops for v in op.operands}
        self.param_indices = [i for i, p in enumerate(params) if p in used]
        self.batch_indices = [i for i, b in enumerate(batch) if b in used]
        received = plan.received[stage]
        sent = list(outputs) if last else plan.sent[stage]
        self.sent_grads = [i for i, v in enumerate(sent) if aval(v).dtype.is_float and not last]
        self.received_grads = [i for i, v in enumerate(received) if aval(v).dtype.is_float]
        originals = [
            *(params[i] for i in self.param_indices),
            *(batch[i] for i in self.batch_indices),
            *received,
        ]
        seed_types = [sent[i].type for i in self.sent_grads]
        self.block = Block(arg_types=[v.type for v in originals] + seed_types)
        # region calls: their functions (and the derivatives autodiff adds) are the
        # traced program's
        self.functions = table_of(ops[0]) if ops else FunctionTable()
        register(self.block, self.functions)
        args = list(self.block.args)
        self.kinds: dict[SSAValue, tuple] = {}
        for position, arg in enumerate(args):
            if position < len(self.param_indices):
                self.kinds[arg] = ("param", self.param_indices[position])
            elif position < len(self.param_indices) + len(self.batch_indices):
                self.kinds[arg] = ("batch", self.batch_indices[position - len(self.param_indices)])
            elif position < len(originals):
                self.kinds[arg] = (
                    "received",
                    position - len(self.param_indices) - len(self.batch_indices),
                )
            else:
                self.kinds[arg] = ("seed", self.sent_grads[position - len(originals)])
        mapping: dict[SSAValue, SSAValue] = dict(
            zip(originals, args[: len(originals)], strict=True)
        )
        forward: list[Operation] = []

        def clone(op: Operation) -> None:
            for operand in op.operands:
                if operand not in mapping and is_free(operand.owner):  # type: ignore[arg-type]
                    clone(operand.owner)  # type: ignore[arg-type]
            copy = op.clone(mapping)
            self.block.add_op(copy)
            forward.append(copy)

        for op in ops:
            clone(op)
        self.forward_ops = set(forward)
        self.sent = [mapping[v] for v in sent]
        seeds = {self.sent[i]: args[len(originals) + k] for k, i in enumerate(self.sent_grads)}
        builder = GradBuilder(InsertPoint.at_end(self.block))
        param_args = args[: len(self.param_indices)]
        received_args = args[len(self.param_indices) + len(self.batch_indices) : len(originals)]
        differentiable = [received_args[i] for i in self.received_grads]
        grads = backprop(
            forward,
            self.sent[0] if last else None,
            [*differentiable, *param_args],
            builder,
            f"pipeline stage {stage}",
            seeds,
            remat,
        )
        self.input_grads = grads[: len(differentiable)]
        self.param_grads = grads[len(differentiable) :]
        self.order = {op: i for i, op in enumerate(self.block.ops)}
        self.split_backward = split_backward

    def slice(
        self, outputs: Sequence[SSAValue], done: set[Operation]
    ) -> tuple[list[Operation], list[SSAValue]]:
        """The ops (in order) computing ``outputs`` beyond ``done``, and the values they
        read from outside (joint arguments or results of ``done`` ops)."""
        ops = _closure(outputs, set(self.order) - done)
        # constants are recomputed, never read from another program
        for op in list(ops):
            for v in op.operands:
                if isinstance(v.owner, Operation) and v.owner in done and is_free(v.owner):
                    ops.add(v.owner)
        for v in outputs:
            if isinstance(v.owner, Operation) and v.owner in done and is_free(v.owner):
                ops.add(v.owner)
        ordered = sorted(ops, key=self.order.__getitem__)
        inside = {r for op in ordered for r in op.results}
        reads: list[SSAValue] = []
        for v in [*(v for op in ordered for v in op.operands), *outputs]:
            if v not in inside and v not in reads:
                reads.append(v)
        return ordered, reads


def _function(
    name: str,
    mesh: Mesh,
    inputs: Sequence[SSAValue],
    ops: Sequence[Operation],
    outputs: Sequence[SSAValue],
    shardings: Sequence[Sharding],
    out_shardings: Sequence[Sharding | None] = (),
    functions: FunctionTable | None = None,
) -> ModuleOp:
    """A Graph IR module of one function: ``ops`` (cloned) from ``inputs`` to ``outputs``,
    the arguments laid out as ``shardings`` and each output with an ``out_shardings``
    entry constrained to it; the region functions its calls reach (from ``functions``)
    follow it."""
    avals = [aval(v) for v in inputs]
    trace = Trace(name, avals, mesh=mesh)
    mapping: dict[SSAValue, SSAValue] = dict(zip(inputs, trace.block.args, strict=True))
    for op in ops:
        trace.block.add_op(op.clone(mapping))
    if functions is not None:
        for callee in _reached(ops, functions):
            trace.functions.functions[callee] = functions.get(callee).clone()
    arg_attrs: list[dict[str, Attribute]] = [
        {SHARDING_KEY: ShardingAttr.get(MESH_SYMBOL, s)} for s in shardings
    ]
    results = [Tensor(trace, mapping[v]) for v in outputs]
    with tracing(trace):
        for i, wanted in enumerate(out_shardings):
            if wanted is not None:
                results[i] = shard(results[i], wanted)
    return trace.finish(results, arg_attrs)


def _reached(ops: Sequence[Operation], functions: FunctionTable) -> list[str]:
    """The functions the ``graph.call`` ops of ``ops`` reach, directly or through calls."""
    reached: list[str] = []
    work = [op.callee_name for op in ops if isinstance(op, graph.CallOp | graph.ScanOp)]
    while work:
        name = work.pop()
        if name in reached:
            continue
        reached.append(name)
        body = functions.get(name).body.block.ops
        work.extend(op.callee_name for op in body if isinstance(op, graph.CallOp | graph.ScanOp))
    return reached


def _lowered(
    module: ModuleOp,
    name: str,
    avals: Sequence[AbstractTensor],
    shardings: Sequence[Sharding],
    config: CompileConfig,
) -> Lowered:
    _, tree = pytree.flatten((tuple(range(len(avals))), {}))
    signature = Signature(tree, tuple(avals), tuple(shardings))
    _, out_tree = pytree.flatten(())
    return Lowered(name, module, signature, out_tree, config)


def stage_programs(
    name: str,
    plan: StagePlan,
    params: Sequence[SSAValue],
    param_layouts: Sequence[Sharding],
    batch: Sequence[SSAValue],
    outputs: Sequence[SSAValue],
    split_backward: bool,
    config: CompileConfig,
    batch_layouts: Sequence[Sharding] | None = None,
) -> list[StagePrograms]:
    """Every stage's compiled programs, each compiled with ``config`` (its mesh is the
    whole mesh), stage by stage: a stage's received values take the layouts of the
    previous stage's sent ones; ``graph.checkpoint`` blocks are recomputed in the
    backward as ``config.remat`` says; batch leaves are laid out as ``batch_layouts`` say
    inside a stage (default: replicated; the pipeline and dp axes are manual)."""
    stages: list[StagePrograms] = []
    received: list[Sharding] = []
    for stage in range(plan.count):
        joint = _Joint(plan, stage, params, batch, outputs, split_backward, config.remat)
        compiler = _StageCompiler(
            f"{name}_s{stage}", joint, param_layouts, received, config, batch_layouts
        )
        programs = compiler.compile(stage, stage == plan.count - 1, plan)
        stages.append(programs)
        received = programs.sent_layouts
    return stages


class _StageCompiler:
    """Slices one stage's joint function into its programs and compiles them."""

    def __init__(
        self, prefix: str, joint: _Joint, param_layouts: Sequence[Sharding],
        received_layouts: list[Sharding], config: CompileConfig,
        batch_layouts: Sequence[Sharding] | None = None,
    ):  # fmt: skip
        assert config.mesh is not None
        self.batch_layouts = batch_layouts
        self.prefix, self.joint, self.mesh, self.config = prefix, joint, config.mesh, config
        self.param_layouts, self.received_layouts = param_layouts, received_layouts
        self.sent_layouts: list[Sharding] = []
        self.saved: dict[SSAValue, Sharding] = {}  # residual -> layout
        self.sources: dict[SSAValue, tuple] = {}  # residual -> ("saved", program, output)

    def layout_of(self, value: SSAValue) -> Sharding:
        if value in self.saved:
            return self.saved[value]
        kind = self.joint.kinds[value]
        if kind[0] == "param":
            return self.param_layouts[kind[1]]
        if kind[0] == "received":
            return self.received_layouts[kind[1]]
        if kind[0] == "seed":
            return self.sent_layouts[kind[1]]
        if self.batch_layouts is not None:  # batch: manual over dp, then as given
            return self.batch_layouts[kind[1]]
        return Sharding.replicated(aval(value).rank)

    def part(
        self, part: str, ops: list[Operation], reads: list[SSAValue], outs: list[SSAValue]
    ) -> Program:
        """Compiles one program of the stage. A backward program's leading outputs, the
        gradients sent back, take the layouts the values were received in (the previous
        stage's seeds)."""
        function = f"{self.prefix}_{part}"
        shardings = [self.layout_of(v) for v in reads]
        grads_back: list[Sharding | None] = []
        if part in ("backward", "backward_input"):
            grads_back = [self.received_layouts[i] for i in self.joint.received_grads]
        module = _function(
            function, self.mesh, reads, ops, outs, shardings, grads_back, self.joint.functions
        )
        avals = [aval(v) for v in reads]
        lowered = _lowered(module, function, avals, shardings, self.config)
        inputs = [self.sources.get(v) or self.joint.kinds[v] for v in reads]
        return Program(function, lowered, inputs)

    def save(self, program: Program, values: Sequence[SSAValue], first: int) -> None:
        """Makes ``values`` (outputs ``first``… of ``program``) readable by later programs."""
        layouts = program.layouts()[1]
        for i, v in enumerate(values):
            self.saved[v] = layouts[first + i]
            self.sources[v] = ("saved", program.name.removeprefix(f"{self.prefix}_"), first + i)

    def compile(self, stage: int, last: bool, plan: StagePlan) -> StagePrograms:
        joint = self.joint
        targets = [*joint.input_grads, *joint.param_grads]
        forward_ops, _ = joint.slice(joint.sent, set())
        done = set(forward_ops)
        _, backward_reads = joint.slice(targets, done)
        made = {r for op in forward_ops for r in op.results}
        # a sent value the backward reads is kept as it was sent (one output, not two)
        residuals = [v for v in backward_reads if v in made and v not in joint.sent]
        forward_outs = [*joint.sent, *residuals]
        forward = self.part("forward", *joint.slice(forward_outs, set()), forward_outs)
        self.sent_layouts = forward.layouts()[1][: len(joint.sent)]
        self.save(forward, joint.sent, 0)
        self.save(forward, residuals, len(joint.sent))
        backward = backward_input = backward_weight = None
        if not joint.split_backward:
            backward = self.part("backward", *joint.slice(targets, done), targets)
            grad_layouts = backward.layouts()[1][len(joint.input_grads) :]
        else:
            input_ops, input_reads = joint.slice(joint.input_grads, done)
            weight_ops, weight_reads = joint.slice(joint.param_grads, done | set(input_ops))
            input_made = {r for op in input_ops for r in op.results}
            carried = [v for v in weight_reads if v in input_made]
            input_outs = [*joint.input_grads, *carried]
            backward_input = self.part("backward_input", input_ops, input_reads, input_outs)
            self.save(backward_input, carried, len(joint.input_grads))
            weight_outs = list(joint.param_grads)
            backward_weight = self.part("backward_weight", weight_ops, weight_reads, weight_outs)
            grad_layouts = backward_weight.layouts()[1]
        return StagePrograms(
            index=stage,
            params=joint.param_indices,
            batch=joint.batch_indices,
            forward=forward,
            backward=backward,
            backward_input=backward_input,
            backward_weight=backward_weight,
            sent=[] if last else [aval(v) for v in joint.sent],
            received=[aval(v) for v in plan.received[stage]],
            received_grads=joint.received_grads,
            sent_grads=joint.sent_grads,
            metric_outputs=len(joint.sent) if last else 0,
            sent_layouts=[] if last else list(self.sent_layouts),
            received_layouts=list(self.received_layouts),
            param_grad_layouts=list(grad_layouts),
        )
