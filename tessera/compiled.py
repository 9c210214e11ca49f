"""``ts.jit``: trace a Python function once per signature, then run the compiled program.

The signature of a call is its pytree structure, the shape and dtype of every array
leaf, and the value of every static leaf (Python scalars, strings, None and arguments
named in ``static_argnums``). A second call with the same signature reuses the compiled
program without retracing (``JitFunction.trace_count`` counts traces).
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp, UnitAttr
from xdsl.ir import Attribute

from tessera import environment, numerics, program_cache, schedule
from tessera import op as _op_library  # noqa: F401 (gives traced tensors their operators)
from tessera.backends import distributed, schedule_runner
from tessera.backends.collective_info import CollectiveInfo, collectives
from tessera.backends.cuda_graphs import CudaGraphs, host_kernels
from tessera.backends.execution import (
    Execution,
    Processes,
    VirtualMesh,
    execution_for,
    kernel_device,
)
from tessera.backends.layout import assemble, piece
from tessera.backends.reference import graph_plan
from tessera.dist.collectives import MESH_SYMBOL, shard
from tessera.dist.shard_spec import ShardSpec, check_shard_specs
from tessera.dist.tensor import DistTensor
from tessera.driver import (
    KERNEL_BACKENDS,
    STAGES,
    CompileConfig,
    pipeline_string,
    run_stage,
    stage_passes,
)
from tessera.dtypes import as_dtype
from tessera.errors import (
    ArgumentError,
    ExecutionError,
    ShardingError,
    TesseraError,
    TraceError,
)
from tessera.frontend import pytree
from tessera.frontend.tracer import Tensor, Trace, current_trace, is_tracing, tracing
from tessera.ir.abstract import AbstractTensor
from tessera.ir.graph import DONATED
from tessera.ir.mesh import Mesh
from tessera.ir.serialize import SerializeError
from tessera.ir.sharding import (
    SHARDING_KEY,
    Sharding,
    ShardingAttr,
    arg_sharding,
    value_sharding,
)
from tessera.passes.plan_memory import peak_bytes
from tessera.program_cache import ProgramCache
from tessera.schedule import ScheduleOptions


def default_kernels() -> str:
    """Generated Triton kernels, unless ``TESSERA_KERNELS=reference`` asks for the oracle."""
    return environment.kernels()


def is_array(leaf: Any) -> bool:
    """Whether a leaf of a call's arguments is an array (traced; the others are static):
    a torch tensor, numpy array or ``dist.tensor``; numpy scalars (``np.float32(1)``)
    count as 0-d arrays."""
    return isinstance(leaf, (torch.Tensor, np.ndarray, np.generic, DistTensor))


_DTYPES: dict[Any, Any] = {}  # torch or numpy dtype -> tessera DType (as_dtype, cached)


def _abstract(leaf: torch.Tensor | np.ndarray | np.generic | DistTensor) -> AbstractTensor:
    dtype = _DTYPES.get(leaf.dtype)
    if dtype is None:
        dtype = _DTYPES[leaf.dtype] = as_dtype(leaf.dtype)
    if isinstance(leaf, torch.Tensor):
        return AbstractTensor(tuple(leaf.shape), dtype)
    return AbstractTensor(tuple(int(d) for d in leaf.shape), dtype)


@dataclass(frozen=True)
class Signature:
    """What a compiled program is specialised on."""

    treedef: pytree.TreeDef
    leaves: tuple[Any, ...]  # AbstractTensor for arrays, the value itself for static leaves
    shardings: tuple[Sharding | None, ...] = ()  # per array leaf, when traced with a mesh


@dataclass(frozen=True)
class ModelStateMemory:
    """Per-rank bytes of a training step's state (the ZeRO paper's "model states")."""

    params: int
    grads: int  # the reduced gradients the optimizer consumes
    optimizer_state: int

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer_state


@dataclass(frozen=True)
class MemoryStats:
    """Per-rank memory of a compiled program."""

    peak_bytes: int  # arguments, results and intermediates live at the worst point
    model_states: ModelStateMemory | None = None  # training steps (graph.training_step)


class Lowered:
    """A traced program for one signature (like ``jax.jit(f).lower(...)``)."""

    def __init__(
        self,
        name: str,
        module: ModuleOp,
        signature: Signature,
        out_tree: pytree.TreeDef,
        config: CompileConfig,
    ):
        self.name = name
        self.module = module  # as traced
        self.signature = signature
        self.out_tree = out_tree
        self.config = config
        self._stages: dict[str, ModuleOp] = {"traced": module}
        # compiled stages on disk, shared by every process tracing the same program
        self._program_cache = ProgramCache(module, config) if program_cache.enabled() else None
        self._sources: dict[str, str] | None = None  # Triton source by tile kernel
        self._runner: schedule_runner.KernelBinder | None = None
        self._plans: dict[tuple[Any, tuple[int, ...]], Any] = {}  # launch plans
        self._graph_plan: Callable[..., list[torch.Tensor]] | None = None
        self.plan_builds = 0  # launch plans built (one per execution and ranks)
        self._digest: bytes | None = None
        self._avals: list[AbstractTensor] | None = None
        self._dtypes: list[torch.dtype] | None = None
        self._devices: dict[torch.device, VirtualMesh] = {}
        self._layout_cache: tuple[list[Sharding], list[Sharding]] | None = None
        self.last_run: distributed.RunRecord | None = None  # set by multi-process calls
        # set by graph.training_step: the per-rank bytes of parameters, gradients, state
        self.model_states: Callable[[], ModelStateMemory] | None = None
        self.graphs: CudaGraphs | None = None  # set by ts.jit(cuda_graphs=True)

    @property
    def mesh(self) -> Mesh | None:
        return self.config.mesh

    @property
    def kernels(self) -> str:
        return self.config.kernels

    @property
    def schedule_options(self) -> ScheduleOptions:
        return self.config.schedule

    def pipeline(self, *stages: str) -> str:
        """The passes that compile this program (or only ``stages``' passes), as a
        ``tessera-opt -p`` string: ``tessera-opt`` given the text of the stage before the
        first of ``stages`` reproduces the text of the last."""
        return pipeline_string(self.config, stages or STAGES[1:])

    def as_text(self, stage: str = "graph") -> str:
        """The IR at ``stage``: ``"traced"`` (as traced), ``"autodiff"`` (a gradient
        program's forward and backward; other programs: as traced), ``"graph"`` (cleaned up by
        canonicalize, cse and dce; global shapes), ``"sharded"`` (every
        value annotated with its sharding, collectives inserted), ``"partitioned"``
        (the per-rank program, local shapes), ``"schedule"`` (kernels, collective
        start/wait pairs, buffer offsets) or ``"tile"`` (the schedule plus one
        ``tile.kernel`` per kernel)."""
        return str(self.module_at(stage))

    def triton_source(self) -> dict[str, str]:
        """The generated Triton source of every kernel, by kernel name (emitted once, or
        read from the program cache)."""
        if self._sources is None and self._program_cache:
            self._sources = self._program_cache.load_sources()
        if self._sources is None:
            from tessera.backends.triton.emit import emit_module

            self._sources = emit_module(self.module_at("tile"))
            if self._program_cache:
                self._program_cache.store_sources(self._sources)
        return dict(self._sources)

    def kernel_runner(self) -> schedule_runner.KernelBinder:
        """How kernels run: generated Triton kernels (compiled on a GPU, interpreted on a
        CPU; gather indices and cross-entropy labels range-checked first) or the
        reference executor (``kernels="reference"``, the test oracle). Launch plans bind
        every kernel with it once; it is also callable as ``runner(kernel, inputs,
        context)``."""
        if self._runner is None:
            if self.kernels == "reference":
                self._runner = schedule_runner.reference_kernel
            else:
                from tessera.backends.triton.runtime import TritonKernels

                self._runner = TritonKernels(self.module_at("tile"), sources=self.triton_source())
        return self._runner

    def launch_plan(self, execution: Execution, ranks: Sequence[int] | None = None) -> Any:
        """The scheduled program planned for ``execution`` and ``ranks`` (by default all
        it runs): built at the first call, then reused by every call
        (:mod:`tessera.backends.launch_plan`)."""
        key = (execution.plan_key, tuple(execution.ranks if ranks is None else ranks))
        plan = self._plans.get(key)
        if plan is None:
            # Triton kernels: the tile stage holds the schedule and the kernels it names,
            # so a program read from the program cache loads one module, not two
            stage = "schedule" if self.kernels == "reference" else "tile"
            plan = execution.plan(
                self.module_at(stage), self.name, self.kernel_runner(), list(key[1]),
                self.digest(),
            )  # fmt: skip
            self._plans[key] = plan
            self.plan_builds += 1
        return plan

    def _run_plan(
        self, execution: Execution, rank_args: Sequence[Sequence[torch.Tensor]]
    ) -> list[tuple[torch.Tensor, ...]]:
        """Runs the launch plan for ``execution``, through a CUDA graph with
        ``cuda_graphs=True`` (:mod:`tessera.backends.cuda_graphs`)."""
        plan = self.launch_plan(execution)
        if self.graphs is None:
            return execution.run_plan(plan, rank_args)

        def host() -> set[str]:  # read at the plan's first call only
            stage = "schedule" if self.kernels == "reference" else "tile"
            return host_kernels(self.module_at(stage), self.name)

        return self.graphs.run(execution, plan, rank_args, host)

    def digest(self) -> bytes:
        """A digest of the whole program: of Tessera's code, the compile configuration and
        the traced module (the program cache's key; computed once). Processes compare it
        before running the program."""
        if self._digest is None:
            cache = self._program_cache or ProgramCache(self.module, self.config)
            try:
                self._digest = bytes.fromhex(cache.key)
            except SerializeError:  # not storable: the digest of its text
                self._digest = hashlib.sha256(str(self.module).encode()).digest()
        return self._digest

    def module_at(self, stage: str) -> ModuleOp:
        """The module after ``stage``'s passes (computed once, on a copy)."""
        if stage not in STAGES:
            raise TesseraError(f"unknown or not yet available stage {stage!r}; available: {STAGES}")
        if stage not in self._stages and not stage_passes(stage, self.config):
            # a stage this program does not have (autodiff): the previous stage's module
            self._stages[stage] = self.module_at(STAGES[STAGES.index(stage) - 1])
        if stage not in self._stages:
            stored = self._program_cache.load(stage) if self._program_cache else None
            if stored is None:
                previous = self.module_at(STAGES[STAGES.index(stage) - 1])
                stored = run_stage(stage, previous, self.config)
                if self._program_cache:
                    self._program_cache.store(stage, stored)
            self._stages[stage] = stored
        return self._stages[stage]

    def memory(self) -> MemoryStats:
        """Per-rank memory of the scheduled program (``plan-memory``'s buffer plan) and,
        for a training step, of its parameters, gradients and optimizer state."""
        return MemoryStats(
            peak_bytes=peak_bytes(self.module_at("schedule"))[self.name],
            model_states=self.model_states() if self.model_states else None,
        )

    def simulate(self, topology: Any = None) -> Any:
        """The scheduled program simulated on ``topology`` (a ``tessera.perf.Topology``, a
        preset name such as ``"gb200_nvl72"``, or a JSON file; by default the mesh's
        ``topology=``, else DGX H100 nodes enough for the mesh): step time, exposed
        communication and a timeline (``.save_trace("trace.json")``); see
        :mod:`tessera.perf.simulate`."""
        from tessera.perf.simulate import simulate

        return simulate(self.module_at("schedule"), self.name, self.mesh, topology)

    def collectives(self) -> list[CollectiveInfo]:
        """The communicating collectives each rank runs, in program order."""
        if self.mesh is None:
            return []
        return collectives(self.module_at("partitioned"))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        leaves, _ = pytree.flatten((args, kwargs))
        return self.run(leaves)

    def run(self, leaves: Sequence[Any], checked: bool = False) -> Any:
        """Runs the program on the array ``leaves`` of a call (global values, or
        ``dist.tensor`` pieces): on the virtual mesh the global results come back; in a
        multi-process job each result is this rank's
        :class:`~tessera.backends.distributed.LocalResult`. ``checked``: the caller
        matched the arrays' shapes and dtypes with the signature already."""
        arrays = [leaf for leaf in leaves if is_array(leaf)]
        expected = self._input_avals()
        if not checked:
            found = [_abstract(a) for a in arrays]
            if found != expected:
                raise ExecutionError(
                    f"{self.name} was compiled for arrays {', '.join(map(str, expected)) or 'none'}; "
                    f"found {', '.join(map(str, found)) or 'none'}"
                )
        to_numpy = any(isinstance(a, (np.ndarray, np.generic)) for a in arrays)
        if self.mesh is None and self.kernels == "reference":  # the oracle: no schedule
            if self.graphs:
                self.graphs.fallback("kernels='reference' runs the reference executor on the CPU")
            inputs = [_to_torch(a, aval) for a, aval in zip(arrays, expected, strict=True)]
            if self._graph_plan is None:
                self._graph_plan = graph_plan(self.module_at("graph"), self.name)
                self.plan_builds += 1
            outputs = _all_unaliased(self._graph_plan(*inputs), inputs)
        elif self.mesh is None:  # one device: the arguments as they are
            execution = self._execution(kernel_device(arrays, self.kernels))
            device = execution.device
            inputs = [
                a.detach()
                if isinstance(a, torch.Tensor) and a.dtype is dtype and a.device == device
                else _to_torch(a, aval, device)
                for a, aval, dtype in zip(arrays, expected, self._torch_dtypes(), strict=True)
            ]
            (outputs,) = self._run_plan(execution, [inputs])
            outputs = _all_unaliased(outputs, inputs)
        else:
            outputs = self._execute(arrays, expected, to_numpy)
            if outputs and isinstance(outputs[0], distributed.LocalResult):
                return pytree.unflatten(self.out_tree, outputs)
        home = _home_device(arrays)
        outputs = [o.to(home) for o in outputs]
        results = [o.numpy() if to_numpy and o.dtype != torch.bfloat16 else o for o in outputs]
        return pytree.unflatten(self.out_tree, results)

    def layouts(self) -> tuple[list[Sharding], list[Sharding]]:
        """The per-rank layouts of the program's arguments and results (computed once)."""
        if self._layout_cache is None and self._program_cache:
            self._layout_cache = self._program_cache.load_layouts()
        if self._layout_cache is None:
            module = self.module_at("partitioned")
            function = next(
                o for o in module.ops if isinstance(o, func.FuncOp) and o.sym_name.data == self.name
            )
            args = [
                arg_sharding(function, i)
                or Sharding.replicated(AbstractTensor.from_xdsl(a.type).rank)
                for i, a in enumerate(function.args)
            ]
            results = [value_sharding(function, v) for v in function.body.block.last_op.operands]
            self._layout_cache = (args, results)
            if self._program_cache:
                self._program_cache.store_layouts(self._layout_cache)
        return self._layout_cache

    def _execute(
        self, arrays: Sequence[Any], avals: Sequence[AbstractTensor], to_numpy: bool
    ) -> list[Any]:
        """Cuts the arguments into the pieces of the ranks this process runs (as the
        partitioned program lays them out; a ``dist.tensor`` gives its own pieces), runs
        the scheduled program, and puts the results back together: global values on the
        virtual mesh, this rank's :class:`~tessera.backends.distributed.LocalResult`
        under a launcher."""
        mesh = self.mesh
        assert mesh is not None, "mesh-less programs run in Lowered.run"
        execution: Execution = execution_for(mesh, arrays, self.kernels)
        arg_layouts, out_layouts = self.layouts()
        wholes = [
            None if isinstance(a, DistTensor) else _to_torch(a, aval, execution.device)
            for a, aval in zip(arrays, avals, strict=True)
        ]

        def argument(index: int, rank: int) -> torch.Tensor:
            array, aval = arrays[index], avals[index]
            if isinstance(array, DistTensor):
                value = array.local(rank)
                value = value if isinstance(value, torch.Tensor) else torch.as_tensor(value)
                value = value.detach().to(dtype=aval.dtype.to_torch())
            else:
                value = piece(wholes[index], arg_layouts[index], mesh, rank)
            return value.to(execution.device)

        rank_args = [[argument(i, rank) for i in range(len(arrays))] for rank in execution.ranks]
        per_rank = self._run_plan(execution, rank_args)
        if isinstance(execution, Processes):
            self.last_run = execution.last_run
            (local,), (outputs,) = rank_args, per_rank
            return [
                distributed.LocalResult(
                    _unaliased(o, local).cpu(), layout, mesh, execution.runtime.rank, to_numpy
                )
                for o, layout in zip(outputs, out_layouts, strict=True)
            ]
        return [
            assemble([ranks[index] for ranks in per_rank], layout, mesh)
            for index, layout in enumerate(out_layouts)
        ]

    def _input_avals(self) -> list[AbstractTensor]:
        if self._avals is None:
            leaves = self.signature.leaves
            self._avals = [leaf for leaf in leaves if isinstance(leaf, AbstractTensor)]
        return self._avals

    def _torch_dtypes(self) -> list[torch.dtype]:
        if self._dtypes is None:
            self._dtypes = [aval.dtype.to_torch() for aval in self._input_avals()]
        return self._dtypes

    def _execution(self, device: torch.device) -> VirtualMesh:
        """The one-device execution of a mesh-less program on ``device`` (made once)."""
        if device not in self._devices:
            self._devices[device] = VirtualMesh(Mesh(("device",), (1,)), device)
        return self._devices[device]


def _home_device(arrays: Sequence[Any]) -> torch.device:
    """Results go where the (torch) arguments live: the first CUDA argument's device, else the CPU."""
    on_gpu = [a.device for a in arrays if isinstance(a, torch.Tensor) and a.is_cuda]
    return on_gpu[0] if on_gpu else torch.device("cpu")


def _to_torch(
    array: torch.Tensor | np.ndarray | np.generic,
    aval: AbstractTensor,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """A tensor of ``aval``'s dtype on ``device``; numpy data is copied (``np.array`` keeps 0-d shapes)."""
    if isinstance(array, DistTensor):
        array = array.data
    tensor = (
        array if isinstance(array, torch.Tensor) else torch.from_numpy(np.array(array, order="C"))
    )
    return tensor.detach().to(device=device, dtype=aval.dtype.to_torch())


def _all_unaliased(
    outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor]
) -> list[torch.Tensor]:
    """``outputs``, each copied if it shares memory with an argument (only a view or an
    argument itself can: others are checked by identity alone)."""
    passed = {id(i) for i in inputs}
    return [
        o if o._base is None and id(o) not in passed else _unaliased(o, inputs) for o in outputs
    ]


def _unaliased(output: torch.Tensor, inputs: Sequence[torch.Tensor]) -> torch.Tensor:
    """``output``, copied if it shares memory with an argument: results are new values."""
    address = output.untyped_storage().data_ptr()
    if any(address == i.untyped_storage().data_ptr() for i in inputs):
        return output.clone()
    return output


class JitFunction:
    """A function compiled by Tessera; call it like the original."""

    def __init__(
        self,
        fn: Callable[..., Any],
        static_argnums: int | Sequence[int] = (),
        mesh: Mesh | None = None,
        in_shardings: Any = None,
        out_shardings: Any = None,
        kernels: str | None = None,
        donate_argnums: int | Sequence[int] = (),
        cuda_graphs: bool = False,
        compile_options: Mapping[str, Any] | None = None,
    ):
        if mesh is not None and not isinstance(mesh, Mesh):
            raise ShardingError(
                f"ts.jit: mesh must be a dist.Mesh (dist.Mesh(axes=[...], shape=(...)) or "
                f"dist.mesh({{'dp': 2}})), found {type(mesh).__name__} {mesh!r}"
            )
        if mesh is None and (in_shardings is not None or out_shardings is not None):
            raise ShardingError("in_shardings and out_shardings need a mesh: ts.jit(fn, mesh=...)")
        check_shard_specs(in_shardings, "ts.jit: in_shardings")
        check_shard_specs(out_shardings, "ts.jit: out_shardings")
        if kernels is not None and kernels not in KERNEL_BACKENDS:
            raise ArgumentError(f"kernels must be one of {KERNEL_BACKENDS}, found {kernels!r}")
        self.kernels = kernels  # None: TESSERA_KERNELS or "triton", read when compiling
        if not isinstance(cuda_graphs, bool):
            raise ArgumentError(f"cuda_graphs must be True or False, found {cuda_graphs!r}")
        self.cuda_graphs = cuda_graphs
        self.mesh = mesh
        self.in_shardings = in_shardings
        self.out_shardings = out_shardings
        # name and docstring only: copying fn.__dict__ could overwrite our own attributes
        functools.update_wrapper(self, fn, updated=())
        self.__name__: str = getattr(fn, "__name__", "main")  # functools.partial has none
        self.fn = fn
        positional = _positional_count(fn)
        self.static_argnums = _argnums(static_argnums, "static_argnums", self.__name__, positional)
        self.donate_argnums = _argnums(donate_argnums, "donate_argnums", self.__name__, positional)
        if set(self.donate_argnums) & set(self.static_argnums):
            raise ArgumentError(f"{self.__name__}: an argument cannot be both static and donated")
        # further CompileConfig fields, fixed by the front-end (a training step's remat
        # and precision)
        self.compile_options = dict(compile_options or {})
        self.trace_count = 0
        self._cache: dict[tuple[Signature, CompileConfig], Lowered] = {}

    def compile_config(self) -> CompileConfig:
        """The configuration a program traced now compiles with: this function's mesh,
        kernels and compile options, and the settings of the user's context managers in
        force (``tessera.schedule``'s options, ``tessera.numerics``' mode), read here once."""
        return CompileConfig(
            self.mesh,
            self.kernels or default_kernels(),
            schedule.current(),
            numerics.mode(),
            **self.compile_options,
        )

    def signature(self, args: Sequence[Any], kwargs: dict[str, Any]) -> Signature:
        """What the program for these arguments is specialised on."""
        return self._signature(args, kwargs)[0]

    def _signature(
        self, args: Sequence[Any], kwargs: dict[str, Any]
    ) -> tuple[Signature, list[Any]]:
        """The signature and the leaves of ``(args, kwargs)``, static arguments as one
        leaf each."""
        if self.static_argnums and not all(
            -len(args) <= n < len(args) for n in self.static_argnums
        ):
            raise ArgumentError(
                f"{self.__name__} has static_argnums={self.static_argnums} but was called "
                f"with {len(args)} positional arguments"
            )
        static = {n % len(args) for n in self.static_argnums}
        marked = tuple(_Static(a) if i in static else a for i, a in enumerate(args))
        leaves, treedef = pytree.flatten((marked, kwargs))
        keys = []
        for index, leaf in enumerate(leaves):
            if isinstance(leaf, Tensor):
                raise TraceError(
                    f"{self.__name__}.lower() got a traced tensor {leaf.aval}; inside traced "
                    f"code call the function itself"
                )
            if is_array(leaf):
                try:
                    keys.append(_abstract(leaf))
                except TesseraError as error:
                    where = _leaf_argument(self.fn, marked, kwargs, index)
                    raise ExecutionError(f"{self.__name__}: {where}: {error}") from None
            else:
                keys.append(leaf if isinstance(leaf, _Static) else _Static(leaf))
        try:
            hash(tuple(keys))
        except TypeError as error:
            raise TraceError(
                f"static arguments of {self.__name__} must be hashable: {error}"
            ) from None
        unsharded = Signature(treedef, tuple(keys))
        shardings = self._input_shardings(args, leaves, unsharded)
        return Signature(treedef, tuple(keys), shardings), leaves

    def _input_shardings(
        self, args: Sequence[Any], leaves: Sequence[Any], signature: Signature
    ) -> tuple[Sharding | None, ...]:
        """The sharding of each array leaf: from ``in_shardings`` (a pytree prefix of the
        positional arguments) or from a ``dist.tensor``'s layout."""
        if self.mesh is None:
            if any(isinstance(leaf, DistTensor) for leaf in leaves):
                raise ShardingError(
                    f"{self.__name__} got a dist.tensor argument but has no mesh: ts.jit(fn, mesh=...)"
                )
            return ()
        names = self._argument_names(signature)
        specs = self.in_shardings
        if specs is not None and not isinstance(specs, (tuple, list)):
            specs = (specs,) * len(args)
        if specs is not None and len(specs) != len(args):
            raise ShardingError(
                f"{self.__name__}: in_shardings has {len(specs)} entries for {len(args)} positional arguments"
            )
        per_leaf: list[ShardSpec | None] = []
        for index, arg in enumerate(args):
            _, tree = pytree.flatten(arg)
            per_leaf += broadcast_prefix(
                specs[index] if specs else None, tree, f"in_shardings[{index}]"
            )
        per_leaf += [None] * (len(leaves) - len(per_leaf))  # keyword arguments: open
        shardings: list[Sharding | None] = []
        array_names = iter(names)
        for leaf, spec in zip(leaves, per_leaf, strict=True):
            if not is_array(leaf):
                continue
            name = f"argument {next(array_names)!r} of {self.__name__}"
            sharding = spec.to_sharding(self.mesh, leaf.shape, name) if spec is not None else None
            if isinstance(leaf, DistTensor):
                if leaf.mesh != self.mesh:
                    raise ShardingError(
                        f"{name}: dist.tensor on {leaf.mesh} but the function runs on {self.mesh}"
                    )
                if sharding is not None and sharding != leaf.sharding:
                    raise ShardingError(
                        f"{name}: in_shardings says {sharding} but the dist.tensor is laid out {leaf.sharding}"
                    )
                sharding = leaf.sharding
            shardings.append(sharding)
        return tuple(shardings)

    def lower(self, *args: Any, **kwargs: Any) -> Lowered:
        """Traces (or fetches from the cache) the program for these arguments."""
        return self._lower(args, kwargs)[0]

    def _lower(self, args: Sequence[Any], kwargs: dict[str, Any]) -> tuple[Lowered, list[Any]]:
        signature, leaves = self._signature(args, kwargs)
        key = (signature, self.compile_config())
        lowered = self._cache.get(key)
        if lowered is None:
            lowered = self._cache[key] = self._trace(*key)
        return lowered, leaves

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if is_tracing():  # called from traced code: inlined into the caller's program
            return self._inline(args, kwargs)
        lowered, leaves = self._lower(args, kwargs)
        if self.static_argnums:  # static arguments were one leaf each
            leaves, _ = pytree.flatten((args, kwargs))
        return lowered.run(leaves, checked=True)  # the signature matched its avals

    def _body(self, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
        """What the program computes, traced on the current trace (``ts.grad`` adds the
        backward pass)."""
        return self.fn(*args, **kwargs)

    def _inline(self, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
        """Traces the function into the program being traced, as ``jax.jit`` inside
        ``jax.jit`` does: the outer function's options govern the whole program; this
        function's shardings become sharding constraints on its arguments and results."""
        trace = current_trace()
        if self.mesh is not None and trace.mesh != self.mesh:
            where = f"{trace.mesh}" if trace.mesh is not None else "no mesh"
            raise ShardingError(
                f"{self.__name__} is compiled for {self.mesh} but is called from a function "
                f"traced with {where}; give the outer ts.jit the same mesh"
            )
        if self.in_shardings is not None:
            specs = self.in_shardings
            if not isinstance(specs, (tuple, list)):
                specs = (specs,) * len(args)
            if len(specs) != len(args):
                raise ShardingError(
                    f"{self.__name__}: in_shardings has {len(specs)} entries for "
                    f"{len(args)} positional arguments"
                )
            args = tuple(
                _constrain(arg, spec, f"in_shardings[{i}]")
                for i, (arg, spec) in enumerate(zip(args, specs, strict=True))
            )
        result = self._body(args, kwargs)
        if self.out_shardings is not None:
            result = _constrain(result, self.out_shardings, "out_shardings")
        return result

    def _trace(self, signature: Signature, config: CompileConfig) -> Lowered:
        self.trace_count += 1
        avals = [k for k in signature.leaves if isinstance(k, AbstractTensor)]
        trace = Trace(self.__name__, avals, mesh=self.mesh)
        for argument, name in zip(trace.block.args, self._argument_names(signature), strict=True):
            argument.name_hint = name
        arguments = iter(trace.block.args)
        leaves = [
            Tensor(trace, next(arguments)) if isinstance(k, AbstractTensor) else k.value
            for k in signature.leaves
        ]
        args, kwargs = pytree.unflatten(signature.treedef, leaves)
        check_call(self.fn, self.__name__, args, kwargs)
        with tracing(trace):
            out_leaves, out_tree, config = self._trace_results(args, kwargs, config)
        for leaf in out_leaves:
            if not isinstance(leaf, Tensor):
                raise TraceError(
                    f"{self.__name__} must return tensors (in tuples, lists or dicts), "
                    f"found {type(leaf).__name__}: {leaf!r}\n  in {where_defined(self.fn)}"
                )
            if leaf.trace is not trace:
                raise TraceError(f"{self.__name__} returned a tensor from another traced function")
        shardings = signature.shardings or (None,) * len(avals)
        donated = self._donated_leaves(signature)
        arg_attrs: list[dict[str, Attribute]] = [
            ({SHARDING_KEY: ShardingAttr.get(MESH_SYMBOL, s)} if s is not None else {})
            | ({DONATED: UnitAttr()} if index in donated else {})
            for index, s in enumerate(shardings)
        ]
        module = trace.finish(out_leaves, arg_attrs)
        lowered = Lowered(trace.name, module, signature, out_tree, config)
        lowered.graphs = CudaGraphs(trace.name) if self.cuda_graphs else None
        return lowered

    def _trace_results(
        self, args: Sequence[Any], kwargs: dict[str, Any], config: CompileConfig
    ) -> tuple[list[Any], pytree.TreeDef, CompileConfig]:
        """Traces the program on the current trace: the leaves the traced module returns,
        the structure of the program's results, and the config it compiles with (as
        given; ``ts.grad`` traces the forward and adds the ``autodiff`` stage's options)."""
        out_leaves, out_tree = pytree.flatten(self._body(args, kwargs))
        if self.out_shardings is not None:
            specs = broadcast_prefix(self.out_shardings, out_tree, "out_shardings")
            out_leaves = [
                shard(leaf, spec) if spec is not None and isinstance(leaf, Tensor) else leaf
                for leaf, spec in zip(out_leaves, specs, strict=True)
            ]
        return out_leaves, out_tree, config

    def _donated_leaves(self, signature: Signature) -> set[int]:
        """Indices (among the array arguments) of the leaves of ``donate_argnums``."""
        positional = signature.treedef.children[0].children
        donated = {
            n % len(positional)
            for n in self.donate_argnums
            if -len(positional) <= n < len(positional)
        }
        indices: set[int] = set()
        leaves = iter(signature.leaves)
        count = 0
        for index, child in enumerate(positional):
            for _ in range(child.num_leaves):
                if isinstance(next(leaves), AbstractTensor):
                    if index in donated:
                        indices.add(count)
                    count += 1
        return indices

    def _argument_names(self, signature: Signature) -> list[str]:
        """IR names of the array leaves: the parameter name plus the path into pytrees."""
        try:
            params = list(inspect.signature(self.fn).parameters)
        except (TypeError, ValueError):
            params = []
        positional, keyword = signature.treedef.children
        names: list[str] = []
        leaves = iter(signature.leaves)

        def visit(treedef: pytree.TreeDef, path: str) -> None:
            if treedef.kind == "leaf":
                if isinstance(next(leaves), AbstractTensor):
                    names.append(re.sub(r"\W", "_", path) or "arg")
                return
            keys = treedef.meta if treedef.kind == "dict" else range(len(treedef.children))
            for key, child in zip(keys, treedef.children, strict=True):
                visit(child, f"{path}_{key}")

        for index, child in enumerate(positional.children):
            visit(child, params[index] if index < len(params) else f"arg{index}")
        for key, child in zip(keyword.meta, keyword.children, strict=True):
            visit(child, str(key))
        return names


def check_call(
    fn: Callable[..., Any], name: str, args: Sequence[Any], kwargs: dict[str, Any]
) -> None:
    """A TraceError when ``fn`` cannot take these arguments (checked before tracing, so
    a TypeError raised inside ``fn`` is not mistaken for one)."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(*args, **kwargs)
    except TypeError as error:
        raise TraceError(
            f"{name} was called with {len(args)} positional argument(s)"
            f"{' and keywords ' + str(sorted(kwargs)) if kwargs else ''}: {error}\n"
            f"  {where_defined(fn)}"
        ) from None


def _positional_count(fn: Callable[..., Any]) -> int | None:
    """How many positional parameters ``fn`` has (None: any number, or unknown)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return None
    return sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)


def _argnums(
    value: int | Sequence[int], what: str, name: str, positional: int | None
) -> tuple[int, ...]:
    """``static_argnums`` / ``donate_argnums`` as a tuple of distinct ints, each in range
    of the function's positional parameters when their number is known."""
    nums = (value,) if isinstance(value, int) and not isinstance(value, bool) else value
    if isinstance(nums, (str, bytes)) or not isinstance(nums, Sequence):
        raise ArgumentError(f"{name}: {what} must be an int or a sequence of ints, found {value!r}")
    for num in nums:
        if not isinstance(num, int) or isinstance(num, bool):
            raise ArgumentError(f"{name}: {what} must hold ints, found {num!r} in {value!r}")
        if positional is not None and not -positional <= num < positional:
            raise ArgumentError(
                f"{name}: {what} has {num}, but the function takes {positional} positional "
                f"arguments"
            )
    if len(set(nums)) != len(nums):
        raise ArgumentError(f"{name}: {what} names an argument twice: {value!r}")
    return tuple(nums)


def _leaf_argument(
    fn: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any], index: int
) -> str:
    """``argument 'x'`` (and which of its leaves) holding the ``index``-th leaf of a call
    (for error messages)."""
    try:
        params = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        params = []
    named = [(params[i] if i < len(params) else str(i), a) for i, a in enumerate(args)]
    start = 0
    for name, value in [*named, *kwargs.items()]:
        count = len(pytree.flatten(value)[0])
        if index < start + count:
            return f"argument {name!r}" + (f" (leaf {index - start})" if count > 1 else "")
        start += count
    return f"argument {index}"


def where_defined(fn: Callable[..., Any]) -> str:
    """``name defined at file:line``: where ``fn`` is defined, for errors about the
    function as a whole."""
    code = getattr(inspect.unwrap(fn), "__code__", None)
    name = getattr(fn, "__qualname__", repr(fn))
    return f"{name} defined at {code.co_filename}:{code.co_firstlineno}" if code else name


@dataclass(frozen=True)
class _Static:
    """A leaf the program is specialised on, compared by type and value: ``1``, ``1.0``
    and ``True`` are equal in Python but trace differently (``x * 1.0`` is float)."""

    value: Any
    kind: type = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", type(self.value))


def jit(
    fn: Callable[..., Any] | None = None,
    *,
    static_argnums: int | Sequence[int] = (),
    mesh: Mesh | None = None,
    in_shardings: Any = None,
    out_shardings: Any = None,
    kernels: str | None = None,
    donate_argnums: int | Sequence[int] = (),
    cuda_graphs: bool = False,
) -> Any:
    """Compiles ``fn`` with Tessera; usable as ``@jit`` or ``@jit(static_argnums=...)``.

    With a ``mesh``, ``in_shardings`` gives one entry per positional argument (a
    ``dist.ShardSpec``, None for "let Tessera choose", or a pytree of those matching the
    argument) and ``out_shardings`` constrains the outputs the same way. ``kernels`` is
    ``"triton"`` (generated kernels; the default, or ``TESSERA_KERNELS``) or
    ``"reference"`` (the reference executor). ``donate_argnums`` (as in JAX) marks
    arguments whose buffers the program may reuse once it has read them: ``plan-memory``
    frees them after their last use and lets an elementwise update write in their place.
    ``cuda_graphs=True`` replays each launch plan from a CUDA graph captured at its second
    call (its results are copies; where a plan cannot be captured, e.g. without CUDA, it
    runs as usual after a ``CudaGraphWarning``: :mod:`tessera.backends.cuda_graphs`).
    """
    options = {
        "static_argnums": static_argnums,
        "mesh": mesh,
        "in_shardings": in_shardings,
        "out_shardings": out_shardings,
        "kernels": kernels,
        "donate_argnums": donate_argnums,
        "cuda_graphs": cuda_graphs,
    }
    if fn is None:
        return lambda f: jit(f, **options)
    if not callable(fn):
        raise ArgumentError(f"ts.jit expects a function, found {type(fn).__name__}")
    if inspect.isclass(fn):
        raise ArgumentError("ts.jit expects a function, found a class")
    return JitFunction(fn, **options)


def _constrain(value: Any, specs: Any, what: str) -> Any:
    """``value`` (a pytree) with each traced tensor constrained to its spec in ``specs``
    (a pytree prefix of ``value`` of ``dist.ShardSpec`` or None)."""
    leaves, tree = pytree.flatten(value)
    per_leaf = broadcast_prefix(specs, tree, what)
    return pytree.unflatten(
        tree,
        [
            shard(leaf, spec) if spec is not None and isinstance(leaf, Tensor) else leaf
            for leaf, spec in zip(leaves, per_leaf, strict=True)
        ],
    )


def broadcast_prefix(prefix: Any, tree: pytree.TreeDef, what: str) -> list[Any]:
    """One entry per leaf of ``tree``: a leaf of ``prefix`` applies to its whole subtree."""
    if prefix is None or isinstance(prefix, ShardSpec):
        return [prefix] * tree.num_leaves
    prefix_leaves, prefix_tree = pytree.flatten(prefix)
    if prefix_tree == tree:
        return prefix_leaves
    if (
        tree.kind in ("tuple", "list", "namedtuple")
        and isinstance(prefix, (tuple, list))
        and len(prefix) == len(tree.children)
    ):
        return [
            x
            for p, child in zip(prefix, tree.children, strict=True)
            for x in broadcast_prefix(p, child, what)
        ]
    if tree.kind == "dict" and isinstance(prefix, dict) and set(prefix) == set(tree.meta):
        return [
            x
            for key, child in zip(tree.meta, tree.children, strict=True)
            for x in broadcast_prefix(prefix[key], child, what)
        ]
    raise ShardingError(f"{what} does not match the structure of the values it describes")


__all__ = ["ExecutionError", "JitFunction", "Lowered", "jit"]
