"""Weight and scale streams of a convolution: decoded with Vela's codec and put back in OHWI order.

The weight stream is Vela's compressed format (``ethosu.mlw_codec``): ``decode`` returns the weights in the
order the NPU consumes them (micro-blocks of output and input channels, sub-kernels, part-kernel or depth
first). Which (o, y, x, i) each position holds is found by encoding index volumes with the same codec and
parameters (``mlw_codec.reorder_encode``) and decoding them again: the order is the codec's own, never a copy.

The scale stream holds one 10-byte record per output channel: bias (40 bits, signed), multiplier (32 bits),
shift (6 bits), little-endian.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..errors import NpuModelError
from .commands import Operation

SCALE_RECORD = 10
DIGIT = 255  # index digits 1..255 keep within the codec's 9-bit weights; 0 marks padding
# Micro-block depths (ifm, ofm) by MACs per cycle (Vela's ArchitectureFeatures.accelerator_configs).
UBLOCK_DEPTHS = {32: (8, 4), 64: (8, 8), 128: (8, 8), 256: (8, 8), 512: (8, 8)}
SUB_KERNEL_MAX = 8


@dataclass(frozen=True)
class Kernel:
    height: int
    width: int
    stride_y: int
    stride_x: int
    dilation_y: int
    dilation_x: int
    part_kernel: bool


def kernel(op: Operation) -> Kernel:
    reg = op.reg("KERNEL_STRIDE")
    dil_x, dil_y = ((reg >> 3) & 1) + 1, ((reg >> 4) & 1) + 1
    stride_x = (((reg >> 6) & 0x7) << 1 | (reg & 1)) + 1
    stride_y = (((reg >> 9) & 0x7) << 1 | ((reg >> 1) & 1)) + 1
    return Kernel(op.reg("KERNEL_HEIGHT_M1") // dil_y + 1, op.reg("KERNEL_WIDTH_M1") // dil_x + 1,
                  stride_y, stride_x, dil_y, dil_x, bool(reg & 4))


def scales(op: Operation, memory: np.ndarray, depth: int, core: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Bias, multiplier and shift per output channel of ``op`` (``memory`` is the scale region, one row) that
    ``core`` computes (its own stream on a two-core NPU: SCALE1_BASE for the second)."""
    name = "SCALE1" if core else "SCALE"
    base, length = op.reg32(f"{name}_BASE"), op.reg32(f"{name}_LENGTH")
    if length < depth * SCALE_RECORD or base + depth * SCALE_RECORD > memory.shape[0]:
        raise NpuModelError(f"{op.title}: the scale stream ({length} B at {base}) is too short for {depth} channels",
                            "the command stream is corrupt; compile the model again with Vela")
    rec = memory[base : base + depth * SCALE_RECORD].reshape(depth, SCALE_RECORD).astype(np.int64)
    bias = sum(rec[:, i] << (8 * i) for i in range(5))
    bias = np.where(bias >= 1 << 39, bias - (1 << 40), bias)
    mult = np.asarray(sum(rec[:, 5 + i] << (8 * i) for i in range(4)))
    shift = rec[:, 9] & 0x3F
    return bias, mult, shift


def weights(op: Operation, memory: np.ndarray, macs: int, shape: tuple[int, int, int, int], depthwise: bool,
            ifm_bits: int, k: Kernel, core: int = 0, cores: int = 1) -> np.ndarray:
    """The weights of ``op`` that ``core`` of ``cores`` computes, as an OHWI int64 array of ``shape`` (zero points
    already taken off by Vela). On a two-core NPU each core has its own stream (WEIGHT1_BASE for the second)
    holding every other output channel."""
    name = "WEIGHT1" if core else "WEIGHT"
    base, length = op.reg32(f"{name}_BASE"), op.reg32(f"{name}_LENGTH")
    block = (op.reg("OFM_BLK_DEPTH_M1") + 1 + cores - 1 - core) // cores
    if base + length > memory.shape[0]:
        raise NpuModelError(f"{op.title}: the weight stream ({length} B at {base}) runs past its region",
                            "the command stream is corrupt; compile the model again with Vela")
    order = _order(macs // cores, shape, block, depthwise, k.part_kernel, ifm_bits,
                   SUB_KERNEL_MAX // k.dilation_y, SUB_KERNEL_MAX // k.dilation_x)
    try:  # in the decoder's process: the codec ends its process on a damaged stream
        decoded = np.asarray(_decoded(memory[base : base + length].tobytes()), dtype=np.int64)
    except Exception as exc:  # noqa: BLE001 - the codec's own error on a damaged stream
        raise NpuModelError(f"{op.title}: the weight stream does not decode ({exc})",
                            "the weights are corrupt; compile the model again with Vela") from exc
    if decoded.size != order.size:
        raise NpuModelError(f"{op.title}: the weight stream decodes to {decoded.size} weights where {order.size} "
                            f"belong to a {'x'.join(map(str, shape))} OHWI kernel",
                            "the weights or the command stream are corrupt; compile the model again with Vela")
    out = np.zeros(int(np.prod(shape)), dtype=np.int64)
    keep = order >= 0
    out[order[keep]] = decoded[keep]
    if np.any(decoded[~keep]):
        raise NpuModelError(f"{op.title}: the weight stream holds non-zero padding weights",
                            "the weights are corrupt; compile the model again with Vela")
    return out.reshape(shape)


_DECODER: list = []  # the decoder's process (edgedeploy.npu.decode_worker), started on first use


@lru_cache(maxsize=512)
def _decoded(data: bytes) -> tuple[int, ...]:
    """A weight stream decoded in the decoder's own process (the codec ends its process on a damaged stream), once."""
    import sys

    from edgedeploy.core.proc import PipeWorker

    if not _DECODER:
        _DECODER.append(PipeWorker([sys.executable, "-m", "edgedeploy.npu.decode_worker"], "Vela's weight decoder"))
    return tuple(np.frombuffer(_DECODER[0].call(data), dtype="<i4").tolist())


def decoded(data: bytes) -> tuple[int, ...]:
    """A weight stream in Vela's compressed format, decoded (the U55's and the U85's standard format alike)."""
    return _decoded(data)


@lru_cache(maxsize=256)
def _order(macs: int, shape: tuple[int, int, int, int], block_depth: int, depthwise: bool, part_kernel: bool,
           ifm_bits: int, decomp_h: int, decomp_w: int) -> np.ndarray:
    """For each position of the decoded stream, the flat OHWI index it holds (-1: padding)."""
    from ethosu import mlw_codec

    if macs not in UBLOCK_DEPTHS:
        raise NpuModelError(f"{macs} MACs per cycle is not a modelled configuration", "use an Ethos-U55/U65 target")
    ifm_ub, ofm_ub = UBLOCK_DEPTHS[macs]
    n = int(np.prod(shape))
    idx = np.arange(n, dtype=np.int64)
    digits = max(1, int(np.ceil(np.log(n + 1) / np.log(DIGIT))))
    order = np.zeros(0, dtype=np.int64)
    for d in range(digits):
        vol = ((idx // DIGIT**d) % DIGIT + 1).astype(np.int16).reshape(shape)
        enc, _ = mlw_codec.reorder_encode(ifm_ub, ofm_ub, vol, block_depth, depthwise, part_kernel, ifm_bits,
                                          decomp_h, decomp_w)
        dec = np.asarray(mlw_codec.decode(enc), dtype=np.int64)
        if d == 0:
            order = np.where(dec > 0, dec - 1, -1)
        else:
            order = np.where(dec > 0, order + (dec - 1) * DIGIT**d, -1)
    return order
