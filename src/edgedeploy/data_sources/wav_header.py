"""A WAV file's header, read and bounded before any sample is decoded or resampled.

The header declares the sample rate, the channel count, the sample width and the length of the samples; each is
checked against the file and against the limits below, and the memory that decoding and resampling the file
would take is estimated from them. A header outside the limits is one error naming the file and the field, so a
damaged or hostile header (a rate of 1 Hz or 4,294,967,291 Hz, a data chunk longer than the file) is refused
before it asks for gigabytes. ``RIFF``, ``RIFX`` (big-endian) and ``RF64`` files are read, as SciPy reads them.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

from ..errors import InvalidInputError
from edgedeploy.core.files import short

RATE_RANGE = (1_000, 384_000)  # Hz, a file's own rate (the range of the recipe's data.sample_rate)
MAX_CHANNELS = 64
MAX_BITS = 64
MEMORY_LIMIT = 1 << 30  # bytes, estimated to decode and resample one file
PCM, FLOAT, EXTENSIBLE = 0x0001, 0x0003, 0xFFFE
_HINT = "replace the file, or re-save it as PCM or float WAV (e.g. sox in.wav -r 16000 out.wav)"


@dataclass(frozen=True)
class WavHeader:
    format_tag: int
    channels: int
    rate: int  # Hz
    byte_rate: int
    block_align: int  # bytes per frame, all channels
    bits: int
    data_size: int  # bytes of samples the data chunk declares

    @property
    def frames(self) -> int:
        return self.data_size // self.block_align


def _fail(name: str, what: str, hint: str = _HINT) -> InvalidInputError:
    return InvalidInputError(f"{short(name)}: {what}", hint)


def _damaged(name: str, what: str) -> InvalidInputError:
    return InvalidInputError(f"{short(name)}: cannot be decoded as a WAV file ({what})", "replace or remove the file")


def read_header(data: bytes, name: str) -> WavHeader:
    """The checked header of the WAV file ``data`` (its bytes); ``name`` is the file as errors name it."""
    if len(data) < 12 or data[:4] not in (b"RIFF", b"RIFX", b"RF64") or data[8:12] != b"WAVE":
        raise _damaged(name, "no RIFF/WAVE header")
    order = ">" if data[:4] == b"RIFX" else "<"
    rf64_size = None
    fmt = None
    pos = 12
    while pos + 8 <= len(data):
        cid = data[pos:pos + 4]
        size = struct.unpack(order + "I", data[pos + 4:pos + 8])[0]
        body = pos + 8
        if cid == b"ds64" and data[:4] == b"RF64":
            if size < 16 or body + 16 > len(data):
                raise _damaged(name, "the RF64 ds64 chunk is shorter than 16 bytes")
            rf64_size = struct.unpack("<Q", data[body + 8:body + 16])[0]
        elif cid == b"fmt ":
            fmt = _fmt(data, body, size, order, name)
        elif cid == b"data":
            if fmt is None:
                raise _damaged(name, "the data chunk comes before the fmt chunk")
            if rf64_size is not None and size == 0xFFFFFFFF:
                size = rf64_size
            header = WavHeader(*fmt, data_size=size)
            _check(header, len(data) - body, name)
            return header
        if body + size > len(data):
            raise _damaged(name, f"its {cid.decode('latin-1')!r} chunk declares {size:,} bytes but "
                           f"{len(data) - body:,} follow it: cut short or damaged")
        pos = body + size + (size & 1)
    raise _damaged(name, "no fmt chunk" if fmt is None else "no data chunk")


def _fmt(data: bytes, body: int, size: int, order: str, name: str) -> tuple[int, int, int, int, int, int]:
    if size < 16 or body + 16 > len(data):
        raise _damaged(name, f"its fmt chunk is {size} bytes, shorter than 16")
    tag, channels, rate, byte_rate, block_align, bits = struct.unpack(order + "HHIIHH", data[body:body + 16])
    if tag == EXTENSIBLE and size >= 40 and body + 40 <= len(data):
        tag = struct.unpack(order + "I", data[body + 24:body + 28])[0]  # the sub-format GUID's first field
    return tag, channels, rate, byte_rate, block_align, bits


def _check(h: WavHeader, available: int, name: str) -> None:
    lo, hi = RATE_RANGE
    if not lo <= h.rate <= hi:
        raise _fail(name, f"the header's sample rate is {h.rate:,} Hz, outside {lo:,}-{hi:,} Hz",
                    f"re-save the file at a rate in that range (e.g. sox in.wav -r 16000 out.wav)")
    if not 1 <= h.channels <= MAX_CHANNELS:
        raise _fail(name, f"the header's channel count is {h.channels}, outside 1-{MAX_CHANNELS}")
    if not 1 <= h.bits <= MAX_BITS or (h.format_tag == FLOAT and h.bits not in (32, 64)):
        raise _fail(name, f"the header's bits per sample is {h.bits}, not "
                    + ("32 or 64 (float)" if h.format_tag == FLOAT else f"1-{MAX_BITS}"))
    width = h.block_align // h.channels
    if h.block_align != width * h.channels or not 1 <= width <= 8 or h.bits > 8 * width:
        raise _fail(name, f"the header's block align is {h.block_align} bytes, not a whole sample of "
                    f"{h.bits} bits for each of {h.channels} channel{'s' if h.channels > 1 else ''}")
    if h.format_tag == PCM and h.byte_rate != h.rate * h.block_align:
        raise _fail(name, f"the header's byte rate is {h.byte_rate:,}, not sample rate x block align "
                    f"({h.rate * h.block_align:,})")
    if h.data_size > available:
        raise _fail(name, f"the data chunk declares {h.data_size:,} bytes of samples but {available:,} follow it",
                    "the file is cut short or its header is damaged: replace it")
    if h.data_size == 0:
        raise _fail(name, "the WAV file holds no samples (its data chunk is empty)", "replace or remove the file")
    if h.data_size % h.block_align:
        raise _fail(name, f"the data chunk's {h.data_size:,} bytes are not a whole number of "
                    f"{h.block_align}-byte frames", "the file is cut short or damaged: replace it")


def resampling(rate: int, sample_rate: int) -> tuple[int, int]:
    """``(up, down)``: the polyphase resampler's factors from ``rate`` to ``sample_rate`` (1, 1: none)."""
    g = math.gcd(int(rate), int(sample_rate))
    return int(sample_rate) // g, int(rate) // g


