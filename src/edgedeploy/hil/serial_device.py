"""A device running the bundle's runner (``edgedeploy_runner.c``), reached through pyserial.

``serial:PORT[@BAUD]`` names it: PORT is anything ``serial.serial_for_url`` opens (``/dev/ttyACM0``,
``COM3``, a pty, ``socket://127.0.0.1:PORT`` for ``edgedeploy emulate FW --serve tcp:PORT``).
Opening sends ``HELLO`` and refuses a firmware whose model hash is not the bundle's; each call
sends one ``INFER`` and returns the output bytes, keeping what the device measured in :attr:`last`.
Every failure is one :class:`~edgedeploy.errors.EdgeDeployError` line: a port that cannot be
opened, or a :class:`DeviceError` naming the device, the frame and what was expected: no answer within
``timeout``, a lost connection or other link error, a CRC error, an error frame, an answer of the wrong
length or with the wrong count of PMU counters, a frame longer than the host reads. Text the device
sent (its model name, an error frame's text) is cut to :data:`~edgedeploy.hil.frame.TEXT_LIMIT`
characters with control characters and terminal escapes removed (:func:`~edgedeploy.hil.frame.printable`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Iterable

from ..errors import InvalidInputError, ToolFailedError, ToolMissingError, UsageError
from edgedeploy.core.units import fmt_count
from . import frame as fr

DEFAULT_BAUD = 115200
DEFAULT_TIMEOUT = 10.0
PYSERIAL_PIN = "pyserial==3.5"
_READ_SLICE = 0.05  # seconds one read waits, so the overall deadline is kept
TEXT_FRAME_MAX = 1 << 20  # the longest frame read besides the expected answer (an error frame and its text)
_RUNNER_HINT = "check that the firmware runs the edgedeploy runner on this port at this baud rate"
_REBUILD_HINT = "build the firmware from a bundle exported by this edgedeploy"


class DeviceError(ToolFailedError):
    """A device that broke the runner protocol or the link: the device, the frame and what was expected, in one
    line (the HIL plugin ends the running test with it, without a traceback)."""


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
            parts.append(fmt_count(self.cycles, "CPU cycles"))
        if self.npu_cycles is not None:
            parts.append(fmt_count(self.npu_cycles, "NPU cycles"))
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
        self.lost = ""  # why the link is gone (later requests fail at once, naming it)
        self.last: Timing | None = None
        self.stream = stream if stream is not None else _open(port, baud, self.timeout)
        try:
            self.hello = self._handshake()
        except BaseException:
            self.close()
            raise

    def _fail(self, problem: str, hint: str | None = None) -> DeviceError:
        return DeviceError(f"the device on {self.port} {problem}", hint)

    def _handshake(self) -> fr.Hello:
        expect = f"a HELLO answer of {fr.HELLO_BYTES} to {fr.HELLO_BYTES + fr.NAME_MAX} bytes"
        payload = self.request(fr.HELLO, b"", "HELLO", fr.HELLO_BYTES + fr.NAME_MAX, expect).payload
        if not fr.HELLO_BYTES <= len(payload) <= fr.HELLO_BYTES + fr.NAME_MAX:
            raise self._fail(f"answered HELLO with {len(payload)} payload bytes; expected {fr.HELLO_BYTES} (the runner's "
                             f"header) and a model name of up to {fr.NAME_MAX} characters", _REBUILD_HINT)  # fmt: skip
        hello = fr.parse_hello(payload)
        where = f"the firmware on {self.port}"
        if hello.version != fr.PROTOCOL_VERSION:
            raise ToolFailedError(f"{where} speaks runner protocol {hello.version}, not {fr.PROTOCOL_VERSION}", _REBUILD_HINT)
        if hello.model_sha256.lower() not in self.accepted:
            raise InvalidInputError(
                f"{where} runs model '{fr.printable(hello.name, 80)}' sha256 {fr.printable(hello.model_sha256[:16])}..., "
                f"not bundle '{self.name}' (sha256 {' or '.join(sorted(s[:16] + '...' for s in self.accepted))})",
                "flash the firmware built from this bundle, or pass the bundle it was built from",
            )
        if (hello.input_bytes, hello.output_bytes) != (self.input_bytes, self.output_bytes):
            raise InvalidInputError(
                f"{where} takes {hello.input_bytes} input and gives {hello.output_bytes} output bytes; "
                f"bundle '{self.name}' has {self.input_bytes} and {self.output_bytes}", "rebuild the firmware from this bundle"
            )  # fmt: skip
        return hello

    def request(self, ftype: int, payload: bytes, what: str, limit: int = TEXT_FRAME_MAX, expect: str = "") -> fr.Frame:
        """Send one frame, return the device's answer to it (a payload of at most ``limit`` bytes; ``expect`` says
        what it should be); an error frame, no answer, a lost connection or a frame the host does not read raises
        :class:`DeviceError`."""
        if self.lost:
            raise self._fail(f"is not answering {what}: {self.lost}", "restart the device and run again")
        self._seq = (self._seq + 1) & 0xFF
        try:
            return self._exchange(ftype, self._seq, payload, what, limit)
        except OSError as exc:  # pyserial's SerialException is an OSError: a disconnect, a write timeout
            failure = exc
        text = fr.printable(str(failure)) or type(failure).__name__
        if "disconnected" in text:
            self.lost = f"it closed the connection during an earlier {what}"
            raise self._fail(f"closed the connection before answering {what} (expected {expect or 'an answer'})",
                             _RUNNER_HINT)
        self.lost = f"the link failed during an earlier {what} ({text})"
        raise self._fail(f"could not be reached during {what}: {text}", _RUNNER_HINT)

    def _exchange(self, ftype: int, seq: int, payload: bytes, what: str, limit: int) -> fr.Frame:
        self.stream.reset_input_buffer()  # what an earlier, abandoned request left
        self.stream.write(fr.encode(ftype, seq, payload))
        self.stream.flush()
        capacity = max(limit, TEXT_FRAME_MAX)
        decoder = fr.Decoder(capacity=capacity, timeout_ms=int(self.timeout * 1000))
        deadline = time.monotonic() + self.timeout
        got, other = 0, ""
        while time.monotonic() < deadline:
            # the rest of a frame begun, else what is waiting: no read waits for bytes that belong to no frame
            size = decoder.needed if decoder.busy else max(1, getattr(self.stream, "in_waiting", 0) or 0)
            data = self.stream.read(size)
            got += len(data)
            for ev in decoder.feed_all(data):
                if isinstance(ev, fr.FrameError) and ev.code == fr.ERR_TOO_LONG:
                    raise self._fail(f"sent a frame of {decoder.length:,} payload bytes for {what}; the host reads at "
                                     f"most {capacity:,}", _RUNNER_HINT)  # fmt: skip
                if isinstance(ev, fr.FrameError):
                    raise DeviceError(
                        f"the answer from {self.port} to {what} failed its check ({fr.ERROR_NAMES.get(ev.code, ev.code)})",
                        "check the baud rate and the wiring; the link corrupts bytes",
                    )
                if ev.type == fr.ERROR:
                    code, text = fr.parse_error(ev.payload)
                    known = code in fr.ERROR_NAMES  # (an unknown code: firmware of another runner version)
                    raise self._fail(
                        f"refused {what}: {fr.ERROR_NAMES.get(code, f'error {code}, not a code the runner sends')} "
                        f"({fr.printable(text) or 'no text'})",
                        "check the baud rate and the wiring" if code in (fr.ERR_CRC, fr.ERR_TIMEOUT) else
                        None if known else _REBUILD_HINT,
                    )
                if ev.type == ftype | fr.REPLY and ev.seq == seq:
                    if len(ev.payload) > limit:
                        raise self._fail(f"answered {what} with {len(ev.payload):,} payload bytes; at most {limit:,} "
                                         "expected", _REBUILD_HINT)  # fmt: skip
                    return ev
                other = other or f"a frame of type 0x{ev.type:02x} seq {ev.seq}, not the answer to {what} seq {seq}"
        arrived = other or (f"{got} bytes arrived, no whole answer" if got else "no bytes arrived")
        raise self._fail(f"did not answer {what} within {self.timeout:g} s ({arrived})", _RUNNER_HINT)

    def infer(self, data: bytes) -> fr.Result:
        if len(data) != self.input_bytes:
            raise ValueError(f"input is {len(data)} bytes; '{self.name}' takes {self.input_bytes}")
        pmu = self.hello.pmu_events
        want = fr.RESULT_BYTES + 4 * pmu + self.output_bytes
        layout = f"{fr.RESULT_BYTES} + 4 x {pmu} PMU counters + {self.output_bytes} output bytes"
        start = time.perf_counter()
        answer = self.request(fr.INFER, bytes(data), "INFER", fr.RESULT_BYTES + 4 * fr.PMU_MAX + self.output_bytes,
                              f"an INFER answer of {want} bytes")  # fmt: skip
        n = len(answer.payload)
        counters = answer.payload[1] if n >= 2 else None
        if counters is not None and counters != pmu:
            raise self._fail(f"answered INFER with {n:,} payload bytes declaring {counters} PMU counters; its HELLO "
                             f"announced {pmu}, so {want} bytes ({layout}) were expected", _REBUILD_HINT)  # fmt: skip
        if n != want:
            raise self._fail(f"answered INFER with {n:,} payload bytes; expected {want} ({layout})", _REBUILD_HINT)
        result = fr.parse_result(answer.payload)
        self.last = Timing(time.perf_counter() - start, result.cycles, result.device_ms, result.npu_cycles, result.pmu)
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
