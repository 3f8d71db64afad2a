"""Worker processes that run Vela.

Vela never runs in the main process. Workers of a process pool import Vela
once and call its documented entry point ``ethosu.vela.vela.main(argv)`` in a
fresh output folder, with the process's stdout/stderr sent to a log file.

This module imports only the standard library, so the CLI can start the
workers before it imports anything else and their start-up overlaps its own.
"""

from __future__ import annotations

import io
import multiprocessing
import os
import sys
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
    # Import Vela once per worker; jobs then pay only for the compile itself.
    import ethosu.vela.vela  # noqa: F401


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
    """A pool of worker processes that import Vela once. Start it early; it warms up in the background."""

    jobs: int = 1
    _pool: ProcessPoolExecutor | None = field(default=None, init=False)

    def start(self) -> "VelaPool":
        if self._pool is None:
            self._pool = ProcessPoolExecutor(max_workers=max(1, self.jobs), mp_context=_context(), initializer=_worker_init)
            for _ in range(max(1, self.jobs)):  # spawn workers now so their imports overlap our own work
                self._pool.submit(_noop)
        return self

    def submit(self, args: list[str], log_path: Path) -> "Future[VelaJobResult]":
        """Compile with Vela in a worker."""
        return self.call(vela_job, args, str(log_path))

    def call(self, fn, *args) -> Future:
        """Run a picklable function in a worker (where Vela and its dependencies are already imported)."""
        self.start()
        assert self._pool is not None
        return self._pool.submit(fn, *args)

    def restart(self) -> None:
        """A fresh pool after a worker died (a broken pool runs nothing more)."""
        self.close(now=True)
        self.start()

    def close(self, now: bool = False) -> None:
        """Stop the workers; ``now`` ends them at once (they may still be importing Vela)."""
        if self._pool is None:
            return
        if now:
            # ProcessPoolExecutor has no public way to end idle workers before Python 3.14.
            for proc in list((getattr(self._pool, "_processes", None) or {}).values()):
                proc.terminate()
            self._pool.shutdown(wait=True, cancel_futures=True)
        else:
            self._pool.shutdown(wait=True, cancel_futures=True)
        self._pool = None

    def __enter__(self) -> "VelaPool":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def _noop() -> None:
    return None