def frames_needed(h: WavHeader, sample_rate: int, length: int) -> int:
    """The frames of the file that the first ``length`` samples at ``sample_rate`` depend on (the resampler's
    filter reaches ``10 * max(up, down)`` upsampled samples ahead), at most all of them."""
    up, down = resampling(h.rate, sample_rate)
    if up == down:
        return min(h.frames, length)
    return min(h.frames, (length * down + 10 * max(up, down)) // up + 2)


def memory_estimate(h: WavHeader, file_size: int, sample_rate: int, length: int) -> int:
    """Bytes that decoding the file and resampling its first ``length`` samples takes, from its header: the
    file and its data chunk as read, the frames used as float32 (all channels, then mono), the resampling filter
    (``20 * max(up, down) + 1`` taps, and the float64 arrays that design it) and the resampled clip."""
    width = h.block_align // h.channels
    padded = 0 if width in (1, 2, 4, 8) else h.frames * h.channels * (4 if width < 4 else 8)
    used = frames_needed(h, sample_rate, length)
    up, down = resampling(h.rate, sample_rate)
    taps = 0 if up == down else 20 * max(up, down) + 1
    out = used if up == down else -(-used * up // down)
    return file_size + h.data_size + padded + used * (h.channels + 1) * 4 + taps * 4 * 8 + out * 8 * 2


def check_memory(h: WavHeader, file_size: int, sample_rate: int, length: int, name: str) -> None:
    need = memory_estimate(h, file_size, sample_rate, length)
    if need > MEMORY_LIMIT:
        up, down = resampling(h.rate, sample_rate)
        raise _fail(name, f"decoding it would take about {need / 2**20:,.0f} MiB (its header: {h.rate:,} Hz, "
                    f"{h.channels} channel{'s' if h.channels > 1 else ''}, {h.data_size:,} bytes of samples; "
                    f"resampled {up}:{down} to a {length:,}-sample clip), over the limit of "
                    f"{MEMORY_LIMIT / 2**20:,.0f} MiB per file",
                    "re-save the file at data.sample_rate, or shorten data.clip_seconds")
