"""`edgedeploy report`: compare the variants × targets of a run, recommend a leaf, gate regressions."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

PROJECT_FILE = "edgedeploy.toml"

EXAMPLE = "Example: edgedeploy report out --max-flash 512KiB -f html"


def register(app: typer.Typer) -> None:
    app.command("report", epilog=EXAMPLE)(report_cmd)


def report_cmd(
    run_dir: Path = typer.Argument(..., help="Run folder written by `edgedeploy compile` or `optimize`, or a "
                                   "sweep's folder (a project with [[models]]): one report comparing its models."),
    fmt: str = typer.Option("table", "--format", "-f", help="table, json, csv, markdown or html."),
    out: Optional[Path] = typer.Option(
        None, "--out", "-o", help="Write the report to FILE (html defaults to RUN_DIR/report.html; others to stdout)."
    ),
    json_out: bool = typer.Option(False, "--json", help="Print only the versioned JSON on stdout (= --format json)."),
    max_accuracy_drop: Optional[float] = typer.Option(
        None, "--max-accuracy-drop", metavar="PTS",
        help="Most int8 accuracy a leaf may lose against the ptq leaf, in percentage points.",
    ),
    max_metric_drop: Optional[float] = typer.Option(
        None, "--max-metric-drop", metavar="VALUE",
        help="Most a leaf's metric (MSE, PSNR ... for models that are not classifiers) may worsen against ptq's.",
    ),
    max_flash: Optional[str] = typer.Option(
        None, "--max-flash", metavar="BYTES", help="Largest compiled model (the *_vela.tflite firmware stores in flash), e.g. 512KiB or 2MiB."
    ),
    max_sram: Optional[str] = typer.Option(
        None, "--max-sram", metavar="BYTES", help="Largest Vela SRAM estimate, e.g. 256KiB."
    ),
    max_latency_ms: Optional[float] = typer.Option(
        None, "--max-latency-ms", metavar="MS", help="Longest latency at the target's NPU clock."
    ),
    max_npu_cycles: Optional[int] = typer.Option(
        None, "--max-npu-cycles", metavar="N", help="Most NPU cycles per inference (Vela's estimate)."
    ),
    project: Optional[Path] = typer.Option(
        None, "--project", metavar="FILE",
        help=f"Project file whose \\[requirements] table applies (default: ./{PROJECT_FILE} if present); "
        "command-line limits take precedence.",
    ),
    compare: Optional[Path] = typer.Option(
        None, "--compare", metavar="OLD.json", help="A report written earlier with --format json to compare against."
    ),
    fail_on_regression: bool = typer.Option(
        False, "--fail-on-regression", help="Exit 10 when accuracy, flash, SRAM or cycles got worse than OLD.json."
    ),
    tolerance: Optional[str] = typer.Option(
        None, "--tolerance", metavar="SPEC",
        help="How much worse is still accepted: accuracy in points, the others in % or absolute "
        "(default accuracy=0.5,flash=1%,sram=1%,cycles=2%).",
    ),
) -> None:
    """Compare leaves × targets (accuracy, flash, SRAM, latency), recommend a leaf, and gate regressions.

    Reads only the run's manifest and the files it names; runs no tool. Exits 8 when no leaf meets the requirements on some target (the report is still written), and 10 on a regression with --fail-on-regression.
    """
    from .common import err_console, guard
    from ..errors import BudgetExceededError, UsageError
    from edgedeploy.core.files import atomic_write_text
    from ..report import (
        Requirements,
        build_report,
        compare_reports,
        load_report_json,
        parse_tolerances,
        raise_on_regression,
        requirements_from_project,
        unmet_targets,
    )
    from ..report.render import FORMATS, render
    from edgedeploy.config.requirements import check_requirements
    from ..report.sweep import (
        build_sweep_report, compare_sweeps, is_sweep_dir, load_sweep_report_json, sweep_unmet,
    )

    with guard():
        if json_out:
            if fmt not in ("table", "json"):
                raise UsageError(f"--json and --format {fmt} disagree", "pass one of them")
            fmt = "json"
        if fmt not in FORMATS:
            raise UsageError(f"--format is '{fmt}'", f"use one of {', '.join(FORMATS)}")
        if (fail_on_regression or tolerance) and compare is None:
            raise UsageError("--fail-on-regression and --tolerance need a reference report",
                             "pass --compare OLD.json (written with --format json)")
        tolerances = parse_tolerances(tolerance)
        given = check_requirements({  # the one check of limits, as for a project file
            "max_accuracy_drop": max_accuracy_drop, "max_metric_drop": max_metric_drop, "max_flash": max_flash,
            "max_sram": max_sram, "max_latency_ms": max_latency_ms, "max_npu_cycles": max_npu_cycles,
        }, "--{flag}", UsageError)
        requirements = Requirements(**given, sources=("command line",) if given else ())
        project_file = project if project is not None else (Path(PROJECT_FILE) if Path(PROJECT_FILE).is_file() else None)
        if project_file is not None:
            requirements = requirements.over(requirements_from_project(project_file))
        if is_sweep_dir(run_dir):  # one comparing report of the sweep's models; the gate runs per model
            old = load_sweep_report_json(compare) if compare is not None else None
            doc = build_sweep_report(run_dir, requirements)
            if old is not None:
                doc["comparison"] = compare_sweeps(old, doc, tolerances, against=str(compare))
        else:
            old = load_report_json(compare) if compare is not None else None
            doc = build_report(run_dir, requirements, html=fmt == "html")
            if old is not None:
                doc["comparison"] = compare_reports(old, doc, tolerances, against=str(compare))
        text = render(doc, fmt)
        if out is None and fmt == "html":
            out = Path(run_dir) / "report.html"
        if out is not None:
            atomic_write_text(out, text)
            err_console.print(f"report: {out}", highlight=False, markup=False)
        else:
            typer.echo(text, nl=False)
        if old is not None and fail_on_regression:
            raise_on_regression(doc["comparison"])
        unmet = sweep_unmet(doc) if doc["schema"] != "edgedeploy.report" else unmet_targets(doc)
        if unmet:
            raise BudgetExceededError(
                "; ".join(r["message"] for r in unmet),
                "relax a requirement, pick a board with more memory, or optimize further",
            )
