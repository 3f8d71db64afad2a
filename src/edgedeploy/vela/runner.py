"""One Vela run, the one way every caller runs Vela: build the arguments, run them in a worker, check how the run
ended, parse what it wrote.

:func:`start` hands a :class:`VelaRequest`'s arguments (:func:`~edgedeploy.vela.outputs.build_vela_args`) to a
:class:`~edgedeploy.vela.VelaExecutor` (a worker of :class:`~edgedeploy.vela.pool.VelaPool`, or a Ray task; never
this process). :func:`finish` checks the run (the worker's death, a full disk, Vela's exit code and its last
lines, the outputs it must have written) and parses the summary CSV, the per-layer CSV, the console log and the
debug database into one :class:`VelaResult`. :func:`run_all` does both for a batch in a pool of its own.
The compile stage, the thin technique's candidates, the palette sweep's encoded sizes and the debug-database
mapping of ``verify`` all go through here.
"""

from __future__ import annotations

import os
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Sequence

from edgedeploy.core.manifest import Metric
from edgedeploy.core.nospace import disk_full, is_no_space, said_no_space
from edgedeploy.errors import ToolFailedError
from edgedeploy.vela import outputs as vela_outputs

if TYPE_CHECKING:
    from edgedeploy.config.targets import Target
    from edgedeploy.vela import VelaExecutor
    from edgedeploy.vela.worker import VelaJobResult

LOG_NAME = "vela.log"  # Vela's console output, beside the files it writes
DEBUG_DB_FLAG = "--enable-debug-db"
# the outputs every run must have written; a caller may need more (``per_layer_csv``, ``debug_db``)
NEEDED = frozenset({"vela_model", "summary_csv"})
DIED_FIX = "check that the model is an intact full-int8 TFLite file"


@dataclass(frozen=True)
class VelaRequest:
    """One compile: ``model`` for ``target`` into ``output_dir``, with ``optimise`` and ``extra`` arguments."""

    model: Path
    target: Target
    output_dir: Path
    optimise: str = "Performance"
    extra: tuple[str, ...] = ()

    @property
    def args(self) -> list[str]:
        """Vela's command-line arguments (without the program name)."""
        return vela_outputs.build_vela_args(self.model, self.target, self.output_dir, self.optimise, self.extra)

    @property
    def log_path(self) -> Path:
        return self.output_dir / LOG_NAME


@dataclass
class VelaRun:
    """A run started by :func:`start`: its request, the arguments given and the worker's future
    (a :class:`~edgedeploy.vela.worker.VelaJobResult`)."""

    request: VelaRequest
    args: list[str]
    job: Future

    def broken(self) -> bool:
        """Whether the worker running it died (every job of that pool fails with it)."""
        return isinstance(self.job.exception(), BrokenProcessPool)


@dataclass
class VelaResult:
    """What one Vela run gave, parsed: the files it wrote (role -> path), the summary CSV's row, the per-layer
    CSV's rows, the operators it left on the CPU and its operator counts (from its console log), the summary's
    metrics (:func:`~edgedeploy.vela.outputs.summary_metrics`) and the debug database's tables when it wrote one."""

    request: VelaRequest
    args: list[str]
    seconds: float | None
    files: dict[str, Path]
    summary: dict[str, Any]
    layers: list[dict[str, Any]]
    cpu_operators: list[vela_outputs.CpuOperator]
    operator_counts: dict[str, int]
    metrics: dict[str, Metric]
    debug_tables: dict[str, list[dict[str, str]]] | None = None

    @property
    def log_path(self) -> Path:
        return self.request.log_path


def start(pool: VelaExecutor, request: VelaRequest) -> VelaRun:
    """Run ``request`` in a worker of ``pool``; :func:`finish` takes its result."""
    args = request.args
    return VelaRun(request, args, pool.submit(args, request.log_path))


def finish(run: VelaRun, *, shown: Path | str | None = None, written: Path | None = None,
           need: Iterable[str] = NEEDED, fix: str | None = None, died_fix: str = DIED_FIX) -> VelaResult:
    """The parsed result of a finished ``run``, or the error that says why there is none.

    ``shown`` names the model in messages (the user's file, not its copy; the model given by default), ``written``
    the folder a full disk is reported for (the output folder by default), ``need`` the outputs that must exist,
    ``fix`` the hint of a Vela failure and ``died_fix`` that of a worker that died."""
    job = wait(run, shown=shown, written=written, died_fix=died_fix)
    check(run.request, job, shown=shown, written=written, fix=fix)
    return read_outputs(run.request, run.args, job.seconds, shown=shown, need=need)


def wait(run: VelaRun, *, shown: Path | str | None = None, written: Path | None = None,
         died_fix: str = DIED_FIX) -> VelaJobResult:
    """The worker's :class:`~edgedeploy.vela.worker.VelaJobResult`: a worker that died is
    :class:`~edgedeploy.errors.ToolFailedError`, a log that could not be written for a full disk
    :class:`~edgedeploy.errors.DiskFullError`."""
    request = run.request
    try:
        return run.job.result()
    except BrokenProcessPool:
        raise died(request, shown, died_fix) from None
    except OSError as exc:  # the worker could not even open its log, or Ray's results could not be stored
        if is_no_space(exc):
            raise disk_full(written or request.output_dir, doing=_doing(request, shown)) from None
        raise


