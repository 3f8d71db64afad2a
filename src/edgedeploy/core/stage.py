"""The stage lifecycle shared by optimize, convert, compile, export and fvp.

A stage is a function ``run(ctx, inputs, cfg) -> StageResult`` that writes only
inside the folder it is given. :func:`run_stage` gives it a fresh staging
folder, renames that into place when the stage succeeds, records a
:class:`~edgedeploy.core.manifest.StageRecord` and saves the manifest. A stage
whose inputs, parameters and tool versions are unchanged is not run again.

Every stage's writing starts in :func:`lock_output` and ends in :func:`place_staged` (its files put in place, or its staging folder removed and the
error named as the user knows the path): the stages of a run, through :func:`end_stage`, and the export of a
firmware bundle, whose files go into the user's folder one by one and whose record is the bundle's own manifest.
"""

from __future__ import annotations

import logging
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, TypeVar

from edgedeploy.errors import DiskFullError, EdgeDeployError, InvalidInputError, UsageError
from edgedeploy.core.files import LOCK_NAME, lock_run_dir, new_staging_dir, promote, sha256_file, sha256_json
from edgedeploy.core.nospace import no_space_error
from edgedeploy.core.names import check_name, is_valid
from edgedeploy.core.manifest import Artifact, Manifest, Metric, StageRecord, ToolInfo, artifacts_intact, now_iso

log = logging.getLogger("edgedeploy")
T = TypeVar("T")


def lock_output(folder: Path, named: str, hint: str) -> None:
    """The start of every stage's writing: the folder it writes into (a run folder, a firmware bundle's folder),
    made when absent and locked for this process (another command writing it is waited for). ``named``: the folder
    as the user gave it, for the message; ``hint``: how to give a folder instead of a file."""
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"{named} is a file", hint)
    try:
        lock_run_dir(folder, log)
    except OSError as exc:
        if (full := no_space_error(exc, folder / LOCK_NAME)) is not None:
            raise full from None
        raise UsageError(f"{named} cannot be written ({exc.strerror})", "check the path and its permissions") from exc


@dataclass
class RunContext:
    """Where a run writes, and its manifest."""

    run_dir: Path
    manifest: Manifest

    @classmethod
    def open(cls, run_dir: Path) -> "RunContext":
        """The run folder, locked for this process (another command writing it is waited for), and its manifest."""
        run_dir = Path(run_dir)
        lock_output(run_dir, f"output folder {run_dir}", "pass a folder path with -o/--out")
        return cls(run_dir, Manifest.open(run_dir))

    def stage_dir(self, stage_id: str) -> Path:
        """The folder of one stage: every part of its id a checked name, so it always lies inside the run."""
        parts = stage_id.split("/")
        for part in parts:
            if not is_valid("target", part):
                check_name("target", part, f"{self.run_dir}: stage {stage_id!r}: name", UsageError)
        for depth in range(1, len(parts)):  # a link on the way would put the stage's files outside the run
            folder = self.run_dir.joinpath(*parts[:depth])
            if folder.is_symlink():
                raise InvalidInputError(f"{folder} is a link; the folders inside a run folder must be its own",
                                        "remove the link (edgedeploy writes nothing through it)")
        return self.run_dir.joinpath(*parts)


@dataclass
class StageResult:
    """What a stage produced: output files (inside its folder), facts and notes."""

    outputs: dict[str, Path] = field(default_factory=dict)
    metrics: dict[str, Metric] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    tool: ToolInfo | None = None


@dataclass(frozen=True)
class StageSpec:
    """Identity of one stage run: which stage, on what, with which settings."""

    stage: str
    variant: str | None
    target: str | None = None
    parent: str | None = None
    params: Mapping[str, Any] = field(default_factory=dict)
    tool_versions: Mapping[str, str] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return "/".join(p for p in (self.stage, self.variant, self.target) if p)

    def cache_key(self, inputs: Mapping[str, Path]) -> str:
        return sha256_json(
            {
                "stage": self.stage,
                "params": dict(self.params),
                "tools": dict(self.tool_versions),
                "inputs": {role: sha256_file(p) for role, p in sorted(inputs.items())},
            }
        )


def cached_record(ctx: RunContext, spec: StageSpec, key: str) -> StageRecord | None:
    """The saved record of ``spec`` if it was made from the same inputs and its outputs are intact."""
    rec = ctx.manifest.records.get(spec.id)
    if rec is None or rec.status == "failed" or rec.cache_key != key:
        return None
    if not artifacts_intact(ctx.manifest, rec.outputs):
        log.warning("stage %s: an output was changed or removed after the stage wrote it; running the stage again",
                    spec.id)
        return None
    return rec


def _record(ctx: RunContext, spec: StageSpec, key: str, started: str, seconds: float, **facts: Any) -> StageRecord:
    """Record one run of ``spec`` in the manifest: its identity and timing, and the ``facts`` of its outcome."""
    rec = StageRecord(id=spec.id, stage=spec.stage, variant=spec.variant, target=spec.target, parent=spec.parent,
                      params=dict(spec.params), cache_key=key, started=started, seconds=round(seconds, 3), **facts)
    ctx.manifest.record(rec)
    return rec


