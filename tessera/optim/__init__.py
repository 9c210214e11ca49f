"""Optimizers as graph ops: SGD (with momentum) and AdamW on pytrees of parameters.

They are plain functions of traced tensors, so a whole training step — forward,
``graph.backward`` and the update — compiles into one program (the updates become fused
elementwise kernels). State lives in pytrees of arrays that the step takes and returns;
``*_state(params)`` builds the initial state from the (torch) parameters::

    state = optim.adamw_state(params)
    params, state = step(params, state, batch)   # step calls optim.adamw inside

The update rules are torch.optim's (``SGD`` with ``dampening=0``; ``AdamW`` with decoupled
weight decay and bias correction).

``lr`` is a float, a schedule (:mod:`tessera.optim.schedules`: ``warmup_cosine``, ...) or
any function of the traced step count built of ``tessera.op`` ops; a scheduled ``lr`` is
evaluated inside the compiled step from the step count kept in the optimizer state
(``state["step"]``: the updates already done), so no step recompiles.
``weight_decay_mask`` chooses the parameters weight decay applies to, as torch's
parameter groups do: a predicate on each parameter's dotted path name (``"blocks.0.ln.w"``)
or a pytree of bools shaped like the parameters (True: decayed); see :func:`decay_mask`.

:class:`SGD` and :class:`AdamW` bundle a rule with its hyper-parameters for
``graph.training_step(optimizer=...)``, which also needs to know how the state is laid
out (:meth:`state_layout`) to shard it for ZeRO.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from tessera import op
from tessera.errors import ArgumentError, TraceError
from tessera.frontend import pytree
from tessera.frontend.region import region
from tessera.frontend.tracer import Tensor, current_trace, is_tracing
from tessera.ir import graph
from tessera.optim import schedules

LearningRate = float | Callable[[Tensor], Any]  # a number, a schedule, a function of the step


def _map(fn: Any, *trees: Any) -> Any:
    leaves = [pytree.flatten(t)[0] for t in trees]
    tree = pytree.flatten(trees[0])[1]
    return pytree.unflatten(tree, [fn(*xs) for xs in zip(*leaves, strict=True)])


def _zeros(params: Any) -> Any:
    return _map(lambda p: torch.zeros_like(torch.as_tensor(p)), params)


def _step_count(params: Any) -> torch.Tensor:
    """A zero step count: f64 when a parameter is f64, else f32."""
    leaves = [torch.as_tensor(p) for p in pytree.flatten(params)[0]]
    wide = any(p.dtype == torch.float64 for p in leaves)
    return torch.zeros((), dtype=torch.float64 if wide else torch.float32)


def sgd_state(params: Any, step: bool = False) -> dict[str, Any]:
    """The momentum buffers of :func:`sgd` (zeros like the parameters); ``step=True``
    adds the step count a scheduled ``lr`` needs: ``{"step", "momentum"}``."""
    momentum = {"momentum": _zeros(params)}
    return {"step": _step_count(params), **momentum} if step else momentum


def sgd(
    params: Any,
    grads: Any,
    state: dict[str, Any] | None = None,
    lr: LearningRate = 1e-2,
    momentum: float = 0.0,
    weight_decay: float = 0.0,
    weight_decay_mask: Any = None,
) -> tuple[Any, dict[str, Any] | None]:
    """One SGD step: ``g += wd p; b = momentum b + g; p -= lr b`` (torch's first step
    sets ``b = g``, which zero-initialised buffers give too). A scheduled ``lr`` reads
    and advances ``state["step"]``."""
    if momentum and (state is None or "momentum" not in state):
        raise ValueError("sgd with momentum needs its state: optim.sgd_state(params)")
    count = state.get("step") if state else None
    rate = _learning_rate(lr, count, "optim.sgd", "optim.sgd_state(params, step=True)")
    if weight_decay:
        decay = decay_mask(weight_decay_mask, params, "optim.sgd")
        grad_leaves, tree = pytree.flatten(grads)
        grad_leaves = [
            g + p * weight_decay if d else g
            for g, p, d in zip(grad_leaves, pytree.flatten(params)[0], decay, strict=True)
        ]
        grads = pytree.unflatten(tree, grad_leaves)
    new_state = dict(state) if state is not None else None
    if count is not None:
        new_state["step"] = count + 1.0  # type: ignore[index]
    if momentum:
        buffers = _map(lambda b, g: b * momentum + g, state["momentum"], grads)  # type: ignore[index]
        new_state["momentum"] = buffers  # type: ignore[index]
        return _map(lambda p, b: p - b * _like(rate, p), params, buffers), new_state
    return _map(lambda p, g: p - g * _like(rate, p), params, grads), new_state


def adamw_state(params: Any) -> dict[str, Any]:
    """AdamW's state: the step count (a scalar: f64 when a parameter is f64, else f32)
    and the two moment estimates."""
    return {"step": _step_count(params), "m": _zeros(params), "v": _zeros(params)}


def adamw(
    params: Any,
    grads: Any,
    state: dict[str, Any],
    lr: LearningRate = 1e-3,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    weight_decay: float = 1e-2,
    weight_decay_mask: Any = None,
) -> tuple[Any, dict[str, Any]]:
    """One AdamW step (torch.optim.AdamW's update); a scheduled ``lr`` is evaluated at
    ``state["step"]``, the updates already done."""
    beta1, beta2 = betas
    rate = _learning_rate(lr, state["step"], "optim.adamw", "optim.adamw_state(params)")
    step = state["step"] + 1.0
    correction1 = 1.0 - op.power(op.full((), beta1, step.dtype), step)
    correction2 = 1.0 - op.power(op.full((), beta2, step.dtype), step)
    decay = decay_mask(weight_decay_mask, params, "optim.adamw") if weight_decay else None
    leaves, tree = pytree.flatten(params)
    flags = decay if decay is not None else [weight_decay != 0] * len(leaves)
    columns = (
        leaves, pytree.flatten(grads)[0], pytree.flatten(state["m"])[0],
        pytree.flatten(state["v"])[0],
    )  # fmt: skip
    static = (rate, correction1, correction2, betas, eps, weight_decay)
    if not _in_regions():
        new = [_adamw_leaf(*row, *static, d) for *row, d in zip(*columns, flags, strict=True)]
    else:  # one region call per group of parameters one region call reads (a layer's)
        new = [()] * len(leaves)
        update = region(_adamw_group)
        for reader, group in region_groups(leaves):
            if reader is None:  # read by no region call (a scan's stacked parameters, the
                # embeddings): updated here, in place of the donated state, as unrolled
                # (a region's results are new buffers: a whole copy of the state at once)
                for i in group:
                    new[i] = _adamw_leaf(*(column[i] for column in columns), *static, flags[i])
                continue
            rows = [[column[i] for i in group] for column in columns]
            results = update(*rows, *static, tuple(flags[i] for i in group))
            for i, p, m, v in zip(group, *results, strict=True):
                new[i] = (p, m, v)
    params_m_v = [pytree.unflatten(tree, [n[i] for n in new]) for i in range(3)]
    return params_m_v[0], {"step": step, "m": params_m_v[1], "v": params_m_v[2]}


def _adamw_leaf(
    p: Any,
    g: Any,
    m: Any,
    v: Any,
    rate: Any,
    correction1: Any,
    correction2: Any,
    betas: tuple[float, float],
    eps: float,
    weight_decay: float,
    decayed: bool,
) -> tuple[Any, Any, Any]:
    """AdamW's update of one parameter: the parameter and its two moments."""
    beta1, beta2 = betas
    m = m * beta1 + g * (1.0 - beta1)
    v = v * beta2 + g * g * (1.0 - beta2)
    lr_p = _like(rate, p)
    if decayed:
        p = p * (1.0 - lr_p * weight_decay)
    return p - (m / correction1) * lr_p / (op.sqrt(v / correction2) + eps), m, v


def _adamw_group(
    ps: list[Any],
    gs: list[Any],
    ms: list[Any],
    vs: list[Any],
    rate: Any,
    correction1: Any,
    correction2: Any,
    betas: tuple[float, float],
    eps: float,
    weight_decay: float,
    decayed: tuple[bool, ...],
) -> tuple[list[Any], list[Any], list[Any]]:
    """AdamW's update of a group of parameters: the parameters and their two moments."""
    new = [
        _adamw_leaf(p, g, m, v, rate, correction1, correction2, betas, eps, weight_decay, d)
        for p, g, m, v, d in zip(ps, gs, ms, vs, decayed, strict=True)
    ]
    return [n[0] for n in new], [n[1] for n in new], [n[2] for n in new]


def _in_regions() -> bool:
    """Whether the program being traced calls regions: its update is then region calls
    too (a step built from regions updates each distinct layer signature once)."""
    return is_tracing() and bool(current_trace().functions.functions)


def region_groups(leaves: Sequence[Any]) -> list[tuple[Any, list[int]]]:
    """The indices of ``leaves`` (parameters of the function being traced) grouped by the
    first region call (``graph.call``) of the traced function that reads each, directly
    or through sharding constraints and casts (a layer's parameters: one group per layer),
    with that call; the leaves no call reads are one group, with None (a ``graph.scan``
    is no such call: it reads every layer's stacked parameters at once). Groups are in the
    order of their first leaf."""
    block = current_trace().block
    position = {o: i for i, o in enumerate(block.ops)}
    groups: dict[Any, list[int]] = {}
    for index, leaf in enumerate(leaves):
        reader = _first_call(leaf.value, position) if isinstance(leaf, Tensor) else None
        groups.setdefault(reader, []).append(index)
    return list(groups.items())


def _first_call(value: Any, position: dict[Any, int]) -> Any:
    """The first ``graph.call`` in ``position``'s block reading ``value`` (through
    ``graph.shard`` and ``graph.cast``), or None."""
    found, work, seen = None, [value], set()
    while work:
        for use in work.pop().uses:
            user = use.operation
            if user in seen or user not in position:
                continue
            seen.add(user)
            if isinstance(user, graph.CallOp):
                if found is None or position[user] < position[found]:
                    found = user
            elif isinstance(user, graph.ShardOp | graph.CastOp):
                work.append(user.results[0])
    return found


def _like(value: Any, p: Any) -> Any:
    """The learning rate ``value`` (a float or a 0-d tensor) in ``p``'s dtype, as a float
    is (a weakly typed scalar): a scheduled rate leaves ``p``'s update in its dtype."""
    if isinstance(value, Tensor) and isinstance(p, Tensor):
        return op.astype(value, p.dtype)
    return value


def _learning_rate(lr: LearningRate, step: Any, owner: str, state_hint: str) -> Any:
    """``lr`` as a float or a 0-d tensor: a schedule or function evaluated at the traced
    step count ``step`` (the updates already done)."""
    if not callable(lr):
        return lr
    if step is None:
        raise ArgumentError(
            f"{owner}: a scheduled lr ({_describe(lr)}) needs the step count in the "
            f"optimizer state: {state_hint}"
        )
    try:
        value = lr(step)
    except TraceError as error:
        raise TraceError(
            f"{owner}: lr={_describe(lr)} is called with the traced step count (a 0-d "
            f"tensor) inside the compiled step, so it must be built of tessera.op ops "
            f"(op.cos, op.minimum, op.where, ...): {error}"
        ) from None
    if isinstance(value, bool) or not isinstance(value, (Tensor, int, float)):
        raise ArgumentError(
            f"{owner}: lr={_describe(lr)} must return a number or a 0-d tensor, "
            f"found {type(value).__name__}"
        )
    if isinstance(value, Tensor) and (value.ndim != 0 or not value.dtype.is_float):
        raise ArgumentError(
            f"{owner}: lr={_describe(lr)} must return a 0-d float tensor, found "
            f"{value.dtype} of shape {list(value.shape)}"
        )
    return value


def _describe(lr: Any) -> str:
    if isinstance(lr, schedules.Schedule):
        return f"optim.schedules.{lr.kind}(...)"
    return getattr(lr, "__name__", type(lr).__name__)


def path_names(params: Any) -> list[str]:
    """The dotted path name of each leaf of ``params``, in ``pytree.flatten`` order: dict
    keys and list or tuple indices joined by dots (``{"blocks": [{"ln": {"w": ...}}]}``
    gives ``"blocks.0.ln.w"``; namedtuples give their field names; a lone leaf ``""``)."""
    names: list[str] = []

    def visit(node: pytree.TreeDef, path: str) -> None:
        if node.kind == "leaf":
            names.append(path)
            return
        if node.kind == "dict":
            keys: Any = node.meta
        elif node.kind == "namedtuple":
            keys = node.meta._fields
        else:
            keys = range(len(node.children))
        for key, child in zip(keys, node.children, strict=True):
            visit(child, f"{path}.{key}" if path else str(key))

    visit(pytree.flatten(params)[1], "")
    return names


def decay_mask(mask: Any, params: Any, owner: str = "optim") -> list[bool]:
    """Per leaf of ``params``: whether weight decay applies to it. ``mask`` is None (all
    of them), a predicate called with each leaf's dotted path name (:func:`path_names`)
    returning a bool, or a pytree of bools with the parameters' structure."""
    leaves, tree = pytree.flatten(params)
    if mask is None:
        return [True] * len(leaves)
    if callable(mask):
        flags = []
        for name in path_names(params):
            flag = mask(name)
            if not isinstance(flag, bool):
                raise ArgumentError(
                    f"{owner}: weight_decay_mask must return a bool for each parameter "
                    f"path name, found {flag!r} for {name!r}"
                )
            flags.append(flag)
        return flags
    flags, mask_tree = pytree.flatten(mask)
    if mask_tree != tree:
        raise ArgumentError(
            f"{owner}: weight_decay_mask does not have the parameters' structure: "
            f"{_structure_difference(mask, params)}; pass a pytree of bools shaped like "
            f"the parameters, or a predicate on their path names"
        )
    names = path_names(params)
    for name, flag in zip(names, flags, strict=True):
        if not isinstance(flag, bool):
            raise ArgumentError(
                f"{owner}: weight_decay_mask must hold bools, found {flag!r} at {name!r}"
            )
    return flags


def _structure_difference(mask: Any, params: Any) -> str:
    have, want = path_names(mask), path_names(params)
    missing = [n for n in want if n not in have]
    extra = [n for n in have if n not in want]
    parts = []
    if missing:
        parts.append(f"it has no entry for {missing}")
    if extra:
        parts.append(f"it has entries {extra} that are not parameters")
    if not parts:  # same names, different containers (a tuple for a list, ...)
        parts.append(
            f"its containers differ: {pytree.flatten(mask)[1]} vs {pytree.flatten(params)[1]}"
        )
    return " and ".join(parts)


def _check_hyperparameters(name: str, **values: float) -> None:
    """torch.optim's checks: every value a finite number >= 0 (betas below 1)."""
    for key, value in values.items():
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise ArgumentError(f"optim.{name}: {key} must be a number, found {value!r}")
        if not 0 <= value < (1 if key.startswith("beta") else math.inf):
            bound = "in [0, 1)" if key.startswith("beta") else "a finite number >= 0"
            raise ArgumentError(f"optim.{name}: {key} must be {bound}, found {value!r}")


def _check_options(name: str, lr: Any, mask: Any) -> dict[str, Any]:
    """Checks ``weight_decay_mask``'s kind; the learning rate to check as a number (none
    when it is a schedule or function)."""
    if mask is not None and not callable(mask):
        leaves = pytree.flatten(mask)[0]
        if not all(isinstance(x, bool) for x in leaves):
            raise ArgumentError(
                f"optim.{name}: weight_decay_mask must be a predicate on parameter path "
                f"names or a pytree of bools, found {mask!r}"
            )
    return {} if callable(lr) else {"lr": lr}


@dataclass(frozen=True)
class SGD:
    """SGD with optional momentum and weight decay (torch.optim.SGD, ``dampening=0``).

    ``lr``: a float, a schedule or a function of the traced step count (the state then
    keeps the step count); ``weight_decay_mask``: which parameters are decayed (a
    predicate on their dotted path names or a pytree of bools; default all)."""

    lr: LearningRate = 1e-2
    momentum: float = 0.0
    weight_decay: float = 0.0
    weight_decay_mask: Any = None

    def __post_init__(self) -> None:
        lr = _check_options("SGD", self.lr, self.weight_decay_mask)
        _check_hyperparameters("SGD", **lr, momentum=self.momentum, weight_decay=self.weight_decay)

    @property
    def scheduled(self) -> bool:
        """Whether the learning rate depends on the step (then the state counts steps)."""
        return callable(self.lr)

    def init(self, params: Any) -> dict[str, Any]:
        if self.weight_decay:
            decay_mask(self.weight_decay_mask, params, "optim.SGD")  # errors now, not at trace
        state = sgd_state(params, step=self.scheduled)
        return state if self.momentum else {k: v for k, v in state.items() if k == "step"}

    def update(self, params: Any, grads: Any, state: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        new_params, new_state = sgd(
            params, grads, state or None, self.lr, self.momentum, self.weight_decay,
            self.weight_decay_mask,
        )  # fmt: skip
        return new_params, new_state or {}

    def state_layout(self, like_params: Any, scalar: Any) -> dict[str, Any]:
        """The state's pytree with ``like_params`` for buffers shaped like the parameters
        and ``scalar`` for scalars (the step count, kept when ``lr`` is scheduled)."""
        layout = {"step": scalar} if self.scheduled else {}
        return {**layout, "momentum": like_params} if self.momentum else layout


@dataclass(frozen=True)
class AdamW:
    """AdamW (torch.optim.AdamW): decoupled weight decay, bias-corrected moments.

    ``lr``: a float, a schedule or a function of the traced step count;
    ``weight_decay_mask``: which parameters are decayed (a predicate on their dotted path
    names or a pytree of bools; default all)."""

    lr: LearningRate = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 1e-2
    weight_decay_mask: Any = None

    def __post_init__(self) -> None:
        if not isinstance(self.betas, (tuple, list)) or len(self.betas) != 2:
            raise ArgumentError(f"optim.AdamW: betas must be a pair, found {self.betas!r}")
        lr = _check_options("AdamW", self.lr, self.weight_decay_mask)
        _check_hyperparameters(
            "AdamW", **lr, beta1=self.betas[0], beta2=self.betas[1], eps=self.eps,
            weight_decay=self.weight_decay,
        )  # fmt: skip

    def init(self, params: Any) -> dict[str, Any]:
        if self.weight_decay:
            decay_mask(self.weight_decay_mask, params, "optim.AdamW")  # errors now, not at trace
        return adamw_state(params)

    def update(self, params: Any, grads: Any, state: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        return adamw(
            params, grads, state, self.lr, self.betas, self.eps, self.weight_decay,
            self.weight_decay_mask,
        )  # fmt: skip

    def state_layout(self, like_params: Any, scalar: Any) -> dict[str, Any]:
        """The state's pytree with ``like_params`` for the moments and ``scalar`` for the
        step count."""
        return {"step": scalar, "m": like_params, "v": like_params}
