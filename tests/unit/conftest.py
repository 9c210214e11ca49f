"""Shared pytest setup for Tessera's unit tests.

Triton kernels run under Triton's CPU interpreter on a machine without a GPU. Tests
of tracing, sharding and communication run their kernels with the reference executor
(``TESSERA_KERNELS=reference``): the interpreter runs a kernel thousands of times slower
than torch, and those tests check program semantics, not code generation. Generated
kernels are tested against the reference in ``test_codegen_*.py``, and end to end
(examples, virtual mesh and processes) where a test asks for ``kernels="triton"``.
The on-disk program cache is off (``TESSERA_PROGRAM_CACHE=0``) except in its own tests.
Hypothesis examples have no deadline: the first example of a new shape traces a
program, which is slower than the cached runs that follow. Under CI (``CI`` set) the
examples are derandomized, so a run is reproducible; local runs explore new examples.
"""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import settings

if not torch.cuda.is_available():  # on a GPU, Triton compiles (test_gpu.py)
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("TESSERA_KERNELS", "reference")
# compiled programs are not read from disk in tests (a test that patches a pass must see
# its patch); tests/unit/test_program_cache.py turns the cache on where it tests it
os.environ.setdefault("TESSERA_PROGRAM_CACHE", "0")

if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):  # pytest-xdist: share the CPUs, no oversubscription
    workers = int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))

settings.register_profile("tessera", deadline=None)
settings.register_profile("ci", deadline=None, derandomize=True, print_blob=True)
settings.load_profile("ci" if os.environ.get("CI") else "tessera")


@pytest.fixture(autouse=True)
def _restore_schedule_options():
    """A test (or a README block run in process) that sets a process-wide schedule option
    (``schedule.pipeline_microbatches``, ``schedule.all_reduce_overlap``) must not leak it
    into the next test."""
    from tessera import schedule

    saved = schedule.current()
    yield
    schedule._current = saved
