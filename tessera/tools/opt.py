"""``tessera-opt``: run Tessera passes on textual IR (xDSL's opt driver, our dialects).

    tessera-opt in.mlir -p 'canonicalize,cse'
    tessera-opt in.mlir -p 'canonicalize{max-fold-elements=16}' --print-between-passes

Bad input is reported as ``FILE:LINE:COL: error: MESSAGE`` on stderr with exit status 1,
never a traceback. With ``--verify-diagnostics`` (or ``--parsing-diagnostics``) the
error is printed on stdout and the exit status is 0, as in ``xdsl-opt``.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
import traceback
from collections.abc import Sequence
from importlib.metadata import version
from typing import IO

from xdsl.dialects.builtin import Builtin, ModuleOp
from xdsl.dialects.func import Func
from xdsl.ir import Operation
from xdsl.passes import ModulePass
from xdsl.printer import Printer
from xdsl.utils.arg_spec import ArgSpec, parse_pipeline
from xdsl.utils.exceptions import ArgSpecParseError, DiagnosticException, ParseError
from xdsl.xdsl_opt_main import xDSLOptMain

from tessera import environment
from tessera.driver import available_passes
from tessera.errors import TesseraError
from tessera.ir.graph import Graph
from tessera.ir.schedule import Schedule
from tessera.ir.tile import TILE_DIALECTS
from tessera.ir.verifier import verify_module
from tessera.passes import pass_options, pass_summaries
from tessera.tools.diagnostics import (
    LocatingParser,
    SpannedVerifyException,
    format_op_error,
    format_parse_error,
    format_spanned_error,
    format_verify_error,
)


class ToolError(Exception):
    """Bad input or arguments: reported as one message on stderr, without a traceback."""


class TesseraOptMain(xDSLOptMain):
    """xdsl-opt with Tessera's dialects and passes only, and MLIR-style error messages."""

    version_format = (
        f"tessera-opt from Tessera {version('tessera')} (xDSL {{xdsl_version}})"
    )

    def register_all_dialects(self) -> None:
        for dialect in (Builtin, Func, Graph, Schedule, *TILE_DIALECTS):
            self.ctx.register_dialect(dialect.name, lambda d=dialect: d)

    def register_all_targets(self) -> None:
        """``mlir`` (the IR, the default) and ``triton`` (the tile kernels' source): xDSL's
        other targets (llvm, x86-asm, ...) need dialects Tessera's modules never hold."""
        super().register_all_targets()
        self.available_targets = {"mlir": self.available_targets["mlir"]}

        def triton_target() -> type:
            from tessera.backends.triton.emit import TritonTarget

            return TritonTarget

        self.available_targets["triton"] = triton_target

    def register_all_passes(self) -> None:
        """Tessera's passes as the compile driver runs them (so a program's ``-p`` string
        replays its compile; ``collective-matmul`` gets the driver's schedule trial)."""
        for flag, factory in available_passes().items():
            self.register_pass(flag, factory)

    def register_all_arguments(self, arg_parser: argparse.ArgumentParser) -> None:
        super().register_all_arguments(arg_parser)
        arg_parser.formatter_class = argparse.RawDescriptionHelpFormatter
        format_help = arg_parser.format_help

        def format_help_with_passes() -> str:  # built on demand: it imports every pass
            arg_parser.epilog = _passes_help()
            return format_help()

        arg_parser.format_help = format_help_with_passes  # type: ignore[method-assign]

    def setup_pipeline(self) -> None:
        """Checks pass names and options first, so that mistakes get a one-line error."""
        try:
            specs = list(parse_pipeline(self.args.passes))
        except ArgSpecParseError as error:  # its text: header, location, source, caret, message
            _, where, *_, message = str(error).strip().split("\n")
            column = where.rsplit(":", 1)[-1]
            raise ToolError(
                f"tessera-opt: error: invalid pass pipeline '{self.args.passes}' "
                f"at column {column}: {message.strip()}"
            ) from None
        for spec in specs:
            if spec.name not in self.available_passes:
                raise ToolError(
                    f"tessera-opt: error: unknown pass '{spec.name}'; "
                    f"available passes: {', '.join(self.available_passes)}"
                )
            pass_class = self.available_passes[spec.name]()
            try:
                pass_class.from_pass_spec(spec)
            except ValueError as error:
                raise ToolError(
                    f"tessera-opt: error: invalid options for pass '{spec.name}': "
                    f"{_option_error(pass_class, spec, error)}"
                ) from None
        super().setup_pipeline()
        self.running: str | None = None  # the pass being applied, for internal errors
        self.pipeline = dataclasses.replace(self.pipeline, callback=self._between_passes)
        self._pass_started = time.perf_counter()

    def _between_passes(
        self, previous: ModulePass | None, module: ModuleOp, following: ModulePass | None
    ) -> None:
        """xDSL's callback (timing, verification, printing), verifying as Tessera does
        (:func:`tessera.ir.verifier.verify_module`); IR that a pass made and that does not
        verify is the pass's internal error."""
        self.running = None
        if self.args.time_passes and previous is not None:
            print(f"Pass {previous.name} took {time.perf_counter() - self._pass_started} seconds")
        if not self.args.disable_verify:
            try:
                verify_module(module)
            except DiagnosticException as error:
                if previous is None or self.args.verify_diagnostics:
                    raise
                where = format_verify_error(error, module, self.get_input_name())
                raise ToolError(
                    f"tessera-opt: internal error in pass '{previous.name}': it made IR "
                    f"that does not verify:\n{where}"
                ) from None
        if previous and following and self.args.print_between_passes:
            print(f"IR after {previous.name}:")
            Printer(stream=sys.stdout).print_op(module)
            print("\n\n\n")
        self.running = following.name if following is not None else None
        self._pass_started = time.perf_counter()

    def parse_chunk(
        self, chunk: IO[bytes], file_extension: str, start_offset: int = 0
    ) -> ModuleOp | None:
        """Parses with :class:`LocatingParser`, so that ops know their source lines; a byte
        that is not UTF-8 is an error at its line."""
        if file_extension != "mlir":
            return super().parse_chunk(chunk, file_extension, start_offset)
        data = chunk.read()
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as error:
            line = data.count(b"\n", 0, error.start) + 1 + start_offset
            column = error.start - (data.rfind(b"\n", 0, error.start) + 1) + 1
            raise ToolError(
                f"{self.get_input_name()}:{line}:{column}: error: the input is not UTF-8 "
                f"text: byte 0x{data[error.start]:02x}"
            ) from None
        parser = LocatingParser(self.ctx, data, self.get_input_name(), start_offset)
        return parser.parse_module(not self.args.no_implicit_module)

    def apply_passes(self, prog: ModuleOp) -> None:
        try:
            super().apply_passes(prog)
        except DiagnosticException as error:
            if self.args.verify_diagnostics:
                raise  # xDSL prints it
            raise ToolError(format_verify_error(error, prog, self.get_input_name())) from None

    def run(self) -> None:
        try:
            super().run()
        except ParseError as error:  # xDSL has set the line offset of split input
            raise ToolError(format_parse_error(error)) from None
        except TesseraError as error:  # e.g. -t triton on a module it cannot emit
            op = getattr(error, "op", None)
            if isinstance(op, Operation):
                raise ToolError(format_op_error(op, self.get_input_name(), str(error))) from None
            raise ToolError(f"tessera-opt: error: {error}") from None
        except UnicodeDecodeError as error:
            raise ToolError(
                f"tessera-opt: error: the input is not UTF-8 text: byte "
                f"0x{error.object[error.start]:02x} at offset {error.start}"
            ) from None
        except RecursionError:
            raise ToolError("tessera-opt: error: the input nests too deeply") from None
        except (MemoryError, OverflowError) as error:
            raise ToolError(
                "tessera-opt: error: a size or number in the input is too large to handle"
                + (f" ({error})" if str(error) else "")
            ) from None
        except SpannedVerifyException as error:  # an attribute's verifier, while parsing
            raise ToolError(format_spanned_error(error)) from None
        except DiagnosticException as error:  # a verifier, outside the pass pipeline
            raise ToolError(f"tessera-opt: error: {error}") from None
        except (ToolError, OSError, SystemExit, KeyboardInterrupt):
            raise
        except Exception as error:  # a bug in Tessera or xDSL, not in the input
            where = getattr(self, "running", None)
            what = f"in pass '{where}'" if where else "while reading or printing the IR"
            message = f"tessera-opt: internal error {what}: {type(error).__name__}: {error}"
            if _debug():
                message += "\n" + traceback.format_exc()
            else:
                message += "\n(set TESSERA_DEBUG=1 for the traceback)"
            raise ToolError(message) from None


