"""Ethos-U85 fast weight format (FWD): one weight stream decoded to its values, in the stream's order.

Vela 5.2 writes FWD (``NPU_SET_WEIGHT_FORMAT`` bit 0) for a convolution or fully-connected layer whose weights do
not compress well; depthwise weights are never written this way. A stream is a 256-bit header followed by the
weights, bits read from the least significant bit of each byte up:

- bit 0: raw mode; bit 1: 2-bit look-up mode; bits 2-103: zero; bits 104-111: the zero adjustment (signed 8-bit);
  bits 112-255: a table of 16 weights of 9 bits each, folded (magnitude times 2, the sign in the lowest bit).
- raw mode: one byte per weight, ``weight = signed byte - zero adjustment`` (weights from -256 to 255 whose
  range spans under 256 values); 2-bit look-up mode: a 2-bit index into the table's first 4 entries per weight;
  neither flag: a 4-bit index into the 16 entries (both flags together: not a stream Vela writes).
- the weights are padded with zero bits to a whole number of 256 bits.

Vela chooses the format per weight tensor: it encodes the standard format (SWD) first and keeps FWD when its
estimate of the decode cycles is lower (with ``--optimise Size``: when the FWD stream is smaller), so dense
random or fine-tuned int8 weights (more than 16 distinct values, little to compress) get FWD and clustered or
pruned weights the standard format. On an NPU of several cores the FWD stream is one stream (``WEIGHT_BASE``)
that interleaves the cores' weight orders (:func:`edgedeploy.npu.u85_weights.fwd_order`).
"""

from __future__ import annotations

import numpy as np

from ..errors import NpuModelError

HEADER_BITS = 256
ALIGN_BITS = 256
LUT_SIZE = 16
_ZERO_ADJUST = 104
_LUT = 112
_CORRUPT = "the weights are corrupt; compile the model again with Vela"


def _unsigned(bits: np.ndarray, width: int) -> np.ndarray:
    """Little-endian unsigned fields of ``width`` bits, from a (n, width) array of bits."""
    return (bits.astype(np.int64) << np.arange(width, dtype=np.int64)).sum(axis=1)


def unfold(folded: np.ndarray) -> np.ndarray:
    """A folded table entry (magnitude times 2, sign in bit 0) as the signed weight it holds."""
    return np.where(folded & 1, -(folded >> 1), folded >> 1)


def stream_size(count: int, bits_per_weight: int) -> int:
    """The bytes of an FWD stream of ``count`` weights of ``bits_per_weight`` bits (header and padding included)."""
    return (HEADER_BITS + -(-count * bits_per_weight // ALIGN_BITS) * ALIGN_BITS) // 8


def decode(data: bytes, count: int, where: str) -> np.ndarray:
    """The ``count`` weights of the FWD stream ``data`` (int64, in the stream's order); ``where`` names the
    operation and stream in errors."""
    if len(data) < HEADER_BITS // 8:
        raise NpuModelError(f"{where}: the fast-format (FWD) weight stream holds {len(data)} B, less than its "
                            f"{HEADER_BITS // 8}-byte header", _CORRUPT)
    bits = np.unpackbits(np.frombuffer(data, dtype=np.uint8), bitorder="little")
    raw, small = bool(bits[0]), bool(bits[1])
    if raw and small:
        raise NpuModelError(f"{where}: the FWD header sets both raw and 2-bit look-up mode", _CORRUPT)
    if np.any(bits[2:_ZERO_ADJUST]):
        raise NpuModelError(f"{where}: the FWD header's reserved bits 2-103 are not zero", _CORRUPT)
    adjust = int(_unsigned(bits[_ZERO_ADJUST:_LUT].reshape(1, 8), 8)[0])
    adjust = adjust - 256 if adjust >= 128 else adjust
    lut = unfold(_unsigned(bits[_LUT:HEADER_BITS].reshape(LUT_SIZE, 9), 9))
    width = 8 if raw else 2 if small else 4
    size = stream_size(count, width)
    if len(data) != size:
        held = (len(data) * 8 - HEADER_BITS) // width
        raise NpuModelError(f"{where}: the FWD weight stream is {len(data)} B ({'raw' if raw else 'look-up'} mode, "
                            f"{width} bits a weight: about {held} weights) where {count} weights take {size} B",
                            "the weights or the command stream are corrupt; compile the model again with Vela")
    fields = _unsigned(bits[HEADER_BITS : HEADER_BITS + count * width].reshape(count, width), width)
    if np.any(bits[HEADER_BITS + count * width :]):
        raise NpuModelError(f"{where}: the FWD weight stream's padding after its {count} weights is not zero",
                            _CORRUPT)
    if raw:
        return np.where(fields >= 128, fields - 256, fields) - adjust
    if adjust:
        raise NpuModelError(f"{where}: the FWD header sets a zero adjustment ({adjust}) in look-up mode", _CORRUPT)
    return lut[fields]
