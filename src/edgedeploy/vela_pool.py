"""Worker processes that run Vela.

Vela never runs in the main process. Workers of a process pool import Vela
once and call its documented entry point ``ethosu.vela.vela.main(argv)`` in a
fresh output folder, with the process's stdout/stderr sent to a log file.

This module imports only the standard library, so the CLI can start the
workers before it imports anything else and their start-up overlaps its own:
:func:`warm_start` forks one worker as the ``edgedeploy`` process starts, and a
command that compiles adopts it (:meth:`VelaPool.grow`); any other command ends it.
"""

from __future__ import annotations

import io
import multiprocessing
import os
import sys
import threading
import time
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path


MAX_JOBS = 256  # --jobs / [compile] jobs: more worker processes than this is a mistake, not a speed-up


def default_jobs(n_tasks: int) -> int:
    return max(1, min(n_tasks, os.cpu_count() or 1))


@dataclass
class VelaJobResult:
    returncode: int
    seconds: float
    error: str | None = None


def _worker_init() -> None:
    # Import Vela once per worker, and the reader of .tflite files that workers run too; jobs then pay only
    # for the work itself.
    import ethosu.vela.vela  # noqa: F401

    from . import tflite_model  # noqa: F401


def vela_job(args: list[str], log_path: str) -> VelaJobResult:
    """Run one Vela compile in this (worker) process, its console output going to ``log_path``."""
    from ethosu.vela import vela as vela_main

    t0 = time.perf_counter()
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    error = None
    with open(log_path, "w", encoding="utf-8") as log_file:
        os.dup2(log_file.fileno(), 1)
        os.dup2(log_file.fileno(), 2)
        old_stdout, old_stderr = sys.stdout, sys.stderr
        sys.stdout = sys.stderr = io.TextIOWrapper(os.fdopen(os.dup(1), "wb"), encoding="utf-8", line_buffering=True)
        try:
            rc = vela_main.main(args)
        except SystemExit as exc:  # argparse errors
            rc = exc.code if isinstance(exc.code, int) else 2
        except Exception as exc:  # Vela raises on models it cannot compile
            rc = 1
            error = f"{type(exc).__name__}: {exc}"
            print(f"edgedeploy: Vela raised {error}")
        finally:
            sys.stdout.flush()
            sys.stdout.close()
            sys.stdout, sys.stderr = old_stdout, old_stderr
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
    return VelaJobResult(int(rc or 0), time.perf_counter() - t0, error)


def _context() -> multiprocessing.context.BaseContext:
    # Forking after TensorFlow has started threads is unsafe; otherwise fork is fastest.
    if "tensorflow" in sys.modules or sys.platform != "linux":
        return multiprocessing.get_context("spawn")
    return multiprocessing.get_context("fork")


@dataclass
class VelaPool:
    """Worker processes that import Vela once. Start it early; it warms up in the background.

    The workers may come from several process pools (one warm worker started with the process, more
    when a command asks for them); work goes to the pool with the fewest jobs per worker."""

    jobs: int = 1
    _pools: list[ProcessPoolExecutor] = field(default_factory=list, init=False)
    _load: dict[int, list[int]] = field(default_factory=dict, init=False)  # id(pool) -> [jobs queued, workers]
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)

    def start(self) -> "VelaPool":
        missing = max(1, self.jobs) - self.workers
        if missing > 0:
            pool = ProcessPoolExecutor(max_workers=missing, mp_context=_context(), initializer=_worker_init)
            for _ in range(missing):  # spawn workers now so their imports overlap our own work
                pool.submit(_noop)
            self._pools.append(pool)
            self._load[id(pool)] = [0, missing]
        return self

    @property
    def workers(self) -> int:
        """Worker processes started (and not closed)."""
        return sum(size for _, size in self._load.values())

    def grow(self, jobs: int) -> "VelaPool":
        """At least ``jobs`` workers in all (those running stay)."""
        self.jobs = max(self.jobs, jobs)
        return self.start()

    def submit(self, args: list[str], log_path: Path) -> "Future[VelaJobResult]":
        """Compile with Vela in a worker."""
        return self.call(vela_job, args, str(log_path))

    def call(self, fn, *args) -> Future:
        """Run a picklable function in a worker (where Vela and its dependencies are already imported)."""
        self.start()
        with self._lock:
            pool = min(self._pools, key=lambda p: self._load[id(p)][0] / self._load[id(p)][1])
            self._load[id(pool)][0] += 1
        future = pool.submit(fn, *args)
        future.add_done_callback(lambda _, key=id(pool): self._done(key))
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
            if now:
                # ProcessPoolExecutor has no public way to end idle workers before Python 3.14.
                for proc in list((getattr(pool, "_processes", None) or {}).values()):
                    proc.terminate()
            pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> "VelaPool":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def warm_start() -> VelaPool | None:
    """One Vela worker, forked as the ``edgedeploy`` process starts (before the command line is parsed).

    Importing Vela takes most of a single compile's time. Started here, it overlaps the command-line
    parsing and option conversion; a command that compiles adopts the worker, every other command ends
    it at once (it costs a fraction of a second of one core). Not started with a single core, where it
    could only compete with the command itself."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return VelaPool(1).start() if cores > 1 else None


def _noop() -> None:
    return None
