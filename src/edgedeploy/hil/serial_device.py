"""A device running the bundle's runner (``edgedeploy_runner.c``), reached through pyserial.

``serial:PORT[@BAUD]`` names it: PORT is anything ``serial.serial_for_url`` opens (``/dev/ttyACM0``,
``COM3``, a pty, ``socket://127.0.0.1:PORT`` for ``edgedeploy emulate FW --serve tcp:PORT``).
Opening sends ``HELLO`` and refuses a firmware whose model hash is not the bundle's; each call
sends one ``INFER`` and returns the output bytes, keeping what the device measured in :attr:`last`.
Every failure is one :class:`~edgedeploy.errors.EdgeDeployError` line: a port that cannot be
opened, a device that does not answer within ``timeout``, a CRC error, an error frame.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Iterable

from ..errors import InvalidInputError, ToolFailedError, ToolMissingError, UsageError
from . import frame as fr

DEFAULT_BAUD = 115200
DEFAULT_TIMEOUT = 10.0
PYSERIAL_PIN = "pyserial==3.5"
_READ_SLICE = 0.05  # seconds one read waits, so the overall deadline is kept


def parse_device(spec: str) -> tuple[str, int]:
    """``serial:PORT[@BAUD]`` -> (port or URL, baud); a bad spec is a :class:`UsageError`."""
    if not spec.startswith("serial:") or not spec[len("serial:") :]:
        raise UsageError(f"device {spec!r} is not serial:PORT[@BAUD]", "e.g. serial:/dev/ttyACM0@115200 or serial:socket://127.0.0.1:4000")
    port, baud = spec[len("serial:") :], DEFAULT_BAUD
    head, sep, tail = port.rpartition("@")
    if sep and tail.isdigit() and head:
        port, baud = head, int(tail)
        if baud <= 0:
            raise UsageError(f"device {spec!r} has baud rate 0", "give a positive baud rate, e.g. @115200")
    return port, baud


@dataclass(frozen=True)
class Timing:
    """One inference as the device and the host saw it."""

    round_trip_s: float  # host: request written to answer read
    cycles: int | None  # device CPU cycle counter
    device_ms: int | None  # device millisecond clock
    npu_cycles: int | None
    pmu: tuple[int, ...]

    def describe(self) -> str:
        parts = []
        if self.cycles is not None:
            parts.append(f"{self.cycles:,} CPU cycles")
        if self.npu_cycles is not None:
            parts.append(f"{self.npu_cycles:,} NPU cycles")
        if self.device_ms is not None:
            parts.append(f"{self.device_ms} ms device clock")
        parts.append(f"{self.round_trip_s * 1000:.1f} ms round trip")
        return ", ".join(parts)


class SerialDevice:
    """The runner on the other end of ``port``; a transport: ``device(input_bytes) -> output_bytes``."""

    def __init__(
        self, port: str, *, model_sha256: Iterable[str], input_bytes: int, output_bytes: int, name: str = "",
        baud: int = DEFAULT_BAUD, timeout: float = DEFAULT_TIMEOUT, stream: Any = None,
    ) -> None:  # fmt: skip
        self.port, self.timeout, self.name = port, float(timeout), name
        self.accepted = {s.lower() for s in model_sha256 if s}
        self.input_bytes, self.output_bytes = int(input_bytes), int(output_bytes)
        self._seq = 0
        self.last: Timing | None = None
        self.stream = stream if stream is not None else _open(port, baud, self.timeout)
        try:
            self.hello = self._handshake()
        except BaseException:
            self.close()
            raise

    def _handshake(self) -> fr.Hello:
        hello = fr.parse_hello(self.request(fr.HELLO, b"", "HELLO").payload)
        where = f"the firmware on {self.port}"
        if hello.version != fr.PROTOCOL_VERSION:
            raise ToolFailedError(f"{where} speaks runner protocol {hello.version}, not {fr.PROTOCOL_VERSION}",
                                  "build the firmware from a bundle exported by this edgedeploy")  # fmt: skip
        if hello.model_sha256.lower() not in self.accepted:
            raise InvalidInputError(
                f"{where} runs model '{hello.name}' sha256 {hello.model_sha256[:16]}..., not bundle '{self.name}' "
                f"(sha256 {' or '.join(sorted(s[:16] + '...' for s in self.accepted))})",
                "flash the firmware built from this bundle, or pass the bundle it was built from",
            )
        if (hello.input_bytes, hello.output_bytes) != (self.input_bytes, self.output_bytes):
            raise InvalidInputError(
                f"{where} takes {hello.input_bytes} input and gives {hello.output_bytes} output bytes; "
                f"bundle '{self.name}' has {self.input_bytes} and {self.output_bytes}", "rebuild the firmware from this bundle"
            )  # fmt: skip
        return hello

    def request(self, ftype: int, payload: bytes, what: str) -> fr.Frame:
        """Send one frame, return the device's answer to it; an error frame or no answer raises."""
        self._seq = (self._seq + 1) & 0xFF
        seq = self._seq
        self.stream.reset_input_buffer()  # what an earlier, abandoned request left
        self.stream.write(fr.encode(ftype, seq, payload))
        self.stream.flush()
        decoder = fr.Decoder(capacity=1 << 24, timeout_ms=int(self.timeout * 1000))
        deadline = time.monotonic() + self.timeout
        got = 0
        while time.monotonic() < deadline:
            data = self.stream.read(max(1, getattr(self.stream, "in_waiting", 0) or 1))
            got += len(data)
            for ev in decoder.feed_all(data):
                if isinstance(ev, fr.FrameError):
                    raise ToolFailedError(
                        f"the answer from {self.port} to {what} failed its check ({fr.ERROR_NAMES.get(ev.code, ev.code)})",
                        "check the baud rate and the wiring; the link corrupts bytes",
                    )
                if ev.type == fr.ERROR:
                    code, text = fr.parse_error(ev.payload)
                    raise ToolFailedError(
                        f"the device on {self.port} refused {what}: {fr.ERROR_NAMES.get(code, f'error {code}')} ({text})",
                        "check the baud rate and the wiring" if code in (fr.ERR_CRC, fr.ERR_TIMEOUT) else None,
                    )
                if ev.type == ftype | fr.REPLY and ev.seq == seq:
                    return ev
        raise ToolFailedError(
            f"the device on {self.port} did not answer {what} within {self.timeout:g} s"
            + (f" ({got} bytes arrived, no whole answer)" if got else " (no bytes arrived)"),
            "check that the firmware runs the edgedeploy runner on this port at this baud rate",
        )

    def infer(self, data: bytes) -> fr.Result:
        if len(data) != self.input_bytes:
            raise ValueError(f"input is {len(data)} bytes; '{self.name}' takes {self.input_bytes}")
        start = time.perf_counter()
        answer = self.request(fr.INFER, bytes(data), "INFER")
        result = fr.parse_result(answer.payload)
        self.last = Timing(time.perf_counter() - start, result.cycles, result.device_ms, result.npu_cycles, result.pmu)
        if len(result.output) != self.output_bytes:
            raise ToolFailedError(f"the device on {self.port} answered {len(result.output)} output bytes, not {self.output_bytes}",
                                  "rebuild the firmware from this bundle")  # fmt: skip
        return result

    def __call__(self, data: bytes) -> bytes:
        return self.infer(data).output

    def close(self) -> None:
        try:
            self.stream.close()
        except Exception:  # noqa: BLE001 - closing a port that is already gone
            pass


