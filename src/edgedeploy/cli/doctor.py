"""``edgedeploy doctor``: what is installed, required and optional."""

from __future__ import annotations

import typer

EXAMPLE = "Example: edgedeploy doctor --json"


def register(app: typer.Typer) -> None:
    app.command("doctor", epilog=EXAMPLE)(doctor_cmd)


def doctor_cmd(json_out: bool = typer.Option(False, "--json", help="Print only versioned JSON on stdout.")) -> None:
    """Show what is installed: the required core (TensorFlow stack, Vela) and optional FVPs, runners, compilers."""
    from .. import api
    from ..errors import ToolMissingError
    from .common import err_console, guard, out_console

    with guard():
        report = api.doctor()
        if json_out:
            typer.echo(api.dumps(report.to_dict()))
        else:
            from rich.table import Table

            table = Table(title="edgedeploy doctor", title_justify="left")
            for col in ("Component", "Needed", "Status", "Version", "Where / what", "How to get it"):
                table.add_column(col, overflow="fold")
            for c in report.checks:
                version = c.version or ""
                if c.expected and c.version and c.version != c.expected:
                    version += f" (pinned {c.expected})"
                style = "green" if c.status == "ok" else ("red" if c.required else "yellow")
                table.add_row(
                    c.name,
                    "required" if c.required else "optional",
                    f"[{style}]{c.status}[/]",
                    version,
                    c.path or c.detail,
                    c.hint or "",
                )
            out_console.print(table)
            optional = [c.name for c in report.missing_optional]
            if optional:
                err_console.print(f"optional parts missing: {', '.join(optional)}", highlight=False, soft_wrap=True,
                                  markup=False)
            if report.ok:
                err_console.print("the required core is installed and usable", highlight=False)
        if not report.ok:
            missing = report.missing_required
            raise ToolMissingError(
                f"required parts missing: {', '.join(c.name for c in missing)}",
                "; ".join(c.hint for c in missing if c.hint) or None,
            )
