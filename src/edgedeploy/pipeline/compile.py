"""The compile stage: int8 TFLite -> Vela, for each (variant, target) pair.

Facts only: this module runs Vela and records what it reports. Judging the
results (fits, Pareto front, recommendation) is the reporter's job.
"""

from __future__ import annotations

import logging
import shutil
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from edgedeploy.errors import CpuFallbackError, EdgeDeployError, InvalidInputError, ToolFailedError, UsageError
from edgedeploy.core.files import clear_staging_dir, prepare_lock, sha256_file
from edgedeploy.core.manifest import Manifest, Metric, StageRecord, ToolInfo, checked_artifact
from edgedeploy.core.stage import PendingStage, RunContext, StageResult, StageSpec, begin_stage, end_stage, run_stage
from edgedeploy.config.targets import Target, get_target
from edgedeploy.vela.compute import compute_facts
from edgedeploy.tflite.reader import BOUNDARY_OPS, check_int8_model, misbiased_descriptions
from edgedeploy.vela import VelaExecutor
from edgedeploy.vela import outputs as vela_backend
from edgedeploy.vela import runner as vela_runner
from edgedeploy.vela.runner import VelaResult, VelaRun
from edgedeploy.vela.pool import MAX_JOBS, VelaPool, default_jobs
from edgedeploy.pipeline.variants import keep_apart, variant_names

log = logging.getLogger("edgedeploy")

INT8_MODEL = "model_int8.tflite"


EXECUTORS = ("local", "ray")


def check_executor(executor: str) -> None:
    """Where work runs, as the user named it: ``local`` or ``ray``."""
    if executor not in EXECUTORS:
        raise UsageError(f"--executor is '{executor}'", f"use one of {', '.join(EXECUTORS)}")


@dataclass(frozen=True)
class CompileOptions:
    """How Vela compiles (its ``--optimise`` strategy, extra arguments, debug database), how many workers, where
    the work runs (``local`` or ``ray``) and whether operators may fall back to the CPU."""

    optimise: str = "Performance"
    jobs: int | None = None
    allow_cpu_ops: bool = False
    extra_vela_args: tuple[str, ...] = ()
    executor: str = "local"  # "local" process pool, or "ray" tasks
    ray_address: str | None = None
    debug_db: bool = False  # Vela's debug database: per-layer encoded weights and weight-read cycles

    def vela_extra(self) -> tuple[str, ...]:
        """Vela arguments beyond the target's: ``extra_vela_args``, plus ``--enable-debug-db`` when asked."""
        flag = "--enable-debug-db"
        return self.extra_vela_args + ((flag,) if self.debug_db and flag not in self.extra_vela_args else ())

    def check(self) -> None:
        check_executor(self.executor)
        if self.optimise not in vela_backend.OPTIMISE_CHOICES:
            raise UsageError(
                f"--optimise is '{self.optimise}'", f"use one of {', '.join(vela_backend.OPTIMISE_CHOICES)}"
            )
        if self.jobs is not None and not 1 <= self.jobs <= MAX_JOBS:
            raise UsageError(f"--jobs is {self.jobs}", f"use a number of worker processes from 1 to {MAX_JOBS}")
        if self.executor == "ray":  # a cluster that is not there stops the command before anything is written
            import os

            from edgedeploy.vela.ray_connect import probe_ray_address

            address = self.ray_address or os.environ.get("RAY_ADDRESS")
            if address:
                probe_ray_address(address, "RAY_ADDRESS" if address == os.environ.get("RAY_ADDRESS") and
                                  not self.ray_address else "--ray-address")


@dataclass
class CompileOutcome:
    """A run folder's compile records of one command; ``cached_ids``: those reused unchanged from an earlier run."""

    run_dir: Path
    records: list[StageRecord] = field(default_factory=list)
    cached_ids: set[str] = field(default_factory=set)

    @property
    def compiled(self) -> int:
        return len(self.records) - len(self.cached_ids)