def _open(port: str, baud: int, timeout: float) -> Any:
    """The port through pyserial; a server still starting (``socket://``) is retried until ``timeout``."""
    try:
        import serial
    except ImportError as exc:
        raise ToolMissingError("pyserial is not installed", f"pip install {PYSERIAL_PIN}") from exc
    deadline = time.monotonic() + timeout
    while True:
        try:
            return serial.serial_for_url(port, baudrate=baud, timeout=_READ_SLICE, write_timeout=timeout)
        except (serial.SerialException, ValueError, OSError) as exc:
            if not port.startswith("socket://") or time.monotonic() >= deadline:
                raise ToolFailedError(f"cannot open {port}: {exc}", "check the port name (serial:PORT[@BAUD])") from None
            time.sleep(0.2)


def bundle_device(bundle: Any, spec: str, timeout: float = DEFAULT_TIMEOUT) -> SerialDevice:
    """The device ``serial:PORT[@BAUD]`` names, checked against ``bundle`` (a :class:`~edgedeploy.hil.testing.GoldenBundle`)."""
    port, baud = parse_device(spec)
    m = bundle.manifest
    hashes = [(m.get("model") or {}).get("sha256", ""), (m.get("cpu_model") or {}).get("sha256", "")]
    return SerialDevice(
        port, model_sha256=hashes, input_bytes=sum(t.nbytes for t in bundle.inputs), output_bytes=bundle.output_bytes,
        name=bundle.name, baud=baud, timeout=timeout,
    )  # fmt: skip
