"""What runs in a Vela worker process, and the one worker forked as the ``edgedeploy`` process starts.

Importing Vela takes most of a single compile's time. :class:`WarmWorker` forks a worker with
``os.fork()`` before the command line is even parsed (this module imports nothing else to get
there), so Vela's import overlaps the CLI's own start-up; :class:`edgedeploy.vela.pool.VelaPool`
adopts it as one of its workers, and any command that compiles nothing ends it at once.

A worker runs :func:`vela_job`: Vela's documented entry point ``ethosu.vela.vela.main(argv)`` in a
fresh output folder, with the process's stdout/stderr sent to a log file.
"""

from __future__ import annotations

import os
import sys

# Nothing but os and sys is imported before the warm worker is forked (typing alone costs milliseconds).
TYPE_CHECKING = False
if TYPE_CHECKING:
    import threading
    from concurrent.futures import Future
    from typing import Any, Callable


class VelaJobResult:
    """How one Vela run ended: its exit code, seconds, and the exception Vela raised (if it raised)."""

    __slots__ = ("returncode", "seconds", "error")

    def __init__(self, returncode: int, seconds: float, error: str | None = None) -> None:
        self.returncode, self.seconds, self.error = returncode, seconds, error

    def __repr__(self) -> str:
        return f"VelaJobResult(returncode={self.returncode}, seconds={self.seconds:.3f}, error={self.error!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, VelaJobResult) and (self.returncode, self.seconds, self.error) == (
            other.returncode, other.seconds, other.error)


# What a worker imports before its first job: Vela, and the .tflite reader that workers run too.
WORKER_MODULES = ("ethosu.vela.vela", "edgedeploy.tflite.reader")


def worker_init() -> None:
    """Import :data:`WORKER_MODULES` once per worker (at once where the worker was forked from a process that has
    them); jobs then pay only for the work itself."""
    import importlib

    for name in WORKER_MODULES:
        importlib.import_module(name)


def installed_vela_version() -> str:
    """The installed Vela's version: in a worker, the one Vela read as it was imported; else from the package's
    metadata."""
    loaded = getattr(sys.modules.get("ethosu.vela._version"), "__version__", None)
    if isinstance(loaded, str):
        return loaded
    from importlib.metadata import PackageNotFoundError, version

    from edgedeploy.errors import ToolMissingError

    try:
        return version("ethos-u-vela")
    except PackageNotFoundError as exc:
        raise ToolMissingError("Vela (ethos-u-vela) is not installed", "pip install ethos-u-vela==5.2.0") from exc


def vela_job(args: list[str], log_path: str) -> VelaJobResult:
    """Run one Vela compile in this (worker) process, its console output going to ``log_path``."""
    import io
    import time

    from ethosu.vela import vela as vela_main

    t0 = time.perf_counter()
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    rc, error = None, None
    with open(log_path, "w", encoding="utf-8") as log_file:
        os.dup2(log_file.fileno(), 1)
        os.dup2(log_file.fileno(), 2)
        old_stdout, old_stderr = sys.stdout, sys.stderr
        sys.stdout = sys.stderr = io.TextIOWrapper(os.fdopen(os.dup(1), "wb"), encoding="utf-8", line_buffering=True)
        try:
            rc = vela_main.main(args)
        except SystemExit as exc:  # argparse errors
            rc = exc.code if isinstance(exc.code, int) else 2
        except Exception as exc:  # Vela raises on models it cannot compile, and on a full disk
            rc = 1
            error = f"{type(exc).__name__}: {exc}"
            try:
                print(f"edgedeploy: Vela raised {error}")
            except OSError:  # the log's own disk is full: the error still travels back in the result
                pass
        finally:
            try:  # a log on a full disk cannot take what is buffered; the result says why Vela stopped
                sys.stdout.flush()
            except OSError as exc:
                rc, error = rc or 1, error or f"{type(exc).__name__}: {exc}"
            try:
                sys.stdout.close()
            except OSError:
                pass
            sys.stdout, sys.stderr = old_stdout, old_stderr
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
    return VelaJobResult(int(rc or 0), time.perf_counter() - t0, error)


