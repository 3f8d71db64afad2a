"""The one place that starts external processes.

Every external tool run goes through :func:`run_command`: it has a timeout,
captures output, optionally tees it to a log file, and returns a
:class:`ProcResult`. Nothing else in the package calls ``subprocess``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

from edgedeploy.errors import DiskFullError, ToolFailedError, ToolMissingError
from edgedeploy.core.nospace import disk_full, said_no_space, writing


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
        try:
            _write_log(log_file, args, returncode, " (timed out)" if timed_out else "", result.seconds,
                       f"--- stdout\n{stdout}\n--- stderr\n{stderr}\n")
        except DiskFullError:
            if result.ok or said_no_space(stdout + "\n" + stderr) is None:
                raise
            # the program met the same full disk: its own line (check_disk_full) says more than the log's
    return result


def run_until_stopped(
    argv: Sequence[str | os.PathLike],
    *,
    cwd: str | os.PathLike | None = None,
    log_file: Path | None = None,
    on_line: Callable[[str], None] | None = None,
) -> tuple[ProcResult, bool]:
    """Run ``argv`` until it exits or this process is interrupted (Ctrl-C; the CLI turns SIGTERM into the same).

    Its output (stdout and stderr together) goes line by line to ``on_line`` as it comes. An interrupt
    stops the program (terminate, then kill after 5 s) and returns ``(result, True)``; an exit of its
    own returns ``(result, False)``. A missing executable raises :class:`ToolMissingError`.
    """
    args = tuple(str(a) for a in argv)
    start = time.perf_counter()
    lines: list[str] = []
    try:
        proc = subprocess.Popen(args, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                text=True, errors="replace", bufsize=1)  # fmt: skip
    except FileNotFoundError as exc:
        raise ToolMissingError(f"{args[0]} was not found", "install it or put it on PATH") from exc
    stopped = False
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if on_line is not None:
                on_line(line.rstrip("\n"))
        proc.wait()
    except KeyboardInterrupt:
        stopped = True
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    result = ProcResult(args, proc.returncode, "".join(lines), "", time.perf_counter() - start)
    if log_file is not None:
        _write_log(log_file, args, proc.returncode, " (stopped)" if stopped else "", result.seconds,
                   f"--- output\n{result.stdout}\n")
    return result, stopped


def check(result: ProcResult, what: str, hint: str | None = None, *, writes: Path | None = None,
          full_hint: str | None = None) -> ProcResult:
    """Raise :class:`ToolFailedError` unless ``result`` succeeded; one whose output says a disk is full is a
    :class:`~edgedeploy.errors.DiskFullError` naming the folder the program ``writes`` (``full_hint``: its fix)."""
    check_disk_full(result, what, writes, full_hint)
    if result.timed_out:
        raise ToolFailedError(f"{what} timed out after {result.seconds:.0f} s", hint)
    if result.returncode != 0:
        raise ToolFailedError(f"{what} failed (exit {result.returncode}): {result.tail()}", hint)
    return result


def check_disk_full(result: ProcResult, what: str, writes: Path | None, hint: str | None = None) -> None:
    """A failed program that says a disk or quota is full (a compiler, CMake, a linker): a
    :class:`~edgedeploy.errors.DiskFullError` naming the folder it ``writes`` and quoting its own line, rather than
    its last lines, which are about something else (a compiler check that could not write its test program)."""
    if result.ok:
        return
    line = said_no_space(result.stdout + "\n" + result.stderr)
    if line is not None:
        raise disk_full(writes, doing=what, detail=line[:300], quota="quota" in line.lower(), hint=hint)


def _write_log(log_file: Path, args: Sequence[str], returncode: int | None, note: str, seconds: float,
               body: str) -> None:
    """The log of one process: its command line, how it ended, then what it printed."""
    with writing(log_file):
        log_file.parent.mkdir(parents=True, exist_ok=True)
        log_file.write_text(f"$ {' '.join(args)}\n# exit {returncode}{note} after {seconds:.2f} s\n{body}",
                            encoding="utf-8")


def _text(data: bytes | str | None) -> str:
    if data is None:
        return ""
    if isinstance(data, bytes):
        return data.decode("utf-8", errors="replace")
    return data


class PipeWorker:
    """A helper program started once (a fresh process, never a fork) that answers length-prefixed requests on its
    stdin and stdout. For native code that ends its process on bad input instead of raising (a decoder that calls
    ``exit``): the worker's end is a :class:`ToolFailedError`, this process lives on, and the next request starts a
    new worker. What the worker writes on stderr is dropped."""

    def __init__(self, argv: Sequence[str], what: str) -> None:
        self.argv, self.what = list(argv), what
        self._proc: subprocess.Popen | None = None

    def call(self, payload: bytes, timeout: float = 120.0) -> bytes:
        import select
        import struct

        if self._proc is None or self._proc.poll() is not None:
            self._proc = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          stderr=subprocess.DEVNULL)
        proc = self._proc
        assert proc.stdin is not None  # (opened with a pipe)
        deadline = time.monotonic() + timeout
        try:
            proc.stdin.write(struct.pack("<I", len(payload)) + payload)
            proc.stdin.flush()
            head = self._read(proc, 4, deadline, select)
            return self._read(proc, struct.unpack("<I", head)[0], deadline, select)
        except (BrokenPipeError, EOFError):
            self.close()
            raise ToolFailedError(f"{self.what} ended its process without a result") from None
        except TimeoutError:
            self.close()
            raise ToolFailedError(f"{self.what} did not finish in {timeout:.0f} s") from None

    @staticmethod
    def _read(proc: subprocess.Popen, n: int, deadline: float, select) -> bytes:
        out = bytearray()
        assert proc.stdout is not None  # (opened with a pipe)
        fd = proc.stdout.fileno()
        while len(out) < n:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError
            chunk = os.read(fd, n - len(out))
            if not chunk:
                raise EOFError
            out += chunk
        return bytes(out)

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            for stream in (proc.stdin, proc.stdout):
                with contextlib.suppress(OSError):
                    if stream is not None:
                        stream.close()
