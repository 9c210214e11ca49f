"""Pipeline schedules as IR: Action lists -> schedule.pipeline -> text -> Action lists,
and what the schedule.pipeline verifier rejects."""

from __future__ import annotations

import re
from io import StringIO

import pytest
from xdsl.context import Context
from xdsl.dialects.builtin import Builtin, ModuleOp
from xdsl.dialects.func import Func
from xdsl.parser import Parser
from xdsl.printer import Printer
from xdsl.utils.exceptions import VerifyException

from tessera.ir import graph, schedule
from tessera.ir.pipeline_actions import (
    BACKWARD,
    BACKWARD_INPUT,
    BACKWARD_WEIGHT,
    FORWARD,
    RECV_ACTIVATION,
    RECV_GRAD,
    SEND_ACTIVATION,
    SEND_GRAD,
    Action,
)
from tessera.transforms.pipeline_schedules import actions_of, pipeline_op

Lists = list[list[Action]]


def _context() -> Context:
    ctx = Context()
    for dialect in (Builtin, Func, graph.Graph, schedule.Schedule):
        ctx.load_dialect(dialect)
    return ctx


def _parse(text: str) -> ModuleOp:
    module = Parser(_context(), text).parse_module()
    module.verify()
    return module


def _generic(module: ModuleOp) -> str:
    out = StringIO()
    Printer(stream=out, print_generic_format=True).print_op(module)
    return out.getvalue()


def _pipeline(module: ModuleOp) -> schedule.PipelineOp:
    (op,) = [o for o in module.walk() if isinstance(o, schedule.PipelineOp)]
    return op


def gpipe(ranks: int, microbatches: int, *, split_backward: bool = False) -> Lists:
    """A hand-built GPipe schedule (virtual = 1): all forwards, then all backwards."""
    last = ranks - 1
    lists: Lists = []
    for s in range(ranks):
        steps: list[Action] = []
        for mb in range(microbatches):
            steps += [Action(RECV_ACTIVATION, mb, s, s - 1)] if s > 0 else []
            steps.append(Action(FORWARD, mb, s))
            steps += [Action(SEND_ACTIVATION, mb, s, s + 1)] if s < last else []
        for mb in range(microbatches):
            steps += [Action(RECV_GRAD, mb, s, s + 1)] if s < last else []
            steps.append(Action(BACKWARD_INPUT if split_backward else BACKWARD, mb, s))
            steps += [Action(SEND_GRAD, mb, s, s - 1)] if s > 0 else []
        if split_backward:
            steps += [Action(BACKWARD_WEIGHT, mb, s) for mb in range(microbatches)]
        lists.append(steps)
    return lists


def looped(ranks: int, virtual: int, microbatches: int) -> Lists:
    """A hand-built schedule over ``virtual`` stages per rank (stage s on rank s % ranks):
    every forward in stage order, then every backward in reverse stage order."""
    stages = ranks * virtual
    lists: Lists = [[] for _ in range(ranks)]
    for s in range(stages):
        for mb in range(microbatches):
            lists[s % ranks] += [Action(RECV_ACTIVATION, mb, s, s - 1)] if s > 0 else []
            lists[s % ranks].append(Action(FORWARD, mb, s))
            lists[s % ranks] += [Action(SEND_ACTIVATION, mb, s, s + 1)] if s < stages - 1 else []
    for s in reversed(range(stages)):
        for mb in range(microbatches):
            lists[s % ranks] += [Action(RECV_GRAD, mb, s, s + 1)] if s < stages - 1 else []
            lists[s % ranks].append(Action(BACKWARD, mb, s))
            lists[s % ranks] += [Action(SEND_GRAD, mb, s, s - 1)] if s > 0 else []
    return lists


HAND_BUILT: dict[str, tuple[int, int, int, Lists]] = {
    "gpipe": (2, 2, 1, gpipe(2, 2)),
    "1f1b": (4, 3, 1, gpipe(4, 3)),
    "interleaved": (2, 2, 2, looped(2, 2, 2)),
    "zb-h1": (3, 2, 1, gpipe(3, 2, split_backward=True)),
    "single-rank": (1, 2, 3, looped(1, 3, 2)),
}