def make_executor(options: CompileOptions, n_tasks: int) -> VelaExecutor:
    """Where Vela runs: the local worker pool (default) or Ray tasks."""
    if options.executor == "ray":
        from edgedeploy.vela.ray_pool import RayExecutor

        return RayExecutor(options.ray_address, options.jobs)
    return VelaPool(min(options.jobs, max(1, n_tasks)) if options.jobs else default_jobs(n_tasks))


def resolve_targets(names: Sequence[str]) -> list[Target]:
    if not names:
        raise UsageError("no target given", "pass --target NAME (see `edgedeploy targets list`)")
    targets, seen = [], set()
    for name in names:
        t = get_target(name)
        if t.name in seen:
            continue
        seen.add(t.name)
        targets.append(t)
    return targets


def import_tflite(ctx: RunContext, variant: str, model: Path) -> StageRecord:
    """Copy a user's (already checked) int8 model into the run, as the variant's int8 model."""
    spec = StageSpec("import", variant, params={"source": str(model.resolve())})

    def run(out: Path) -> StageResult:
        dest = out / INT8_MODEL
        shutil.copyfile(model, dest)
        return StageResult(outputs={"int8_model": dest}, metrics={"tflite_bytes": Metric(dest.stat().st_size, "B", "measured")})

    return run_stage(ctx, spec, {"model": model}, run)


def compile_spec(variant: str, target: Target, options: CompileOptions, parent: str | None) -> StageSpec:
    return StageSpec(
        "compile",
        variant,
        target.name,
        parent=parent,
        params={
            "optimise": options.optimise,
            "extra_vela_args": list(options.extra_vela_args),
            "target_fingerprint": target.fingerprint(),
            **({"debug_db": True} if options.debug_db else {}),
        },
        tool_versions={"ethos-u-vela": vela_backend.vela_version()},
    )


def compile_result(vela: VelaResult, misbiased: Sequence[str] = ()) -> StageResult:
    """The compile stage's record of one parsed Vela run: its files, metrics, details and warnings."""
    layers, cpu_ops, counts = vela.layers, vela.cpu_operators, vela.operator_counts
    metrics = dict(vela.metrics)
    metrics["cpu_operators"] = Metric(len(cpu_ops), "count", "estimated")
    metrics["npu_operators"] = (
        Metric(counts["npu"], "count", "estimated")
        if "npu" in counts
        else Metric.missing("count", "estimated", "Vela printed no operator count")
    )
    warnings = [f"{o.op} '{o.name}' runs on the CPU: {o.reason}" for o in cpu_ops]
    warnings += [f"{op} has a bias quantized for another input scale, so the int8 model computes something other "
                 "than its float model there; re-convert it (a QAT range below zero after a ReLU is a known cause)"
                 for op in misbiased]
    outputs = {role: path for role, path in vela.files.items() if role != "debug_db"}
    outputs["log"] = vela.log_path
    details: dict[str, Any] = {"summary": vela.summary, "layers": layers, "cpu_operators": [o.to_dict() for o in cpu_ops]}
    # what the NPU computes: MACs and compute- vs memory-bound layers (edgedeploy.vela.compute)
    details["npu_compute"] = compute_facts(layers)
    for bound in ("compute", "memory"):
        metrics[f"{bound}_bound_cycles"] = Metric(details["npu_compute"][f"{bound}_bound_cycles"], "cycles",
                                                  "estimated")
    if vela.debug_tables is not None:  # --enable-debug-db: per-layer NPU weight facts
        from edgedeploy.vela.debugdb import weight_report

        outputs["debug_db"] = vela.files["debug_db"]
        details["npu_weights"] = weight_report(vela.debug_tables, vela.request.model)
        totals = details["npu_weights"]["summary"]
        for key in ("weight_read_cycles", "weight_transfer_cycles"):
            metrics[key] = (Metric(totals[key], "cycles", "estimated") if totals[key] is not None
                            else Metric.missing("cycles", "estimated", "Vela's debug database has no value"))
    return StageResult(
        outputs=outputs,
        metrics=metrics,
        details=details,
        warnings=warnings,
        tool=ToolInfo("vela", vela_backend.vela_version(), ["vela", *vela.args]),
    )


