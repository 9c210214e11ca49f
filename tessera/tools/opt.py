"""``tessera-opt``: run Tessera passes on textual IR (xDSL's opt driver, our dialects)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from xdsl.dialects.builtin import Builtin
from xdsl.dialects.func import Func
from xdsl.xdsl_opt_main import xDSLOptMain

from tessera.ir.graph import Graph
from tessera.passes import get_all_passes


class TesseraOptMain(xDSLOptMain):
    """xdsl-opt with Tessera's dialects and passes only."""

    def register_all_dialects(self) -> None:
        for dialect in (Builtin, Func, Graph):
            self.ctx.register_dialect(dialect.name, lambda d=dialect: d)

    def register_all_passes(self) -> None:
        for flag, factory in get_all_passes().items():
            self.register_pass(flag, factory)


def main(args: Sequence[str] | None = None) -> int:
    TesseraOptMain(description="Tessera's IR optimizer driver", args=args).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
