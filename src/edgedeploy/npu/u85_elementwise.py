"""Ethos-U85 elementwise operations and the U85's scaling, chaining and lookup tables.

Scaling (OFM_SCALE, and IFM_SCALE/IFM2_SCALE for ADD and SUB) is ``(x * scale + round) >> shift`` with the
rounding mode in the register's parameter: NATURAL adds half; DOUBLE_SYMMETRIC adds, besides, ``2**(30 - d)``
away from zero when the shift is over ``31 - d`` (``d`` the double-rounding point, also in the parameter), which
is TFLite's two-step rounding of an operand shifted left by ``d`` bits. This is the arithmetic Vela 5.2's U85
backend folds constants with. An OFM or IFM with CHAINED storage is passed between operations without memory,
one buffer per number its region field gives. A scalar operand is OP_SCALAR.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..errors import NpuModelError
from . import lut, sigmoid16, u85_ofm_order
from .commands import Operation
from .featuremap import feature_map, read, write

Memory = Callable[[int], np.ndarray]
SHRAM = -1
H, W, C, SCALAR = 1, 2, 4, 8  # broadcast flags
CHAINED, NO_STORAGE = 2, 3
UNARY = ("CLZ", "ABS", "NOT", "LRELU")


def scale(x, mult, shift, mode: int, double: int = 0) -> np.ndarray:
    """``(x * mult + round) >> shift`` in Python integers per element, with the U85's rounding ``mode``."""
    x = np.asarray(x, dtype=object)
    mult = int(mult)
    shift = int(shift)
    prod = x * mult
    half = (1 << (shift - 1)) if shift > 0 else 0
    d = (1 << (30 - double)) if shift > 31 - double else 0
    neg = np.vectorize(lambda v: v < 0, otypes=[bool])(x) if x.size else np.zeros(x.shape, bool)
    if mode == 0:  # DOUBLE_SYMMETRIC
        rnd = np.where(neg, half - d, half + d)
    elif mode == 1:  # NATURAL
        rnd = np.full(x.shape, half, dtype=object)
    elif mode == 2:  # DOUBLE_ASYMMETRIC
        rnd = np.full(x.shape, half + d, dtype=object)
    elif mode == 3:  # SYMMETRIC
        rnd = np.where(neg, half - 1, half)
    elif mode == 4:  # TRUNCATE_TO_ZERO
        rnd = np.where(neg, (1 << shift) - 1, 0)
    elif mode == 5:  # TRUNCATE_TO_LOWER
        rnd = np.zeros(x.shape, dtype=object)
    else:
        raise ValueError(mode)
    return (prod + rnd.astype(object)) >> shift


def _saturate(x, bits: int, signed: bool) -> np.ndarray:
    lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    return np.clip(np.asarray(x, dtype=object), lo, hi).astype(np.int64)


def _operand(op: Operation, prefix: str, mem: Memory, chain: dict, shape: tuple[int, int, int]) -> np.ndarray:
    prec = op.reg(f"{prefix}_PRECISION")
    flags = op.r0.get(f"{prefix}_BROADCAST", 0) & 0xF
    zero = op.signed(f"{prefix}_ZERO_POINT")
    if flags & SCALAR:
        v = op.reg32("OP_SCALAR") & 0xFFFFFFFF
        if prec & 1 and v & 0x80000000:
            v -= 1 << 32
        return np.full((1, 1, 1, 1), v - zero, dtype=np.int64)
    h, w, c = shape
    want = (1 if flags & H else h, 1 if flags & W else w, 1 if flags & C else c)
    if (prec >> 14) & 0x3 == CHAINED:
        region = op.reg(f"{prefix}_REGION") & 0x7
        if region not in chain:
            raise NpuModelError(f"{op.title}: {prefix} reads chaining buffer {region}, which nothing wrote",
                                "the command stream is corrupt; compile the model again with Vela")
        value = chain[region]
        if value.shape[1:] != want:
            raise NpuModelError(f"{op.title}: {prefix} reads {want} from a chaining buffer holding {value.shape[1:]}",
                                "the command stream is corrupt; compile the model again with Vela")
        return value - zero
    fm = feature_map(op, prefix)
    return read(mem(fm.region & 0x7), fm, want, op.title) - zero


