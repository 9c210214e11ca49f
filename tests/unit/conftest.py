"""Shared pytest setup for Tessera's unit tests.

Triton kernels run under Triton's CPU interpreter unless a GPU run asks otherwise.
Hypothesis examples have no deadline: the first example of a new shape traces a
program, which is slower than the cached runs that follow.
"""

from __future__ import annotations

import os

from hypothesis import settings

os.environ.setdefault("TRITON_INTERPRET", "1")

settings.register_profile("tessera", deadline=None)
settings.load_profile("tessera")
