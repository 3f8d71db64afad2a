"""The typer application. Each command parses options, calls the Python API and renders."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from pathlib import Path
from typing import Iterator, List, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from . import __version__
from .errors import EdgeDeployError, UsageError

app = typer.Typer(
    name="edgedeploy",
    help="Take a Keras model to an Arm Ethos-U NPU: optimize, convert, compile with Vela, report, export.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
targets_app = typer.Typer(help="List and inspect Ethos-U targets.", no_args_is_help=True)
app.add_typer(targets_app, name="targets")

def _console(stderr: bool = False) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() else int(os.environ.get("COLUMNS", "200"))
    return Console(stderr=stderr, width=width)


out_console = _console()
err_console = _console(stderr=True)
log = logging.getLogger("edgedeploy")


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
    log.handlers[:] = [handler]
    log.setLevel(level)
    log.propagate = False


@contextlib.contextmanager
def guard() -> Iterator[None]:
    """Turn library errors into one line on stderr and the error's exit code."""
    try:
        yield
    except EdgeDeployError as exc:
        err_console.print(f"[bold red]error:[/] {escape(exc.one_line())}", highlight=False, soft_wrap=True)
        raise typer.Exit(exc.exit_code) from None
    except KeyboardInterrupt:
        err_console.print("interrupted; finished stages are kept, the one in progress left nothing behind")
        raise typer.Exit(130) from None


def _table(title: str, columns: tuple[tuple[str, str], ...], rows: list[dict[str, str]]) -> Table:
    table = Table(title=title, title_justify="left")
    for key, header in columns:
        table.add_column(header, justify="left" if key in ("variant", "target", "name", "kind") else "right")
    for row in rows:
        table.add_row(*(row[key] for key, _ in columns))
    return table


# --------------------------------------------------------------------------- compile


