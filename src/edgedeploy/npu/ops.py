"""The block operations: convolution, depthwise convolution, pooling and elementwise, on a batch of inputs.

Each reads its input feature maps from the batched memory, computes int64 accumulators, and hands them to the
output stage (:func:`output_stage`): scaling (per channel from the scale stream, or one global OFM_SCALE),
the output zero point, the activation clamp, the clip range, a lookup table, and the output precision.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from ..errors import NpuModelError
from . import arith, lut, sigmoid16
from .commands import Operation, regs
from .featuremap import FeatureMap, feature_map, read, write
from .weight_streams import Kernel, kernel, scales, weights

Memory = Callable[[int], np.ndarray]  # region -> (batch, bytes)
ROUNDING = {0: "TFL", 1: "TRUNCATE", 2: "NATURAL"}
CLIP_RANGES = {0: None, 2: (0, 255), 3: (-128, 127), 5: (-32768, 32767)}
DUAL_CORE_MACS = 512  # Ethos-U65-512: two cores of 256 MACs


def ofm_shape(op: Operation) -> tuple[int, int, int]:
    return op.reg("OFM_HEIGHT_M1") + 1, op.reg("OFM_WIDTH_M1") + 1, op.reg("OFM_DEPTH_M1") + 1


def _padding(op: Operation) -> tuple[int, int, int, int]:
    return op.reg("IFM_PAD_TOP"), op.reg("IFM_PAD_BOTTOM"), op.reg("IFM_PAD_LEFT"), op.reg("IFM_PAD_RIGHT")


def _check_plain(op: Operation, upscale: bool = False) -> None:
    if op.r0.get("IFM_UPSCALE", 0) not in ((0, 1, 2) if upscale else (0,)):
        raise NpuModelError(f"{op.title}: IFM up-scaling (IFM_UPSCALE {op.r0['IFM_UPSCALE']}) is not modelled",
                            "nearest (1) and transpose (2) up-scaling of convolution and pooling inputs are")
    if op.r0.get("ACC_FORMAT", 0) not in (0, 1):
        raise NpuModelError(f"{op.title}: accumulator format {op.r0['ACC_FORMAT']} is not modelled",
                            "32- and 40-bit integer accumulators are")


def _windows(op: Operation, mem: Memory, ifm: FeatureMap, k: Kernel, depth: int, fill: float):
    """The padded input (batch, h, w, c) as float64 with ``fill`` in the padding, and the output shape."""
    oh, ow, _ = ofm_shape(op)
    top, bottom, left, right = _padding(op)
    kh = (k.height - 1) * k.dilation_y + 1
    kw = (k.width - 1) * k.dilation_x + 1
    ih = (oh - 1) * k.stride_y + kh - top - bottom
    iw = (ow - 1) * k.stride_x + kw - left - right
    if ih <= 0 or iw <= 0:
        raise NpuModelError(f"{op.title}: the padding leaves no input ({ih}x{iw})", "the command stream is corrupt")
    x = _upscaled(op, mem, ifm, ih, iw, depth)
    padded = np.full((x.shape[0], ih + top + bottom, iw + left + right, depth), fill)
    padded[:, top : top + ih, left : left + iw, :] = x
    return padded, (oh, ow)


def _upscaled(op: Operation, mem: Memory, ifm: FeatureMap, ih: int, iw: int, depth: int) -> np.ndarray:
    """The input the kernel sees (zero point taken off): the IFM itself, or twice its height and width by
    repeating each element (nearest) or by putting zeros between elements (transpose)."""
    mode = op.r0.get("IFM_UPSCALE", 0)
    if mode == 0:
        return read(mem(ifm.region), ifm, (ih, iw, depth), op.title).astype(np.float64) - ifm.zero_point
    x = read(mem(ifm.region), ifm, ((ih + 1) // 2, (iw + 1) // 2, depth), op.title).astype(np.float64)
    x -= ifm.zero_point
    if mode == 1:
        up = x.repeat(2, axis=1).repeat(2, axis=2)
    else:
        up = np.zeros((x.shape[0], 2 * x.shape[1], 2 * x.shape[2], depth))
        up[:, ::2, ::2] = x
    return up[:, :ih, :iw]


def convolve(op: Operation, mem: Memory, ifm: FeatureMap, k: Kernel, in_depth: int, w: np.ndarray, depthwise: bool,
             shape: tuple[int, int, int]) -> np.ndarray:
    """The exact integer accumulators (batch, OH, OW, OD) of a convolution or depthwise convolution of ``ifm`` with
    the weights ``w`` (OD, KH, KW, ID or 1), before the bias: the same on every Ethos-U."""
    oh, ow, od = shape
    padded, _ = _windows(op, mem, ifm, k, in_depth, 0.0)
    acc = np.zeros((padded.shape[0], oh, ow, od))
    for ky in range(k.height):
        for kx in range(k.width):
            tap = _tap(padded, k, ky, kx, oh, ow)
            acc += tap * w[:, ky, kx, 0] if depthwise else tap @ w[:, ky, kx, :].T
    return np.rint(acc).astype(np.int64)


def _tap(padded: np.ndarray, k: Kernel, ky: int, kx: int, oh: int, ow: int) -> np.ndarray:
    y0, x0 = ky * k.dilation_y, kx * k.dilation_x
    return padded[:, y0 : y0 + (oh - 1) * k.stride_y + 1 : k.stride_y, x0 : x0 + (ow - 1) * k.stride_x + 1 : k.stride_x]


def convolution(op: Operation, mem: Memory, macs: int, depthwise: bool) -> None:
    _check_plain(op, upscale=True)
    ifm, ofm = feature_map(op, "IFM"), feature_map(op, "OFM")
    k = kernel(op)
    oh, ow, od = ofm_shape(op)
    in_depth = od if depthwise else op.reg("IFM_DEPTH_M1") + 1
    cores = min(2 if macs == DUAL_CORE_MACS else 1, od)
    w = np.zeros((od, k.height, k.width, 1 if depthwise else in_depth))
    bias, mult, shift = (np.zeros(od, np.int64) for _ in range(3))
    for core in range(cores):  # a two-core NPU computes every other output channel on each core
        part = (len(range(core, od, cores)), k.height, k.width, 1 if depthwise else in_depth)
        w[core::cores] = weights(op, mem(op.reg("WEIGHT_REGION"))[0], macs, part, depthwise, 8 * ifm.size, k,
                                 core, cores)
        bias[core::cores], mult[core::cores], shift[core::cores] = scales(op, mem(op.reg("SCALE_REGION"))[0],
                                                                          part[0], core)
    acc = convolve(op, mem, ifm, k, in_depth, w, depthwise, (oh, ow, od)) + bias
    output_stage(op, mem, ofm, acc, mult, shift)


def pooling(op: Operation, mem: Memory) -> None:
    _check_plain(op, upscale=True)
    mode = op.sub_op
    ifm, ofm = feature_map(op, "IFM"), feature_map(op, "OFM")
    k = kernel(op)
    oh, ow, od = ofm_shape(op)
    if mode not in ("MAX", "AVERAGE", "REDUCE_SUM"):
        raise NpuModelError(f"{op.title}: pooling mode {mode} is not modelled", "MAX, AVERAGE and REDUCE_SUM are")
    acc, count = pool_windows(op, mem, ifm, k, (oh, ow, od))
    if mode == "AVERAGE" and not (_global_scale(op) and not any(_padding(op))):  # else OFM_SCALE divides by the
        # kernel's size; here the NPU divides by the number of elements inside the input
        assert count is not None
        acc = _divide(acc, count, ROUNDING[(op.reg("OFM_PRECISION") >> 14) & 0x3])
    one = np.ones(1, dtype=np.int64)
    if _global_scale(op):
        mult, shift = _ofm_scale(op)
        output_stage(op, mem, ofm, acc, one * mult, one * shift)
    else:
        output_stage(op, mem, ofm, acc, one, one * 0)


def pool_windows(op: Operation, mem: Memory, ifm: FeatureMap, k: Kernel,
                 shape: tuple[int, int, int]) -> tuple[np.ndarray, np.ndarray | None]:
    """The integer reduction of each pooling window of ``ifm`` (batch, OH, OW, OD) by ``op``'s mode, the same on
    every Ethos-U: REDUCE_SUM (over channels, a 1x1 kernel), MAX, or SUM and AVERAGE as the windows' sums, with,
    for AVERAGE, the number of elements of each window inside the input (the divisor; None for the others)."""
    mode, (oh, ow, od) = op.sub_op, shape
    if mode == "REDUCE_SUM":
        if k.height != 1 or k.width != 1:
            raise NpuModelError(f"{op.title}: REDUCE_SUM over a {k.height}x{k.width} kernel is not modelled",
                                "a 1x1 kernel (a sum over channels) is")
        padded, _ = _windows(op, mem, ifm, k, op.reg("IFM_DEPTH_M1") + 1, 0.0)
        return np.rint(_tap(padded, k, 0, 0, oh, ow).sum(axis=3, keepdims=True)).astype(np.int64), None
    padded, _ = _windows(op, mem, ifm, k, od, np.nan)
    taps = np.stack([_tap(padded, k, ky, kx, oh, ow) for ky in range(k.height) for kx in range(k.width)])
    if mode == "MAX":
        return np.rint(np.nanmax(taps, axis=0)).astype(np.int64), None
    total = np.rint(np.nansum(taps, axis=0)).astype(np.int64)
    return total, (np.sum(~np.isnan(taps), axis=0).astype(np.int64) if mode == "AVERAGE" else None)


def _divide(total: np.ndarray, count: np.ndarray, rounding: str | None) -> np.ndarray:
    """``total / count`` rounded towards zero (TRUNCATE), else half away from zero (as TFLite's AVERAGE_POOL_2D:
    Vela asks for NATURAL rounding here, and only half away from zero reproduces TFLite)."""
    if rounding == "TRUNCATE":
        return np.where(total >= 0, total // count, -((-total) // count))
    return np.where(total >= 0, (total + count // 2) // count, -((-total + count // 2) // count))


def _global_scale(op: Operation) -> bool:
    return bool((op.reg("OFM_PRECISION") >> 8) & 1)


def _ofm_scale(op: Operation) -> tuple[int, int]:
    v = op.reg32("OFM_SCALE")
    return v & 0xFFFFFFFF, (v >> 32) & 0x3F


def output_stage(op: Operation, mem: Memory, ofm: FeatureMap, acc: np.ndarray, mult, shift) -> None:
    """Scale, add the zero point, clamp, look up, saturate and store the accumulators of ``op``."""
    rounding = ROUNDING.get((op.reg("OFM_PRECISION") >> 14) & 0x3)
    if rounding is None:
        raise NpuModelError(f"{op.title}: OFM rounding mode 3 is not defined", "the command stream is corrupt")
    value = arith.scale(acc, mult, shift, rounding)
    act = op.reg("ACTIVATION")
    kind, clip = act & 0xFFF, (act >> 12) & 0xF
    if clip not in CLIP_RANGES:
        raise NpuModelError(f"{op.title}: activation clip range {clip} is not modelled", "compile again with Vela 5.2")
    if kind in sigmoid16.FUNCTIONS and ofm.size == 2:  # on the scaled value, before the zero point
        value, kind = sigmoid16.FUNCTIONS[kind](value), 0
    value = value + ofm.zero_point
    table = lut.is_table(kind)
    if ofm.size < 4 or table:
        value = np.clip(value, op.signed("ACTIVATION_MIN"), op.signed("ACTIVATION_MAX"))
    if (clip_range := CLIP_RANGES[clip]) is not None:
        value = np.clip(value, *clip_range)
    if table:
        value = lut.lookup(mem(-1)[0], kind - lut.LUT_START, value, ofm.size, ofm.signed, op.title)
    elif kind != 0:
        name = regs().activation(kind).name if kind in (3, 4) else str(kind)
        raise NpuModelError(f"{op.title}: activation {name} is not modelled on a {8 * ofm.size}-bit output",
                            "lookup tables, clamps, and TANH and SIGMOID on 16-bit outputs are (Vela 5.2 turns int8 "
                            "TANH and LOGISTIC into lookup tables)")
    write(mem(ofm.region), ofm, arith.saturate(value, ofm.size, ofm.signed), op.title)

