"""``edgedeploy fvp run``: a compiled model on its board's Corstone FVP."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

EXAMPLE = "Example: edgedeploy fvp run out --leaf ptq -t corstone-300-u55-128"
FVP_SCHEMA = "edgedeploy.fvp"
FVP_SCHEMA_VERSION = 1

fvp_app = typer.Typer(
    help="Run compiled models on an Arm Corstone FVP (optional: needs an FVP from Arm and a runner app).",
    no_args_is_help=True,
    epilog=EXAMPLE,
)


@fvp_app.command("run", epilog=EXAMPLE)
def fvp_run_cmd(
    run_dir: Path = typer.Argument(..., help="Run folder written by `edgedeploy compile` or `optimize`."),
    leaf: str = typer.Option(..., "--leaf", "-l", help="Variant (leaf) whose compiled model to run."),
    target: str = typer.Option(..., "--target", "-t", help="Board target (corstone-*) it was compiled for."),
    fvp: Optional[Path] = typer.Option(None, "--fvp", help="FVP executable, or a folder holding it."),
    runner: Optional[Path] = typer.Option(
        None, "--runner", help="inference_runner .axf built with dynamic model loading for this board."
    ),
    timeout: float = typer.Option(600.0, "--timeout", help="Seconds before the run is stopped."),
    golden: Optional[Path] = typer.Option(
        None, "--golden", help="Folder written by `edgedeploy export` for this compile: feed its first golden case "
        "and compare the output with its reference.",
    ),
    json_out: bool = typer.Option(False, "--json", help="Print only versioned JSON on stdout."),
) -> None:
    """Run one compiled model on its board's FVP and record the simulated NPU counters."""
    from .. import api
    from .common import err_console, escape, guard, out_console

    with guard():
        outcome = api.fvp_run(run_dir, leaf, target, fvp=fvp, runner=runner, timeout=timeout, golden=golden)
        rec = outcome.record
        if json_out:
            from .. import __version__

            manifest = api.Manifest.load(run_dir)
            typer.echo(
                api.dumps(
                    {
                        "schema": FVP_SCHEMA,
                        "schema_version": FVP_SCHEMA_VERSION,
                        "edgedeploy_version": __version__,
                        "run_dir": str(manifest.run_dir),
                        "manifest": str(manifest.path),
                        "status": "cached" if outcome.cached else rec.status,
                        "tools": manifest.tools,
                        "target": manifest.targets.get(rec.target or ""),
                        "result": rec.to_dict(),
                    }
                )
            )
            return
        from rich.table import Table

        title = f"{rec.variant} on {rec.target} ({rec.tool.name + ' ' + rec.tool.version if rec.tool else 'FVP'})"
        table = Table(title=title + (" (cached)" if outcome.cached else ""), title_justify="left")
        for col in ("Metric", "Value", "Unit", "Mode"):
            table.add_column(col, justify="left" if col in ("Metric", "Unit", "Mode") else "right")
        for name, m in rec.metrics.items():
            value = "n/a" if m.value is None else (f"{m.value:,.3f}" if isinstance(m.value, float) else f"{m.value:,}")
            table.add_row(name, value, m.unit, m.mode)
        out_console.print(table)
        for w in rec.warnings:
            err_console.print(f"[yellow]warning:[/] {escape(w)}", highlight=False)
        err_console.print(f"input: {rec.details.get('input', {}).get('description', '')}", highlight=False, markup=False)
        err_console.print(f"manifest: {Path(run_dir) / 'manifest.json'}", highlight=False, markup=False)


def register(app: typer.Typer) -> None:
    app.add_typer(fvp_app, name="fvp")
