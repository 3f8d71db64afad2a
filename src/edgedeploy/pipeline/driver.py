"""The driver: what ``edgedeploy compile`` does with what it is given, read top to bottom.

    compile_driver(request)
      1. What the sources are: int8 ``.tflite`` files, the run folder of ``edgedeploy optimize``, or one project
         file (:func:`source_kind`).
      2. ``.tflite`` files or a run folder: import the models (or take the run's leaves) and compile each for each
         target (:mod:`edgedeploy.pipeline.compile`). Done.
      3. A project file, read once (:func:`edgedeploy.pipeline.project.load_project`): its targets, compile options
         and requirements, with the command line's over them.
      4. One runner for the whole command (:func:`edgedeploy.pipeline.tree_run.make_runner`): this process, worker
         processes or Ray.
      5. Each model (one, or each ``[[models]]`` table of a sweep, :mod:`edgedeploy.pipeline.sweep`) through
         :func:`run_model`: its model, data and task loaded once (:func:`edgedeploy.pipeline.tree_run.load_inputs`),
         then the strategy:
           - the whole tree as one task graph: train, convert and compile every leaf
             (:func:`edgedeploy.pipeline.tree_run.run_tree`), or
           - ``--walk``: the same graph level by level until a leaf meets the requirements
             (:func:`edgedeploy.pipeline.walk.walk`).
      6. The outcome: the compile records (each stage recorded in the run's manifest as it finished), the walk's
         record, the sweep's record.

Walk and sweep are strategies the driver hands the loaded inputs and the runner to; neither imports this module.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from edgedeploy.config import DEFAULT_RUN_DIR
from edgedeploy.config.recipe import Recipe
from edgedeploy.config.targets import Target
from edgedeploy.errors import UsageError
from edgedeploy.pipeline.compile import CompileOptions, CompileOutcome, compile_run, compile_tflite, resolve_targets
from edgedeploy.pipeline.project import ModelEntry, Project, load_project, merged_options
from edgedeploy.report import Requirements, requirements_from_table

if TYPE_CHECKING:
    from edgedeploy.pipeline.runners import StageRunner
    from edgedeploy.pipeline.sweep import SweepOutcome
    from edgedeploy.vela import VelaExecutor

DEFAULT_OUT = Path(DEFAULT_RUN_DIR)


@dataclass(frozen=True)
class CompileRequest:
    """What ``edgedeploy compile`` is asked: its sources, extra targets, run folder, options and strategy."""

    sources: tuple[Path, ...]
    targets: tuple[str, ...] = ()
    out: Path | None = None  # None: a project's own `out`, else edgedeploy-out
    options: CompileOptions = CompileOptions()
    walk: bool = False
    requirements: Requirements | None = None  # over the project file's [requirements]


@dataclass
class DriverOutcome:
    """What one command did: its run folder and compile records; the walk's record (``--walk``); the sweep's
    outcome (a project with ``[[models]]``, whose models' failures :meth:`SweepOutcome.raise_first_failure` raises)."""

    run_dir: Path
    compiled: CompileOutcome
    walk: dict[str, Any] | None = None
    sweep: SweepOutcome | None = None


def compile_driver(request: CompileRequest, *, pool: VelaExecutor | None = None) -> DriverOutcome:
    """Run one ``edgedeploy compile``: see the module text. ``pool``: Vela workers already started for ``.tflite``
    sources (:mod:`edgedeploy.cli.prestart`)."""
    sources = [Path(s) for s in request.sources]
    kind = source_kind(sources, request.walk)
    if kind == "tflite":
        out = request.out or DEFAULT_OUT
        return DriverOutcome(out, compile_tflite(sources, request.targets, out, request.options, pool=pool))
    if kind == "run":
        if request.out not in (None, sources[0]):
            raise UsageError(f"a run folder is compiled into itself, not into {request.out}",
                             f"leave out --out, or copy {sources[0]} to {request.out} first")
        return DriverOutcome(sources[0], compile_run(sources[0], request.targets, request.options, pool=pool))

    project = load_project(sources[0])
    targets = resolve_targets([*project.targets, *request.targets])  # at least one, or a usage error
    options = merged_options(project, request.options)
    requirements = project_requirements(project, request.requirements) if request.walk else Requirements()
    # the tree's modules (optimize, walk, sweep, the judge) and numpy load only for a project file: .tflite files
    # and run folders compile without them (bench/bench_startup.py)
    from edgedeploy.pipeline.sweep import run_sweep
    from edgedeploy.pipeline.tree_run import make_runner

    if project.is_sweep:
        sweep = run_sweep(project, targets, options, request.out or project.out, requirements, walk=request.walk,
                          run_model=run_model)
        return DriverOutcome(sweep.out, CompileOutcome(sweep.out), sweep=sweep)

    runner = make_runner(options.executor, options.ray_address, project.recipe.jobs)
    try:
        compiled, walked = run_model(project.entry, request.out or project.out, targets, options, requirements,
                                     runner, walk=request.walk)
    finally:
        runner.close()
    return DriverOutcome(compiled.run_dir, compiled, walk=walked)


def source_kind(sources: Sequence[Path], walk: bool = False) -> str:
    """``tflite`` (int8 models), ``run`` (a run folder) or ``project`` (one project file); mixed sources are refused."""
    one = len(sources) == 1
    if walk and not (one and sources[0].suffix == ".toml"):
        raise UsageError("--walk walks the deployment tree of a project file",
                         "pass one edgedeploy.toml: `edgedeploy compile edgedeploy.toml --walk`")
    if one and sources[0].suffix == ".toml":
        return "project"
    if one and sources[0].is_dir():
        return "run"
    for m in sources:
        if m.is_dir():
            raise UsageError(f"{m} is a folder", "pass a run folder alone: `edgedeploy compile RUN_DIR -t T`")
        if m.suffix == ".toml":
            raise UsageError(f"{m} is a project file", "pass it alone: `edgedeploy compile edgedeploy.toml`")
    return "tflite"


def project_requirements(project: Project, over: Requirements | None) -> Requirements:
    """The project file's ``[requirements]`` (as it was read), with ``over``'s values winning."""
    req = requirements_from_table(project.requirements, project.path)
    return over.over(req) if over is not None else req


def run_model(entry: ModelEntry, run_dir: Path, targets: Sequence[Target], options: CompileOptions,
              requirements: Requirements, runner: StageRunner, *,
              walk: bool = False) -> tuple[CompileOutcome, dict | None]:
    """One model into ``run_dir``: its inputs loaded once, then the whole tree, or the walk level by level; its
    compile outcome and walk record. A walk that meets nothing raises (its record is in the run's manifest)."""
    from edgedeploy.pipeline.tree_run import load_inputs, run_tree
    from edgedeploy.pipeline.walk import levels_of
    from edgedeploy.pipeline.walk import walk as walk_levels

    recipe = entry.recipe
    # a walk checks the leaves of its first level now, each deeper level's when it gets there
    first = next(iter(levels_of(recipe.leaves).values())) if walk else None
    inputs = load_inputs(entry.model, entry.data, run_dir, recipe, trust_lambda=entry.trust_lambda, leaves=first)
    if walk:
        walked = walk_levels(inputs, run_dir, recipe, targets, requirements, options, runner=runner)
        return CompileOutcome(walked.run_dir, walked.compiled), walked.record
    return run_tree(inputs, run_dir, recipe, runner, targets=targets, compile_options=options).compiled, None


def walk_model(model: Path, data: Path, out: Path, recipe: Recipe, targets: Sequence[Target],
               requirements: Requirements, options: CompileOptions | None = None, *,
               trust_lambda: bool = False) -> DriverOutcome:
    """``edgedeploy optimize MODEL --data DATA --walk``: one model walked without a project file (raises
    :class:`~edgedeploy.errors.BudgetExceededError` when no level meets the requirements)."""
    from edgedeploy.pipeline.tree_run import make_runner

    options = options or CompileOptions()
    options.check()
    entry = ModelEntry("", Path(model), data, recipe, trust_lambda)
    runner = make_runner(options.executor, options.ray_address, recipe.jobs)
    try:
        compiled, walked = run_model(entry, Path(out), targets, options, requirements, runner, walk=True)
    finally:
        runner.close()
    return DriverOutcome(compiled.run_dir, compiled, walk=walked)
