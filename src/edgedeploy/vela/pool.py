"""Worker processes that run Vela.

Vela never runs in the main process. Workers of a process pool import Vela once and run
:func:`edgedeploy.vela.worker.vela_job` (Vela's documented entry point in a fresh output folder,
its console output going to a log file). A pool may also adopt the worker that the ``edgedeploy``
command forked as it started (:class:`edgedeploy.vela.worker.WarmWorker`).

This module imports only the standard library.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import threading
from concurrent.futures import Future, ProcessPoolExecutor
from typing import TYPE_CHECKING, Any, Callable

from edgedeploy.vela import VelaExecutor
from edgedeploy.vela.worker import WORKER_MODULES, VelaJobResult, WarmWorker, vela_job, worker_init

if TYPE_CHECKING:
    from pathlib import Path

__all__ = ["MAX_JOBS", "VelaJobResult", "VelaPool", "default_jobs", "vela_job"]

MAX_JOBS = 256  # --jobs / [compile] jobs: more worker processes than this is a mistake, not a speed-up


def default_jobs(n_tasks: int) -> int:
    return max(1, min(n_tasks, os.cpu_count() or 1))


def prestart_pool(jobs: str, n_tasks: int, warm: WarmWorker | None = None) -> VelaPool | None:
    """Vela workers for ``n_tasks`` compiles started before the command's options are checked (``jobs``: the
    --jobs text as given; None when it is not a valid count, which the option's own check then reports)."""
    if jobs and not (jobs.isdigit() and 0 < int(jobs) <= MAX_JOBS):
        return None
    wanted = min(int(jobs), n_tasks) if jobs else default_jobs(n_tasks)
    return VelaPool(wanted, warm=warm).start()


def _context() -> multiprocessing.context.BaseContext:
    # Forking after TensorFlow has started threads is unsafe; otherwise fork is fastest.
    if sys.platform != "linux":
        return multiprocessing.get_context("spawn")
    if "tensorflow" in sys.modules:
        # Workers forked from a server process that never loads TensorFlow and imports Vela once (started at the
        # first pool, kept until this process ends): each later worker starts without importing Vela again.
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(list(WORKER_MODULES))
        return ctx
    return multiprocessing.get_context("fork")


class VelaPool(VelaExecutor):
    """Worker processes that import Vela once. Start it early; it warms up in the background.

    The workers may come from several process pools (one warm worker started with the process, more
    when a command asks for them); work goes to the pool with the fewest jobs per worker."""

    def __init__(self, jobs: int = 1, warm: WarmWorker | None = None) -> None:
        self.jobs = jobs
        self._pools: list[ProcessPoolExecutor | WarmWorker] = []  # and the warm worker if one was adopted
        self._load: dict[int, list[int]] = {}  # id(pool) -> [jobs queued, workers]
        self._lock = threading.Lock()
        if warm is not None:
            self._pools.append(warm)
            self._load[id(warm)] = [0, warm.workers]

    def __repr__(self) -> str:
        return f"VelaPool(jobs={self.jobs}, workers={self.workers})"

    def start(self) -> "VelaPool":
        missing = max(1, self.jobs) - self.workers
        if missing > 0:
            pool = ProcessPoolExecutor(max_workers=missing, mp_context=_context(), initializer=worker_init)
            for _ in range(missing):  # spawn workers now so their imports overlap our own work
                pool.submit(_noop)
            self._pools.append(pool)
            self._load[id(pool)] = [0, missing]
        return self

    @property
    def workers(self) -> int:
        """Worker processes started (and not closed)."""
        return sum(size for _, size in self._load.values())

    def holds(self, worker: object) -> bool:
        """Whether ``worker`` (a warm worker given to the constructor) is one of this pool's."""
        return any(pool is worker for pool in self._pools)

    def submit(self, args: list[str], log_path: Path) -> "Future[VelaJobResult]":
        """Compile with Vela in a worker."""
        return self.call(vela_job, args, str(log_path))

    def call(self, fn: Callable[..., Any], *args: Any) -> Future:
        """Run a picklable function in a worker (where Vela and its dependencies are already imported)."""
        self.start()
        with self._lock:
            pool = min(self._pools, key=lambda p: self._load[id(p)][0] / self._load[id(p)][1])
            self._load[id(pool)][0] += 1
        future = pool.submit(fn, *args)
        key = id(pool)
        future.add_done_callback(lambda _: self._done(key))
        return future

    def _done(self, key: int) -> None:
        with self._lock:
            if key in self._load:
                self._load[key][0] -= 1

    def restart(self) -> None:
        """A fresh pool after a worker died (a broken pool runs nothing more)."""
        self.close(now=True)
        self.start()

    def close(self, now: bool = False) -> None:
        """Stop the workers; ``now`` ends them at once (they may still be importing Vela)."""
        pools, self._pools = self._pools, []
        with self._lock:
            self._load.clear()
        for pool in pools:
            if isinstance(pool, WarmWorker):
                pool.close(now)
                continue
            if now:
                # ProcessPoolExecutor has no public way to end idle workers before Python 3.14.
                for proc in list((getattr(pool, "_processes", None) or {}).values()):
                    proc.terminate()
            pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> "VelaPool":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def _noop() -> None:
    return None