def _option_error(pass_class: type[ModulePass], spec: ArgSpec, error: ValueError) -> str:
    """xDSL's message for an option of the wrong type (``Incompatible types: given (3,),
    expected <class 'str'>``) rewritten to name the option, its value and its type."""
    if not str(error).startswith("Incompatible types"):
        return str(error)
    types = {f.name: f.type for f in dataclasses.fields(pass_class)}
    for name, values in spec.parameters.items():
        try:
            pass_class.from_pass_spec(ArgSpec(spec.name, {name: values}))
        except ValueError:
            given = ",".join(repr(v) if isinstance(v, str) else str(v) for v in values)
            wanted = types.get(name.replace("-", "_"), "?")
            wanted = wanted if isinstance(wanted, str) else getattr(wanted, "__name__", wanted)
            return f"option '{name}' takes a value of type {wanted}, given {given}"
    return str(error)


def _passes_help() -> str:
    """The epilog of ``--help``: each pass with its summary and options (with defaults)."""
    summaries, options = pass_summaries(), pass_options()
    width = max(map(len, summaries), default=0) + 2
    lines = ["Tessera passes (-p 'flag1,flag2{option=value option=value}'):"]
    for flag, summary in summaries.items():
        lines.append(f"  {flag:<{width}}{summary}")
        lines += [f"  {'':<{width}}  {option}" for option in options.get(flag, [])]
    return "\n".join(lines)


def _debug() -> bool:
    """``TESSERA_DEBUG``: show internal errors' tracebacks (an invalid value counts as yes)."""
    try:
        return environment.debug()
    except TesseraError:
        return True


def main(args: Sequence[str] | None = None) -> int:
    try:
        TesseraOptMain(description="Tessera's IR optimizer driver", args=args).run()
    except ToolError as error:
        print(error, file=sys.stderr)
        return 1
    except OSError as error:  # an unreadable input or unwritable output file
        print(f"tessera-opt: error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
