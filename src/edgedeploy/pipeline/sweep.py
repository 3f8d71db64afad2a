"""A sweep: every model of a project file's ``[[models]]`` tables through one pipeline, into ``OUT/NAME``.

``edgedeploy compile PROJECT.toml`` on a project listing ``[[models]]`` runs each model in file order, the
model's plan (:class:`edgedeploy.pipeline.run_plan.Plan`) through the driver's
:func:`edgedeploy.pipeline.driver.run` (its whole tree, or with ``--walk`` its walk) on one stage runner, into its
own run folder ``OUT/NAME``: a complete run that ``report``, ``export`` and ``emulate`` take like any other. All
models share the project's targets, compile options and requirements; each has its own recipe.

What a failure does: a model whose run raises one of edgedeploy's errors is recorded as failed and the others
still run; the sweep ends with the first failed model's error (so its exit code), naming every model that
failed. A walk that meets nothing (exit 8) is such a failure, with its walk recorded in the model's manifest.

The sweep's own record, ``OUT/sweep.json`` (:mod:`edgedeploy.report.sweep_report`), lists the models, their folders
and each one's status, error and time; it is written atomically before the first model starts and after each
model, so an interrupted sweep says how far it got. Facts about the models stay in their manifests.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from edgedeploy.config.targets import Target
from edgedeploy.pipeline.compile import CompileOptions, CompileOutcome
from edgedeploy.errors import BudgetExceededError, EdgeDeployError, InvalidInputError, UsageError
from edgedeploy.core.files import atomic_write_text
from edgedeploy.core.manifest import Manifest, now_iso
from edgedeploy.pipeline.project import ModelEntry, Project
from edgedeploy.pipeline.run_plan import Plan
from edgedeploy.pipeline.runners import StageRunner, open_runner
from edgedeploy.report import Requirements
from edgedeploy.report.sweep_report import SWEEP_FILE, SWEEP_SCHEMA, SWEEP_SCHEMA_VERSION

log = logging.getLogger("edgedeploy")

# the driver's run of one plan on a runner (edgedeploy.pipeline.driver.run): its outcome, whose ``compiled`` and
# ``walk`` a member keeps
RunPlan = Callable[[Plan, StageRunner], Any]


@dataclass
class MemberOutcome:
    """One model of a sweep: its run folder, and its compile outcome or its error."""

    name: str
    run_dir: Path
    outcome: CompileOutcome | None = None
    walk: dict[str, Any] | None = None
    error: EdgeDeployError | None = None


@dataclass
class SweepOutcome:
    out: Path
    record: dict[str, Any]
    members: list[MemberOutcome] = field(default_factory=list)

    @property
    def failed(self) -> list[MemberOutcome]:
        return [m for m in self.members if m.error is not None]

    def raise_first_failure(self) -> None:
        """The first failed model's error (same class, so the same exit code), naming every failed model."""
        failed = self.failed
        if not failed:
            return
        first, error = failed[0], failed[0].error
        assert error is not None  # (a failed member)
        done = [m.name for m in self.members if m.error is None]
        also = [m.name for m in failed[1:]]
        text = (f"model '{first.name}' of the sweep failed: {error.message}"
                + (f"; also failed: {', '.join(also)}" if also else "")
                + (f"; finished: {', '.join(done)}" if done else ""))
        hint = (error.hint or "") + (f" (each model's outcome is in {self.out / SWEEP_FILE})")
        raise type(error)(text, hint.strip()) from error


def write_record(out: Path, record: dict[str, Any]) -> None:
    import json

    atomic_write_text(Path(out) / SWEEP_FILE, json.dumps(record, indent=2) + "\n")


def check_files(project: Project) -> None:
    """Every model and data file a sweep will read exists (before anything is written)."""
    from edgedeploy.core.files import check_input_file

    for m in project.models:
        for what, p in (("model", m.model), ("data", m.data)):
            if not p.exists():
                raise InvalidInputError(f"{project.path}: [[models]] '{m.name}': {what} file {p} does not exist",
                                        f"fix `{what}` of that table (paths are relative to the project file)")
            try:  # a regular file of bounded size
                check_input_file(p, f"[[models]] '{m.name}': {what} file", what)
            except InvalidInputError as exc:
                raise InvalidInputError(f"{project.path}: {exc.message}", exc.hint) from None


