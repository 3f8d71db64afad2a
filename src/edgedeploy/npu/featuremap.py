"""Feature maps in NPU memory: NHWC and NHCWB16 layouts, up to four tiles, element precision.

A feature map is described by its registers (``IFM_``, ``IFM2_`` or ``OFM_`` prefix): region, four tile base
addresses (top-left, top-right, bottom-left, bottom-right), tile heights and width, strides and precision.
Element (y, x, c) of tile t lies at ``base[t] + y' * stride_y + x' * stride_x + channel part``, with y', x'
counted from the tile's corner; the channel part is ``c * size`` in NHWC and
``(c // 16) * stride_c + (c % 16) * size`` in NHCWB16 (bricks of 16 channels).
Memory is a batch of byte rows (one per input), so one gather reads a feature map for every input at once.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import NpuModelError
from .commands import Operation

ADDRESS_MASK = (1 << 40) - 1
IFM_SIZES = {0: 1, 1: 2, 2: 4}  # precision bits 2-3
OFM_SIZES = {0: 1, 1: 2, 2: 4}  # precision bits 1-2
NP_TYPES = {(1, True): np.int8, (1, False): np.uint8, (2, True): np.int16, (2, False): np.uint16,
            (4, True): np.int32, (4, False): np.uint32}


@dataclass(frozen=True)
class FeatureMap:
    prefix: str  # IFM, IFM2 or OFM
    region: int
    bases: tuple[int, int, int, int]
    height0: int
    height1: int
    width0: int
    strides: tuple[int, int, int]  # y, x, c (bytes)
    size: int  # bytes per element
    signed: bool
    brick: bool  # NHCWB16
    zero_point: int

    @property
    def dtype(self):
        return NP_TYPES[(self.size, self.signed)]

    def offsets(self, height: int, width: int, depth: int) -> np.ndarray:
        """Byte offset (in its region) of each element, shaped (height, width, depth)."""
        y = np.arange(height)[:, None]
        x = np.arange(width)[None, :]
        right = x >= self.width0
        lower = np.where(right, y >= self.height1, y >= self.height0)
        tile = right.astype(np.int64) + 2 * lower.astype(np.int64)
        bases = np.asarray(self.bases, dtype=np.int64)[tile]
        yy = y - np.where(lower, np.where(right, self.height1, self.height0), 0)
        xx = x - np.where(right, self.width0, 0)
        sy, sx, sc = self.strides
        pos = bases + yy * sy + xx * sx  # (h, w)
        c = np.arange(depth)
        chan = (c // 16) * sc + (c % 16) * self.size if self.brick else c * self.size
        return pos[:, :, None] + chan[None, None, :]


def feature_map(op: Operation, prefix: str) -> FeatureMap:
    """The feature map ``prefix`` of ``op`` from its registers."""
    prec = op.reg(f"{prefix}_PRECISION")
    if prefix == "OFM":
        size = OFM_SIZES.get((prec >> 1) & 0x3)
    else:
        size = IFM_SIZES.get((prec >> 2) & 0x3)
    fmt = (prec >> 6) & 0x3
    if size is None or fmt > 1:
        raise NpuModelError(f"{op.title}: {prefix}_PRECISION {prec:#x} (precision or format) is not modelled",
                            "int8/int16/int32 in NHWC or NHCWB16 are")
    base0, base1, base2, base3 = (op.reg32(f"{prefix}_BASE{i}") & ADDRESS_MASK for i in range(4))
    zp_name = f"{prefix}_ZERO_POINT"
    zero = op.signed(zp_name)
    return FeatureMap(
        prefix=prefix,
        region=op.reg(f"{prefix}_REGION"),
        bases=(base0, base1, base2, base3),
        height0=op.reg(f"{prefix}_HEIGHT0_M1") + 1,
        height1=op.reg(f"{prefix}_HEIGHT1_M1") + 1,
        width0=op.reg(f"{prefix}_WIDTH0_M1") + 1,
        strides=(op.reg32(f"{prefix}_STRIDE_Y"), op.reg32(f"{prefix}_STRIDE_X"), op.reg32(f"{prefix}_STRIDE_C")),
        size=size,
        signed=bool(prec & 1),
        brick=fmt == 1,
        zero_point=zero,
    )


def read(memory: np.ndarray, fm: FeatureMap, shape: tuple[int, int, int], what: str) -> np.ndarray:
    """The feature map's elements for every row of ``memory`` (batch, bytes): (batch, h, w, c) as int64."""
    _check(memory, fm, shape, what)
    offs = fm.offsets(*shape)
    if fm.size == 1:
        raw = memory[:, offs]
        return raw.view(fm.dtype).astype(np.int64)
    idx = offs[..., None] + np.arange(fm.size)
    raw = np.ascontiguousarray(memory[:, idx])
    return raw.view(np.dtype(fm.dtype).newbyteorder("<")).reshape(raw.shape[:-1]).astype(np.int64)


def write(memory: np.ndarray, fm: FeatureMap, values: np.ndarray, what: str) -> None:
    """Store (batch, h, w, c) ``values`` (already in range) as the feature map's elements."""
    shape = values.shape[1:]
    _check(memory, fm, shape, what)
    offs = fm.offsets(*shape)
    data = values.astype(np.dtype(fm.dtype).newbyteorder("<"))
    if fm.size == 1:
        memory[:, offs] = data.view(np.uint8)
        return
    idx = offs[..., None] + np.arange(fm.size)
    memory[:, idx] = np.ascontiguousarray(data).view(np.uint8).reshape(data.shape + (fm.size,))


def span(fm: FeatureMap, shape: tuple[int, int, int]) -> tuple[int, int] | None:
    """The first byte and the end of the bytes the elements of ``shape`` reach (None when it has none), in Python
    integers from the registers, before any offset array is made: strides up to 2**40 cannot overflow here."""
    h, w, d = (int(v) for v in shape)
    if h <= 0 or w <= 0 or d <= 0:
        return None
    sy, sx, sc = fm.strides
    last = d - 1
    chan = ((last // 16) * sc + (last % 16) * fm.size if fm.brick else last * fm.size)
    if fm.brick and d > 16:  # the last full brick's channel 15 may lie further than the last channel
        chan = max(chan, (last // 16 - 1) * sc + 15 * fm.size)
    left_w, right_w = min(w, fm.width0), w - min(w, fm.width0)
    lo, hi = None, None
    # tiles: (columns, first row, rows) for top-left, top-right, bottom-left, bottom-right
    for t, cols, rows in ((0, left_w, min(h, fm.height0)), (1, right_w, min(h, fm.height1)),
                          (2, left_w, h - min(h, fm.height0)), (3, right_w, h - min(h, fm.height1))):
        if cols <= 0 or rows <= 0:
            continue
        base = fm.bases[t]
        end = base + (rows - 1) * sy + (cols - 1) * sx + chan + fm.size
        lo, hi = (base, end) if lo is None or hi is None else (min(lo, base), max(hi, end))
    return None if lo is None or hi is None else (lo, hi)


def _check(memory: np.ndarray, fm: FeatureMap, shape: tuple[int, int, int], what: str) -> None:
    reach = span(fm, shape)
    if reach is not None and (reach[0] < 0 or reach[1] > memory.shape[1]):
        raise NpuModelError(f"{what}: {fm.prefix} reaches bytes {reach[0]}..{reach[1]} of "
                            f"region {fm.region}, which holds {memory.shape[1]}",
                            "the command stream or the arena size is wrong; compile the model again with Vela")