def _ifm_scale(op: Operation, name: str, x: np.ndarray) -> np.ndarray:
    v = op.reg32(name)
    param = v >> 32
    return scale(x, v & 0x7FFFFFFF, param & 0x3F, (param >> 13) & 1, (param >> 6) & 0x1F)


def elementwise(op: Operation, mem: Memory, chain: dict) -> None:
    mode = op.sub_op
    h, w, c = op.reg("OFM_HEIGHT_M1") + 1, op.reg("OFM_WIDTH_M1") + 1, op.reg("OFM_DEPTH_M1") + 1
    a = np.asarray(_operand(op, "IFM", mem, chain, (h, w, c)), dtype=object)
    b: Any = None if mode in UNARY else np.asarray(_operand(op, "IFM2", mem, chain, (h, w, c)), dtype=object)
    if mode in ("ADD", "SUB"):
        a, b = _ifm_scale(op, "IFM_SCALE", a), _ifm_scale(op, "IFM2_SCALE", b)
        acc = a + b if mode == "ADD" else a - b
    elif mode == "MUL":
        acc = a * b
    elif mode == "MIN":
        acc = np.minimum(a, b)
    elif mode == "MAX":
        acc = np.maximum(a, b)
    elif mode == "SHL":
        acc = _saturate(a * (np.ones_like(b) << np.clip(b, 0, 31)), 32, True).astype(object)
    elif mode == "SHR":
        param = op.reg32("OFM_SCALE") >> 32
        acc = np.vectorize(lambda x, s: scale(np.array([x]), 1, int(min(max(s, 0), 31)), (param >> 13) & 7)[0],
                           otypes=[object])(*np.broadcast_arrays(a, b))
    elif mode == "ABS":
        acc = np.abs(a)
    elif mode == "CLZ":
        acc = np.vectorize(lambda x: 32 - (int(x) & 0xFFFFFFFF).bit_length(), otypes=[object])(a)
    elif mode == "LRELU":  # negative inputs scaled by IFM2_SCALE (alpha folded in), the others by IFM_SCALE
        acc = np.where(a < 0, _ifm_scale(op, "IFM2_SCALE", a), _ifm_scale(op, "IFM_SCALE", a))
    else:
        raise NpuModelError(f"{op.title}: elementwise {mode} is not modelled on the Ethos-U85",
                            "ADD, SUB, MUL, MIN, MAX, SHL, SHR, ABS, CLZ and LRELU are")
    acc = np.broadcast_to(acc, (mem(1).shape[0], h, w, c))
    if mode not in ("SHR", "SHL", "CLZ", "MIN", "MAX"):
        v = op.reg32("OFM_SCALE")
        param = v >> 32
        mult = v & 0x7FFFFFFF
        if mode == "MUL" and (op.reg("IFM_PRECISION") >> 2) & 0x3 == 2:
            mult = 1  # a product of 32-bit operands is shifted only: OFM_SCALE's multiplier is left out
        acc = scale(acc, mult, param & 0x3F, (param >> 13) & 7, (param >> 6) & 0x1F)
    store(op, mem, chain, acc)


def store(op: Operation, mem: Memory, chain: dict, acc) -> None:
    """Add the OFM zero point, clamp, look up, saturate, and write to memory or the chaining buffer."""
    prec = op.reg("OFM_PRECISION")
    bits = {0: 8, 1: 16, 2: 32}.get((prec >> 1) & 0x3)
    if bits is None:
        raise NpuModelError(f"{op.title}: OFM precision {(prec >> 1) & 0x3} is not modelled", "8-, 16- and 32-bit are")
    acc, function = tanh_sigmoid(op, acc, bits)
    value = np.asarray(acc, dtype=object) + op.signed("OFM_ZERO_POINT")
    if bits < 32 or function:
        value = np.clip(value, op.signed("ACTIVATION_MIN"), op.signed("ACTIVATION_MAX"))
    if function:
        value = lookup(op, mem, value)
    signed = bool(prec & 1)
    out = _saturate(value, bits, signed)
    if (prec >> 14) & 0x3 == CHAINED:
        chain[op.reg("OFM_REGION") & 0x7] = out
        return
    fm = feature_map(op, "OFM")
    write(mem(fm.region & 0x7), fm, u85_ofm_order.arrange(op, out), op.title)


