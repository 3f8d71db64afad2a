"""Ethos-U85 weight and scale streams: decoded and put back in OHWI order.

The U85's standard weight stream (weight format SWD) is compressed with the same bitstream as the U55's and is
decoded with Vela's codec (:func:`edgedeploy.npu.weight_streams.decoded`). What differs is the order the weights are
laid out in, which :func:`order` follows as Vela 5.2's U85 weight encoder lays them out: over OFM blocks, IFM
blocks (in alternating directions from one OFM block to the next), sub-kernels of at most 8x8 (fewer with
dilation), IFM and OFM micro-blocks, kernel strides (part-kernel-first and depthwise only), kernel positions
(rows in alternating directions), then groups of 4 output channels by 8 input channels (16 with 2:4 sparse
weights; 1 for depthwise), with zero padding where a sub-kernel's positions round up (to 5, or 10 for 16-bit or
sparse weights and depthwise). An NPU of several cores has one weight stream per core; core ``s`` holds the
groups of 4 output channels ``s, s + cores, ...`` of each micro-block. The fast weight format (FWD, decoded by
:mod:`edgedeploy.npu.u85_fwd`) holds the same order in one stream, the cores' orders taken in turn
(:func:`fwd_order`).

The scale stream holds one 10-byte record per output channel, padded to whole micro-blocks: with 32-bit
accumulators a 32-bit bias, a 31-bit multiplier and a 6-bit shift; with 48-bit accumulators a 48-bit bias, a
15-bit multiplier and the shift.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..errors import NpuModelError
from .commands import Operation
from .u85_fwd import decode as fwd_decode
from .weight_streams import decoded, kernel

SCALE_RECORD = 10
GROUP_OFM = 4  # output channels interleaved in a group
# OFM micro-blocks (height, width, depth) and cores by MACs per cycle (Vela 5.2's U85 accelerator configurations)
UBLOCKS = {128: ((1, 2, 8), (1, 1, 16)), 256: ((1, 2, 16), (1, 4, 8), (2, 2, 8)), 512: ((2, 2, 16), (1, 4, 16)),
           1024: ((2, 2, 32), (1, 4, 32), (2, 4, 16)), 2048: ((2, 2, 64), (1, 4, 64), (4, 4, 16))}
CORES = {128: 1, 256: 1, 512: 2, 1024: 4, 2048: 4}
MICROBLOCK = {0: (1, 1), 1: (1, 2), 2: (1, 4), 3: (2, 2), 4: (2, 4), 5: (4, 4)}  # ACC_FORMAT bits 8-10: (h, w)
STREAMS = ("WEIGHT", "WEIGHT1", "WEIGHT2", "WEIGHT3")


@dataclass(frozen=True)
class Layout:
    """What the weight order depends on."""

    shape: tuple[int, int, int, int]  # OHWI as the stream holds it (depthwise: channels, h, w, 1)
    stride: tuple[int, int]  # (y, x); (1, 1) for depth-first
    dilation: tuple[int, int]
    ofm_block: int
    ifm_block: int
    ublock: int  # OFM micro-block depth
    traversal: str  # DEPTH_FIRST, PART_KERNEL_FIRST, DEPTHWISE
    sparse: bool
    ifm_bits: int
    macs: int


def ublock_depth(op: Operation, macs: int) -> int:
    """The OFM micro-block depth: the micro-block ACC_FORMAT names, among those of the configuration."""
    if macs not in UBLOCKS:
        raise NpuModelError(f"{op.title}: an Ethos-U85 of {macs} MACs per cycle is not a known configuration",
                            "compile for ethos-u85-128, -256, -512, -1024 or -2048")
    hw = MICROBLOCK.get((op.r0.get("ACC_FORMAT", 0) >> 8) & 0x7)
    found = [d for h, w, d in UBLOCKS[macs] if (h, w) == hw]
    if not found:
        raise NpuModelError(f"{op.title}: micro-block {hw} is not one of the Ethos-U85-{macs}'s",
                            "the command stream is corrupt; compile the model again with Vela")
    return found[0]


def layout(op: Operation, macs: int, ifm_bits: int) -> Layout:
    """The weight layout of a CONV or DEPTHWISE operation, from its registers and the NPU's configuration."""
    stride_reg = op.reg("KERNEL_STRIDE")
    fmt = op.r0.get("WEIGHT_FORMAT", 0)
    sparse = bool(fmt & 0x10)
    stride = ((stride_reg >> 1 & 1 | (stride_reg >> 9 & 1) << 1) + 1, (stride_reg & 1 | (stride_reg >> 6 & 1) << 1) + 1)
    dilation = ((stride_reg >> 4 & 1) + 1, (stride_reg >> 3 & 1) + 1)
    k = kernel(op)
    kh, kw = k.height, k.width
    od = op.reg("OFM_DEPTH_M1") + 1
    ub = ublock_depth(op, macs)
    if op.kind == "DEPTHWISE":
        if sparse or fmt & 1:
            raise NpuModelError(f"{op.title}: {'2:4 sparse' if sparse else 'fast-format (FWD)'} depthwise weights "
                                "are not modelled", "Vela writes none; compile the model again with Vela")
        return Layout((od, kh, kw, 1), stride, dilation, op.reg("OFM_BLK_DEPTH_M1") + 1, 1, ub, "DEPTHWISE", False,
                      ifm_bits, macs)
    part_kernel = bool(stride_reg >> 2 & 1)
    if part_kernel:
        ifm_block = 16
    elif ifm_bits == 32 or (macs in (128, 256) and ub == 16 and not sparse):
        ifm_block = 32
    elif sparse and ifm_bits == 8:
        ifm_block = 128
    else:
        ifm_block = 64
    return Layout((od, kh, kw, op.reg("IFM_DEPTH_M1") + 1), stride if part_kernel else (1, 1), dilation,
                  op.reg("OFM_BLK_DEPTH_M1") + 1, ifm_block, ub, "PART_KERNEL_FIRST" if part_kernel else "DEPTH_FIRST",
                  sparse, ifm_bits, macs)


