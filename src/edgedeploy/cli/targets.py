"""``edgedeploy targets list`` and ``edgedeploy targets show``."""

from __future__ import annotations

import typer

targets_app = typer.Typer(help="List and inspect Ethos-U targets.", no_args_is_help=True,
                          epilog="Example: edgedeploy targets show ethos-u55-128")


def _complete_target(incomplete: str) -> list[str]:
    from .common import complete_target

    return complete_target(incomplete)


def register(app: typer.Typer) -> None:
    app.add_typer(targets_app, name="targets")


@targets_app.command("list", epilog="Example: edgedeploy targets list --json")
def targets_list(json_out: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """List the built-in targets."""
    from .. import api
    from .common import guard, out_console, table

    with guard():
        targets = api.list_targets()
        if json_out:
            typer.echo(api.dumps([t.to_dict() for t in targets]))
            return
        cols = (("name", "Name"), ("kind", "Kind"), ("npu", "NPU"), ("system", "Vela system config"),
                ("memory_mode", "Memory mode"), ("clock", "NPU clock"), ("sram", "Board SRAM (B)"), ("fvp", "FVP"))
        out_console.print(table("Built-in targets", cols, api.target_rows(targets)))


@targets_app.command("show", epilog="Example: edgedeploy targets show corstone-300-u55-128")
def targets_show(name: str = typer.Argument(..., help="Target name or TOML file.", autocompletion=_complete_target)) -> None:
    """Show one target, resolved (with the vela.ini it uses and its sha256)."""
    from .. import api
    from .common import guard

    with guard():
        typer.echo(api.dumps(api.get_target(name).to_dict()))