def _serve(requests: int, replies: int) -> None:
    """The forked worker: import Vela, then run each pickled ``(fn, args)`` and send back its outcome."""
    code = 0
    try:
        import pickle

        worker_init()
        with os.fdopen(requests, "rb") as inbox, os.fdopen(replies, "wb") as outbox:
            while True:
                try:
                    job = pickle.load(inbox)
                except EOFError:
                    break
                if job is None:  # asked to stop
                    break
                fn, args = job
                try:
                    outcome = (True, fn(*args))
                except BaseException as exc:  # noqa: BLE001 - handed to the caller, as a pool would
                    outcome = (False, exc)
                try:
                    data = pickle.dumps(outcome)
                except Exception as exc:  # an outcome that cannot travel: say what it was
                    data = pickle.dumps((False, RuntimeError(f"{fn.__name__}: {type(exc).__name__}: {exc}")))
                outbox.write(data)
                outbox.flush()
    except BaseException:  # noqa: BLE001 - a worker ends quietly; its caller sees the pipe close
        code = 1
    finally:
        os._exit(code)


class WarmWorker:
    """One worker process forked with ``os.fork()`` that imports Vela at once.

    It has the part of a :class:`concurrent.futures.ProcessPoolExecutor`'s interface that
    :class:`edgedeploy.vela.pool.VelaPool` uses: :meth:`submit` returns a future (``BrokenProcessPool``
    if the process died), :meth:`close` ends it. Jobs run one at a time, in the order given.
    """

    workers = 1

    def __init__(self) -> None:
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the worker
            os.close(req_w)
            os.close(rep_r)
            _serve(req_r, rep_w)
        os.close(req_r)
        os.close(rep_w)
        self.pid = pid
        self._requests = os.fdopen(req_w, "wb")
        self._replies = os.fdopen(rep_r, "rb")
        self._pending: list[Future] = []
        self._reader: threading.Thread | None = None
        self._lock: threading.Lock | None = None  # (threading is imported on first use)
        self._broken = False
        self._closed = False

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        import pickle
        import threading
        from concurrent.futures import Future

        if self._lock is None:
            self._lock = threading.Lock()
        future: Future = Future()
        with self._lock:
            if self._broken or self._closed:
                future.set_exception(_broken(self.pid))
                return future
            self._pending.append(future)
            try:
                self._requests.write(pickle.dumps((fn, args)))
                self._requests.flush()
            except OSError:  # the worker is gone; the reader fails what is pending
                pass
            if self._reader is None:
                self._reader = threading.Thread(target=self._read, name="edgedeploy-warm-worker", daemon=True)
                self._reader.start()
        return future

    def _read(self) -> None:
        import pickle

        lock = self._lock
        assert lock is not None  # (made by the submit that started this reader)
        while True:
            try:
                ok, value = pickle.load(self._replies)
            except Exception:  # EOF or a torn message: the worker died
                break
            with lock:
                future = self._pending.pop(0) if self._pending else None
            if future is not None and future.set_running_or_notify_cancel():
                future.set_result(value) if ok else future.set_exception(value)
        with lock:
            self._broken = True
            pending, self._pending = self._pending, []
        for future in pending:
            if future.set_running_or_notify_cancel():
                future.set_exception(_broken(self.pid))

    def close(self, now: bool = False) -> None:
        """End the worker: ``now`` at once (it may still be importing Vela), else after the jobs given."""
        if self._closed:
            return
        self._closed = True
        import signal

        if now:
            try:
                os.kill(self.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        else:
            try:
                self._requests.write(b"N.")  # pickle of None: stop after the jobs before it
                self._requests.flush()
            except OSError:
                pass
        try:
            self._requests.close()
        except OSError:
            pass
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass
        if self._reader is not None:
            self._reader.join()
        self._replies.close()


def _broken(pid: int) -> Exception:
    from concurrent.futures.process import BrokenProcessPool

    return BrokenProcessPool(f"the Vela worker process {pid} ended (killed by a signal, a crash or lack of memory)")


def fork_warm_worker() -> WarmWorker | None:
    """The warm worker, unless this process has a single core (where it could only compete with the command),
    the platform has no ``fork``, or TensorFlow is loaded already (the console script's function called from a
    program that imported it): TensorFlow's threads do not survive a fork, and the child would wait on them."""
    if not hasattr(os, "fork") or "tensorflow" in sys.modules:
        return None
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return WarmWorker() if cores > 1 else None