def died(request: VelaRequest, shown: Path | str | None = None, fix: str = DIED_FIX) -> ToolFailedError:
    """The error of a worker that died running ``request`` (or reading its model)."""
    return ToolFailedError(
        f"Vela's worker process died compiling {shown or request.model} for target {request.target.name} "
        "(killed by a signal, a crash or lack of memory)", fix)


def check(request: VelaRequest, job: VelaJobResult, *, shown: Path | str | None = None,
          written: Path | None = None, fix: str | None = None) -> None:
    """Nothing when Vela exited with 0; else :class:`~edgedeploy.errors.DiskFullError` when it stopped on a full
    disk (the exception it raised, or its own last lines, say so), or :class:`~edgedeploy.errors.ToolFailedError`
    quoting the last lines of its log."""
    if job.returncode == 0:
        return
    target = request.target
    if met_full_disk(job.error, request.log_path):
        raise disk_full(written or request.output_dir, doing=_doing(request, shown),
                        hint="free space on that disk (or compile into a folder on another one with -o), then run "
                             "the command again; the model is not at fault")
    try:
        tail = " | ".join(request.log_path.read_text(errors="replace").strip().splitlines()[-3:])
    except OSError:
        tail = job.error or "no log"
    raise ToolFailedError(
        f"Vela failed on {shown or request.model} for target {target.name} (exit {job.returncode}): {tail}",
        fix or f"check the target's Vela settings ({target.vela_ini_path()}: {target.vela.system_config}/"
               f"{target.vela.memory_mode}) and that the model is a full-int8 TFLite model")


def met_full_disk(error: str | None, log_path: Path) -> bool:
    """Whether a failed Vela run stopped on a full disk: the exception it raised, or its own output, says so."""
    if error and said_no_space(error):
        return True
    try:
        with open(log_path, "rb") as fh:  # the end of the log: where Vela's last words are
            fh.seek(max(0, os.fstat(fh.fileno()).st_size - 8192))
            tail = fh.read().decode("utf-8", errors="replace")
    except OSError:
        return False
    return said_no_space(tail) is not None


def read_outputs(request: VelaRequest, args: Sequence[str] | None = None, seconds: float | None = None, *,
                 shown: Path | str | None = None, need: Iterable[str] = NEEDED) -> VelaResult:
    """Parse what a successful Vela run of ``request`` wrote into its output folder (a missing needed output is
    :class:`~edgedeploy.errors.ToolFailedError`)."""
    folder, target = request.output_dir, request.target
    found = vela_outputs.find_vela_outputs(folder, request.model.stem)
    missing = set(need) - set(found)
    if missing:
        raise ToolFailedError(
            f"Vela wrote no {' or '.join(sorted(missing))} for {shown or request.model} on {target.name}",
            f"read {LOG_NAME} in the compile output folder")
    stdout = request.log_path.read_text(encoding="utf-8", errors="replace") if request.log_path.is_file() else ""
    summary = vela_outputs.parse_summary_csv(found["summary_csv"].read_text(encoding="utf-8"))
    layers = (vela_outputs.parse_per_layer_csv(found["per_layer_csv"].read_text(encoding="utf-8"))
              if "per_layer_csv" in found else [])
    tables = None
    if "debug_db" in found:
        from edgedeploy.vela.debugdb import parse_debug_db

        tables = parse_debug_db(found["debug_db"].read_text(encoding="utf-8"))
    return VelaResult(
        request=request,
        args=list(args) if args is not None else request.args,
        seconds=seconds,
        files=found,
        summary=summary,
        layers=layers,
        cpu_operators=vela_outputs.parse_cpu_operators(stdout),
        operator_counts=vela_outputs.parse_operator_counts(stdout),
        metrics=vela_outputs.summary_metrics(summary, target, layers),
        debug_tables=tables,
    )


def run_all(requests: Sequence[VelaRequest], jobs: int | None = None, *, shown: Sequence[Path | str] | None = None,
            need: Iterable[str] = NEEDED, fix: str | None = None) -> list[VelaResult]:
    """Each request run in a pool of ``jobs`` Vela workers of its own (by default one per request, up to the
    cores), and its result, in order; the first failure is raised (after the pool is closed)."""
    from edgedeploy.vela.pool import VelaPool, default_jobs

    need = frozenset(need)
    with VelaPool(jobs or default_jobs(len(requests))) as pool:
        runs = [start(pool, request) for request in requests]
        return [finish(run, shown=shown[i] if shown else None, need=need, fix=fix) for i, run in enumerate(runs)]


def _doing(request: VelaRequest, shown: Path | str | None) -> str:
    return f"Vela's output for {shown or request.model} on {request.target.name}"
