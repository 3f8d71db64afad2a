"""Weight streams decode back to the kernels that were encoded; scale records decode to bias, multiplier, shift."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from ethosu import mlw_codec

from edgedeploy.errors import NpuModelError
from edgedeploy.npu.commands import Operation
from edgedeploy.npu.weight_streams import UBLOCK_DEPTHS, kernel, scales, weights


def _op(kind="CONV", **regs32):
    r0 = {"KERNEL_STRIDE": 0, "KERNEL_HEIGHT_M1": 0, "KERNEL_WIDTH_M1": 0, "OFM_BLK_DEPTH_M1": 15}
    r1 = {"WEIGHT_BASE": 0, "WEIGHT_LENGTH": 0, "SCALE_BASE": 0, "SCALE_LENGTH": 0}
    r1.update(regs32)
    return Operation(0, kind, 0, 0, r0, r1)


@pytest.mark.parametrize("macs, shape, depthwise, part_kernel, block", [
    (128, (16, 3, 3, 8), False, False, 16),
    (128, (24, 1, 1, 64), False, False, 16),
    (256, (8, 10, 4, 1), False, True, 8),
    (32, (12, 5, 5, 3), False, True, 8),
    (128, (64, 3, 3, 1), True, False, 16),
    (256, (40, 9, 9, 2), False, False, 32),  # larger than a sub-kernel: split into pieces
])
def test_encoded_kernel_decodes_back(macs, shape, depthwise, part_kernel, block):
    rng = np.random.default_rng(7)
    ohwi = rng.integers(-255, 256, size=shape).astype(np.int16)
    ifm_ub, ofm_ub = UBLOCK_DEPTHS[macs]
    enc, _ = mlw_codec.reorder_encode(ifm_ub, ofm_ub, ohwi, block, depthwise, part_kernel, 8, 8, 8)
    memory = np.frombuffer(bytes(16) + bytes(enc), dtype=np.uint8)
    op = _op("DEPTHWISE" if depthwise else "CONV", WEIGHT_BASE=16, WEIGHT_LENGTH=len(enc))
    op.r0.update(KERNEL_HEIGHT_M1=shape[1] - 1, KERNEL_WIDTH_M1=shape[2] - 1, OFM_BLK_DEPTH_M1=block - 1,
                 KERNEL_STRIDE=4 if part_kernel else 0)
    got = weights(op, memory, macs, shape, depthwise, 8, kernel(op))
    np.testing.assert_array_equal(got, ohwi)


def test_damaged_weight_stream_is_named():
    rng = np.random.default_rng(3)
    ohwi = rng.integers(-100, 100, size=(16, 3, 3, 16)).astype(np.int16)
    enc, _ = mlw_codec.reorder_encode(8, 8, ohwi, 16, False, False, 8, 8, 8)
    op = _op(WEIGHT_BASE=0, WEIGHT_LENGTH=len(enc) // 2)  # half the stream
    op.r0.update(KERNEL_HEIGHT_M1=2, KERNEL_WIDTH_M1=2)
    with pytest.raises(NpuModelError, match="operation 0 \\(CONV"):
        weights(op, np.frombuffer(bytes(enc), np.uint8), 128, (16, 3, 3, 16), False, 8, kernel(op))


def test_kernel_register_fields():
    op = _op()
    # stride 3x2 (x: low bit 0, extension 1; y: low bit 1), dilation 2x1, part-kernel first
    op.r0.update(KERNEL_STRIDE=(0 << 0) | (1 << 1) | (1 << 2) | (1 << 3) | (1 << 6), KERNEL_HEIGHT_M1=2,
                 KERNEL_WIDTH_M1=4)
    k = kernel(op)
    assert (k.stride_x, k.stride_y, k.dilation_x, k.dilation_y, k.part_kernel) == (3, 2, 2, 1, True)
    assert (k.height, k.width) == (3, 3)


def test_scale_records_decode():
    recs = [(-5, 1 << 30, 38), ((1 << 39) - 1, 0xFFFFFFFF, 63), (-(1 << 39), 1, 0)]
    raw = b"".join(struct.pack("<q", b)[:5] + struct.pack("<I", m) + bytes([s]) for b, m, s in recs)
    op = _op(SCALE_BASE=0, SCALE_LENGTH=len(raw))
    bias, mult, shift = scales(op, np.frombuffer(raw, np.uint8), 3)
    assert bias.tolist() == [b for b, _, _ in recs]
    assert mult.tolist() == [m for _, m, _ in recs]
    assert shift.tolist() == [s for _, _, s in recs]


def test_short_scale_stream_is_refused():
    op = _op(SCALE_BASE=0, SCALE_LENGTH=10)
    with pytest.raises(NpuModelError, match="too short for 2 channels"):
        scales(op, np.zeros(20, np.uint8), 2)


def test_second_core_reads_its_own_streams():
    rng = np.random.default_rng(5)
    ohwi = rng.integers(-50, 50, size=(8, 1, 1, 16)).astype(np.int16)
    enc, _ = mlw_codec.reorder_encode(8, 8, ohwi, 8, False, False, 8, 8, 8)
    op = _op(WEIGHT_BASE=0, WEIGHT_LENGTH=0, WEIGHT1_BASE=32, WEIGHT1_LENGTH=len(enc))
    op.r0.update(OFM_BLK_DEPTH_M1=15)  # 16 channels over two cores: 8 each
    memory = np.frombuffer(bytes(32) + bytes(enc), np.uint8)
    got = weights(op, memory, 512, (8, 1, 1, 16), False, 8, kernel(op), core=1, cores=2)
    np.testing.assert_array_equal(got, ohwi)
    raw = struct.pack("<q", 7)[:5] + struct.pack("<I", 99) + bytes([31])
    op.r1.update(SCALE_BASE=0, SCALE_LENGTH=0, SCALE1_BASE=10, SCALE1_LENGTH=10)
    bias, mult, shift = scales(op, np.frombuffer(bytes(10) + raw, np.uint8), 1, core=1)
    assert (bias[0], mult[0], shift[0]) == (7, 99, 31)
