"""The Python API behind the CLI: every command calls only these functions. Nothing here imports TensorFlow
(or NumPy) at import time; each function imports what it runs when it is called, and the classes named here are
imported when first used.

    from edgedeploy import api
    run = api.compile(["model_int8.tflite"], ["ethos-u55-128"], "out")  # or a project file, a run folder
    run = api.optimize("model.h5", "data.npz", "out", leaves=["ptq", "pcqat"], settings={"epochs": 2})
    report = api.build_report(Path("out"))
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Sequence

from edgedeploy.config import DEFAULT_RUN_DIR  # the default run folder, also the command line's
from edgedeploy.core.lazy import lazy_exports
from edgedeploy.interactive.arguments import DATA_FILE, MODEL_FILE, as_path, as_paths, target_names

if TYPE_CHECKING:
    import os

    import keras
    import numpy as np
    import tensorflow as tf
    import tf_keras

    from edgedeploy.config.keys import Key
    from edgedeploy.config.recipe import Recipe
    from edgedeploy.config.targets import Target
    from edgedeploy.core.manifest import Manifest, Metric, StageRecord
    from edgedeploy.export.locate import ExportOptions
    from edgedeploy.export.bundle_stage import ExportResult
    from edgedeploy.fvp.inference import FvpOutcome
    from edgedeploy.hil.emulate.golden_run import EmulationResult
    from edgedeploy.hil.emulate.serve import ServeResult
    from edgedeploy.interactive.report_view import Report
    from edgedeploy.interactive.optimize_run import OptimizeRun
    from edgedeploy.npu.verify import VerifyOptions, VerifyResult
    from edgedeploy.pipeline.compile import CompileOptions, CompileOutcome
    from edgedeploy.pipeline.environment import DoctorReport
    from edgedeploy.pipeline.driver import DriverOutcome
    from edgedeploy.pipeline.tree_run import OptimizeOutcome
    from edgedeploy.report.limits import Requirements, Tolerance
    from edgedeploy.tflite.reader import TfliteModel
    from edgedeploy.report.render.tables import compile_json
    from edgedeploy.vela.pool import VelaPool
    from edgedeploy.vela.worker import WarmWorker

__all__ = [
    "CompileOptions", "CompileOutcome", "DoctorReport", "DriverOutcome", "EmulationResult", "ExportOptions",
    "ExportResult", "FvpOutcome", "Key", "Manifest", "Metric", "OptimizeOutcome", "OptimizeRun", "Recipe",
    "Report", "Requirements", "ServeResult", "StageRecord", "Target", "TfliteModel", "Tolerance", "VerifyOptions",
    "VerifyResult", "WarmWorker", "build_report", "compare_reports", "compile", "compile_json", "doctor", "dumps",
    "emulate_bundle", "export_bundle", "fvp_run", "get_target", "is_sweep_folder", "leaves_json", "list_targets",
    "load_recipe", "load_report_json", "optimize", "parse_tolerances", "plain_settings", "raise_on_regression",
    "read_tflite", "recipe_key", "render_report", "report_formats", "requirements", "resolve_targets",
    "serve_bundle", "target_rows", "unmet_requirements", "verify_options", "verify_run", "walk", "walk_lines",
]

# The classes and table functions by the module that defines them, imported when first used.
_LAZY = {
    "edgedeploy.pipeline.compile": ("CompileOptions", "CompileOutcome"),
    "edgedeploy.pipeline.driver": ("DriverOutcome",),
    "edgedeploy.report.render.tables": ("compile_json",),
    "edgedeploy.pipeline.environment": ("DoctorReport",),
    "edgedeploy.hil.emulate.golden_run": ("EmulationResult",),
    "edgedeploy.export.locate": ("ExportOptions",),
    "edgedeploy.export.bundle_stage": ("ExportResult",),
    "edgedeploy.fvp.inference": ("FvpOutcome",),
    "edgedeploy.config.keys": ("Key",),
    "edgedeploy.core.manifest": ("Manifest", "Metric", "StageRecord"),
    "edgedeploy.pipeline.tree_run": ("OptimizeOutcome",),
    "edgedeploy.interactive.optimize_run": ("OptimizeRun",),
    "edgedeploy.config.recipe": ("Recipe",),
    "edgedeploy.interactive.report_view": ("Report",),
    "edgedeploy.report.limits": ("Requirements", "Tolerance"),
    "edgedeploy.hil.emulate.serve": ("ServeResult",),
    "edgedeploy.config.targets": ("Target",),
    "edgedeploy.tflite.reader": ("TfliteModel",),
    "edgedeploy.npu.verify": ("VerifyOptions", "VerifyResult"),
    "edgedeploy.vela.worker": ("WarmWorker",),
}
__getattr__ = lazy_exports(__name__, {name: module for module, names in _LAZY.items() for name in names})


def compile(
    sources: Sequence[str | os.PathLike[str]],
    targets: Sequence[str] = (),
    out: str | os.PathLike[str] | None = None,
    *,
    options: CompileOptions | None = None,
    walk: bool = False,
    requirements: Requirements | None = None,
    pool: VelaPool | None = None,
) -> DriverOutcome:
    """``edgedeploy compile``, the one compile of the API: what ``sources`` holds selects what is compiled.

    - int8 ``.tflite`` files: each imported into the run folder ``out`` and compiled for each of ``targets``;
    - one run folder of :func:`optimize`: its int8 leaves compiled into that same folder (``out`` left out, or the
      folder itself), so that its report sets each leaf's int8 accuracy beside its NPU figures;
    - one project file (``edgedeploy.toml``): its tree trained, converted and compiled; with ``walk`` level by
      level until a leaf meets the requirements; a project listing ``[[models]]`` is a sweep, one run folder per
      model.

    Sources of two kinds at once are one usage error.

    Args:
        sources: the models, the run folder or the project file.
        targets: target names or target files, beside a project's own.
        out: the run folder (default: the project's ``out``, else ``edgedeploy-out``).
        options: Vela's options and where the work runs (a project's ``[compile]`` table fills in the defaults).
        walk: walk the project's tree level by level (``BudgetExceededError``, exit 8, when no leaf meets).
        requirements: requirements over the project file's ``[requirements]`` (for ``walk``).
        pool: Vela workers already started.

    Returns:
        The run folder, its compile records (``outcome.compiled.records``), the walk's record and, for a sweep,
        the sweep's outcome (failed models are raised by ``outcome.sweep.raise_first_failure()``).
    """
    from edgedeploy.pipeline.compile import CompileOptions
    from edgedeploy.pipeline.driver import CompileRequest, compile_driver

    request = CompileRequest(tuple(as_paths(sources, "sources", "a model file, a run folder or a project file")),
                             tuple(target_names(targets)), None if out is None else as_path(out, "out", "a folder"),
                             options or CompileOptions(), walk, requirements)
    return compile_driver(request, pool=pool)


def walk(
    model: str | os.PathLike[str],
    data: str | os.PathLike[str],
    out: str | os.PathLike[str],
    recipe: Recipe,
    targets: Sequence[str],
    requirements: Requirements,
    options: CompileOptions | None = None,
    *,
    trust_lambda: bool = False,
) -> DriverOutcome:
    """``edgedeploy optimize MODEL --data DATA --walk``: train, convert, compile and judge the tree level by level
    and stop at the first level with a leaf that meets ``requirements`` on every target.

    Returns:
        The run folder and the walk's record (``outcome.walk``); raises ``BudgetExceededError`` (exit 8), with the
        walk recorded in the run's manifest, when no level meets.
    """
    from edgedeploy.pipeline.compile import CompileOptions, resolve_targets
    from edgedeploy.pipeline.driver import drive
    from edgedeploy.pipeline.run_plan import Plan

    plan = Plan(as_path(model, "model", MODEL_FILE), as_path(data, "data", DATA_FILE), as_path(out, "out", "a folder"),
                recipe, resolve_targets(target_names(targets)), options or CompileOptions(), requirements, walk=True,
                trust_lambda=trust_lambda)
    return drive(plan)


def optimize(
    model: str | os.PathLike[str] | tf_keras.Model | keras.Model,
    data: str | os.PathLike[str] | tuple[Any, Any] | Mapping[str, np.ndarray] | tf.data.Dataset,
    out: str | os.PathLike[str] = DEFAULT_RUN_DIR,
    *,
    leaves: Sequence[str] | None = None,
    recipe: str | os.PathLike[str] | Mapping[str, Any] | Recipe | None = None,
    settings: Mapping[str, Any] | None = None,
    preprocess: str | Callable[[np.ndarray], Any] | None = None,
    calibration: Callable[[], Iterable[Any]] | Iterable[Any] | None = None,
    labels: Sequence[str] | None = None,
    batched: bool | None = None,
    trust_lambda: bool = False,
    executor: str = "local",
    ray_address: str | None = None,
) -> OptimizeRun:
    """Run the deployment tree on ``model`` and ``data`` into the run folder ``out``, as :func:`edgedeploy.optimize`
    does (its page says what each argument takes), with the recipe keys given by name in ``settings``
    (``{"epochs": 2, "seed": 1}``; they win over ``recipe``), the stages run here or in ``jobs`` workers
    (``executor="local"``) or as Ray tasks (``"ray"``, at ``ray_address``). ``edgedeploy optimize`` calls it with
    its loaded recipe. Returns the run: its leaves' and trained nodes' records, ``.compile(targets)``,
    ``.report()``, ``.export(leaf, target, out)``."""
    from edgedeploy.interactive.optimize_run import optimize as run

    return run(model, data, out, leaves=leaves, recipe=recipe, preprocess=preprocess, calibration=calibration,
               labels=labels, batched=batched, trust_lambda=trust_lambda, executor=executor, ray_address=ray_address,
               **dict(settings or {}))


def load_recipe(path: Path | None = None, overrides: Mapping[str, Any] | None = None,
                table: Mapping[str, Any] | None = None) -> Recipe:
    """A checked recipe from the TOML file at ``path`` (or a parsed ``table``) with ``overrides`` (fields by name;
    None is left out) applied; a bad value raises :class:`edgedeploy.errors.UsageError` naming the key."""
    from edgedeploy.config.recipe import load_recipe as load

    return load(path, overrides, table)


def recipe_key(path: str) -> Key:
    """The recipe key at dotted ``path`` (``pruning.schedule``): its type, default and help, written only there."""
    from edgedeploy.config.keys import lookup
    from edgedeploy.config.recipe import RECIPE_KEYS

    return lookup(RECIPE_KEYS, path)


def plain_settings() -> dict[str, Any]:
    """What ``plain = true`` (``--plain``, TFMOT's plain fine-tuning) sets of the Recipe fields left unset."""
    from edgedeploy.config.recipe import PLAIN

    return dict(PLAIN)


def leaves_json(outcome: OptimizeRun | OptimizeOutcome) -> dict[str, Any]:
    """The leaves of a tree run as the versioned JSON document ``edgedeploy optimize --json`` prints."""
    from edgedeploy.report.render.leaf_table import leaves_json as doc

    return doc(outcome)


def list_targets() -> list[Target]:
    """Every built-in target, loaded and validated, in file-name order."""
    from edgedeploy.config.targets import list_targets as targets

    return targets()


def get_target(name_or_path: str) -> Target:
    """A built-in target by name, or a target TOML file by path, resolved and validated."""
    from edgedeploy.config.targets import get_target as get

    return get(name_or_path)


def resolve_targets(names: Sequence[str]) -> list[Target]:
    """Targets by name or file, each once, in the order given; none given is a usage error."""
    from edgedeploy.pipeline.compile import resolve_targets as resolve

    return resolve(names)


def target_rows(targets: Sequence[Target]) -> list[dict[str, str]]:
    """One row of text cells per target, as ``edgedeploy targets list`` shows them."""
    from edgedeploy.report.render.tables import target_rows as rows

    return rows(targets)


def read_tflite(path: Path | str) -> TfliteModel:
    """A ``.tflite`` file parsed (tensors, operators, buffers); a file that is not one raises an input error."""
    from edgedeploy.tflite.reader import read_tflite as read

    return read(as_path(path, "path", "a .tflite file"))


def doctor() -> DoctorReport:
    """What is installed: the required core (TensorFlow stack, Vela) and the optional FVPs, runners, compilers."""
    from edgedeploy.pipeline.environment import run_doctor

    return run_doctor()


def dumps(obj: Any) -> str:
    """``obj`` as indented JSON text, as every ``--json`` option prints it."""
    from edgedeploy.report.render.tables import dumps as text

    return text(obj)


def walk_lines(record: Mapping[str, Any] | None) -> list[str]:
    """A walk's record (levels visited, verdicts, the leaf picked) as lines of text."""
    from edgedeploy.report.render.walk_text import walk_lines as lines

    return lines(record)


def requirements(max_accuracy_drop: float | None = None, max_metric_drop: float | None = None,
                 max_flash: str | None = None, max_sram: str | None = None, max_latency_ms: float | None = None,
                 max_npu_cycles: int | None = None, *, project: Path | None = None) -> Requirements:
    """Requirements given as the ``--max-*`` options of ``report`` give them (accuracy points lost against the ptq
    leaf, the task metric's worsening, sizes as text such as ``512KiB``, milliseconds, NPU cycles), checked as a
    project file's are (a bad value raises :class:`edgedeploy.errors.UsageError` naming its flag), over the
    ``[requirements]`` of the ``project`` file where one is given."""
    from edgedeploy.report.judge import requirements_from_options
    from edgedeploy.report.limits import requirements_from_project

    req = requirements_from_options(max_accuracy_drop=max_accuracy_drop, max_metric_drop=max_metric_drop,
                                    max_flash=max_flash, max_sram=max_sram, max_latency_ms=max_latency_ms,
                                    max_npu_cycles=max_npu_cycles)
    return req if project is None else req.over(requirements_from_project(project))


def is_sweep_folder(path: Path) -> bool:
    """Whether ``path`` is the folder of a sweep (a project with [[models]]) rather than one run folder."""
    from edgedeploy.report.sweep_report import is_sweep_dir

    return is_sweep_dir(path)


def build_report(run_dir: Path, requirements: Requirements | None = None, *, html: bool = False) -> dict[str, Any]:
    """The report document (rows, judgments, recommendations) of a run folder (schema ``edgedeploy.report``) or
    of a sweep's folder (its models compared, ``edgedeploy.sweep_report``), judged by ``requirements`` (default:
    those a walk recorded, if any); ``html`` also gathers what only the HTML page plots (one run folder)."""
    if is_sweep_folder(run_dir):
        from edgedeploy.report.sweep_report import build_sweep_report

        return build_sweep_report(run_dir) if requirements is None else build_sweep_report(run_dir, requirements)
    from edgedeploy.report.build import build_report as build

    return build(run_dir, html=html) if requirements is None else build(run_dir, requirements, html=html)


def load_report_json(path: Path, *, sweep: bool = False) -> dict[str, Any]:
    """A report written earlier with ``--format json`` (a sweep's report with ``sweep``), checked."""
    from edgedeploy.report.regressions import load_report_json as load
    from edgedeploy.report.sweep_report import load_sweep_report_json

    return load_sweep_report_json(path) if sweep else load(path)


def parse_tolerances(spec: str | None) -> dict[str, Tolerance]:
    """``accuracy=0.5,flash=1%,sram=1KiB,cycles=2%`` over the defaults; accuracy is in percentage points."""
    from edgedeploy.report.limits import parse_tolerances as parse

    return parse(spec)


def compare_reports(old: Mapping[str, Any], new: Mapping[str, Any], tolerances: Mapping[str, Tolerance], *,
                    against: str = "") -> dict[str, Any]:
    """What got worse (beyond ``tolerances``), better or changed from ``old`` to ``new``: row by row, or model by
    model for sweep reports. ``against`` names the old report in the result."""
    from edgedeploy.report.regressions import compare_reports as compare

    return compare(old, new, tolerances, against=against)


def raise_on_regression(comparison: Mapping[str, Any]) -> None:
    """Raise :class:`edgedeploy.errors.RegressionError` when ``comparison`` (:func:`compare_reports`) has one."""
    from edgedeploy.report.regressions import raise_on_regression as check

    check(comparison)


def unmet_requirements(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The recommendations of a report whose leaves were judged and none met the requirements (``message``)."""
    from edgedeploy.report.judge import sweep_unmet, unmet_targets

    return sweep_unmet(doc) if doc["schema"] != "edgedeploy.report" else unmet_targets(doc)


def report_formats() -> tuple[str, ...]:
    """The formats :func:`render_report` writes: table, json, csv, markdown, html."""
    from edgedeploy.report.render import FORMATS

    return FORMATS


def render_report(doc: Mapping[str, Any], fmt: str) -> str:
    """A report document as text in ``fmt`` (one of :func:`report_formats`); every format shows the same numbers."""
    from edgedeploy.report.render import render

    return render(doc, fmt)


def export_bundle(run_dir: Path, options: ExportOptions) -> ExportResult:
    """The firmware bundle of one (leaf, target) of the run folder ``run_dir``: C source and header, CMake, golden
    vectors; ``options``: ``ExportOptions(out, target=, leaf=, name=, golden=, data=, section=, force=)``."""
    from edgedeploy.export.bundle_stage import export_bundle as export

    return export(run_dir, options)


def emulate_bundle(bundle: Path, *, tflm_dir: Path | str | None = None, build_dir: Path | None = None,
                   timeout: float | None = None, stack_bytes: int | None = None) -> EmulationResult:
    """The golden vectors of ``bundle`` (written by ``export``) through its firmware (CPU path, TFLM) on QEMU's
    Cortex-M55 board, bit for bit: built with the TFLM tree ``tflm_dir`` (default: ``EDGEDEPLOY_TFLM_DIR``) in
    ``build_dir`` (default: a temporary folder), ``stack_bytes`` of stack (default 32 KiB), stopped after
    ``timeout`` seconds (default 120). Returns every vector's comparison and the measured arena and stack;
    ``.check()`` raises on a mismatch."""
    from edgedeploy.hil.emulate.golden_run import emulate_bundle as emulate

    given: dict[str, Any] = {k: v for k, v in (("timeout", timeout), ("stack_bytes", stack_bytes)) if v is not None}
    return emulate(bundle, tflm_dir=tflm_dir, build_dir=build_dir, **given)


def serve_bundle(bundle: Path, address: str, *, tflm_dir: Path | str | None = None, build_dir: Path | None = None,
                 stack_bytes: int | None = None, on_ready: Callable[[str], None] | None = None) -> ServeResult:
    """A bundle's device runner on the emulated board's UART, served at ``address`` (``tcp:[HOST:]PORT``) until
    stopped; ``on_ready(line)`` is called when the runner is up. Other arguments as :func:`emulate_bundle`."""
    from edgedeploy.hil.emulate.serve import serve_bundle as serve

    given = {} if stack_bytes is None else {"stack_bytes": stack_bytes}
    return serve(bundle, address, tflm_dir=tflm_dir, build_dir=build_dir, on_ready=on_ready, **given)


def verify_options(*, leaf: str | None = None, target: str | None = None, data: Path | None = None,
                   count: int | None = None, seed: int | None = None) -> VerifyOptions:
    """What :func:`verify_run` checks: the leaf and target (may be left out when the run has one), on ``count``
    (default 8) rows of the evaluation ``data`` or, without data, ``count`` inputs drawn with ``seed``."""
    from edgedeploy.npu.verify import VerifyOptions

    given = {k: v for k, v in (("count", count), ("seed", seed)) if v is not None}
    return VerifyOptions(leaf=leaf, target=target, data=data, **given)


def verify_run(run_dir: Path, options: VerifyOptions) -> VerifyResult:
    """A compiled Ethos-U55/U65 leaf's command stream on the functional NPU model against TFLite's reference
    kernels; raises :class:`edgedeploy.errors.MismatchError` when an output differs."""
    from edgedeploy.npu.verify import verify_run as verify

    return verify(run_dir, options)


def fvp_run(run_dir: Path | str, leaf: str, target: str, *, fvp: Path | str | None = None,
            runner: Path | str | None = None, timeout: float | None = None,
            golden: Path | str | None = None) -> FvpOutcome:
    """The compiled ``leaf`` of a run folder on the Corstone FVP of its board ``target`` (``corstone-*``), stopped
    after ``timeout`` seconds (default 600), with the simulated NPU counters recorded in the run. ``fvp``: the FVP
    executable or its folder (default: found on the PATH); ``runner``: the board's inference runner ``.axf``;
    ``golden``: an ``export`` bundle whose first golden case is fed and compared. Returns the run's record and
    whether it was reused."""
    from edgedeploy.fvp.inference import fvp_run as run

    given: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
    return run(run_dir, leaf, target, fvp=fvp, runner=runner, golden=golden, **given)
