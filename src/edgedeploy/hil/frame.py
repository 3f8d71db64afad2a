"""The device runner's frame codec on the host: the same bytes as ``edgedeploy_frame.c`` in a bundle.

A frame (little-endian): sync ``ED 5A``, type, sequence number, payload length (u32), payload,
CRC-32 of everything after the sync bytes (zlib's CRC-32: IEEE 802.3, reflected, init and final
XOR ``0xFFFFFFFF``). :class:`Decoder` is the C decoder's state machine, byte for byte: it hunts for
the sync bytes, refuses a length over its capacity, checks the CRC and times out a frame that
stops part way. Pure functions, no I/O: :mod:`edgedeploy.hil.serial_device` moves the bytes.
"""

from __future__ import annotations

import re
import struct
import zlib
from dataclasses import dataclass

from ..core.files import short

PROTOCOL_VERSION = 1
SYNC = b"\xed\x5a"
HEADER_BYTES = 8
CRC_BYTES = 4
REPLY = 0x80

HELLO = 0x01
INFER = 0x02
ERROR = 0x7F

ERR_CRC = 1
ERR_TOO_LONG = 2
ERR_TIMEOUT = 3
ERR_UNKNOWN_TYPE = 4
ERR_BAD_SIZE = 5
ERR_INVOKE = 6
ERROR_NAMES = {
    ERR_CRC: "CRC mismatch", ERR_TOO_LONG: "frame too long", ERR_TIMEOUT: "frame cut off",
    ERR_UNKNOWN_TYPE: "unknown frame type", ERR_BAD_SIZE: "wrong input size", ERR_INVOKE: "the model failed to run",
}  # fmt: skip

HAS_CYCLES = 0x01
HAS_PMU = 0x02
HAS_CLOCK = 0x04
HELLO_BYTES = 80
RESULT_BYTES = 24
NAME_MAX = 255  # the longest model name a HELLO answer may carry (the runner sends at most 63 characters)
PMU_MAX = 255  # a u8 count
TEXT_LIMIT = 200  # device-supplied text (a name, an error frame's text) is shown cut to this many characters
LINE_LIMIT = 1000  # characters of one HIL test failure line

_HEADER = struct.Struct("<2sBBI")
_HELLO = struct.Struct("<BBBxIII64s")
_RESULT = struct.Struct("<BBxxQIQ")


def crc32(data: bytes, crc: int = 0) -> int:
    return zlib.crc32(data, crc) & 0xFFFFFFFF


def encode(ftype: int, seq: int, payload: bytes = b"") -> bytes:
    """One whole frame."""
    body = _HEADER.pack(SYNC, ftype & 0xFF, seq & 0xFF, len(payload))[2:] + payload
    return SYNC + body + struct.pack("<I", crc32(body))


@dataclass(frozen=True)
class Frame:
    type: int
    seq: int
    payload: bytes


@dataclass(frozen=True)
class FrameError:
    """What the decoder reports for a bad frame (the device answers it with an error frame)."""

    code: int
    seq: int


_HUNT0, _HUNT1, _HEAD, _PAYLOAD, _CRC, _DROP = range(6)


