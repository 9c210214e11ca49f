"""The environment of a device check (scripts/device_check.sh): versions and the GPU."""

from __future__ import annotations

import importlib.metadata
import sys

import torch
import triton

import tessera  # noqa: F401  (the check fails here when Tessera cannot be imported)

versions = {
    "python": sys.version.split()[0],
    "torch": torch.__version__,
    "triton": triton.__version__,
    "xdsl": importlib.metadata.version("xdsl"),
    "CUDA": torch.version.cuda,
}
print(" | ".join(f"{name} {version}" for name, version in versions.items()))
if torch.cuda.is_available():
    properties = torch.cuda.get_device_properties(0)
    print(
        f"device {properties.name}, {properties.total_memory / 2**30:.0f} GiB, "
        f"{properties.multi_processor_count} SMs, {torch.cuda.device_count()} visible"
    )
else:
    print("device: none (CPU)")
