"""The one place that starts external processes.

Every external tool run goes through :func:`run_command`: it has a timeout,
captures output, optionally tees it to a log file, and returns a
:class:`ProcResult`. Nothing else in the package calls ``subprocess``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from .errors import ToolFailedError, ToolMissingError


@dataclass(frozen=True)
class ProcResult:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    seconds: float
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    def tail(self, lines: int = 5) -> str:
        text = (self.stderr.strip() or self.stdout.strip()).splitlines()
        return " | ".join(text[-lines:])


def which(program: str) -> str | None:
    return shutil.which(program)


def run_command(
    argv: Sequence[str | os.PathLike],
    *,
    timeout: float,
    cwd: str | os.PathLike | None = None,
    env: Mapping[str, str] | None = None,
    log_file: Path | None = None,
    input_text: str | None = None,
) -> ProcResult:
    """Run ``argv`` to completion (or ``timeout`` seconds) and capture its output.

    A missing executable raises :class:`ToolMissingError`; a non-zero exit is
    returned, not raised, so callers can read the tool's own message.
    """
    args = tuple(str(a) for a in argv)
    full_env = None
    if env is not None:
        full_env = dict(os.environ)
        full_env.update(env)
    start = time.perf_counter()
    timed_out = False
    try:
        proc = subprocess.run(
            args,
            cwd=cwd,
            env=full_env,
            input=input_text,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout,
            check=False,
        )
        returncode, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
    except FileNotFoundError as exc:
        raise ToolMissingError(f"{args[0]} was not found", "install it or put it on PATH") from exc
    except subprocess.TimeoutExpired as exc:
        timed_out = True
        returncode = -9
        stdout = _text(exc.stdout)
        stderr = _text(exc.stderr)
    result = ProcResult(args, returncode, stdout, stderr, time.perf_counter() - start, timed_out)
    if log_file is not None:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        log_file.write_text(
            f"$ {' '.join(args)}\n# exit {returncode}{' (timed out)' if timed_out else ''}"
            f" after {result.seconds:.2f} s\n--- stdout\n{stdout}\n--- stderr\n{stderr}\n",
            encoding="utf-8",
        )
    return result


def check(result: ProcResult, what: str, hint: str | None = None) -> ProcResult:
    """Raise :class:`ToolFailedError` unless ``result`` succeeded."""
    if result.timed_out:
        raise ToolFailedError(f"{what} timed out after {result.seconds:.0f} s", hint)
    if result.returncode != 0:
        raise ToolFailedError(f"{what} failed (exit {result.returncode}): {result.tail()}", hint)
    return result


def _text(data: bytes | str | None) -> str:
    if data is None:
        return ""
    if isinstance(data, bytes):
        return data.decode("utf-8", errors="replace")
    return data