class Decoder:
    """Bytes in, :class:`Frame` or :class:`FrameError` out; the state machine of ``edgedeploy_frame.c``."""

    def __init__(self, capacity: int, timeout_ms: int = 250) -> None:
        self.capacity = capacity
        self.timeout_ms = timeout_ms
        self.state = _HUNT0
        self.buf = bytearray()
        self.length = 0
        self.seq = 0
        self.last_ms = 0

    @property
    def busy(self) -> bool:
        return self.state != _HUNT0

    @property
    def needed(self) -> int:
        """Bytes still to come before the frame being read is whole (1 while hunting for the sync bytes): a reader
        may ask for this many without waiting for bytes that belong to no frame."""
        if self.state == _HEAD:
            return HEADER_BYTES - len(self.buf)
        if self.state in (_PAYLOAD, _CRC):
            return HEADER_BYTES + self.length + CRC_BYTES - len(self.buf)
        return 1

    def feed(self, byte: int, now_ms: int = 0) -> Frame | FrameError | None:
        self.last_ms = now_ms
        s = self.state
        if s == _HUNT0:
            if byte == SYNC[0]:
                self.state = _HUNT1
        elif s == _HUNT1:
            if byte == SYNC[1]:
                self.buf = bytearray(SYNC)
                self.state = _HEAD
            elif byte != SYNC[0]:
                self.state = _HUNT0
        elif s == _HEAD:
            self.buf.append(byte)
            if len(self.buf) == HEADER_BYTES:
                _sync, _type, self.seq, self.length = _HEADER.unpack(bytes(self.buf))
                if self.length > self.capacity:
                    self.state = _DROP
                    return FrameError(ERR_TOO_LONG, self.seq)
                self.state = _PAYLOAD if self.length else _CRC
        elif s in (_PAYLOAD, _CRC):
            self.buf.append(byte)
            if s == _PAYLOAD and len(self.buf) == HEADER_BYTES + self.length:
                self.state = _CRC
            elif s == _CRC and len(self.buf) == HEADER_BYTES + self.length + CRC_BYTES:
                self.state = _HUNT0
                body, (got,) = bytes(self.buf[2:-CRC_BYTES]), struct.unpack("<I", self.buf[-CRC_BYTES:])
                if crc32(body) != got:
                    return FrameError(ERR_CRC, self.seq)
                return Frame(body[0], body[1], body[6:])
        return None  # _DROP: left by poll()

    def poll(self, now_ms: int) -> FrameError | None:
        """While no byte arrives: a started frame older than the timeout is an ``ERR_TIMEOUT``."""
        if self.state == _HUNT0 or ((now_ms - self.last_ms) & 0xFFFFFFFF) <= self.timeout_ms:
            return None
        quiet = self.state in (_HUNT1, _DROP)
        self.state = _HUNT0
        return None if quiet else FrameError(ERR_TIMEOUT, self.seq)

    def feed_all(self, data: bytes, now_ms: int = 0) -> list[Frame | FrameError]:
        out = []
        for b in data:
            ev = self.feed(b, now_ms)
            if ev is not None:
                out.append(ev)
        return out


@dataclass(frozen=True)
class Hello:
    """The device's answer to ``HELLO``: who it is."""

    version: int
    flags: int
    pmu_events: int
    input_bytes: int
    output_bytes: int
    capacity: int
    model_sha256: str
    name: str


def parse_hello(payload: bytes) -> Hello:
    if len(payload) < HELLO_BYTES:
        raise ValueError(f"a HELLO answer of {len(payload)} bytes; at least {HELLO_BYTES} expected")
    version, flags, n_pmu, n_in, n_out, cap, sha = _HELLO.unpack(payload[:HELLO_BYTES])
    return Hello(version, flags, n_pmu, n_in, n_out, cap, sha.decode("ascii", "replace"),
                 payload[HELLO_BYTES:].decode("ascii", "replace"))  # fmt: skip


@dataclass(frozen=True)
class Result:
    """The device's answer to ``INFER``: what it measured and the output bytes."""

    flags: int
    cycles: int | None  # CPU cycles (a cycle counter such as DWT CYCCNT), None when the device has none
    device_ms: int | None  # the board's millisecond clock
    npu_cycles: int | None  # Ethos-U PMU cycle counter
    pmu: tuple[int, ...]  # Ethos-U PMU event counts
    output: bytes


def parse_result(payload: bytes) -> Result:
    if len(payload) < RESULT_BYTES:
        raise ValueError(f"an INFER answer of {len(payload)} bytes; at least {RESULT_BYTES} expected")
    flags, n_pmu, cycles, ms, npu = _RESULT.unpack(payload[:RESULT_BYTES])
    end = RESULT_BYTES + 4 * n_pmu
    if len(payload) < end:
        raise ValueError(f"an INFER answer of {len(payload)} bytes cannot hold {n_pmu} PMU counters")
    pmu = struct.unpack(f"<{n_pmu}I", payload[RESULT_BYTES:end])
    return Result(
        flags, cycles if flags & HAS_CYCLES else None, ms if flags & HAS_CLOCK else None,
        npu if flags & HAS_PMU else None, pmu if flags & HAS_PMU else (), payload[end:],
    )  # fmt: skip


def parse_error(payload: bytes) -> tuple[int, str]:
    code = payload[0] if payload else 0
    return code, payload[1:].decode("ascii", "replace")


_ESCAPE = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]?|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[ -/]*[0-~]?)")


def printable(text: str | bytes, limit: int = TEXT_LIMIT) -> str:
    """Text a device sent, fit for a terminal and a test report: terminal escape sequences removed, other control
    characters (newlines, tabs, NUL ...) as single spaces, cut in the middle to ``limit`` characters."""
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).decode("utf-8", "replace")
    text = _ESCAPE.sub("", text)
    text = " ".join("".join(c if c.isprintable() else " " for c in text).split())
    return short(text, limit)