@dataclass
class PendingCompile:
    """One compile begun by :func:`start_compile`: its stage begun (:func:`~edgedeploy.core.stage.begin_stage`),
    Vela (and the bias check) running in a worker."""

    stage: PendingStage
    model: Path
    target: Target
    run: VelaRun
    misbiased: Future

    @property
    def staged(self) -> Path:
        return self.stage.staged


def start_compile(ctx: RunContext, variant: str, model: Path, parent: str | None, target: Target,
                  options: CompileOptions, get_pool: Callable[[], VelaExecutor], *,
                  misbiased: Future | None = None) -> StageRecord | PendingCompile:
    """One (variant, target) compile of a task graph: the earlier record when unchanged, else Vela started in
    ``get_pool()`` (a :class:`VelaPool` or a Ray executor, asked for only when something compiles);
    :func:`finish_compile` records it. The stage's lifecycle is every stage's (:mod:`edgedeploy.core.stage`)."""
    ctx.manifest.targets[target.name] = target.to_dict()
    got = begin_stage(ctx, compile_spec(variant, target, options, parent), {"model": model})
    if isinstance(got, StageRecord):
        return got
    request = vela_runner.VelaRequest(model, target, got.staged, options.optimise, options.vela_extra())
    try:  # the workers start here (a Ray address is joined): when they cannot, no staging folder is left
        pool = get_pool()
        # Read in a worker too, so this process never loads the flatbuffer reader; given first, it is done by
        # the time Vela is, whichever worker takes it.
        if misbiased is None:
            misbiased = pool.call(misbiased_descriptions, str(model))
        return PendingCompile(got, model, target, vela_runner.start(pool, request), misbiased)
    except BaseException:
        shutil.rmtree(got.staged, ignore_errors=True)
        raise


def finish_compile(ctx: RunContext, item: PendingCompile) -> StageRecord:
    """Parse and record a finished compile (raises its error, recorded, when Vela failed)."""
    return end_stage(ctx, item.stage, lambda: _compiled(ctx, item))


DIED_FIX = f"{vela_runner.DIED_FIX}; the other compiles went on"


def _compiled(ctx: RunContext, item: PendingCompile) -> tuple[StageResult, str | None, float]:
    """What Vela's finished run in ``item`` gives: the stage's result, and how long Vela ran."""
    spec, request = item.stage.spec, item.run.request
    shown = _source_of(ctx, spec.parent) or item.model  # the model the user gave, not its copy in the run folder
    final = ctx.stage_dir(spec.id)
    job = vela_runner.wait(item.run, shown=shown, written=final, died_fix=DIED_FIX)
    try:
        misbiased = item.misbiased.result()
    except BrokenProcessPool:
        raise vela_runner.died(request, shown, DIED_FIX) from None
    vela_runner.check(request, job, shown=shown, written=final)
    result = compile_result(vela_runner.read_outputs(request, item.run.args, job.seconds, shown=item.model),
                            misbiased)
    assert result.tool is not None  # (compile_result records Vela's command line)
    result.tool.argv = [a.replace(str(item.staged), str(final.resolve())) for a in result.tool.argv]
    return result, None, job.seconds


def end_compiles(ctx: RunContext, records: Iterable[StageRecord], options: CompileOptions) -> None:
    """After the compiles of a task graph: Vela's version in the manifest, and
    :class:`~edgedeploy.errors.CpuFallbackError` when an operator runs on the CPU and that was not allowed."""
    ctx.manifest.tools["ethos-u-vela"] = vela_backend.vela_version()
    ctx.manifest.save()
    if not options.allow_cpu_ops:
        _check_cpu_fallback(ctx, records)


