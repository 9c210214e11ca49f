"""Shared pytest setup for Tessera's unit tests.

Triton kernels run under Triton's CPU interpreter unless a GPU run asks otherwise.
Hypothesis examples have no deadline: the first example of a new shape traces a
program, which is slower than the cached runs that follow. Under CI (``CI`` set) the
examples are derandomized, so a run is reproducible; local runs explore new examples.
"""

from __future__ import annotations

import os

from hypothesis import settings

os.environ.setdefault("TRITON_INTERPRET", "1")

settings.register_profile("tessera", deadline=None)
settings.register_profile("ci", deadline=None, derandomize=True, print_blob=True)
settings.load_profile("ci" if os.environ.get("CI") else "tessera")