def _blocking(lay: Layout) -> tuple[int, int]:
    """The sub-kernel rounding (kernel positions) and IFM micro-block depth of a layout."""
    wide = lay.ifm_bits == 16
    if lay.traversal == "PART_KERNEL_FIRST":
        return (10 if wide or lay.sparse else 5), (8 if wide and not lay.sparse else lay.ifm_block)
    if lay.traversal == "DEPTHWISE":
        return 10, 1
    return 1, lay.ifm_block


@lru_cache(maxsize=256)
def order(lay: Layout, stream: int, streams: int) -> np.ndarray:
    """For each weight of stream ``stream`` (of ``streams``), the flat OHWI index it holds (-1: a zero)."""
    od, kh, kw, idp = lay.shape
    depthwise = lay.traversal == "DEPTHWISE"
    wide = lay.ifm_bits == 16
    rounding, ifm_ublock = _blocking(lay)
    sy, sx = lay.stride
    decomp_y, decomp_x = 8 // lay.dilation[0], 8 // lay.dilation[1]
    dw_pad = 0 if (not wide and lay.macs <= 256) else (2 if lay.macs <= 512 else 6)
    step = 1 if depthwise else (16 if lay.sparse else 8)
    out: list[int] = []
    zero = -1
    inc = -lay.ifm_block
    ifm_z0 = 0
    for ofm_block_z in range(0, od, lay.ofm_block):
        inc = -inc
        clipped_ofm = min(lay.ofm_block, od - ofm_block_z)
        ifm_block_z = ifm_z0
        while ifm_block_z < (1 if depthwise else idp) and ifm_block_z >= 0:
            ifm_z0 = ifm_block_z
            clipped_ifm = min(lay.ifm_block, idp - ifm_block_z)
            for sub_x in range(0, kw, decomp_x):
                sub_w = min(kw - sub_x, decomp_x)
                for sub_y in range(0, kh, decomp_y):
                    sub_h = min(kh - sub_y, decomp_y)
                    for ifm_outer in range(0, 1 if depthwise else clipped_ifm, ifm_ublock):
                        for ofm_outer in range(0, clipped_ofm, lay.ublock):
                            elements = -(-sub_w * sub_h // rounding) * rounding
                            for stride_y in range(sy):
                                rows = (sub_h + sy - 1 - stride_y) // sy
                                for stride_x in range(sx):
                                    cols = (sub_w + sx - 1 - stride_x) // sx
                                    for ky in range(rows):
                                        for kx in range(cols):
                                            x = kx if ky % 2 == 0 else cols - 1 - kx
                                            elements -= 1
                                            wy, wx = sub_y + stride_y + ky * sy, sub_x + stride_x + x * sx
                                            for ifm_inner in range(0, ifm_ublock, step):
                                                for ofm_z in range(stream * GROUP_OFM, lay.ublock,
                                                                   GROUP_OFM * streams):
                                                    for ofm_inner in range(GROUP_OFM):
                                                        o = ofm_block_z + ofm_outer + ofm_inner + ofm_z
                                                        for ifm_z in range(step):
                                                            i = ifm_block_z + ifm_outer + ifm_inner + ifm_z
                                                            out.append(((o * kh + wy) * kw + wx) * idp + i
                                                                       if i < idp and o < od else zero)
                                            if depthwise and elements % rounding == 0:
                                                out.extend([zero] * (dw_pad * lay.ublock // streams))
                            if elements > 0:
                                pad = (elements + (dw_pad if depthwise else 0)) * ifm_ublock * lay.ublock // streams
                                out.extend([zero] * pad)
            ifm_block_z += inc
    return np.asarray(out, dtype=np.int64)


@lru_cache(maxsize=256)
def fwd_order(lay: Layout, cores: int) -> np.ndarray:
    """The order of the one fast-format (FWD) stream of an NPU of ``cores`` cores: the cores' own orders
    (:func:`order`) interleaved, a block of ``ublock * ifm micro-block * rounding / cores`` weights of each core
    in turn (Vela 5.2's FWD weight source; one core: its order as it is). ValueError where the cores' orders do
    not split into whole blocks (no layout Vela 5.2 writes)."""
    if cores == 1:
        return order(lay, 0, 1)
    rounding, ifm_ublock = _blocking(lay)
    block = lay.ublock * ifm_ublock * rounding // cores
    parts = [order(lay, s, cores) for s in range(cores)]
    if len({p.size for p in parts}) != 1 or parts[0].size % block:
        raise ValueError(f"its {cores} cores' weight orders of {[p.size for p in parts]} weights do not interleave "
                         f"in blocks of {block}")
    return np.stack([p.reshape(-1, block) for p in parts], axis=1).reshape(-1)


def _stream(op: Operation, region: np.ndarray, s: int) -> bytes:
    name = STREAMS[s]
    base, length = op.reg32(f"{name}_BASE") & ((1 << 40) - 1), op.reg32(f"{name}_LENGTH")
    if base + length > region.size:
        raise NpuModelError(f"{op.title}: weight stream {s} ({length} B at {base}) runs past its region "
                            f"({region.size} B)", "the command stream is corrupt; compile the model again")
    return bytes(region[base : base + length])


def weights(op: Operation, region: np.ndarray, macs: int, ifm_bits: int) -> np.ndarray:
    """The operation's weights, OHWI (depthwise: channels, h, w, 1), from its weight streams: one stream per core
    in the standard format, one stream in all in the fast format (FWD)."""
    lay = layout(op, macs, ifm_bits)
    fast = bool(op.r0.get("WEIGHT_FORMAT", 0) & 1)
    cores = CORES[macs]
    streams = 1 if fast else cores
    flat = np.zeros(int(np.prod(lay.shape)), dtype=np.int64)
    if fast:
        for s in range(1, cores):
            extra = op.r1.get(f"{STREAMS[s]}_LENGTH", 0)
            if extra:
                raise NpuModelError(f"{op.title}: fast-format (FWD) weights with a second stream "
                                    f"({STREAMS[s]}_LENGTH {extra} B) are not modelled",
                                    "Vela writes one FWD stream; compile the model again with Vela")
    for s in range(streams):
        data = _stream(op, region, s)
        if fast:
            try:
                where = fwd_order(lay, cores)
            except ValueError as exc:
                raise NpuModelError(f"{op.title}: fast-format (FWD) weights are not modelled: {exc}",
                                    "the command stream is not one Vela 5.2 writes; compile the model again") from exc
            values = fwd_decode(data, where.size, f"{op.title}: weight stream {s}")
        else:
            values = np.asarray(decoded(data), dtype=np.int64)
            where = order(lay, s, streams)
        if values.size != where.size:
            raise NpuModelError(f"{op.title}: weight stream {s} decodes to {values.size} weights; its layout "
                                f"holds {where.size}", "the weights are corrupt; compile the model again with Vela")
        keep = where >= 0
        if np.any(values[~keep]):
            raise NpuModelError(f"{op.title}: weight stream {s} holds non-zero padding weights",
                                "the weights are corrupt; compile the model again with Vela")
        flat[where[keep]] = values[keep]
    return flat.reshape(lay.shape)


def scales(op: Operation, region: np.ndarray, depth: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Bias, multiplier and shift per output channel from the scale stream."""
    base, length = op.reg32("SCALE_BASE") & ((1 << 40) - 1), op.reg32("SCALE_LENGTH")
    if length < depth * SCALE_RECORD or base + depth * SCALE_RECORD > region.size:
        raise NpuModelError(f"{op.title}: the scale stream ({length} B at {base}) is too short for {depth} "
                            "output channels", "the command stream is corrupt; compile the model again with Vela")
    rec = np.asarray(region[base : base + depth * SCALE_RECORD], dtype=np.int64).reshape(depth, SCALE_RECORD)
    wide = (op.r0.get("ACC_FORMAT", 0) & 0x3) == 1  # 48-bit accumulators
    bias_bytes = 6 if wide else 4
    bias = sum(rec[:, j] << (8 * j) for j in range(bias_bytes))
    bias = np.where(bias >= 1 << (8 * bias_bytes - 1), bias - (1 << (8 * bias_bytes)), bias)
    mult = np.asarray(sum(rec[:, bias_bytes + j] << (8 * j) for j in range(8 - bias_bytes)))
    mult &= (1 << (63 - 8 * bias_bytes)) - 1
    shift = rec[:, 8] & 0x3F
    return bias, mult, shift
