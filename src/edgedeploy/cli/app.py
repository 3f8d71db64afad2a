"""The typer application: the root options and the command list (one module per command)."""

from __future__ import annotations

import importlib
import logging
import sys

from typing import Any, Callable

import typer
from typer.core import TyperGroup

from .. import __version__
from .common import PRESTARTED

# Each module of this package named here has ``register(app)``; a missing one is left out. A module may
# also have ``prestart(values)``: see :class:`_Group`.
COMMANDS = ("compile", "targets", "optimize", "report", "export", "fvp", "doctor")
PRESTART: dict[str, Callable[[dict[str, Any]], Any]] = {}


class _Group(TyperGroup):
    """The root command group; it runs the invoked command's ``prestart`` hook first.

    Converting option values (typer validates them with pydantic) and importing what a command runs
    take as long as Vela's own start-up. A command that needs Vela workers therefore gets, in its
    ``prestart(values)``, the values of its options as click's parser splits them from the command
    line (strings, before conversion; defaults for the options not given) and may start its workers
    there; what it returns is kept in the root context's ``meta[PRESTARTED]`` for the command and
    closed with the context. A command line that does not parse starts nothing: the normal parse
    then reports the error.
    """

    def parse_args(self, ctx, args: list[str]) -> list[str]:
        if not ctx.resilient_parsing:
            started = _prestart(self, ctx, list(args))
            if started is not None:
                ctx.meta[PRESTARTED] = started
                ctx.call_on_close(lambda: started.close(now=True))
        return super().parse_args(ctx, args)


def _prestart(group: TyperGroup, ctx, args: list[str]) -> Any:
    try:
        _, rest, _ = group.make_parser(ctx).parse_args(args=args)
        hook = PRESTART.get(rest[0]) if rest else None
        cmd = group.commands.get(rest[0]) if hook else None
        if cmd is None:
            return None
        opts, _, _ = cmd.make_parser(type(ctx)(cmd, parent=ctx, info_name=rest[0])).parse_args(args=rest[1:])
    except Exception:  # the normal parse reports it
        return None
    if opts.get("help"):
        return None
    return hook({p.name: opts.get(p.name, p.default) for p in cmd.params if p.name})


app = typer.Typer(
    cls=_Group,
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
        if hasattr(module, "prestart"):
            PRESTART[name] = module.prestart


_register_commands()
