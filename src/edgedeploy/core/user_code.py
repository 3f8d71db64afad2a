"""Running the user's own code (a preprocessing function, a metric): what it prints kept off stdout, and an
interrupt it raises itself told apart from one a signal caused.

``with user_code() as signalled:`` around the call; in its ``except BaseException`` handler,
:func:`reraise_interrupt` lets a signalled interrupt go on, and the caller turns anything else (``SystemExit``
and a ``KeyboardInterrupt`` of the code's own included) into one :class:`~edgedeploy.errors.UsageError` naming the
function (:func:`ended_by` says how it ended). So stdout carries only what the command prints (``--json``'s
document), and user code cannot end a command with exit 0 and no word.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from typing import Iterator


def ended_by(exc: BaseException) -> str:
    """``Type: text`` (or the type alone) of what the user's code raised."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def tried_to_end(exc: BaseException) -> bool:
    """Whether ``exc`` is not an error but an attempt to end the process (``SystemExit``, ``KeyboardInterrupt``)."""
    return not isinstance(exc, Exception)


def reraise_interrupt(exc: BaseException, signalled: list[int]) -> None:
    """An interrupt by a signal while the user's code ran goes on as the interrupt it is."""
    if isinstance(exc, KeyboardInterrupt) and signalled:
        raise exc


@contextlib.contextmanager
def user_code() -> Iterator[list[int]]:
    """While the user's code runs: its ``print`` and anything written to file descriptor 1 go to stderr, and the
    signals that interrupt a command (SIGINT, SIGTERM, SIGHUP, where a Python handler takes them) are noted in the
    list yielded, so that a ``KeyboardInterrupt`` they cause is told apart from one the code raises itself."""
    signalled: list[int] = []
    restore = []
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)):
            if signum is None:  # (no SIGHUP on this platform)
                continue
            old = signal.getsignal(signum)
            if callable(old):
                def noted(number, frame, old=old):
                    signalled.append(number)
                    return old(number, frame)

                signal.signal(signum, noted)
                restore.append((signum, old))
    saved = _stdout_to_stderr()
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield signalled
    finally:
        if saved is not None:
            with contextlib.suppress(OSError, ValueError):
                sys.stderr.flush()
            os.dup2(saved, 1)
            os.close(saved)
        for signum, old in restore:
            signal.signal(signum, old)


def _stdout_to_stderr() -> int | None:
    """File descriptor 1 pointed at stderr's (what C code and child processes print too); returns a copy of the
    old one, or None where either descriptor is not open."""
    try:
        if sys.stdout is not None:
            sys.stdout.flush()
        saved = os.dup(1)
    except (OSError, ValueError):
        return None
    try:
        os.dup2(2, 1)
    except OSError:
        os.close(saved)
        return None
    return saved
