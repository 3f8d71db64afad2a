"""The driver: one model's run (:func:`run`), and what ``edgedeploy compile`` does with what it is given
(:func:`compile_driver`), each read top to bottom.

Every command and API call that trains a tree comes here: ``edgedeploy compile PROJECT.toml`` (with ``--walk`` or
not, one model or each model of a sweep), ``edgedeploy optimize`` (with ``--walk`` or not), and the notebook API
``edgedeploy.optimize``. Each builds a :class:`~edgedeploy.pipeline.run_plan.Plan` (a project file's model table,
or the arguments) and hands it to :func:`drive`, which opens the one stage runner of the command
(:func:`edgedeploy.pipeline.runners.open_runner`, closed when the run ends) and calls :func:`run`:

    run(plan, runner)
      1. Load: the model, the data and the task, loaded and checked once (:meth:`Plan.load`).
      2. Task graph: every node the leaves need, every leaf and its compiles (:func:`~.tree_run.open_tree`; the
         run folder's manifest records the model, data, recipe and task first).
      3. Run: each task starts on the runner as soon as the stages it reads are done (:meth:`TreeGraph.run`).
      4. Gate: Vela's version recorded, and a CPU fallback refused unless allowed (:meth:`TreeGraph.gate`).
      5. Record: each stage was recorded in the manifest as it finished; the outcome returned.
    ``--walk`` runs steps 2 to 4 level by level (:func:`edgedeploy.pipeline.walk.walk`), judging after each level,
    and records the walk in the manifest.

    compile_driver(request)
      1. What the sources are: int8 ``.tflite`` files, the run folder of ``edgedeploy optimize``, or one project
         file (:func:`source_kind`).
      2. ``.tflite`` files or a run folder: import the models (or take the run's leaves) and compile each for each
         target (:mod:`edgedeploy.pipeline.compile`). Done.
      3. A project file, read once (:func:`edgedeploy.pipeline.project.load_project`): its targets, compile options
         and requirements, with the command line's over them.
      4. Its model's plan through :func:`drive`; or, for a sweep (``[[models]]``, :mod:`edgedeploy.pipeline.sweep`),
         each model's plan through :func:`run` on one runner for the whole sweep.

Walk and sweep are strategies over :func:`run`; neither imports this module.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from edgedeploy.config import DEFAULT_RUN_DIR
from edgedeploy.config.recipe import Recipe
from edgedeploy.errors import UsageError
from edgedeploy.pipeline.compile import CompileOptions, CompileOutcome, compile_run, compile_tflite, resolve_targets
from edgedeploy.pipeline.project import Project, load_project, merged_options
from edgedeploy.report import Requirements, requirements_from_table

if TYPE_CHECKING:
    from edgedeploy.pipeline.run_plan import Plan
    from edgedeploy.pipeline.runners import StageRunner
    from edgedeploy.pipeline.tree_run import OptimizeOutcome
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
    """What one command did: its run folder and compile records; the tree's leaves and nodes; the walk's record
    (``--walk``); the sweep's outcome (a project with ``[[models]]``, whose models' failures
    :meth:`SweepOutcome.raise_first_failure` raises)."""

    run_dir: Path
    compiled: CompileOutcome
    walk: dict[str, Any] | None = None
    sweep: SweepOutcome | None = None
    tree: OptimizeOutcome | None = None  # every leaf's and trained node's record (a run that is not a walk)


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
    from edgedeploy.pipeline.run_plan import Plan

    if project.is_sweep:
        from edgedeploy.pipeline.sweep import run_sweep

        sweep = run_sweep(project, targets, options, request.out or project.out, requirements, walk=request.walk,
                          run=run)
        return DriverOutcome(sweep.out, CompileOutcome(sweep.out), sweep=sweep)
    return drive(Plan.of_entry(project.entry, request.out or project.out, targets, options, requirements,
                               walk=request.walk))


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


def drive(plan: Plan) -> DriverOutcome:
    """One plan on its own stage runner (made here, closed when the run ends): :func:`run`."""
    from edgedeploy.pipeline.runners import open_runner

    plan.options.check()
    with open_runner(plan.options.executor, plan.options.ray_address, plan.recipe.jobs) as runner:
        return run(plan, runner)


def run(plan: Plan, runner: StageRunner) -> DriverOutcome:
    """One model's run on ``runner``: load, task graph, run, gate, record (see the module text). A walk that meets
    nothing raises :class:`~edgedeploy.errors.BudgetExceededError` (its record is in the run's manifest)."""
    from edgedeploy.pipeline.walk import walk

    inputs = plan.load()  # 1. load, once

    def tree(recipe: Recipe) -> OptimizeOutcome:
        from edgedeploy.pipeline.tree_run import open_tree

        graph = open_tree(inputs, plan.out, recipe, runner, targets=plan.targets,  # 2. task graph
                          compile_options=plan.options, reuse=plan.reuse)
        done = graph.run()  # 3. run
        graph.gate(done)  # 4. gate
        return done  # 5. record: every stage is in the run's manifest

    if plan.walk:  # 2-4 level by level, until a level meets the requirements; the walk's record in the manifest
        walked = walk(plan, tree)
        return DriverOutcome(walked.run_dir, CompileOutcome(walked.run_dir, walked.compiled), walk=walked.record)
    done = tree(plan.recipe)
    return DriverOutcome(done.run_dir, done.compiled or CompileOutcome(done.run_dir), tree=done)
