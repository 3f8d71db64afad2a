"""Elementwise operations: ADD, SUB, MUL, MIN, MAX, SHL, SHR, CLZ, ABS (binary ones with broadcast or a scalar).

Operands have their zero points taken off. ADD and SUB scale their operands first (``scale_mode`` of
IFM_PRECISION): both by 16-bit factors (OPA_SCALE, OPB_SCALE), or one by a 32-bit (multiplier, shift) and the
other shifted left by the headroom Vela leaves for it (``scaling.advanced_elementwise_add_sub_scale``: 19 bits
for 8-bit inputs, 14 for 16-bit). ADD, SUB, MUL and ABS then go through the global OFM_SCALE; the others are not
scaled. A MUL of 32-bit operands takes its second operand as the multiplier and OFM_SCALE's shift as the
shift, rounded as the output stage rounds (TFL: TFLite's ``SaturatingRoundingDoublingHighMul`` then
``RoundingDivideByPOT``); the multiplier Vela writes into OFM_SCALE (its quantization of the scale ratio) is left
out. That is what makes Vela's int8 softmax and MEAN sequences reproduce TFLite's fixed-point arithmetic.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import NpuModelError
from . import arith
from .commands import Operation
from .featuremap import feature_map, read
from .ops import ROUNDING, Memory, _check_plain, _ofm_scale, ofm_shape, output_stage

BROADCAST_H, BROADCAST_W, BROADCAST_C, REVERSED, SCALAR = 1, 2, 4, 64, 128
SCALED = ("ADD", "SUB", "MUL", "ABS")
UNARY = ("CLZ", "ABS", "LRELU")
ADVANCED_HEADROOM = {1: 19, 2: 14}


def elementwise(op: Operation, mem: Memory) -> None:
    _check_plain(op)
    mode = op.sub_op
    ifm, ofm = feature_map(op, "IFM"), feature_map(op, "OFM")
    h, w, c = ofm_shape(op)
    a = read(mem(ifm.region), ifm, (h, w, c), op.title) - ifm.zero_point
    b: Any = None  # the second operand: read for every mode not in UNARY
    if mode not in UNARY:
        b = _second(op, mem, (h, w, c))
        if op.reg("IFM2_BROADCAST") & REVERSED:
            a, b = b, a
    rounding = ROUNDING[(op.reg("OFM_PRECISION") >> 14) & 0x3]
    if mode in ("ADD", "SUB"):
        a, b = _operand_scaling(op, a, b, ifm.size, rounding)
        acc = a + b if mode == "ADD" else a - b
    elif mode == "MUL":
        acc = _product(a, b)
    elif mode == "MIN":
        acc = np.minimum(a, b)
    elif mode == "MAX":
        acc = np.maximum(a, b)
    elif mode == "SHL":
        acc = arith.saturate(np.asarray(a, dtype=object) << np.clip(b, 0, 31).astype(object), 4, True).astype(np.int64)
    elif mode == "SHR":
        acc = arith.scale(a, np.ones(1, np.int64), np.clip(b, 0, 31), rounding)
    elif mode == "ABS":
        acc = np.abs(a)
    elif mode == "LRELU":  # negative inputs times alpha (OFM_SCALE), the others unscaled
        mult, shift = _ofm_scale(op)
        one = np.ones(1, dtype=np.int64)
        acc = np.where(a < 0, arith.scale(a, one * mult, one * shift, rounding), a)
    elif mode == "CLZ":
        u = (a.astype(np.int64) & 0xFFFFFFFF)
        acc = np.where(u == 0, 32, 31 - np.floor(np.log2(np.maximum(u, 1))).astype(np.int64))
    else:
        raise NpuModelError(f"{op.title}: elementwise {mode} is not modelled",
                            "ADD, SUB, MUL, MIN, MAX, SHL, SHR, CLZ, ABS and LRELU are")
    one = np.ones(1, dtype=np.int64)
    if mode == "MUL" and ifm.size == 4:  # the second operand is the multiplier; only OFM_SCALE's shift applies
        _, shift = _ofm_scale(op)
        x, m = np.broadcast_arrays(np.asarray(a), np.asarray(b))
        value = arith.scale(x, m, one * shift, "TFL") if rounding == "TFL" else arith.scale(acc, one, one * shift,
                                                                                                  rounding)
        output_stage(op, mem, ofm, value, one, one * 0)
    elif mode in SCALED:
        mult, shift = _ofm_scale(op)
        output_stage(op, mem, ofm, acc, one * mult, one * shift)
    else:
        output_stage(op, mem, ofm, acc, one, one * 0)


def _second(op: Operation, mem: Memory, shape: tuple[int, int, int]) -> np.ndarray:
    flags = op.reg("IFM2_BROADCAST")
    zero = op.signed("IFM2_ZERO_POINT")
    if flags & SCALAR:
        prec = op.reg("IFM2_PRECISION")
        scalar = op.signed("IFM2_SCALAR") if prec & 1 else op.reg("IFM2_SCALAR")
        return np.full((1, 1, 1, 1), scalar - zero, dtype=np.int64)
    ifm2 = feature_map(op, "IFM2")
    h, w, c = shape
    h2, w2, c2 = (1 if flags & BROADCAST_H else h, 1 if flags & BROADCAST_W else w, 1 if flags & BROADCAST_C else c)
    return read(mem(ifm2.region), ifm2, (h2, w2, c2), op.title) - ifm2.zero_point


def _operand_scaling(op: Operation, a, b, size: int, rounding: str):
    mode = (op.reg("IFM_PRECISION") >> 8) & 0x3
    opa = op.reg32("OPA_SCALE")
    opb = op.reg32("OPB_SCALE") & 0xFFFFFFFF
    if mode == 0:  # 16-bit factors on both operands
        return a * _s32(opa & 0xFFFFFFFF), b * _s32(opb)
    if size not in ADVANCED_HEADROOM:
        raise NpuModelError(f"{op.title}: 32-bit operand scaling of {8 * size}-bit inputs is not modelled",
                            "8- and 16-bit inputs are")
    one = np.ones(1, dtype=np.int64)
    scaled = lambda x: arith.scale(x, one * (opa & 0xFFFFFFFF), one * ((opa >> 32) & 0x3F), rounding)  # noqa: E731
    shifted = lambda x: np.asarray(x, dtype=np.int64) << ADVANCED_HEADROOM[size]  # noqa: E731
    if mode == 1:
        return scaled(a), shifted(b)
    if mode == 2:
        return shifted(a), scaled(b)
    raise NpuModelError(f"{op.title}: operand scale mode 3 is not defined", "the command stream is corrupt")


def _s32(v: int) -> int:
    return v - (1 << 32) if v & 0x80000000 else v


def _product(a, b):
    a, b = np.broadcast_arrays(np.asarray(a), np.asarray(b))
    if arith._big(a, b):
        return np.asarray(a, dtype=object) * np.asarray(b, dtype=object)
    return a.astype(np.int64) * b.astype(np.int64)
