"""Where the work of a tree stage (train a node, convert a leaf) runs: in this process, or in worker processes.

``optimize`` hands each ready stage's work to a runner and records the result itself (cache keys, staging folders
and the manifest stay in the driver, in one thread). :class:`LocalStages` runs the work here when ``jobs`` is 1
(the default) and otherwise in ``jobs`` worker processes, started with ``spawn`` (TensorFlow has threads running
in this process; forking it is unsafe), each with TensorFlow's intra-op threads set to its share of the cores.
The workers share this machine's file system: they read the parents' files and write into the stage's staging
folder directly. Every stage seeds itself, so a result does not depend on the worker it ran in.

With workers, the runner queues what it cannot start yet and hands each worker the next queued stage, so no worker
waits while work is queued. A leaf's conversion asks for the worker that trained its node (``after``): there it
takes the model the node stage kept in memory (:mod:`edgedeploy.optimize.handoff`) instead of loading it again;
for a QAT node, rebuilding the quantization-aware model costs as long as the conversion itself. The queue is
served in the driver's thread (when it submits, and through :meth:`LocalStages.start_queued` before it waits), so
a worker freed by a node is still free when that node's leaf is submitted.

:class:`edgedeploy.pipeline.runners.ray.RayStages` is the same interface on Ray. A runner also keeps the Vela executor the
compiles of the graph use, so one command starts its workers (or Ray) once, however many times it walks the tree.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
import weakref
from concurrent.futures import FIRST_COMPLETED, CancelledError, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any, Callable

from edgedeploy.errors import ToolFailedError
from edgedeploy.core.manifest import now_iso
from edgedeploy.pipeline.runners.protocol import StageRunner
from edgedeploy.vela import VelaExecutor

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
    # splits one op's arithmetic, so its size changes the order of float sums in training and so the trained
    # leaves (docs/commands/optimize.md). It keeps TensorFlow's default, as in the driver, so every jobs count
    # gives the same leaves.
    env.tf.config.threading.set_inter_op_parallelism_threads(threads)


def run_work(fn: Callable[..., Any], *args: Any) -> tuple[Any, str, float]:
    """``fn(env, *args)`` with this process's TensorFlow; and when it started and how long it took."""
    from edgedeploy.keras import tfenv

    env = tfenv.load()
    started, t0 = now_iso(), time.perf_counter()
    return fn(env, *args), started, time.perf_counter() - t0