def _round_trip(kind: str, ranks: int, microbatches: int, virtual: int, lists: Lists) -> None:
    op = pipeline_op(kind, ranks, microbatches, virtual, lists)
    op.verify()
    assert actions_of(op) == lists
    module = ModuleOp([op])
    text = str(module)
    assert "schedule.pipeline {kind = " in text
    parsed = _parse(text)
    assert str(parsed) == text
    assert actions_of(_pipeline(parsed)) == lists
    generic = _parse(_generic(module))
    assert actions_of(_pipeline(generic)) == lists
    found = _pipeline(parsed)
    assert (found.schedule_kind, found.ranks.value.data, found.microbatches.value.data) == (
        kind,
        ranks,
        microbatches,
    )
    assert found.virtual.value.data == virtual


@pytest.mark.parametrize("name", sorted(HAND_BUILT))
def test_hand_built_lists_round_trip(name: str) -> None:
    ranks, microbatches, virtual, lists = HAND_BUILT[name]
    _round_trip(name, ranks, microbatches, virtual, lists)


GENERATED = [
    ("gpipe", 2, 2, 1),
    ("gpipe", 4, 3, 1),
    ("1f1b", 2, 2, 1),
    ("1f1b", 4, 8, 1),
    ("1f1b", 3, 2, 1),
    ("interleaved", 2, 4, 2),
    ("interleaved", 4, 8, 2),
    ("zb-h1", 2, 2, 1),
    ("zb-h1", 4, 8, 1),
]


@pytest.mark.parametrize(("kind", "ranks", "microbatches", "virtual"), GENERATED)
def test_generated_schedules_round_trip(
    kind: str, ranks: int, microbatches: int, virtual: int
) -> None:
    from tessera.transforms.pipeline_schedules import pipeline_schedule

    lists = pipeline_schedule(kind, ranks, microbatches, virtual)
    _round_trip(kind, ranks, microbatches, virtual, lists)


def test_syntax() -> None:
    text = str(ModuleOp([pipeline_op("1f1b", 2, 1, 1, gpipe(2, 1))]))
    assert text == (
        "builtin.module {\n"
        '  schedule.pipeline {kind = "1f1b", ranks = 2, microbatches = 1, virtual = 1} {\n'
        "    schedule.pipeline_rank {index = 0} {\n"
        "      schedule.action forward {microbatch = 0, stage = 0}\n"
        "      schedule.action send_activation {microbatch = 0, stage = 0, peer = 1}\n"
        "      schedule.action recv_grad {microbatch = 0, stage = 0, peer = 1}\n"
        "      schedule.action backward {microbatch = 0, stage = 0}\n"
        "    }\n"
        "    schedule.pipeline_rank {index = 1} {\n"
        "      schedule.action recv_activation {microbatch = 0, stage = 1, peer = 0}\n"
        "      schedule.action forward {microbatch = 0, stage = 1}\n"
        "      schedule.action backward {microbatch = 0, stage = 1}\n"
        "      schedule.action send_grad {microbatch = 0, stage = 1, peer = 0}\n"
        "    }\n"
        "  }\n"
        "}"
    )


# --- the verifier ---------------------------------------------------------------------------


def _rejects(lists: Lists, message: str, ranks: int = 2, microbatches: int = 2) -> None:
    op = pipeline_op("gpipe", ranks, microbatches, 1, lists)
    with pytest.raises(VerifyException) as error:
        op.verify()
    assert str(error.value) == message
    text = str(ModuleOp([pipeline_op("gpipe", ranks, microbatches, 1, lists)]))
    with pytest.raises(VerifyException, match="^" + re.escape(message)):
        _parse(text)


