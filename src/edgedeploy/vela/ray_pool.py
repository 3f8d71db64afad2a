"""Run Vela compiles as Ray tasks, for sweeps that outgrow one machine.

The local process pool (:mod:`edgedeploy.vela.pool`) is the default. With ``--executor ray`` each compile
becomes a Ray task: the model and ``vela.ini`` travel with the task, Vela runs in the Ray worker's own
temporary folder, and the files it writes come back and are stored exactly where a local compile would put
them, so everything after (parsing, manifest, caching) is the same. ``ray.init`` joins the cluster named by
``--ray-address`` or ``RAY_ADDRESS``, or starts a local Ray instance; an address is checked first and joined
within a bounded time (:mod:`edgedeploy.vela.ray_connect`, ``EDGEDEPLOY_RAY_CONNECT_TIMEOUT``).
"""

from __future__ import annotations

import os
import tempfile
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Callable

from edgedeploy.errors import ToolFailedError, ToolMissingError
from edgedeploy.vela import VelaExecutor
from edgedeploy.vela.ray_connect import bounded_join, probe_ray_address
from edgedeploy.vela.worker import VelaJobResult, vela_job


LOCAL_START_WAIT_S = 120


def _remote_compile(model_name: str, model: bytes, ini: bytes, args: list[str]) -> dict[str, Any]:
    """Runs inside a Ray worker: compile in a private folder and return every file Vela wrote."""
    with tempfile.TemporaryDirectory(prefix="edgedeploy-vela-") as tmp:
        root = Path(tmp)
        (root / model_name).write_bytes(model)
        (root / "vela.ini").write_bytes(ini)
        out = root / "out"
        out.mkdir()
        local = list(args)
        local[0] = str(root / model_name)
        local[local.index("--config") + 1] = str(root / "vela.ini")
        local[local.index("--output-dir") + 1] = str(out)
        result = vela_job(local, str(root / "vela.log"))
        files = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
        log = (root / "vela.log").read_text(encoding="utf-8", errors="replace")
        # paths in Vela's messages name the worker's folder; show the driver's instead
        log = log.replace(str(out), args[args.index("--output-dir") + 1]).replace(local[0], args[0])
        return {"returncode": result.returncode, "seconds": result.seconds, "error": result.error,
                "files": files, "log": log}


_AUTH_MODE = "RAY_AUTH_MODE"
_auth_mode_unset = False  # RAY_AUTH_MODE was unset when we started a local head (Ray then sets it)


def init_ray(ray, kwargs: dict[str, Any], address: str | None = None) -> None:
    """``ray.init``, with a start-up wait that suits a busy machine and a one-line error when Ray won't start.

    A local head of Ray 2.60 turns token authentication on by setting ``RAY_AUTH_MODE=token`` in this process
    for good (the token itself lives in ``~/.ray/auth_token``); :func:`shutdown_ray` puts the variable back as
    it was, so a later start in the same process follows the user's setting again.
    """
    global _auth_mode_unset
    if not address:
        _auth_mode_unset = _AUTH_MODE not in os.environ
    # Ray waits 30 s for a new local head's GCS to publish its port; on a loaded 2-core machine that is too
    # short. The user's own setting wins.
    key = "RAY_gcs_server_port_wait_time_s"
    set_wait = key not in os.environ and not address
    if set_wait:
        os.environ[key] = str(LOCAL_START_WAIT_S)
    try:
        if address:
            with bounded_join():
                ray.init(**kwargs)
        else:
            ray.init(**kwargs)
    except (RuntimeError, ConnectionError, TimeoutError, OSError) as exc:
        where = f"the Ray cluster at {address}" if address else "a local Ray instance"
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ToolFailedError(
            f"could not start or join {where}: {first}",
            "check the Ray logs under /tmp/ray/session_latest/logs, give --ray-address of a running cluster, "
            "or compile with --executor local") from exc
    finally:
        if set_wait:
            os.environ.pop(key, None)


def join_ray(ray, address: str | None, num_cpus: int | None = None) -> bool:
    """Join the Ray cluster at ``address`` (else start a local Ray, with ``num_cpus`` when given), quietly,
    unless Ray is running in this process already; whether this call started it (its caller then shuts it down).
    Nothing answering at ``address`` is one line naming it, within the connect timeout."""
    if ray.is_initialized():
        return False
    kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "logging_level": "ERROR"}
    if address:
        source = "RAY_ADDRESS" if address == os.environ.get("RAY_ADDRESS") else "--ray-address"
        probe_ray_address(address, source)
        kwargs["address"] = address
    elif num_cpus:
        kwargs["num_cpus"] = num_cpus
    init_ray(ray, kwargs, address)
    return True


def shutdown_ray(ray) -> None:
    """``ray.shutdown``, and forget the authentication mode a local head of ours set in this process."""
    global _auth_mode_unset
    ray.shutdown()
    if _auth_mode_unset:
        os.environ.pop(_AUTH_MODE, None)
    _auth_mode_unset = False


def import_ray():
    """The ``ray`` module, or :class:`~edgedeploy.errors.ToolMissingError` saying how to install it."""
    try:
        import ray
    except ImportError as exc:
        raise ToolMissingError("Ray is not installed", "pip install 'edgedeploy[ray]' (ray==2.60.0)") from exc
    return ray


class RayExecutor(VelaExecutor):
    """The same interface as :class:`~edgedeploy.vela.pool.VelaPool`, on Ray."""

    def __init__(self, address: str | None = None, jobs: int | None = None) -> None:
        self._ray = import_ray()
        self._address = address or os.environ.get("RAY_ADDRESS")
        self._jobs = jobs
        self._started_here = False
        self._task = None

    def _start(self):
        """Join or start Ray on the first compile, so a run whose results are all reused never starts it."""
        ray = self._ray
        if self._task is None:
            self._started_here = join_ray(ray, self._address, self._jobs) or self._started_here
            self._task = ray.remote(num_cpus=1)(_remote_compile)
        return self._task

    def submit(self, args: list[str], log_path: Path) -> "Future[VelaJobResult]":
        model = Path(args[0])
        ini = Path(args[args.index("--config") + 1])
        out_dir = Path(args[args.index("--output-dir") + 1])
        remote = self._start().remote(model.name, model.read_bytes(), ini.read_bytes(), list(args)).future()
        done: Future = Future()

        def store(f: Future) -> None:
            try:
                res = f.result()
                for name, data in res["files"].items():
                    (out_dir / name).write_bytes(data)
                Path(log_path).write_text(res["log"], encoding="utf-8")
                done.set_result(VelaJobResult(res["returncode"], res["seconds"], res["error"]))
            except BaseException as exc:  # surface Ray errors through the future
                done.set_exception(exc)

        remote.add_done_callback(store)
        return done

    def call(self, fn: Callable[..., Any], *args: Any) -> Future:
        """Checks that read local files run here, not on a cluster node that cannot see them."""
        done: Future = Future()
        try:
            done.set_result(fn(*args))
        except BaseException as exc:
            done.set_exception(exc)
        return done

    def restart(self) -> None:
        """Nothing: Ray restarts a task whose worker died on its own."""

    def close(self, now: bool = False) -> None:
        if self._started_here and self._ray.is_initialized():
            shutdown_ray(self._ray)
        self._started_here = False
        self._task = None

    def __enter__(self) -> "RayExecutor":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
