"""``edgedeploy compile``: int8 TFLite models through Vela for one or more targets."""

from __future__ import annotations

from pathlib import Path
from typing import Any, List, Optional

import typer

from ..api import DEFAULT_RUN_DIR

EXAMPLE = "Example: edgedeploy compile examples/kws/dscnn_mlperf_int8.tflite -t ethos-u55-128 -t ethos-u85-256"


def _complete_target(incomplete: str) -> list[str]:
    from .common import complete_target

    return complete_target(incomplete)


def register(app: typer.Typer) -> None:
    app.command("compile", epilog=EXAMPLE)(compile_cmd)


def compile_cmd(
    ctx: typer.Context,
    models: List[Path] = typer.Argument(..., help="int8 .tflite model(s), an edgedeploy.toml project file, or the "
                                        "run folder of `edgedeploy optimize` (compiles its leaves into it)."),
    target: List[str] = typer.Option([], "--target", "-t", help="Target name or TOML file; repeat for several.",
                                     autocompletion=_complete_target),
    out: Path = typer.Option(Path(DEFAULT_RUN_DIR), "--out", "-o", help="Run folder (manifest and outputs)."),
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
    verify: bool = typer.Option(False, "--verify", help="Then run each compiled Ethos-U55/U65 leaf on the functional "
                                "NPU model and compare it with TFLite's reference kernels (as `edgedeploy verify`)."),
) -> None:
    """Compile int8 TFLite models with Vela for one or more Ethos-U targets."""
    from .prestart import PRESTARTED

    pool = ctx.find_root().meta.get(PRESTARTED) if executor == "local" else None
    _compile(models, target, out, json_out, optimise, jobs, allow_cpu_ops, executor, ray_address, debug_db, pool,
             walk, verify)


def prestart(values: dict[str, Any], warm=None):
    """Vela workers for this compile, started before its options are converted (see :mod:`.prestart`);
    ``warm`` (the worker the console script started) is adopted as the first of them.

    Only for .tflite files into a new run folder with the local executor: a project file runs TensorFlow
    first, and a re-run most likely reuses its results (workers then start when something needs compiling).
    """
    models, out = [Path(m) for m in values.get("models") or ()], Path(values.get("out") or DEFAULT_RUN_DIR)
    if values.get("executor") != "local" or not values.get("target") or not models:
        return None
    if any(m.suffix != ".tflite" for m in models):
        return None
    if (out / "manifest.json").exists():
        return None
    from ..api import process

    n_tasks = max(1, len(values.get("target") or ())) * len(models)
    return process.prestart_pool(str(values.get("jobs") or ""), n_tasks, warm)


def _compile(models, target, out, json_out, optimise, jobs, allow_cpu_ops, executor, ray_address, debug_db,
             pool, walk=False, verify=False) -> None:
    from .. import api
    from ..api import process
    from .common import err_console, escape, guard, out_console, table

    with guard():
        options = api.CompileOptions(optimise=optimise, jobs=jobs, allow_cpu_ops=allow_cpu_ops, executor=executor,
                                     ray_address=ray_address, debug_db=debug_db)
        done = api.compile(models, target, None if out == Path(DEFAULT_RUN_DIR) else out, options=options,
                           walk=walk, pool=pool)
        if done.sweep is not None:
            from .compile_sweep import print_sweep

            print_sweep(done.sweep, json_out)
            done.sweep.raise_first_failure()
            return
        outcome, walk_record = done.compiled, done.walk
        cached_ids = outcome.cached_ids
        manifest = api.Manifest.load(outcome.run_dir)
        if json_out:
            doc = api.compile_json(manifest, outcome.records, cached_ids)
            if walk_record is not None:
                doc["walk"] = walk_record
            if verify:
                from .verify import verify_compiled

                doc["verify"] = verify_compiled(outcome.run_dir, outcome.records, json_out)
            typer.echo(api.dumps(doc))
        else:
            rows = process.compile_rows(manifest, outcome.records, cached_ids)
            columns = process.compile_columns(rows)
            out_console.print(table(f"Vela {manifest.tools.get('ethos-u-vela', '')} estimates", columns, rows))
            for r in outcome.records:
                for w in r.warnings:
                    err_console.print(f"[yellow]warning:[/] {escape(f'{r.variant} on {r.target}: {w}')}", highlight=False)
            if walk_record is not None:
                for line in api.walk_lines(walk_record):
                    out_console.print(f"walk {line}", markup=False, highlight=False)
            err_console.print(f"manifest: {manifest.path}; compare the variants with "
                              f"`edgedeploy report {manifest.run_dir}`", highlight=False, markup=False)
        if verify and not json_out:
            from .verify import verify_compiled

            verify_compiled(outcome.run_dir, outcome.records, json_out)

