"""Ethos-U85 operations on a batch of inputs: DMA, convolution, depthwise convolution, pooling, nearest resize,
elementwise.

Feature maps, padding, strides, dilation and TFLite's two-step rounding are the U55's (:mod:`featuremap`,
:mod:`ops`, :mod:`arith`); the weight and scale streams are the U85's (:mod:`u85_weights`), elementwise operations,
chaining and lookup tables are in :mod:`u85_elementwise`. The output stage reads the rounding mode from OFM_SCALE's
parameter (DOUBLE_SYMMETRIC is TFLite's two-step rounding, as the U55's TFL), per-channel or global scaling from
OFM_PRECISION bit 8 and the activation function from ACTIVATION bits 0-4.

What is not executed stops, before the stream runs, with the first operation that needs it (:func:`check`):
BILINEAR and REPLICATE resize, convolutions or pooling reading a chained IFM, accumulators kept across operations or
read from IFM2, weights taken from IFM2 (MATMUL), activation functions other than LUT_U8_U8, LUT_S8_S8, LUT_S8_S16,
LUT_S8_S32, LUT_S16_S16 (table 0), TANH and SIGMOID (16-bit outputs) -- LUT_S16_S32 among them --, IFM up-scaling,
the OFM orders :mod:`u85_ofm_order` refuses (transposed and reversed OFMs are stored as it says), convolution and
pooling rounding other than DOUBLE_SYMMETRIC, NATURAL and TRUNCATE_TO_ZERO or with a double-rounding point, 2D/3D
DMA and DMA out of the NPU's internal memory.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from ..errors import NpuModelError
from . import arith, u85_ofm_order
from .commands import Operation
from .featuremap import OFM_SIZES, FeatureMap, feature_map, read, write
from .ops import _divide, convolve, ofm_shape, pool_windows  # what every Ethos-U shares
from .u85_commands import OFM_ROUNDING
from .u85_elementwise import SHRAM, TANH_SIGMOID, elementwise, lookup, modelled_table, scale, tanh_sigmoid
from .u85_weights import scales, weights
from .weight_streams import kernel

Memory = Callable[[int], np.ndarray]
ROUNDING = {0: "TFL", 1: "NATURAL", 4: "TRUNCATE"}  # OFM_SCALE rounding mode -> arith's name
EXECUTED = ("DMA", "CONV", "DEPTHWISE", "POOL", "ELEMENTWISE", "RESIZE")
RESIZE_MODES = {2: "NEAREST"}  # BILINEAR (0) and REPLICATE (1) are not modelled
ELEMENTWISE = ("ADD", "SUB", "MUL", "MIN", "MAX", "SHL", "SHR", "ABS", "CLZ", "LRELU")
POOLS = ("MAX", "SUM", "AVERAGE", "REDUCE_SUM")


def why_not(op: Operation) -> str | None:
    """Why ``op`` cannot be executed (None: it can)."""
    if op.kind not in EXECUTED:
        return f"Ethos-U85 {op.kind} operations are not executed by the NPU model"
    if op.kind == "DMA":
        src, dst = op.r0.get("DMA0_SRC_REGION", 0), op.r0.get("DMA0_DST_REGION", 0)
        if src & 0x100:
            return "DMA out of the NPU's internal memory is not modelled"
        if (src | dst) & 0x600:
            return "a 2D/3D DMA is not modelled"
        return None
    if op.kind == "RESIZE" and op.param & 0x3 not in RESIZE_MODES:
        return "BILINEAR and REPLICATE resize are not modelled (NEAREST is)"
    if op.kind == "POOL" and op.sub_op not in POOLS:
        return f"pooling mode {op.sub_op} is not modelled"
    if op.kind == "ELEMENTWISE" and op.sub_op not in ELEMENTWISE:
        return f"elementwise {op.sub_op} is not modelled"
    if op.kind in ("CONV", "DEPTHWISE") and op.param & 1:
        return "weights read from IFM2 are not modelled"
    if op.kind != "ELEMENTWISE" and (op.r0.get("IFM_PRECISION", 0) >> 14) & 0x3 == 2:
        return "a chained IFM of a convolution or pooling is not modelled"
    if (order := u85_ofm_order.why_not(op)) is not None:
        return order
    acc = op.r0.get("ACC_FORMAT", 0)
    if (acc >> 4) & 0x7:
        return "an accumulator kept across operations, read from IFM2 or not written out is not modelled"
    if op.r0.get("IFM_UPSCALE", 0):
        return "IFM up-scaling is not modelled"
    activation = op.r0.get("ACTIVATION", 0)
    function, table = activation & 0x1F, (activation >> 5) & 0x7
    if function and function not in TANH_SIGMOID and not modelled_table(function, table):
        return (f"activation function {function} (table {table}) is not modelled (LUT_U8_U8, LUT_S8_S8, LUT_S8_S16, "
                "LUT_S8_S32, LUT_S16_S16 in table 0, TANH and SIGMOID are)")
    param = op.r1.get("OFM_SCALE", 0) >> 32
    if op.kind not in ("ELEMENTWISE", "RESIZE") and (param >> 6) & 0x1F:
        return "an OFM double-rounding point is not modelled"
    if op.kind not in ("ELEMENTWISE", "RESIZE") and (param >> 13) & 0x7 not in ROUNDING:
        return f"OFM rounding {OFM_ROUNDING.get((param >> 13) & 0x7, (param >> 13) & 0x7)} is not modelled"
    return None


def chained_output(op: Operation) -> bool:
    """Whether the (U85) operation hands its OFM to the next one in the chaining buffer instead of memory."""
    return op.registers is not None and (op.r0.get("OFM_PRECISION", 0) >> 14) & 0x3 == 2


def check(ops: list[Operation], npu: str, where: str) -> None:
    """Stop at the first operation the model cannot execute, naming it."""
    for op in ops:
        reason = why_not(op)
        if reason is not None:
            raise NpuModelError(f"{where}: {op.title} on {npu}: {reason}",
                                "see docs/reference/npu-coverage.md for what the Ethos-U85 model executes")


def execute(op: Operation, mem: Memory, macs: int, chain: dict) -> None:
    """Run ``op``; ``chain`` holds the chaining buffers (by number) between operations."""
    reason = why_not(op)
    if reason is not None:
        raise NpuModelError(f"{op.title}: {reason}", "see docs/reference/npu-coverage.md")
    if op.kind == "DMA":
        _dma(op, mem)
    elif op.kind == "POOL":
        _pooling(op, mem, chain)
    elif op.kind == "ELEMENTWISE":
        elementwise(op, mem, chain)
    elif op.kind == "RESIZE":
        _resize(op, mem, chain)
    else:
        _convolution(op, mem, macs, chain)


def _dma(op: Operation, mem: Memory) -> None:
    dst_reg = op.reg("DMA0_DST_REGION")
    src, dst = mem(op.reg("DMA0_SRC_REGION") & 0x7), mem(SHRAM if dst_reg & 0x100 else dst_reg & 0x7)
    s, d = op.reg32("DMA0_SRC") & ((1 << 40) - 1), op.reg32("DMA0_DST") & ((1 << 40) - 1)
    n = op.reg32("DMA0_LEN") & ((1 << 40) - 1)
    if s + n > src.shape[1] or d + n > dst.shape[1]:
        raise NpuModelError(f"{op.title}: DMA of {n} B from {s} to {d} runs past a region "
                            f"({src.shape[1]} B and {dst.shape[1]} B)",
                            "the command stream is corrupt or the arena too small; compile the model again with Vela")
    dst[:, d : d + n] = src[:, s : s + n]


def _convolution(op: Operation, mem: Memory, macs: int, chain: dict) -> None:
    depthwise = op.kind == "DEPTHWISE"
    ifm, ofm = feature_map(op, "IFM"), _ofm(op)
    k = kernel(op)
    oh, ow, od = ofm_shape(op)
    in_depth = od if depthwise else op.reg("IFM_DEPTH_M1") + 1
    w = weights(op, mem(op.reg("WEIGHT_REGION") & 0x7)[0], macs, 8 * ifm.size).astype(np.float64)
    if w.shape[1:3] != (k.height, k.width):
        raise NpuModelError(f"{op.title}: the weights hold a {w.shape[1]}x{w.shape[2]} kernel; the registers a "
                            f"{k.height}x{k.width} one", "the command stream is corrupt; compile again with Vela")
    bias, mult, shift = scales(op, mem(op.reg("SCALE_REGION") & 0x7)[0], od)
    acc = convolve(op, mem, ifm, k, in_depth, w, depthwise, (oh, ow, od)) + bias
    if _global(op):
        mult, shift = _ofm_scale(op)
    _output(op, mem, ofm, acc, mult, shift, chain)


def _pooling(op: Operation, mem: Memory, chain: dict) -> None:
    ifm, ofm = feature_map(op, "IFM"), _ofm(op)
    k = kernel(op)
    oh, ow, od = ofm_shape(op)
    acc, count = pool_windows(op, mem, ifm, k, (oh, ow, od))  # the modes check() admits (POOLS)
    if count is not None:  # AVERAGE: divided by the number of elements inside the input, half away from zero
        acc = _divide(acc, count, None)
    if not _global(op):
        raise NpuModelError(f"{op.title}: per-channel scaling of a pooling operation is not modelled",
                            "global OFM_SCALE is")
    mult, shift = _ofm_scale(op)
    _output(op, mem, ofm, acc, mult, shift, chain)


def _source_index(op: Operation, axis: str, size: int) -> np.ndarray:
    """For each output row or column, the input one NEAREST takes: ``(i * d + offset)  / n`` rounded to the nearest
    (half upwards), with the ratio ``d / n`` from RESIZE_<axis>_SCALE_N_M1 and RESIZE_<axis> (its whole and remainder
    steps)."""
    n = op.reg(f"RESIZE_{axis}_SCALE_N_M1") + 1
    step = op.reg32(f"RESIZE_{axis}")
    d = ((step >> 32) & 0xF) * n + (step & 0x7FF)
    offset = op.reg(f"RESIZE_{axis}_OFFSET") & 0xFFF  # 12 bits, signed
    offset -= 0x1000 if offset & 0x800 else 0
    return (np.arange(size) * d + offset + n // 2) // n


def _resize(op: Operation, mem: Memory, chain: dict) -> None:
    ifm, ofm = feature_map(op, "IFM"), _ofm(op)
    oh, ow, od = ofm_shape(op)
    ih, iw = op.reg("IFM_HEIGHT0_M1") + 1, op.reg("IFM_WIDTH0_M1") + 1
    ys = np.clip(_source_index(op, "Y", oh), 0, ih - 1)
    xs = np.clip(_source_index(op, "X", ow), 0, iw - 1)
    x = read(mem(ifm.region & 0x7), ifm, (ih, iw, od), op.title) - ifm.zero_point
    acc = x[:, ys][:, :, xs] << 16  # the U85 weights the taken element by 2**16; OFM_SCALE shifts it back
    v = op.reg32("OFM_SCALE")
    param = v >> 32
    value = np.asarray(scale(acc, v & 0x7FFFFFFF, param & 0x3F, (param >> 13) & 0x7, (param >> 6) & 0x1F), np.int64)
    _output(op, mem, ofm, value, np.ones(1, np.int64), np.zeros(1, np.int64), chain)


def _ofm(op: Operation) -> FeatureMap:
    """The OFM; a chained one has no address registers (Vela sets none), only its type and zero point."""
    if not chained_output(op):
        return feature_map(op, "OFM")
    prec = op.reg("OFM_PRECISION")
    size = OFM_SIZES.get((prec >> 1) & 0x3)
    if size is None:
        raise NpuModelError(f"{op.title}: OFM_PRECISION {prec:#x} is not modelled", "int8/int16/int32 are")
    return FeatureMap("OFM", op.reg("OFM_REGION"), (0, 0, 0, 0), 1, 1, 1, (0, 0, 0), size, bool(prec & 1), False,
                      op.signed("OFM_ZERO_POINT"))


def _global(op: Operation) -> bool:
    return bool((op.reg("OFM_PRECISION") >> 8) & 1)


def _ofm_scale(op: Operation) -> tuple[np.ndarray, np.ndarray]:
    v = op.reg32("OFM_SCALE")
    return np.array([v & 0x7FFFFFFF], np.int64), np.array([(v >> 32) & 0x3F], np.int64)


def _output(op: Operation, mem: Memory, ofm: FeatureMap, acc: np.ndarray, mult, shift, chain: dict) -> None:
    """Scale with OFM_SCALE's rounding mode, add the zero point, clamp, saturate and store."""
    rounding = ROUNDING.get((op.reg32("OFM_SCALE") >> 45) & 0x7, "TFL")  # RESIZE: scaled already, shift 0
    value, function = tanh_sigmoid(op, arith.scale(acc, mult, shift, rounding), 8 * ofm.size)
    value = value + ofm.zero_point
    if ofm.size < 4 or function:
        value = np.clip(value, op.signed("ACTIVATION_MIN"), op.signed("ACTIVATION_MAX"))
    if function:
        value = lookup(op, mem, value)
    value = arith.saturate(value, ofm.size, ofm.signed)
    if (op.reg("OFM_PRECISION") >> 14) & 0x3 == 2:  # CHAINED: handed to the next operation, not to memory
        chain[op.reg("OFM_REGION") & 0x7] = value
        return
    write(mem(ofm.region & 0x7), ofm, u85_ofm_order.arrange(op, value), op.title)

