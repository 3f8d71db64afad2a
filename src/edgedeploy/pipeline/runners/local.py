"""Where the work of a tree stage (train a node, convert a leaf) runs: in this process, or in worker processes.

``optimize`` hands each ready stage's work to a runner and records the result itself (cache keys, staging folders
and the manifest stay in the driver, in one thread). :class:`LocalStages` runs the work here when ``jobs`` is 1
(the default) and otherwise in ``jobs`` worker processes, started with ``spawn`` (TensorFlow has threads running
in this process; forking it is unsafe), each with TensorFlow's intra-op threads set to its share of the cores.
The workers share this machine's file system: they read the parents' files and write into the stage's staging
folder directly. Every stage seeds itself, so a result does not depend on the worker it ran in.

:class:`edgedeploy.pipeline.runners.ray.RayStages` is the same interface on Ray. A runner also keeps the Vela executor the
compiles of the graph use, so one command starts its workers (or Ray) once, however many times it walks the tree.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Callable

from edgedeploy.errors import ToolFailedError
from edgedeploy.core.manifest import now_iso

MAX_STAGE_JOBS = 64


def threads_per_job(jobs: int) -> int:
    """TensorFlow threads each of ``jobs`` workers may use: its share of this machine's cores (at least 1)."""
    return max(1, (os.cpu_count() or 1) // max(1, jobs))


def _init_worker(threads: int) -> None:
    from edgedeploy.keras import tfenv
    from edgedeploy.core.files import join_private_tmp

    join_private_tmp()  # TensorFlow's generated files go where the command removes them, even if we are killed
    env = tfenv.load()
    # Only the inter-op pool (independent ops side by side) is cut to the worker's share. The intra-op pool
    # splits one op's arithmetic, so its size changes the order of float sums in training: with 1 thread instead
    # of 2 the example's qat leaf ended 0.25 points apart. It keeps TensorFlow's default, as in the driver, so
    # every jobs count gives the same leaves.
    env.tf.config.threading.set_inter_op_parallelism_threads(threads)


def run_work(fn: Callable[..., Any], *args: Any) -> tuple[Any, str, float]:
    """``fn(env, *args)`` with this process's TensorFlow; and when it started and how long it took."""
    from edgedeploy.keras import tfenv

    env = tfenv.load()
    started, t0 = now_iso(), time.perf_counter()
    return fn(env, *args), started, time.perf_counter() - t0


class LocalStages:
    """Stage work here (``jobs=1``) or in ``jobs`` spawned worker processes; compiles in a Vela pool."""

    def __init__(self, jobs: int = 1) -> None:
        self.jobs = max(1, int(jobs))
        self._pool: ProcessPoolExecutor | None = None
        self._futures: list[Future] = []
        self._vela = None

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        """Start ``fn(env, node_or_leaf, inputs, out, ...)``; its future gives (result, started, seconds)."""
        if self.jobs == 1:
            done: Future = Future()
            try:
                done.set_result(run_work(fn, *args))
            except Exception as exc:  # the stage's error, raised where the result is read
                done.set_exception(exc)
            return done
        if self._pool is None:
            self._pool = ProcessPoolExecutor(max_workers=self.jobs, mp_context=multiprocessing.get_context("spawn"),
                                             initializer=_init_worker, initargs=(threads_per_job(self.jobs),))
        future = self._pool.submit(run_work, fn, *args)
        self._futures = [f for f in self._futures if not f.done()] + [future]
        return future

    def collect(self, future: Future, out) -> tuple[Any, str | None, float | None]:
        """The stage's result (its files are in ``out`` already), or its error raised."""
        try:
            return future.result()
        except BrokenProcessPool:
            raise ToolFailedError("a stage worker process died (killed by a signal, a crash or lack of memory)",
                                  f"run fewer stages at once (recipe key jobs, now {self.jobs})") from None

    def vela(self, options, n_tasks: int):
        """The Vela executor of this command's compiles, started on first use and kept until :meth:`close`."""
        if self._vela is None:
            from edgedeploy.pipeline.compile import make_executor

            self._vela = make_executor(options, n_tasks)
        return self._vela

    def close(self) -> None:
        """Stop the workers; work still running (the command stopped on an error or Ctrl-C) is ended, its
        staging folder left for the next run in this folder to remove."""
        if self._pool is not None:
            if any(not f.done() for f in self._futures):
                # ProcessPoolExecutor has no public way to end busy workers before Python 3.14.
                for proc in list((getattr(self._pool, "_processes", None) or {}).values()):
                    proc.terminate()
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        self._futures = []
        if self._vela is not None:
            self._vela.close()
            self._vela = None