def test_rejects_duplicated_forward() -> None:
    lists = gpipe(2, 2)
    lists[0].insert(2, Action(FORWARD, 0, 0))
    _rejects(
        lists,
        "schedule.pipeline: rank 0: forward(mb=0, stage=0): duplicated "
        "(also at position 0 of this rank)",
    )


def test_rejects_missing_forward() -> None:
    lists = gpipe(2, 2)
    lists[1].remove(Action(FORWARD, 1, 1))
    _rejects(
        lists, "schedule.pipeline: rank 1: microbatch 1, stage 1: expected a forward, found none"
    )


def test_rejects_send_without_recv() -> None:
    lists = gpipe(2, 2)
    lists[1].remove(Action(RECV_ACTIVATION, 0, 1, 0))
    _rejects(
        lists,
        "schedule.pipeline: rank 0: send_activation(mb=0, stage=0->1): "
        "no matching recv_activation(mb=0, stage=1->0) on rank 1",
    )


def test_rejects_recv_without_send() -> None:
    lists = gpipe(2, 2)
    lists[1].remove(Action(SEND_GRAD, 1, 1, 0))
    _rejects(
        lists,
        "schedule.pipeline: rank 0: recv_grad(mb=1, stage=0->1): "
        "no matching send_grad(mb=1, stage=1->0) on rank 1",
    )


def test_rejects_missing_transfer_pair() -> None:
    lists = gpipe(2, 2)
    lists[0].remove(Action(SEND_ACTIVATION, 1, 0, 1))
    lists[1].remove(Action(RECV_ACTIVATION, 1, 1, 0))
    _rejects(
        lists,
        "schedule.pipeline: rank 1: microbatch 1, stage 1: expected a recv_activation "
        "from stage 0 (rank 0), found none",
    )


def test_rejects_stage_on_wrong_rank() -> None:
    lists = gpipe(2, 2)
    lists[1].remove(Action(FORWARD, 0, 1))
    lists[0].append(Action(FORWARD, 0, 1))
    _rejects(lists, "schedule.pipeline: rank 0: forward(mb=0, stage=1): stage 1 runs on rank 1")


def test_rejects_non_adjacent_peer() -> None:
    lists = gpipe(3, 1)
    lists[0][1] = Action(SEND_ACTIVATION, 0, 0, 2)
    _rejects(
        lists,
        "schedule.pipeline: rank 0: send_activation(mb=0, stage=0->2): "
        "expected peer 1 (stage + 1), found 2",
        ranks=3,
        microbatches=1,
    )


def test_rejects_out_of_range() -> None:
    lists = gpipe(2, 2)
    lists[0].append(Action(FORWARD, 2, 0))
    _rejects(
        lists,
        "schedule.pipeline: rank 0: forward(mb=2, stage=0): expected 0 <= microbatch < 2, found 2",
    )
    lists = gpipe(2, 2)
    lists[0].append(Action(FORWARD, 0, 2))
    _rejects(
        lists,
        "schedule.pipeline: rank 0: forward(mb=0, stage=2): "
        "expected 0 <= stage < 2 (ranks * virtual), found 2",
    )


def test_rejects_backward_and_split_backward() -> None:
    lists = gpipe(2, 2)
    lists[0].append(Action(BACKWARD_WEIGHT, 1, 0))
    _rejects(
        lists,
        "schedule.pipeline: rank 0: microbatch 1, stage 0: expected a backward or a "
        "backward_input and a backward_weight, found backward and backward_weight",
    )
    lists = gpipe(2, 2, split_backward=True)
    lists[1].remove(Action(BACKWARD_WEIGHT, 0, 1))
    _rejects(
        lists,
        "schedule.pipeline: rank 1: microbatch 0, stage 1: expected a backward or a "
        "backward_input and a backward_weight, found backward_input",
    )


def test_rejects_recv_after_its_computation() -> None:
    lists = gpipe(2, 2)
    recv = Action(RECV_GRAD, 0, 0, 1)
    lists[0].remove(recv)
    lists[0].append(recv)
    _rejects(
        lists,
        "schedule.pipeline: rank 0: backward(mb=0, stage=0): "
        "expected after recv_grad(mb=0, stage=0->1)",
    )