# LUT_U8_U8, LUT_S8_S8, LUT_S8_S16, LUT_S8_S32: bytes per entry and entry type. Each is a table of 256 entries in
# the U85's 2048-byte lookup memory; ACTIVATION's table field counts tables of that function's size (Regor's
# register generator divides its 256-byte slot by the table's size in slots), so table ``t`` starts at byte
# ``t * 256 * size`` and there are 8, 8, 4 and 2 of them.
LUTS = {1: (1, "u1"), 4: (1, "i1"), 5: (2, "<i2"), 7: (4, "<i4")}
LUT_S16_S16 = 8  # the U55's interpolated 16-bit table (lut.interpolate16): 512 entries of 4 bytes, table 0
TANH_SIGMOID = {10: sigmoid16.TANH, 11: sigmoid16.SIGMOID}  # the U85's numbers -> the U55's (sigmoid16)


def tanh_sigmoid(op: Operation, scaled, bits: int) -> tuple[np.ndarray, int]:
    """The scaled value through the TANH or SIGMOID function (the U55's 16-bit ones, on the value before the zero
    point), and the activation function left to apply (0 after these)."""
    function = op.reg("ACTIVATION") & 0x1F
    if function not in TANH_SIGMOID:
        return scaled, function
    if bits != 16:
        raise NpuModelError(f"{op.title}: activation function {function} is not modelled on {bits}-bit outputs",
                            "TANH and SIGMOID on 16-bit outputs are")
    return sigmoid16.FUNCTIONS[TANH_SIGMOID[function]](np.asarray(scaled, dtype=np.int64)), 0


def lookup(op: Operation, mem: Memory, value) -> np.ndarray:
    """The activation's lookup table (loaded by DMA into the NPU's internal memory; see ``LUTS``), indexed by the
    int8 value + 128 (the uint8 value for LUT_U8_U8); or LUT_S16_S16, the 16-bit interpolated table at the start
    of that memory, indexed and interpolated as on the U55."""
    function, table = op.reg("ACTIVATION") & 0x1F, (op.reg("ACTIVATION") >> 5) & 0x7
    if function == LUT_S16_S16 and not table:
        entries = np.ascontiguousarray(mem(SHRAM)[0, : 4 * lut.ENTRIES_16])
        if entries.shape[0] != 4 * lut.ENTRIES_16:
            raise NpuModelError(f"{op.title}: a 16-bit lookup table runs past the NPU's internal memory",
                                "the command stream is corrupt; compile the model again with Vela")
        return lut.interpolate16(entries.view("<i4"), np.asarray(value, dtype=np.int64), op.title)
    if not modelled_table(function, table):
        raise NpuModelError(f"{op.title}: activation function {function} (table {table}) is not modelled on the "
                            "Ethos-U85", "LUT_U8_U8, LUT_S8_S8, LUT_S8_S16, LUT_S8_S32 and LUT_S16_S16 (table 0) are")
    return table_lookup(mem(SHRAM), function, table, value, op.title)


def modelled_table(function: int, table: int) -> bool:
    """Whether ``lookup`` models activation ``function`` with ``table`` (LUT_S16_S16 in table 0 included)."""
    if function == LUT_S16_S16:
        return table == 0
    return function in LUTS and table < lut.LUT_BYTES // (lut.LUT_SLOT * LUTS[function][0])


def table_lookup(memory: np.ndarray, function: int, table: int, value, title: str) -> np.ndarray:
    """``value`` (one row per batch element, clamped to the activation range) looked up in table ``table`` of the
    8-bit-indexed ``function`` (a key of ``LUTS``) in ``memory``, the internal memory (one row per batch element)."""
    size, dtype = LUTS[function]
    base = table * lut.LUT_SLOT * size
    raw = np.ascontiguousarray(memory[:, base : base + lut.LUT_SLOT * size])
    if raw.shape[1] != lut.LUT_SLOT * size:
        raise NpuModelError(f"{title}: a lookup table runs past the NPU's internal memory",
                            "the command stream is corrupt; compile the model again with Vela")
    entries = raw.view(dtype).astype(np.int64)
    index = np.asarray(value, dtype=np.int64) + (0 if dtype == "u1" else 128)
    if index.size and (index.min() < 0 or index.max() > 255):
        raise NpuModelError(f"{title}: a lookup index leaves 0..255", "the activation clamp is wrong")
    return np.take_along_axis(entries, index.reshape(index.shape[0], -1), axis=1).reshape(index.shape)
