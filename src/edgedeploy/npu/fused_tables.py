"""A documented difference seen through a lookup table that Vela fused into the operation that makes it.

Vela compiles an int8 LOGISTIC or TANH (and other activations it turns into tables) that follows a
FULLY_CONNECTED into the same NPU operation: the convolution's output stage looks its result up in the table
before it stores it. The fully-connected's own output never reaches memory, so the first NPU output that differs
from TFLite is the activation's, although the difference is the fully-connected's documented rounding.

Vela 5.2's 8-bit tables equal TFLite 2.21's reference LOGISTIC and TANH entry for entry, so the NPU output is
explained when, element by element, it is the operation's own table at an input within the fully-connected's
bound of TFLite's fully-connected output, and the table at TFLite's input gives TFLite's activation output.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from . import lut, u85_elementwise
from .commands import Operation
from .featuremap import feature_map

Table = tuple[np.ndarray, int]  # 256 entries, and what to add to a value to index them


def activation_table(op: Operation, memory: Callable[[int], np.ndarray], u85: bool) -> Table | None:
    """The 8-bit-indexed table an operation's 8-bit output is looked up in (as the run just applied it), if any."""
    if op.kind == "DMA" or feature_map(op, "OFM").size != 1:
        return None
    act = op.reg("ACTIVATION")
    shram = memory(u85_elementwise.SHRAM if u85 else -1)
    if u85:
        function, slot = act & 0x1F, (act >> 5) & 0x7
        if function not in u85_elementwise.LUTS or u85_elementwise.LUTS[function][0] != 1:
            return None
        dtype = u85_elementwise.LUTS[function][1]
        raw = np.ascontiguousarray(shram[0, slot * lut.LUT_SLOT : (slot + 1) * lut.LUT_SLOT])
        return raw.view(dtype).astype(np.int64), 0 if dtype == "u1" else 128
    kind = act & 0xFFF
    if not lut.is_table(kind):
        return None
    signed = feature_map(op, "OFM").signed
    raw = np.ascontiguousarray(lut.table_bytes(shram[0], kind - lut.LUT_START, lut.LUT_SLOT, op.title))
    return raw.view(np.int8 if signed else np.uint8).astype(np.int64), 128 if signed else 0


def explained(npu: np.ndarray, before: np.ndarray, after: np.ndarray, table: Table, bound: int) -> bool:
    """Whether the NPU's output ``npu`` is ``table`` at inputs within ``bound`` of TFLite's ``before`` (the
    activation's input), and the table at ``before`` is TFLite's ``after`` (the activation's output)."""
    entries, offset = table
    index = np.asarray(before, dtype=np.int64).reshape(-1) + offset
    npu, after = np.asarray(npu, np.int64).reshape(-1), np.asarray(after, np.int64).reshape(-1)
    if index.shape != npu.shape or index.shape != after.shape or index.size == 0:
        return False
    if index.min() < 0 or index.max() >= entries.size or not np.array_equal(entries[index], after):
        return False
    near = np.stack([entries[np.clip(index + d, 0, entries.size - 1)] for d in range(-bound, bound + 1)])
    return bool((near == npu[None, :]).any(axis=0).all())
