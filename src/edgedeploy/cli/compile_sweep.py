"""What ``edgedeploy compile PROJECT.toml`` prints for a sweep (a project listing [[models]]): one table over
every model's compiles, or one JSON document holding each model's compile JSON and the sweep's record."""

from __future__ import annotations

from typing import Any

import typer

SWEEP_COMPILE_SCHEMA = "edgedeploy.compile_sweep"
SWEEP_COMPILE_SCHEMA_VERSION = 1


def sweep_json(sweep: Any) -> dict[str, Any]:
    from .. import __version__, api

    models: dict[str, Any] = {}
    for m in sweep.members:
        entry: dict[str, Any] = {"run_dir": str(m.run_dir), "status": "failed" if m.error else "ok"}
        if m.error is not None:
            entry["error"] = {"exit_code": m.error.exit_code, "message": m.error.message, "hint": m.error.hint}
        if m.outcome is not None:
            entry["compile"] = api.compile_json(api.Manifest.load(m.run_dir), m.outcome.records, m.outcome.cached_ids)
        if m.walk is not None:
            entry["walk"] = m.walk
        models[m.name] = entry
    return {"schema": SWEEP_COMPILE_SCHEMA, "schema_version": SWEEP_COMPILE_SCHEMA_VERSION,
            "edgedeploy_version": __version__, "out": str(sweep.out), "sweep": sweep.record, "models": models}


def print_sweep(sweep: Any, json_out: bool) -> None:
    """The compile table of every model (a Model column first), failures, walks, and where the report is."""
    from .. import api
    from ..api import process
    from .common import err_console, escape, out_console, table

    if json_out:
        typer.echo(api.dumps(sweep_json(sweep)))
        return
    rows: list[dict[str, str]] = []
    vela = ""
    for m in sweep.members:
        if m.outcome is None:
            continue
        manifest = api.Manifest.load(m.run_dir)
        vela = vela or manifest.tools.get("ethos-u-vela", "")
        rows += [{"model": m.name, **r} for r in process.compile_rows(manifest, m.outcome.records, m.outcome.cached_ids)]
        for r in m.outcome.records:
            for w in r.warnings:
                err_console.print(f"[yellow]warning:[/] {escape(f'{m.name}: {r.variant} on {r.target}: {w}')}",
                                  highlight=False)
    columns = process.sweep_columns(rows)
    out_console.print(table(f"Vela {vela} estimates, {len(sweep.members)} models", columns, rows))
    for m in sweep.members:
        for line in api.walk_lines(m.walk):
            out_console.print(f"walk {m.name}: {line}", markup=False, highlight=False)
        if m.error is not None:
            out_console.print(f"failed {m.name}: {m.error.one_line()}", markup=False, highlight=False)
    err_console.print(f"sweep: {sweep.out}; compare the models with `edgedeploy report {sweep.out}`",
                      highlight=False, markup=False)
