"""Run the stages of the deployment tree (train a node, convert a leaf) as Ray tasks, all ready ones at once.

``optimize(..., executor="ray")`` (and ``compile PROJECT`` and ``--walk`` with ``--executor ray``) submits every
stage whose parents are done as a Ray task; everything around the work (cache keys, staging folders, the
manifest) stays in the driver, so a stage run on Ray is recorded and reused exactly as a local one.

Artifacts travel through Ray's object store, so the workers need not share a file system with the driver: a
task gets the stage function, the loaded data set (with its soft targets), the recipe, and the bytes of every
file in its input models' stage folders; it writes them into a private temporary folder, loads TensorFlow,
runs the stage there (seeded as a local stage is) and returns its result with the bytes of every file it wrote.
The driver writes those files into the stage's staging folder. The compiles of the same command go to Ray too
(:class:`~edgedeploy.vela.ray_pool.RayExecutor`, which ships the model the same way). Ray starts once per command:
``ray.init`` joins the cluster named by ``ray_address`` or ``RAY_ADDRESS``, or starts a local Ray instance.
"""

from __future__ import annotations

import os
import tempfile
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Callable

from edgedeploy.errors import ToolFailedError
from edgedeploy.pipeline.runners.protocol import StageRunner
from edgedeploy.vela.ray_pool import RayExecutor, import_ray, join_ray

SHIPPED_ROLES_SKIP = ("data",)  # the data set travels as the loaded object, not as its file


def _folder_bytes(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _write_files(folder: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        path = folder / rel
        if ".." in Path(rel).parts or Path(rel).is_absolute():
            raise ValueError(f"a stage returned a file outside its folder: {rel}")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def _swap(obj: Any, old: str, new: str) -> Any:
    """``obj`` (details, warnings) with the worker's folder named as the driver's."""
    if isinstance(obj, str):
        return obj.replace(old, new)
    if isinstance(obj, dict):
        return {k: _swap(v, old, new) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_swap(v, old, new) for v in obj]
    return obj


def _remote_stage(fn: Callable[..., Any], name: str, inputs: dict[str, str], shipped: dict[str, tuple[str, dict]],
                  *args: Any) -> tuple[Any, dict[str, bytes], str, float]:
    """Runs inside a Ray worker: the stage in a private folder; its result (output paths relative to that folder)
    and the bytes of every file it wrote."""
    from edgedeploy.pipeline.runners.local import run_work

    with tempfile.TemporaryDirectory(prefix="edgedeploy-stage-") as tmp:
        root = Path(tmp)
        local = dict(inputs)
        for role, (file_name, files) in shipped.items():
            _write_files(root / "in" / role, files)
            local[role] = str(root / "in" / role / file_name)
        out = root / "out"
        out.mkdir()
        result, started, seconds = run_work(fn, name, {k: Path(v) for k, v in local.items()}, out, *args)
        result.outputs = {role: Path(p).resolve().relative_to(out.resolve()).as_posix()
                          for role, p in result.outputs.items()}
        result.details = _swap(result.details, str(out), "{out}")
        result.warnings = _swap(result.warnings, str(out), "{out}")
        return result, _folder_bytes(out), started, seconds


class RayStages(StageRunner):
    """Stage work as Ray tasks (all ready stages at once); compiles through a :class:`RayExecutor` on the same Ray."""

    def __init__(self, address: str | None = None) -> None:
        self._ray = import_ray()
        self._address = address or os.environ.get("RAY_ADDRESS")
        self._task = None
        self._started_here = False
        self._vela: RayExecutor | None = None

    def _start(self):
        ray = self._ray
        if self._task is None:
            self._started_here = join_ray(ray, self._address) or self._started_here
            self._task = ray.remote(num_cpus=1, max_retries=0)(_remote_stage)
        return self._task

    def submit(self, fn: Callable[..., Any], name: str, inputs: dict[str, Path], out: Path, *args: Any,
               after: Future | None = None) -> Future:  # (Ray places its tasks itself)
        shipped = {role: (Path(p).name, _folder_bytes(Path(p).parent)) for role, p in inputs.items()
                   if role not in SHIPPED_ROLES_SKIP}
        return self._start().remote(fn, name, {k: str(v) for k, v in inputs.items()}, shipped, *args).future()

    def start_queued(self) -> None:
        """Nothing: every task was handed to Ray when it was submitted."""

    def collect(self, future: Future, out: Path) -> tuple[Any, str | None, float | None]:
        """The stage's result with its files written into ``out`` (the staging folder); a stage's own (typed)
        error is raised here as it was raised there."""
        ray = self._ray
        try:
            result, files, started, seconds = future.result()
        except ray.exceptions.RayTaskError as exc:
            cause = exc.as_instanceof_cause()
            raise (cause.cause if getattr(cause, "cause", None) is not None else cause) from None
        except ray.exceptions.RayError as exc:  # the worker or its node was lost, not the stage's own error
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ToolFailedError(f"a Ray task running a stage was lost: {first}",
                                  "check the Ray logs under /tmp/ray/session_latest/logs, or run with "
                                  "--executor local") from None
        _write_files(out, files)
        result.outputs = {role: out / rel for role, rel in result.outputs.items()}
        result.details = _swap(result.details, "{out}", str(out))
        result.warnings = _swap(result.warnings, "{out}", str(out))
        return result, started, seconds

    def vela(self, options: Any, n_tasks: int) -> RayExecutor:
        if self._vela is None:
            self._start()
            self._vela = RayExecutor(options.ray_address or self._address, options.jobs)
        return self._vela

    def close(self) -> None:
        if self._vela is not None:
            self._vela.close()
            self._vela = None
        if self._started_here and self._ray.is_initialized():
            from edgedeploy.vela.ray_pool import shutdown_ray

            shutdown_ray(self._ray)
        self._started_here = False
        self._task = None