@app.command("compile")
def compile_cmd(
    models: List[Path] = typer.Argument(..., help="int8 .tflite model(s), an edgedeploy.toml project file, or the "
                                        "run folder of `edgedeploy optimize` (compiles its leaves into it)."),
    target: List[str] = typer.Option([], "--target", "-t", help="Target name or TOML file; repeat for several."),
    out: Path = typer.Option(Path("edgedeploy-out"), "--out", "-o", help="Run folder (manifest and outputs)."),
    json_out: bool = typer.Option(False, "--json", help="Print only versioned JSON on stdout."),
    optimise: str = typer.Option("Performance", "--optimise", help="Vela strategy: Performance or Size."),
    jobs: Optional[int] = typer.Option(None, "--jobs", "-j", help="Parallel Vela workers (default: one per CPU)."),
    allow_cpu_ops: bool = typer.Option(
        False, "--allow-cpu-ops", help="Accept operators Vela leaves on the CPU (other than I/O quantize)."
    ),
    executor: str = typer.Option("local", "--executor", help="Where Vela runs: local (process pool) or ray."),
    ray_address: Optional[str] = typer.Option(None, "--ray-address", help="Ray cluster to join (default: RAY_ADDRESS, else a local Ray)."),
    debug_db: bool = typer.Option(False, "--debug-db", help="Run Vela with its debug database: per-layer encoded "
                                  "weight bytes, distinct int8 values and weight-read cycles, shown by `report`."),
    walk: bool = typer.Option(False, "--walk", help="With a project file: train, convert and compile the tree level "
                              "by level and stop at the first level with a leaf meeting the project's requirements "
                              "on every target (exit 8 when none does)."),
) -> None:
    """Compile int8 TFLite models with Vela for one or more Ethos-U targets."""
    from . import cli
    from .compile import CompileOptions, compile_tflite
    from .manifest import Manifest
    from .render import COMPILE_COLUMNS, compile_json, compile_rows, dumps

    with guard():
        options = CompileOptions(optimise=optimise, jobs=jobs, allow_cpu_ops=allow_cpu_ops, executor=executor,
                                 ray_address=ray_address, debug_db=debug_db)
        pool = cli._PREWARMED if executor == "local" else None
        walk_record = None
        if walk and not (len(models) == 1 and models[0].suffix == ".toml"):
            raise UsageError("--walk walks the deployment tree of a project file",
                             "pass one edgedeploy.toml: `edgedeploy compile edgedeploy.toml --walk`")
        if walk:
            from .compile import CompileOutcome
            from .walk import walk_project

            walked = walk_project(models[0], extra_targets=target,
                                  out=out if out != Path("edgedeploy-out") else None, options=options)
            outcome = CompileOutcome(walked.run_dir, walked.compiled)
            walk_record = walked.record
        elif len(models) == 1 and models[0].suffix == ".toml":
            from .project import run_project

            outcome = run_project(models[0], extra_targets=target, out=out if out != Path("edgedeploy-out") else None,
                                  options=options)
        elif len(models) == 1 and models[0].is_dir():
            from .compile import compile_run

            if out not in (Path("edgedeploy-out"), models[0]):
                raise UsageError(f"a run folder is compiled into itself, not into {out}",
                                 f"leave out --out, or copy {models[0]} to {out} first")
            outcome = compile_run(models[0], target, options, pool=pool)
        else:
            for m in models:
                if m.is_dir():
                    raise UsageError(f"{m} is a folder", "pass a run folder alone: `edgedeploy compile RUN_DIR -t T`")
                if m.suffix == ".toml":
                    raise UsageError(f"{m} is a project file", "pass it alone: `edgedeploy compile edgedeploy.toml`")
            outcome = compile_tflite(models, target, out, options, pool=pool)
        cached_ids = outcome.cached_ids
        manifest = Manifest.load(outcome.run_dir)
        if json_out:
            doc = compile_json(manifest, outcome.records, cached_ids)
            if walk_record is not None:
                doc["walk"] = walk_record
            typer.echo(dumps(doc))
        else:
            rows = compile_rows(manifest, outcome.records, cached_ids)
            columns = tuple(c for c in COMPILE_COLUMNS if c[0] != "accuracy" or any(r["accuracy"] != "n/a" for r in rows))
            out_console.print(_table(f"Vela {manifest.tools.get('ethos-u-vela', '')} estimates", columns, rows))
            for r in outcome.records:
                for w in r.warnings:
                    err_console.print(f"[yellow]warning:[/] {escape(f'{r.variant} on {r.target}: {w}')}", highlight=False)
            if walk_record is not None:
                from .walk_text import walk_lines

                for line in walk_lines(walk_record):
                    out_console.print(line, markup=False, highlight=False)
            err_console.print(f"manifest: {manifest.path}; compare the variants with "
                              f"`edgedeploy report {manifest.run_dir}`", highlight=False, markup=False)


# --------------------------------------------------------------------------- targets


@targets_app.command("list")
def targets_list(json_out: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """List the built-in targets."""
    from .render import dumps, target_rows
    from .targets import list_targets

    with guard():
        targets = list_targets()
        if json_out:
            typer.echo(dumps([t.to_dict() for t in targets]))
            return
        cols = (("name", "Name"), ("kind", "Kind"), ("npu", "NPU"), ("system", "Vela system config"),
                ("memory_mode", "Memory mode"), ("clock", "NPU clock"), ("sram", "Board SRAM"), ("fvp", "FVP"))
        out_console.print(_table("Built-in targets", cols, target_rows(targets)))


@targets_app.command("show")
def targets_show(name: str = typer.Argument(..., help="Target name or TOML file.")) -> None:
    """Show one target, resolved (with the vela.ini it uses and its sha256)."""
    from .render import dumps
    from .targets import get_target

    with guard():
        typer.echo(dumps(get_target(name).to_dict()))


def _register_command_modules() -> None:
    """Attach the commands that live in their own modules (each has ``register(app)``)."""
    import importlib

    for name in ("cli_optimize", "cli_report", "cli_export", "cli_fvp"):
        try:
            module = importlib.import_module(f"edgedeploy.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"edgedeploy.{name}":
                continue
            raise
        module.register(app)


_register_command_modules()
