"""lit configuration: runs every .mlir and .py test under tests/lit with FileCheck."""

import os
import shutil
import sys

import lit.formats

config.name = "tessera"  # noqa: F821 - `config` is provided by lit
config.test_format = lit.formats.ShTest(execute_external=False)  # noqa: F821
config.suffixes = [".mlir", ".py"]  # noqa: F821
config.excludes = ["lit.cfg.py", "Output"]  # noqa: F821
config.test_source_root = os.path.dirname(__file__)  # noqa: F821

root = os.path.dirname(os.path.dirname(config.test_source_root))  # noqa: F821
bin_dir = os.path.dirname(sys.executable)
config.environment["PATH"] = os.pathsep.join([bin_dir, os.environ.get("PATH", "")])  # noqa: F821
config.environment["PYTHONPATH"] = root  # noqa: F821
config.environment["TRITON_INTERPRET"] = "1"  # noqa: F821
tessera_opt = shutil.which("tessera-opt", path=bin_dir) or os.path.join(
    root, "tools", "tessera-opt"
)
config.substitutions.append(("tessera-opt", f"{tessera_opt}"))  # noqa: F821
config.substitutions.append(("%python", sys.executable))  # noqa: F821
config.substitutions.append(("%root", root))  # noqa: F821
