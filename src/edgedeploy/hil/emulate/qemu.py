"""One run of the firmware on QEMU's mps3-an547 board, and what its output says.

The firmware reports in lines starting with ``EDGEDEPLOY ``; :func:`parse_output` reads them
(pure, tested on recorded output). A run that faults, hangs (the timeout) or ends without its
``done`` line is a :class:`ToolFailedError` quoting the last lines the firmware printed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from edgedeploy.errors import ToolFailedError
from edgedeploy.core.nospace import writing
from edgedeploy.core.proc import run_command
from edgedeploy.hil.emulate.toolchain import QEMU_MACHINE

INPUT_FILE = "input.bin"
OUTPUT_FILE = "output.bin"
DEFAULT_TIMEOUT = 120.0
_PREFIX = "EDGEDEPLOY "
_QEMU_FATAL = re.compile(r"^qemu: fatal: (.*)$", re.M)
_KV = re.compile(r"(\w+)=(\S+)")


@dataclass
class FirmwareReport:
    """What the firmware printed: the verdicts it reached and the figures it measured."""

    started: bool = False
    done: bool = False
    cases: int | None = None
    cases_ok: list[int] = field(default_factory=list)
    arena_used_bytes: int | None = None
    stack_used_bytes: int | None = None
    arena_bytes: int | None = None
    fault: str | None = None
    error: str | None = None
    lines: list[str] = field(default_factory=list)
    tflm_messages: list[str] = field(default_factory=list)  # TFLM's MicroPrintf lines, in order


def parse_output(text: str) -> FirmwareReport:
    rep = FirmwareReport(lines=[ln.rstrip() for ln in text.splitlines() if ln.strip()])
    for line in rep.lines:
        line = line.strip()
        if not line.startswith(_PREFIX):
            continue
        rest = line[len(_PREFIX) :]
        word = rest.split(" ", 1)[0]
        kv = dict(_KV.findall(rest))
        if word == "start":
            rep.started = True
            rep.arena_bytes = int(kv["arena"]) if "arena" in kv else None
        elif word == "case" and rest.endswith(" ok"):
            rep.cases_ok.append(int(rest.split()[1]))
        elif word == "done":
            rep.done = True
            rep.cases = int(kv.get("cases", len(rep.cases_ok)))
        elif word == "fault":
            rep.fault = rest[len(word) :].strip()
        elif word == "error":
            rep.error = rest[len(word) :].strip()
        elif word == "tflm" and rest[len(word) :].strip():
            rep.tflm_messages.append(rest[len(word) :].strip())
        if "arena_used_bytes" in kv:
            rep.arena_used_bytes = int(kv["arena_used_bytes"])
        if "stack_used_bytes" in kv:
            rep.stack_used_bytes = int(kv["stack_used_bytes"])
    return rep


def last_lines(text: str, n: int = 3) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return " | ".join(lines[-n:]) if lines else "(no output)"


def qemu_argv(qemu: str, elf: Path) -> list[str]:
    return [
        qemu, "-M", QEMU_MACHINE, "-nographic", "-monitor", "none", "-serial", "null",
        "-semihosting-config", "enable=on,target=native", "-kernel", str(elf),
    ]  # fmt: skip


def run_firmware(qemu: str, elf: Path, workdir: Path, inputs: bytes, timeout: float = DEFAULT_TIMEOUT) -> tuple[FirmwareReport, bytes, float]:
    """Run ``elf`` with ``inputs`` as ``input.bin``; (report, ``output.bin`` bytes, seconds)."""
    with writing(workdir / INPUT_FILE):
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / INPUT_FILE).write_bytes(inputs)
    (workdir / OUTPUT_FILE).unlink(missing_ok=True)
    res = run_command(qemu_argv(qemu, elf), timeout=timeout, cwd=workdir, log_file=workdir / "qemu.log")
    rep = parse_output(res.stdout)
    fatal = _QEMU_FATAL.search(res.stderr)
    if fatal and not rep.fault:
        rep.fault = fatal.group(1).strip()  # e.g. a lockup: a fault while the stack is exhausted
    text = res.stdout if res.stdout.strip() else res.stderr
    hint = f"full output in {workdir / 'qemu.log'}"
    if rep.fault:
        lockup = "; a lockup in a fault handler is most often a stack overflow (raise --stack-size)" if "Lockup" in rep.fault else ""
        raise ToolFailedError(f"the firmware faulted on the emulated Cortex-M55 ({rep.fault}); last output: {last_lines(text)}", hint + lockup)
    if res.timed_out:
        raise ToolFailedError(f"the firmware hung: no exit within {timeout:g} s on QEMU; last output: {last_lines(text)}", hint)
    if rep.error:
        said = f"; TFLM says: {' | '.join(rep.tflm_messages[-3:])}" if rep.tflm_messages else ""
        raise ToolFailedError(f"the firmware stopped: {rep.error}{said}", hint)
    if not rep.started:
        raise ToolFailedError(f"the firmware printed no start line (QEMU exit {res.returncode}); output: {last_lines(text)}", hint)
    if not rep.done or res.returncode != 0:
        raise ToolFailedError(f"the firmware ended early (QEMU exit {res.returncode}); last output: {last_lines(text)}", hint)
    out = workdir / OUTPUT_FILE
    return rep, (out.read_bytes() if out.is_file() else b""), res.seconds
