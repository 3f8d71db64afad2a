"""Lookup tables of the activation stage, as Vela 5.2 builds them and the NPU applies them.

Tables live in the NPU's shared buffer (SHRAM), loaded there by DMA: the top 2048 bytes hold eight slots of 256
bytes, and activation function ``16 + slot`` (the low bits of NPU_SET_ACTIVATION) looks the output up in the
table that starts at that slot. What a table holds depends on the output's precision:

* 8-bit output: 256 entries of one byte, indexed by the value + 128 (signed) or the value (unsigned);
* 32-bit output: 256 entries of four bytes, indexed by the int8-clamped value + 128 (Vela forces the int8 clip
  range for these);
* 16-bit output: 512 entries of four bytes (the whole 2048 bytes, so slot 0), an interpolated table. Each entry
  is ``slope * 65536 + base`` (Vela's ``lut.create_lut_int16_op`` and the int16 softmax's exp and
  1/(1+x) tables); the int16 value picks entry ``(value + 32768) >> 7`` with its top nine bits and interpolates
  with its low seven: ``base + ((slope * (value & 127) + 64) >> 7)``, the same piecewise-linear lookup as
  TFLite's int16 reference kernels (``generic_int16_table_lookup``) over their 513-entry tables, whose last
  entry only gives the last slope.

The entry is read as one signed 32-bit number ``slope * 65536 + base`` with ``base`` in -32768..32767, which is how
Vela adds the two; where the base is negative this puts ``slope - 1`` in the top half. Every table Vela 5.2
writes (exp, and the softmax's exp and 1/(1+x)) has non-negative bases, where reading the halves as two int16
gives the same slope.
"""

from __future__ import annotations

import numpy as np

from ..errors import NpuModelError

LUT_START, LUT_END = 16, 23  # activation functions 16..23: table lookup in slot 0..7
LUT_SLOT = 256
LUT_BYTES = 2048  # the top of SHRAM
ENTRIES_16 = 512
STEP_BITS_16 = 7


def is_table(function: int) -> bool:
    return LUT_START <= function <= LUT_END


def table_bytes(shram: np.ndarray, slot: int, nbytes: int, title: str) -> np.ndarray:
    """The ``nbytes`` of the table at ``slot`` (one batch row of SHRAM)."""
    base = shram.shape[0] - LUT_BYTES + slot * LUT_SLOT
    entries = shram[base : base + nbytes]
    if slot * LUT_SLOT + nbytes > LUT_BYTES or entries.shape[0] != nbytes:
        raise NpuModelError(f"{title}: a {nbytes}-byte lookup table at slot {slot} runs past SHRAM",
                            "the command stream is corrupt; compile the model again with Vela")
    return entries


def lookup(shram: np.ndarray, slot: int, value: np.ndarray, size: int, signed: bool, title: str) -> np.ndarray:
    """``value`` (already clamped to the activation range) looked up in the table at ``slot``, for an output of
    ``size`` bytes."""
    if size == 2:
        if not signed:
            raise NpuModelError(f"{title}: a 16-bit lookup table on an unsigned output is not modelled",
                                "int16 outputs are")
        return interpolate16(table_bytes(shram, slot, 4 * ENTRIES_16, title).view("<i4"), value, title)
    entries = table_bytes(shram, slot, 256 * size, title)
    table = entries.view("<i4" if size == 4 else (np.int8 if signed else np.uint8)).astype(np.int64)
    index = np.asarray(value, dtype=np.int64) + (128 if size == 4 or signed else 0)
    if index.size and (index.min() < 0 or index.max() > 255):
        raise NpuModelError(f"{title}: a lookup index leaves 0..255", "the activation clamp is wrong")
    return table[index]


def split16(entries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(base, slope) of 512 interpolated-table entries, each the signed 32-bit ``slope * 65536 + base``."""
    word = np.asarray(entries, dtype=np.int64)
    word = np.where(word >= 1 << 31, word - (1 << 32), word)
    base = ((word & 0xFFFF) ^ 0x8000) - 0x8000
    return base, (word - base) >> 16


def interpolate16(entries: np.ndarray, value: np.ndarray, title: str = "lookup") -> np.ndarray:
    """The interpolated lookup of int16 ``value`` in 512 entries (see the module's description)."""
    v = np.asarray(value, dtype=np.int64)
    if v.size and (v.min() < -32768 or v.max() > 32767):
        raise NpuModelError(f"{title}: a 16-bit lookup input leaves the int16 range", "the activation clamp is wrong")
    base, slope = split16(entries)
    index = (v + 32768) >> STEP_BITS_16
    frac = v & ((1 << STEP_BITS_16) - 1)
    return base[index] + ((slope[index] * frac + (1 << (STEP_BITS_16 - 1))) >> STEP_BITS_16)


def table16(values) -> np.ndarray:
    """The 512 entries Vela builds from 513 int16 samples (for tests and tools): ``slope * 65536 + base``, as
    unsigned 32-bit words."""
    v = np.asarray(values, dtype=np.int64)
    if v.shape != (ENTRIES_16 + 1,):
        raise ValueError(f"an interpolated table takes {ENTRIES_16 + 1} samples, not {v.shape}")
    return (((v[1:] - v[:-1]) << 16) + v[:-1]) & 0xFFFFFFFF