def compile_variants(
    ctx: RunContext,
    variants: Sequence[tuple[str, Path, str | None]],
    targets: Sequence[Target],
    options: CompileOptions,
    pool: VelaExecutor | None = None,
    read: Mapping[Path, Future] | None = None,
) -> CompileOutcome:
    """Compile each (variant name, int8 model, parent stage id) for each target, in parallel workers
    (:func:`start_compile` and :func:`finish_compile` for each pair). ``read``: the models' misbiased operators
    (:func:`~edgedeploy.tflite.reader.misbiased_descriptions`) already asked of ``pool``'s workers."""
    options.check()
    # Vela's version (part of every cache key): read by a worker already started, which has it at hand; else
    # here, so that a re-run that reuses every result starts no worker
    vela_backend.vela_version(pool if getattr(pool, "workers", 0) else None)
    outcome = CompileOutcome(ctx.run_dir)
    own: list[VelaExecutor] = []

    def get_pool() -> VelaExecutor:
        if pool is not None:
            return pool
        if not own:
            own.append(make_executor(options, len(variants) * len(targets)))
        return own[0]

    try:
        items: list[PendingCompile] = []
        for variant, model, parent in variants:
            for target in targets:
                got = start_compile(ctx, variant, model, parent, target, options, get_pool,
                                    misbiased=(read or {}).get(model))
                if isinstance(got, PendingCompile):
                    items.append(got)
                else:
                    outcome.records.append(got)
                    outcome.cached_ids.add(got.id)
        first_error: EdgeDeployError | None = None
        lost = []  # compiles whose worker process died (every job of a broken pool fails with it)
        for item in items:
            if item.run.broken() or isinstance(item.misbiased.exception(), BrokenProcessPool):
                lost.append(item)
                continue
            try:
                outcome.records.append(finish_compile(ctx, item))
            except EdgeDeployError as exc:
                first_error = first_error or exc
        # A worker died: its pool is gone with every job still in it. Each of those runs again, one at a time on
        # a fresh worker, so the model that kills a worker is the one named and the others finish.
        for item in lost:
            clear_staging_dir(item.staged)
            workers = get_pool()
            workers.restart()
            item.run = vela_runner.start(workers, item.run.request)
            if item.run.broken():  # run alone: this model kills the worker
                item.misbiased = item.run.job
            else:
                item.misbiased = workers.call(misbiased_descriptions, str(item.model))
            try:
                outcome.records.append(finish_compile(ctx, item))
            except EdgeDeployError as exc:
                first_error = first_error or exc
        if first_error is not None:
            raise first_error
    finally:
        for workers in own:
            workers.close()
    end_compiles(ctx, outcome.records, options)
    return outcome


def _source_of(ctx: RunContext, parent: str | None) -> str | None:
    rec = ctx.manifest.records.get(parent) if parent else None
    return rec.params.get("source") if rec is not None else None


def _check_cpu_fallback(ctx: RunContext, records: Iterable[StageRecord]) -> None:
    bad = []
    for rec in records:
        for op in rec.details.get("cpu_operators", []):
            if op["op"].upper() not in BOUNDARY_OPS:
                bad.append((rec, op))
    if bad:
        rec, op = bad[0]
        more = f" and {len(bad) - 1} more" if len(bad) > 1 else ""
        model = _source_of(ctx, rec.parent) or (rec.inputs[0].path if rec.inputs else rec.variant)
        raise CpuFallbackError(
            f"{model}: operator {op['op']} '{op['name']}' falls back to the CPU on {rec.target}{more} "
            f"({op['reason']})",
            "change the layer to one the NPU supports (see `vela --supported-ops-report`), "
            "or pass --allow-cpu-ops to accept CPU execution",
        )