class LocalStages(StageRunner):
    """Stage work here (``jobs=1``) or in ``jobs`` spawned worker processes; compiles in a Vela pool."""

    def __init__(self, jobs: int = 1) -> None:
        self.jobs = max(1, int(jobs))
        self._workers: list[ProcessPoolExecutor | None] = [None] * self.jobs  # one process each, started on use
        self._busy: dict[int, Future] = {}  # worker -> the stage's future it is running
        self._queue: list[tuple[Future, tuple, int | None]] = []  # (future, (fn, *args), the worker it asks for)
        self._ran_in: weakref.WeakKeyDictionary[Future, int] = weakref.WeakKeyDictionary()
        self._retired: list[ProcessPoolExecutor] = []  # pools whose process died
        self._lock = threading.RLock()  # (a pool calls back at once for work done already)
        self._vela: VelaExecutor | None = None

    def submit(self, fn: Callable[..., Any], name: str, inputs: dict[str, Path], out: Path, *args: Any,
               after: Future | None = None) -> Future:
        """Start ``fn(env, node_or_leaf, inputs, out, ...)``; its future gives (result, started, seconds).
        ``after``: the future of the stage whose kept model this one reads (its worker is preferred)."""
        if self.jobs == 1:
            done: Future = Future()
            try:
                done.set_result(run_work(fn, name, inputs, out, *args))
            except Exception as exc:  # the stage's error, raised where the result is read
                done.set_exception(exc)
            return done
        future: Future = Future()
        with self._lock:
            self._queue.append((future, (fn, name, inputs, out, *args),
                                self._ran_in.get(after) if after is not None else None))
        self.start_queued()
        return future

    def start_queued(self) -> None:
        """Give each free worker a queued stage: first one that asks for that worker, else the first in line."""
        with self._lock:
            while self._queue:
                free = [w for w in range(self.jobs) if w not in self._busy]
                if not free:
                    return
                asked = next(((i, q[2]) for i, q in enumerate(self._queue) if q[2] in free), None)
                if asked is None:  # a worker no queued stage asks for, if there is one
                    wanted = {q[2] for q in self._queue}
                    asked = (0, next((w for w in free if w not in wanted), free[0]))
                i, worker = asked
                future, work, _ = self._queue.pop(i)
                self._start(worker, future, work)

    def _start(self, worker: int, future: Future, work: tuple) -> None:
        if not future.set_running_or_notify_cancel():
            return
        pool = self._workers[worker]
        if pool is None:
            pool = self._workers[worker] = ProcessPoolExecutor(
                max_workers=1, mp_context=multiprocessing.get_context("spawn"), initializer=_init_worker,
                initargs=(threads_per_job(self.jobs),))
        inner = pool.submit(run_work, *work)
        self._busy[worker] = future
        self._ran_in[future] = worker
        inner.add_done_callback(lambda done: self._done(worker, future, done))

    def _done(self, worker: int, future: Future, inner: Future) -> None:
        # the pool's thread: the worker is free; queued stages start when the driver next submits or waits
        with self._lock:
            self._busy.pop(worker, None)
            if not inner.cancelled() and isinstance(inner.exception(), BrokenProcessPool):
                # its process died: this stage fails, the next one there starts a new process
                dead, self._workers[worker] = self._workers[worker], None
                if dead is not None:
                    self._retired.append(dead)
        if inner.cancelled():  # (the runner is closing; a running future cannot be cancelled, only ended)
            future.set_exception(CancelledError())
        elif inner.exception() is not None:
            future.set_exception(inner.exception())
        else:
            future.set_result(inner.result())

    def collect(self, future: Future, out: Path) -> tuple[Any, str | None, float | None]:
        """The stage's result (its files are in ``out`` already), or its error raised."""
        while not future.done():  # (a caller that does not go through the graph may collect a queued stage)
            self.start_queued()
            with self._lock:
                running = list(self._busy.values())
            wait([future, *running], return_when=FIRST_COMPLETED)
        try:
            return future.result()
        except BrokenProcessPool:
            raise ToolFailedError("a stage worker process died (killed by a signal, a crash or lack of memory)",
                                  f"run fewer stages at once (recipe key jobs, now {self.jobs})") from None

    def vela(self, options: Any, n_tasks: int) -> VelaExecutor:
        """The Vela executor of this command's compiles, started on first use and kept until :meth:`close`."""
        if self._vela is None:
            from edgedeploy.pipeline.compile import make_executor

            self._vela = make_executor(options, n_tasks)
        return self._vela

    def close(self) -> None:
        """Stop the workers; work still running (the command stopped on an error or Ctrl-C) is ended, its
        staging folder left for the next run in this folder to remove."""
        with self._lock:
            queued, self._queue = self._queue, []
            busy = set(self._busy)
        for future, _, _ in queued:
            future.cancel()
        for dead in self._retired:
            dead.shutdown(wait=True)
        self._retired = []
        for worker, pool in enumerate(self._workers):
            if pool is None:
                continue
            if worker in busy:
                # ProcessPoolExecutor has no public way to end busy workers before Python 3.14.
                for proc in list((getattr(pool, "_processes", None) or {}).values()):
                    proc.terminate()
            pool.shutdown(wait=True, cancel_futures=True)
        self._workers = [None] * self.jobs
        self._busy = {}
        if self._vela is not None:
            self._vela.close()
            self._vela = None
