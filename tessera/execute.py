"""Running a compiled program (:class:`tessera.program.Lowered`) on the array leaves of a
call: on one device, on the virtual mesh (every rank in this process) or as this
process's ranks under a launcher.

A program's :class:`Executor` cuts the arguments into each rank's pieces, runs the
program's launch plan (built once per execution and ranks, replayed from a CUDA graph
with ``cuda_graphs=True``) and assembles the results: global values, or this rank's
:class:`~tessera.backends.distributed.LocalResult` in a multi-process job.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from tessera.backends import distributed, schedule_runner
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
from tessera.dist.tensor import DistTensor
from tessera.dtypes import as_dtype
from tessera.errors import ExecutionError
from tessera.frontend import pytree
from tessera.ir.abstract import AbstractTensor
from tessera.ir.mesh import Mesh

if TYPE_CHECKING:
    from tessera.program import Lowered


def is_array(leaf: Any) -> bool:
    """Whether a leaf of a call's arguments is an array (traced; the others are static):
    a torch tensor, numpy array or ``dist.tensor``; numpy scalars (``np.float32(1)``)
    count as 0-d arrays."""
    return isinstance(leaf, (torch.Tensor, np.ndarray, np.generic, DistTensor))


_DTYPES: dict[Any, Any] = {}  # torch or numpy dtype -> tessera DType (as_dtype, cached)


def abstract(leaf: torch.Tensor | np.ndarray | np.generic | DistTensor) -> AbstractTensor:
    """The shape and dtype of an array leaf."""
    dtype = _DTYPES.get(leaf.dtype)
    if dtype is None:
        dtype = _DTYPES[leaf.dtype] = as_dtype(leaf.dtype)
    if isinstance(leaf, torch.Tensor):
        return AbstractTensor(tuple(leaf.shape), dtype)
    return AbstractTensor(tuple(int(d) for d in leaf.shape), dtype)


class Executor:
    """Runs one compiled program, keeping what its calls reuse: the kernel runner, the
    launch plans, the one-device executions and the reference executor's graph plan."""

    def __init__(self, program: Lowered):
        self.program = program
        self._runner: schedule_runner.KernelBinder | None = None
        self.plans: dict[tuple[Any, tuple[int, ...]], Any] = {}  # launch plans
        self._graph_plan: Callable[..., list[torch.Tensor]] | None = None
        self.plan_builds = 0  # launch plans built (one per execution and ranks)
        self._avals: list[AbstractTensor] | None = None
        self._dtypes: list[torch.dtype] | None = None
        self._devices: dict[torch.device, VirtualMesh] = {}
        self.last_run: distributed.RunRecord | None = None  # set by multi-process calls
        self.graphs: CudaGraphs | None = None  # set by ts.jit(cuda_graphs=True)

    def kernel_runner(self) -> schedule_runner.KernelBinder:
        """How kernels run: generated Triton kernels (compiled on a GPU, interpreted on a
        CPU; gather indices and cross-entropy labels range-checked first) or the
        reference executor (``kernels="reference"``, the test oracle). Launch plans bind
        every kernel with it once; it is also callable as ``runner(kernel, inputs,
        context)``."""
        if self._runner is None:
            if self.program.kernels == "reference":
                self._runner = schedule_runner.reference_kernel
            else:
                from tessera.backends.triton.runtime import TritonKernels

                self._runner = TritonKernels(
                    self.program.module_at("tile"), sources=self.program.triton_source()
                )
        return self._runner

    def launch_plan(self, execution: Execution, ranks: Sequence[int] | None = None) -> Any:
        """The scheduled program planned for ``execution`` and ``ranks`` (by default all
        it runs): built at the first call, then reused by every call
        (:mod:`tessera.backends.launch_plan`)."""
        program = self.program
        key = (execution.plan_key, tuple(execution.ranks if ranks is None else ranks))
        plan = self.plans.get(key)
        if plan is None:
            # Triton kernels: the tile stage holds the schedule and the kernels it names,
            # so a program read from the program cache loads one module, not two
            stage = "schedule" if program.kernels == "reference" else "tile"
            plan = execution.plan(
                program.module_at(stage), program.name, self.kernel_runner(), list(key[1]),
                program.digest(),
            )  # fmt: skip
            self.plans[key] = plan
            self.plan_builds += 1
        return plan

    def run_plan(
        self,
        execution: Execution,
        rank_args: Sequence[Sequence[torch.Tensor]],
        ranks: Sequence[int] | None = None,
        check_program: bool = True,
    ) -> list[tuple[torch.Tensor, ...]]:
        """Runs the launch plan for ``execution`` and ``ranks`` (by default all it runs;
        a pipeline stage: its members) on each rank's arguments, through a CUDA graph
        with ``cuda_graphs=True`` (:mod:`tessera.backends.cuda_graphs`).
        ``check_program``: see :meth:`~tessera.backends.execution.Execution.run_plan`."""
        plan = self.launch_plan(execution, ranks)
        if self.graphs is None:
            return execution.run_plan(plan, rank_args, check_program)

        def host() -> set[str]:  # read at the plan's first call only
            stage = "schedule" if self.program.kernels == "reference" else "tile"
            return host_kernels(self.program.module_at(stage), self.program.name)

        return self.graphs.run(execution, plan, rank_args, host)

    def run(self, leaves: Sequence[Any], checked: bool = False) -> Any:
        """Runs the program on the array ``leaves`` of a call (global values, or
        ``dist.tensor`` pieces): on the virtual mesh the global results come back; in a
        multi-process job each result is this rank's
        :class:`~tessera.backends.distributed.LocalResult`. ``checked``: the caller
        matched the arrays' shapes and dtypes with the signature already."""
        program = self.program
        arrays = [leaf for leaf in leaves if is_array(leaf)]
        expected = self._input_avals()
        if not checked:
            found = [abstract(a) for a in arrays]
            if found != expected:
                raise ExecutionError(
                    f"{program.name} was compiled for arrays {', '.join(map(str, expected)) or 'none'}; "
                    f"found {', '.join(map(str, found)) or 'none'}"
                )
        to_numpy = any(isinstance(a, (np.ndarray, np.generic)) for a in arrays)
        if program.mesh is None and program.kernels == "reference":  # the oracle: no schedule
            if self.graphs:
                self.graphs.fallback("kernels='reference' runs the reference executor on the CPU")
            inputs = [to_torch(a, aval) for a, aval in zip(arrays, expected, strict=True)]
            if self._graph_plan is None:
                self._graph_plan = graph_plan(program.module_at("graph"), program.name)
                self.plan_builds += 1
            outputs = all_unaliased(self._graph_plan(*inputs), inputs)
        elif program.mesh is None:  # one device: the arguments as they are
            execution = self._one_device(kernel_device(arrays, program.kernels))
            device = execution.device
            inputs = [
                a.detach()
                if isinstance(a, torch.Tensor) and a.dtype is dtype and a.device == device
                else to_torch(a, aval, device)
                for a, aval, dtype in zip(arrays, expected, self._torch_dtypes(), strict=True)
            ]
            (outputs,) = self.run_plan(execution, [inputs])
            outputs = all_unaliased(outputs, inputs)
        else:
            outputs = self._on_mesh(arrays, expected, to_numpy)
            if outputs and isinstance(outputs[0], distributed.LocalResult):
                return pytree.unflatten(program.out_tree, outputs)
        home = home_device(arrays)
        outputs = [o.to(home) for o in outputs]
        results = [o.numpy() if to_numpy and o.dtype != torch.bfloat16 else o for o in outputs]
        return pytree.unflatten(program.out_tree, results)

    def _on_mesh(
        self, arrays: Sequence[Any], avals: Sequence[AbstractTensor], to_numpy: bool
    ) -> list[Any]:
        """Cuts the arguments into the pieces of the ranks this process runs (as the
        partitioned program lays them out; a ``dist.tensor`` gives its own pieces), runs
        the scheduled program, and puts the results back together: global values on the
        virtual mesh, this rank's :class:`~tessera.backends.distributed.LocalResult`
        under a launcher."""
        program = self.program
        mesh = program.mesh
        assert mesh is not None, "mesh-less programs run in Executor.run"
        execution: Execution = execution_for(mesh, arrays, program.kernels)
        arg_layouts, out_layouts = program.layouts()
        wholes = [
            None if isinstance(a, DistTensor) else to_torch(a, aval, execution.device)
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
        per_rank = self.run_plan(execution, rank_args)
        if isinstance(execution, Processes):
            self.last_run = execution.last_run
            (local,), (outputs,) = rank_args, per_rank
            return [
                distributed.LocalResult(
                    unaliased(o, local).cpu(), layout, mesh, execution.runtime.rank, to_numpy
                )
                for o, layout in zip(outputs, out_layouts, strict=True)
            ]
        return [
            assemble([ranks[index] for ranks in per_rank], layout, mesh)
            for index, layout in enumerate(out_layouts)
        ]

    def _input_avals(self) -> list[AbstractTensor]:
        if self._avals is None:
            leaves = self.program.signature.leaves
            self._avals = [leaf for leaf in leaves if isinstance(leaf, AbstractTensor)]
        return self._avals

    def _torch_dtypes(self) -> list[torch.dtype]:
        if self._dtypes is None:
            self._dtypes = [aval.dtype.to_torch() for aval in self._input_avals()]
        return self._dtypes

    def _one_device(self, device: torch.device) -> VirtualMesh:
        """The one-device execution of a mesh-less program on ``device`` (made once)."""
        if device not in self._devices:
            self._devices[device] = VirtualMesh(Mesh(("device",), (1,)), device)
        return self._devices[device]


def home_device(arrays: Sequence[Any]) -> torch.device:
    """Results go where the (torch) arguments live: the first CUDA argument's device, else the CPU."""
    on_gpu = [a.device for a in arrays if isinstance(a, torch.Tensor) and a.is_cuda]
    return on_gpu[0] if on_gpu else torch.device("cpu")


def to_torch(
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


def all_unaliased(
    outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor]
) -> list[torch.Tensor]:
    """``outputs``, each copied if it shares memory with an argument (only a view or an
    argument itself can: others are checked by identity alone)."""
    passed = {id(i) for i in inputs}
    return [o if o._base is None and id(o) not in passed else unaliased(o, inputs) for o in outputs]


def unaliased(output: torch.Tensor, inputs: Sequence[torch.Tensor]) -> torch.Tensor:
    """``output``, copied if it shares memory with an argument: results are new values."""
    address = output.untyped_storage().data_ptr()
    if any(address == i.untyped_storage().data_ptr() for i in inputs):
        return output.clone()
    return output