def _commit(ctx: RunContext, pending: PendingStage, result: StageResult, started: str, seconds: float) -> StageRecord:
    """Record a finished stage whose outputs, made in its staging folder, were renamed into place."""
    staged, final = pending.staged, ctx.stage_dir(pending.spec.id)
    outputs = [Artifact.of(role, final / Path(p).resolve().relative_to(staged.resolve()), ctx.run_dir)
               for role, p in result.outputs.items()]
    return _record(ctx, pending.spec, pending.key, started, seconds, status="ok", tool=result.tool,
                   inputs=[Artifact.of(role, p, ctx.run_dir) for role, p in pending.inputs.items()],
                   outputs=outputs, metrics=result.metrics, details=result.details, warnings=result.warnings)


@dataclass
class PendingStage:
    """A stage begun by :func:`begin_stage`: its work writes into ``staged``; :func:`end_stage` records it."""

    spec: StageSpec
    key: str
    inputs: Mapping[str, Path]
    staged: Path
    started: str
    t0: float


def begin_stage(ctx: RunContext, spec: StageSpec, inputs: Mapping[str, Path], *,
                reuse: bool = True) -> StageRecord | PendingStage:
    """The first half of :func:`run_stage`: the earlier record when it can be reused, else a fresh staging folder
    for the stage's work (which may run elsewhere: in a worker process or a Ray task)."""
    key = spec.cache_key(inputs)
    if reuse:
        rec = cached_record(ctx, spec, key)
        if rec is not None:
            log.info("stage %s: unchanged, reusing the previous result", spec.id)
            return rec
    log.info("stage %s: running", spec.id)
    staged = new_staging_dir(ctx.stage_dir(spec.id))
    return PendingStage(spec, key, dict(inputs), staged, now_iso(), time.perf_counter())


def place_staged(staged: Path, shown: Path, work: Callable[[], T], place: Callable[[Path], None]) -> T:
    """The end of every stage's writing, recorded in a run's manifest or not (a firmware bundle): ``work()`` fills
    the staging folder ``staged`` (from :func:`~edgedeploy.core.files.new_staging_dir`) and gives the stage's
    result, ``place(staged)`` puts what it made where it belongs, and the result is returned. On an error the
    staging folder is removed and the error raised as an :class:`~edgedeploy.errors.EdgeDeployError`: a full disk,
    however the work met it, as a :class:`~edgedeploy.errors.DiskFullError` naming the file as it lies under
    ``shown`` (the stage's folder), not its staging name. Any other error is raised as it is."""
    try:
        result = work()
        place(staged)
    except BaseException as exc:
        shutil.rmtree(staged, ignore_errors=True)
        err = exc if isinstance(exc, EdgeDeployError) else (
            no_space_error(exc, shown) if isinstance(exc, Exception) else None)
        if err is None:
            raise
        if isinstance(err, DiskFullError) and str(staged) in err.message:  # the file as it lies in the stage folder
            err = DiskFullError(err.message.replace(str(staged), str(shown)), err.hint)
        if err is exc:
            raise
        raise err from None
    return result


def end_stage(ctx: RunContext, pending: PendingStage,
              work: Callable[[], tuple[StageResult, str | None, float | None]]) -> StageRecord:
    """The second half: ``work()`` gives the stage's result, with when its work started and how long it took where
    it ran (``None``: from :func:`begin_stage` to now), or raises its error; a result is renamed into place and
    recorded, an error is recorded and raised again, its staging folder removed (:func:`place_staged`). A full
    disk is not recorded: it says nothing about the stage, and the stage's earlier record and folder, if any, are
    left as they were."""
    spec = pending.spec
    shown = ctx.run_dir.joinpath(*spec.id.split("/"))
    try:
        result, started, seconds = place_staged(pending.staged, shown, work,
                                                lambda staged: promote(staged, ctx.stage_dir(spec.id)))
    except EdgeDeployError as err:
        if not isinstance(err, DiskFullError):
            _record(ctx, spec, pending.key, pending.started, time.perf_counter() - pending.t0, status="failed",
                    error=err.one_line())
        raise
    return _commit(ctx, pending, result, started or pending.started,
                   time.perf_counter() - pending.t0 if seconds is None else seconds)


def run_stage(
    ctx: RunContext,
    spec: StageSpec,
    inputs: Mapping[str, Path],
    fn: Callable[[Path], StageResult],
    *,
    reuse: bool = True,
) -> StageRecord:
    """Run ``fn(out_dir)`` unless an identical earlier run is recorded; record the result."""
    begun = begin_stage(ctx, spec, inputs, reuse=reuse)
    if not isinstance(begun, PendingStage):
        return begun
    return end_stage(ctx, begun, lambda: (fn(begun.staged), None, None))