def compile_tflite(
    models: Sequence[Path],
    target_names: Sequence[str],
    out: Path,
    options: CompileOptions = CompileOptions(),
    pool: VelaExecutor | None = None,
) -> CompileOutcome:
    """``edgedeploy compile MODEL.tflite ...``: check inputs, import the models, compile them."""
    options.check()
    if not models:
        raise UsageError("no model given", "pass a .tflite file or an edgedeploy.toml project file")
    models = [Path(m) for m in models]
    targets = resolve_targets(target_names)
    # read only: nothing is written (not even the run folder) until every model passed its checks
    earlier = Manifest.open(out) if Path(out).is_dir() else Manifest(Path(out))
    imported = {a.sha256 for r in earlier.find(stage="import") if r.status == "ok" for a in r.inputs}
    own_pool = pool is None
    pool = pool or make_executor(options, len(models) * len(targets))
    try:
        # A model this run folder imported before was checked then. The others are checked in workers, which
        # have the flatbuffer reader's dependencies loaded already; all at once, in model order.
        checks = {m: pool.call(check_int8_model, str(m)) for m in models
                  if not (m.is_file() and sha256_file(m) in imported)}
        misbiased = {}
        if not own_pool or checks:  # workers are starting anyway: they also read Vela's version and what
            # Vela's report needs from each model, while this process imports the models (a re-run that
            # reuses every result starts none)
            vela_backend.ask_vela_version(pool)
            misbiased = {m: pool.call(misbiased_descriptions, str(m)) for m in models}
        prepare_lock()  # while the workers read the models (they may still be importing Vela)
        for m, check in checks.items():
            try:
                check.result()
            except BrokenProcessPool as exc:
                pool.restart()
                raise ToolFailedError(f"{m}: the worker process reading it died (killed by a signal, a crash "
                                      "or lack of memory)", "check that it is an intact .tflite file") from exc
        ctx = RunContext.open(out)
        variants = []
        sources: dict[str, str | None] = {v: None for v in ctx.manifest.variants()}
        sources.update({r.variant: r.params.get("source") for r in ctx.manifest.find(stage="import") if r.variant})
        for model, (name, clash) in zip(models, keep_apart(models, variant_names(models), sources)):
            if clash:
                shown = f"another model ({sources[clash]})" if sources[clash] else "a leaf of `edgedeploy optimize`"
                log.warning("%s: variant '%s' of %s is %s; this one is compiled as '%s' beside it",
                            model, clash, out, shown, name)
            rec = import_tflite(ctx, name, model)
            int8 = rec.output("int8_model")
            assert int8 is not None  # (an import records the model it copied)
            variants.append((name, ctx.manifest.resolve(int8), rec.id))
            if model in misbiased:
                misbiased[variants[-1][1]] = misbiased[model]
        return compile_variants(ctx, variants, targets, options, pool, read=misbiased)
    finally:
        if own_pool:
            pool.close(now=True)


def compile_run(
    run_dir: Path,
    target_names: Sequence[str],
    options: CompileOptions = CompileOptions(),
    pool: VelaExecutor | None = None,
) -> CompileOutcome:
    """``edgedeploy compile RUN_DIR``: every int8 leaf ``edgedeploy optimize`` converted into ``RUN_DIR``, compiled
    into that same folder, so that ``report RUN_DIR`` sets each leaf's int8 accuracy beside its NPU figures."""
    options.check()
    run_dir = Path(run_dir)
    manifest = Manifest.load(run_dir)
    leaves = [(r.variant, r, art) for r in manifest.find(stage="convert")
              if r.status == "ok" and r.variant and (art := r.output("int8_model")) is not None]
    if not leaves:
        raise InvalidInputError(f"{run_dir} holds no int8 leaves",
                                f"run `edgedeploy optimize MODEL.h5 --data DATA.npz -o {run_dir}` first, "
                                "or pass .tflite files")
    targets = resolve_targets(target_names)
    # before anything is written: a leaf changed since optimize scored it is never compiled beside that score
    variants = [(name, checked_artifact(manifest, rec, art, f"the int8 model of leaf {name}"), rec.id)
                for name, rec, art in leaves]
    ctx = RunContext.open(run_dir)
    return compile_variants(ctx, variants, targets, options, pool)
