"""`edgedeploy report`: compare the variants × targets of a run, recommend a leaf, gate regressions."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer

PROJECT_FILE = "edgedeploy.toml"

EXAMPLE = "Example: edgedeploy report out --max-flash 512KiB -f html"


def register(app: typer.Typer) -> None:
    app.command("report", epilog=EXAMPLE)(report_cmd)


# typer declares the command's options as its parameters: the signature is the option list.
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
    values = dict(locals())  # every option by name, as the helpers below read them
    from .common import guard

    with guard():
        _report(values)


def _report(v: dict[str, Any]) -> None:
    from .. import api
    from ..errors import BudgetExceededError, UsageError

    fmt = _format(v["fmt"], v["json_out"])
    if (v["fail_on_regression"] or v["tolerance"]) and v["compare"] is None:
        raise UsageError("--fail-on-regression and --tolerance need a reference report",
                         "pass --compare OLD.json (written with --format json)")
    tolerances = api.parse_tolerances(v["tolerance"])
    project = v["project"] if v["project"] is not None else (Path(PROJECT_FILE) if Path(PROJECT_FILE).is_file() else None)
    # the one check of limits, as for a project file; the project's [requirements] fill in those not given
    requirements = api.requirements(**{k: v[k] for k in api.Requirements.KEYS}, project=project)
    run_dir, compare = v["run_dir"], v["compare"]
    # a sweep's folder: one comparing report of its models, and the gate runs per model
    old = api.load_report_json(compare, sweep=api.is_sweep_folder(run_dir)) if compare is not None else None
    doc = api.build_report(run_dir, requirements, html=fmt == "html")
    if old is not None:
        doc["comparison"] = api.compare_reports(old, doc, tolerances, against=str(compare))
    out = v["out"]
    if out is None and fmt == "html":
        out = Path(run_dir) / "report.html"
    _write(api.render_report(doc, fmt), out)
    if old is not None and v["fail_on_regression"]:
        api.raise_on_regression(doc["comparison"])
    unmet = api.unmet_requirements(doc)
    if unmet:
        raise BudgetExceededError(
            "; ".join(r["message"] for r in unmet),
            "relax a requirement, pick a board with more memory, or optimize further",
        )


def _format(fmt: str, json_out: bool) -> str:
    """The --format asked for, with --json (= --format json) checked against it."""
    from .. import api
    from ..errors import UsageError

    if json_out:
        if fmt not in ("table", "json"):
            raise UsageError(f"--json and --format {fmt} disagree", "pass one of them")
        fmt = "json"
    if fmt not in api.report_formats():
        raise UsageError(f"--format is '{fmt}'", f"use one of {', '.join(api.report_formats())}")
    return fmt


def _write(text: str, out: Optional[Path]) -> None:
    """The report into ``out`` (written whole, then renamed), or on stdout."""
    from ..api import process
    from .common import err_console

    if out is not None:
        process.write_text(out, text)
        err_console.print(f"report: {out}", highlight=False, markup=False)
    else:
        typer.echo(text, nl=False)
