"""``edgedeploy emulate FW --serve tcp:PORT``: the bundle's device runner on the emulated board's UART.

The firmware is the bundle's CPU path with the runner (``edgedeploy_runner.h``) answering framed
requests on UART0 of QEMU's mps3-an547, which QEMU serves on a local TCP port
(``-serial tcp:HOST:PORT,server=on,wait=off``). It runs until the command is stopped (Ctrl-C,
SIGTERM); a client may connect, disconnect and connect again. The host side is
``--edgedeploy-device serial:socket://HOST:PORT`` of the pytest plugin.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from edgedeploy.errors import EdgeDeployError, InvalidInputError, ToolFailedError, UsageError
from edgedeploy.core.proc import run_until_stopped
from edgedeploy.export.bundle import check_bundle_files
from edgedeploy.hil.emulate.board import EmulatedBoard, read_bundle
from edgedeploy.hil.emulate.firmware import DEFAULT_STACK
from edgedeploy.hil.emulate.qemu import last_lines
from edgedeploy.hil.emulate.toolchain import QEMU_MACHINE

_ADDRESS = re.compile(r"^tcp:(?:(?P<host>[A-Za-z0-9.\-]+):)?(?P<port>\d{1,5})$")
_FAULT = re.compile(r"^EDGEDEPLOY (fault|error) (.*)$", re.M)


def parse_address(address: str) -> tuple[str, int]:
    """``tcp:PORT`` or ``tcp:HOST:PORT`` -> (host, port); the host defaults to 127.0.0.1 (this machine only)."""
    m = _ADDRESS.fullmatch(address or "")
    port = int(m.group("port")) if m else 0
    if m is None or not 0 < port < 65536:
        raise UsageError(f"--serve {address!r} is not tcp:PORT or tcp:HOST:PORT", "e.g. --serve tcp:4000 (port 1 to 65535)")
    return m.group("host") or "127.0.0.1", port


def qemu_serve_argv(qemu: str, elf: Path, host: str, port: int) -> list[str]:
    return [
        qemu, "-M", QEMU_MACHINE, "-nographic", "-monitor", "none",
        "-serial", f"tcp:{host}:{port},server=on,wait=off",
        "-semihosting-config", "enable=on,target=native", "-kernel", str(elf),
    ]  # fmt: skip


def check_runner(bundle: Path) -> None:
    """The bundle ships the device runner, its files as the export wrote them."""
    manifest = read_bundle(bundle)
    runner = manifest.get("runner")
    if not runner:
        raise InvalidInputError(f"{bundle} ships no device runner (exported by an earlier edgedeploy)",
                                "export it again: `edgedeploy export RUN_DIR --golden N --data DATA.npz --out FWDIR`")  # fmt: skip
    names = [*runner.get("sources", []), *runner.get("headers", [])] if isinstance(runner, dict) else [runner]
    check_bundle_files(bundle, manifest, names)  # hashed by read_bundle already; here: each is one it lists


@dataclass
class ServeResult:
    """A finished serving session: the bundle name, the TCP address served and how long it ran."""

    name: str
    address: str
    seconds: float
    stopped: bool  # by the user (Ctrl-C, SIGTERM), not by the firmware
    log: Path


def serve_bundle(
    bundle: Path, address: str, tflm_dir: Path | str | None = None, build_dir: Path | None = None,
    stack_bytes: int = DEFAULT_STACK, on_ready: Callable[[str], None] | None = None,
) -> ServeResult:  # fmt: skip
    """Build the serving firmware and run it on QEMU until stopped; ``on_ready(line)`` when the runner is up."""
    host, port = parse_address(address)
    bundle = Path(bundle)
    check_runner(bundle)
    build_dir = Path(build_dir).resolve() if build_dir is not None else None  # CMake takes the toolchain file relative to its build
    board = EmulatedBoard(bundle, tflm_dir, build_dir, stack_bytes=stack_bytes, serve=True)
    log = board.build_dir / "serve" / "qemu-serve.log"

    served: list[str] = []

    def line(text: str) -> None:
        if text.startswith("EDGEDEPLOY serve "):
            served.append(text)
            if on_ready is not None:
                on_ready(text[len("EDGEDEPLOY ") :])

    try:
        res, stopped = run_until_stopped(qemu_serve_argv(board.qemu, board.firmware.elf, host, port), cwd=board.build_dir,
                                         log_file=log, on_line=line)  # fmt: skip
    except BaseException as exc:
        board.close(keep=isinstance(exc, EdgeDeployError))  # an error's log stays; an interrupt leaves nothing
        raise
    if not stopped:
        board.close(keep=True)  # the log the error points at
        said = _FAULT.search(res.stdout)
        why = said.group(0)[len("EDGEDEPLOY ") :] if said else f"QEMU exit {res.returncode}"
        what = "the serving firmware stopped on its own" if served else f"QEMU stopped before the firmware served on {host}:{port}"
        raise ToolFailedError(f"{what} ({why}); last output: {last_lines(res.stdout)}", f"full output in {log}")
    board.close()
    return ServeResult(str(board.manifest["name"]), f"tcp:{host}:{port}", res.seconds, stopped, log)
