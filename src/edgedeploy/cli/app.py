"""The typer application: the root options and the command list (one module per command)."""

from __future__ import annotations

import importlib
import logging
import sys

import typer

from .prestart import PRESTART, PrestartGroup

# Each module of this package named here has ``register(app)``; a missing one is left out. A module may
# also have ``prestart(values)``: see :class:`.prestart.PrestartGroup`.
COMMANDS = ("compile", "targets", "optimize", "report", "export", "emulate", "fvp", "doctor", "verify")

app = typer.Typer(
    cls=PrestartGroup,
    name="edgedeploy",
    help="Take a Keras model to an Arm Ethos-U NPU: optimize, convert, compile with Vela, report, export.",
    no_args_is_help=True,
    epilog="Example: edgedeploy compile examples/kws/dscnn_mlperf_int8.tflite -t ethos-u55-128; "
           "shell completion: edgedeploy --install-completion",
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version_callback(value: bool) -> None:
    if value:
        from .. import __version__  # importlib.metadata: only when asked

        typer.echo(f"edgedeploy {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    verbose: int = typer.Option(0, "--verbose", "-v", count=True, help="More log output on stderr (-vv for debug)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Only errors on stderr."),
    version: bool = typer.Option(False, "--version", callback=_version_callback, is_eager=True, help="Print the version."),
) -> None:
    level = logging.ERROR if quiet else (logging.WARNING, logging.INFO, logging.DEBUG)[min(verbose, 2)]
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("edgedeploy: %(message)s"))
    log = logging.getLogger("edgedeploy")
    log.handlers[:] = [handler]
    log.setLevel(level)
    log.propagate = False


def _register_commands() -> None:
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"{__package__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"{__package__}.{name}":
                continue
            raise
        module.register(app)
        if hasattr(module, "prestart"):
            PRESTART[name] = module.prestart


_register_commands()