def test_rejects_backward_before_forward() -> None:
    lists = gpipe(1, 1)
    _rejects(
        [list(reversed(lists[0]))],
        "schedule.pipeline: rank 0: backward(mb=0, stage=0): expected after forward(mb=0, stage=0)",
        ranks=1,
        microbatches=1,
    )


def test_rejects_wrong_number_or_order_of_ranks() -> None:
    lists = gpipe(2, 2)
    op = pipeline_op("gpipe", 3, 2, 1, lists)
    with pytest.raises(
        VerifyException,
        match=r"^schedule.pipeline: expected 3 schedule.pipeline_rank ops \(one per rank\), found 2",
    ):
        op.verify()
    op = pipeline_op("gpipe", 2, 2, 1, lists)
    first = op.rank_ops[0]
    first.detach()
    op.body.block.add_op(first)
    with pytest.raises(
        VerifyException,
        match=r"^schedule.pipeline: expected the ranks in order, found index 1 at position 0",
    ):
        op.verify()


def test_rejects_bad_kind() -> None:
    text = str(ModuleOp([pipeline_op("gpipe", 1, 1, 1, gpipe(1, 1))]))
    with pytest.raises(
        VerifyException,
        match=r"^schedule.action: kind must be one of \('forward', .*\), found 'fwd'",
    ):
        _parse(text.replace("action forward", "action fwd"))


def test_rejects_peer_on_computation_and_missing_peer_on_transfer() -> None:
    text = str(ModuleOp([pipeline_op("gpipe", 2, 1, 1, gpipe(2, 1))]))
    with pytest.raises(
        VerifyException,
        match=r"^schedule.action forward: expected no peer \(a computation has none\), found 1",
    ):
        _parse(
            text.replace(
                "forward {microbatch = 0, stage = 0}",
                "forward {microbatch = 0, stage = 0, peer = 1}",
            )
        )
    with pytest.raises(
        VerifyException,
        match=r"^schedule.action send_activation: expected a peer stage \(a transfer names its peer\)",
    ):
        _parse(text.replace("stage = 0, peer = 1}", "stage = 0}"))


def test_action_outside_a_rank() -> None:
    text = (
        "func.func @f() {\n  schedule.action forward {microbatch = 0, stage = 0}\n  func.return\n}"
    )
    with pytest.raises(
        VerifyException, match=r"'schedule\.action' expects parent op 'schedule\.pipeline_rank'"
    ):
        _parse(text)


# --- the pipeline-schedule pass ----------------------------------------------------------------


def _staged_function(stages: int) -> str:
    body = "".join(
        f"  schedule.stage {{index = {i}, count = {stages}}} {{\n    schedule.yield\n  }}\n"
        for i in range(stages)
    )
    return f"func.func @f() {{\n{body}  func.return\n}}"


@pytest.mark.parametrize(("kind", "ranks", "microbatches", "virtual"), GENERATED)
def test_pass_inserts_the_generated_schedule(
    kind: str, ranks: int, microbatches: int, virtual: int
) -> None:
    from tessera.passes.pipeline_schedule import PipelineSchedulePass
    from tessera.transforms.pipeline_schedules import pipeline_schedule

    module = _parse(_staged_function(ranks * virtual))
    for _ in range(2):  # the second run replaces the first schedule
        PipelineSchedulePass(kind, microbatches, virtual).apply(Context(), module)
    module.verify()
    (function,) = module.ops
    *_, last_stage, pipeline, ret = function.body.block.ops
    assert isinstance(last_stage, schedule.StageOp)
    assert pipeline is _pipeline(module)  # the only one: the first run's was replaced
    assert ret.name == "func.return"
    assert actions_of(pipeline) == pipeline_schedule(kind, ranks, microbatches, virtual)