def _entry(m: ModelEntry) -> dict[str, Any]:
    return {"name": m.name, "folder": m.name, "model": str(m.model), "data": str(m.data),
            "leaves": list(m.recipe.leaves), "status": "pending"}


def run_sweep(
    project: Project,
    targets: Sequence[Target],
    opts: CompileOptions,
    out: Path,
    requirements: Requirements,
    *,
    walk: bool = False,
    run: RunPlan,
) -> SweepOutcome:
    """Run the plan of every ``[[models]]`` table of ``project`` into ``OUT/NAME`` with ``run`` (the driver's, which
    loads the model's inputs once and runs its tree or walk); see the module text.

    Failed models do not stop the others: call :meth:`SweepOutcome.raise_first_failure` after using the outcome.
    """
    if not project.is_sweep:
        raise UsageError(f"{project.path} lists no [[models]] tables",
                         "run a one-model project with `edgedeploy compile`")
    out = Path(out)
    check_files(project)
    if (out / "manifest.json").exists():
        raise UsageError(f"{out} is the run folder of one model (it holds manifest.json), not a sweep's folder",
                         "give the sweep its own folder: set out in the project file or pass --out")
    record: dict[str, Any] = {
        "schema": SWEEP_SCHEMA,
        "schema_version": SWEEP_SCHEMA_VERSION,
        "project": str(project.path.resolve()),
        "mode": "walk" if walk else "compile",
        "targets": [t.name for t in targets],
        "started": now_iso(),
        "finished": None,
        "models": [_entry(m) for m in project.models],
    }
    outcome = SweepOutcome(out, record)
    write_record(out, record)
    # one runner for every model: Ray (or the stage workers) start once per sweep
    with open_runner(opts.executor, opts.ray_address, max(m.recipe.jobs for m in project.models)) as runner:
        for entry, rec in zip(project.models, record["models"]):
            plan = Plan.of_entry(entry, out / entry.name, targets, opts, requirements if walk else Requirements(),
                                 walk=walk)
            _run_member(plan, entry.name, rec, outcome, run, runner)
    record["finished"] = now_iso()
    write_record(out, record)
    return outcome


def _run_member(plan: Plan, name: str, rec: dict[str, Any], outcome: SweepOutcome, run: RunPlan,
                runner: StageRunner) -> None:
    """One model of the sweep into ``OUT/NAME``; its status, error and time in the sweep's record."""
    member = MemberOutcome(name, plan.out)
    outcome.members.append(member)
    log.info("sweep: model %s -> %s", name, member.run_dir)
    rec["status"], t0 = "running", time.perf_counter()
    write_record(outcome.out, outcome.record)
    try:
        done = run(plan, runner)
        member.outcome, member.walk = done.compiled, done.walk
        rec["status"] = "ok"
    except EdgeDeployError as exc:
        member.error = exc
        if plan.walk and isinstance(exc, BudgetExceededError):  # the walk recorded where it stopped, then raised
            member.walk = Manifest.load(member.run_dir).info.get("walk")
        rec.update(status="failed", error={"type": type(exc).__name__, "exit_code": exc.exit_code,
                                           "message": exc.message, "hint": exc.hint})
        log.warning("sweep: model %s failed: %s", name, exc.one_line())
    except BaseException as exc:  # a bug or an interrupt stops the sweep; the record says where
        rec.update(status="failed", error={"type": type(exc).__name__, "exit_code": None,
                                           "message": f"the sweep stopped here: {type(exc).__name__}: {exc}",
                                           "hint": None})
        raise
    finally:
        rec["seconds"] = round(time.perf_counter() - t0, 2)
        write_record(outcome.out, outcome.record)
