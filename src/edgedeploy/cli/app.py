"""The typer application: the root options and the command list (one module per command)."""

from __future__ import annotations

import importlib
import logging
import sys

import typer

from .. import __version__

# Each module of this package named here has ``register(app)``; a missing one is left out.
COMMANDS = ("compile", "targets", "optimize", "report", "export", "fvp", "doctor")

app = typer.Typer(
    name="edgedeploy",
    help="Take a Keras model to an Arm Ethos-U NPU: optimize, convert, compile with Vela, report, export.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version_callback(value: bool) -> None:
    if value:
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


_register_commands()
