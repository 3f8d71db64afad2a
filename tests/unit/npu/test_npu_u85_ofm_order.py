"""Ethos-U85 transposed and reversed OFMs: where each element of an operation's output lands in memory."""

from __future__ import annotations

import numpy as np
import pytest

from edgedeploy.npu import u85_commands
from edgedeploy.npu.commands import Operation
from edgedeploy.npu.featuremap import feature_map, write
from edgedeploy.npu.u85_ofm_order import arrange, stored_shape, why_not

SHAPE = (2, 3, 5)  # the operation's (height, width, depth): every size different, so a wrong axis shows
# OFM_PRECISION's transpose field -> where the op's element (h, w, c) is stored, as (row, column, channel) of the
# stored NHWC feature map (Vela 5.2 names the stored order: WHC swaps height and width, CHW puts depth first, ...)
TRANSPOSED = {
    0: lambda h, w, c: (h, w, c),  # HWC
    1: lambda h, w, c: (w, h, c),  # WHC
    2: lambda h, w, c: (h, c, w),  # HCW
    3: lambda h, w, c: (w, c, h),  # WCH
    6: lambda h, w, c: (c, h, w),  # CHW
    7: lambda h, w, c: (c, w, h),  # CWH
}
# OFM_PRECISION's reverse field -> the stored position (no transpose)
REVERSED = {
    1: lambda h, w, c: (SHAPE[0] - 1 - h, w, c),
    2: lambda h, w, c: (h, SHAPE[1] - 1 - w, c),
    3: lambda h, w, c: (h, w, SHAPE[2] - 1 - c),
}


def _op(precision: int, stored: tuple[int, int, int], registers=True) -> Operation:
    """A U85 operation writing a SHAPE-sized signed 8-bit NHWC OFM, stored as ``stored`` (height, width, depth)
    at byte 0 of region 1 in one tile, as Vela programs it."""
    sh, sw, sc = stored
    r0 = {"OFM_PRECISION": precision, "OFM_REGION": 1, "OFM_ZERO_POINT": 0,
          "OFM_HEIGHT_M1": SHAPE[0] - 1, "OFM_WIDTH_M1": SHAPE[1] - 1, "OFM_DEPTH_M1": SHAPE[2] - 1,
          "OFM_HEIGHT0_M1": sh - 1, "OFM_HEIGHT1_M1": sh - 1, "OFM_WIDTH0_M1": sw - 1}
    r1 = {"OFM_BASE0": 0, "OFM_BASE1": 0, "OFM_BASE2": 0, "OFM_BASE3": 0,
          "OFM_STRIDE_Y": sw * sc, "OFM_STRIDE_X": sc, "OFM_STRIDE_C": 1}
    return Operation(0, "POOL", 3, 100, r0, r1, u85_commands.registers() if registers else None)


def _stored(op: Operation, values: np.ndarray) -> np.ndarray:
    """The bytes the OFM writer leaves in memory for ``values`` (1, h, w, c)."""
    memory = np.zeros((1, 64), np.uint8)
    write(memory, feature_map(op, "OFM"), arrange(op, values), op.title)
    return memory[0]


def _check(op: Operation, where) -> None:
    values = np.arange(np.prod(SHAPE), dtype=np.int64).reshape((1,) + SHAPE)
    memory = _stored(op, values)
    _, sw, sc = stored_shape(op)
    for h, w, c in np.ndindex(*SHAPE):
        y, x, z = where(h, w, c)
        assert memory[y * sw * sc + x * sc + z] == values[0, h, w, c], (h, w, c)


@pytest.mark.parametrize("code", sorted(TRANSPOSED))
def test_a_transposed_ofm_lands_where_its_stored_order_puts_each_element(code):
    stored = TRANSPOSED[code](*SHAPE)
    op = _op(0x101 | code << 11, stored)  # signed int8, global scale, NHWC
    assert why_not(op) is None
    assert stored_shape(op) == stored
    _check(op, TRANSPOSED[code])


@pytest.mark.parametrize("code", sorted(REVERSED))
def test_a_reversed_ofm_runs_backwards_along_its_axis(code):
    op = _op(0x101 | code << 9, SHAPE)
    assert why_not(op) is None
    assert stored_shape(op) == SHAPE
    _check(op, REVERSED[code])


def test_the_transposed_brick_ofm_vela_writes_for_a_depth_multiplier():
    """Vela's interleaving of a depthwise convolution's two output halves: a WHC-transposed NHCWB16 OFM (2, 32, 512)
    stored as 32 rows of 2 columns, strides 1024, 16 and 32 as its stream sets them."""
    shape = (2, 32, 512)
    r0 = {"OFM_PRECISION": 0x941, "OFM_REGION": 1, "OFM_ZERO_POINT": 0, "OFM_HEIGHT_M1": 1, "OFM_WIDTH_M1": 31,
          "OFM_DEPTH_M1": 511, "OFM_HEIGHT0_M1": 31, "OFM_HEIGHT1_M1": 31, "OFM_WIDTH0_M1": 1}
    r1 = {"OFM_BASE0": 0, "OFM_BASE1": 0, "OFM_BASE2": 0, "OFM_BASE3": 0, "OFM_STRIDE_Y": 1024, "OFM_STRIDE_X": 16,
          "OFM_STRIDE_C": 32}
    op = Operation(6, "POOL", 3, 175, r0, r1, u85_commands.registers())
    assert stored_shape(op) == (32, 2, 512)
    values = np.random.default_rng(0).integers(-128, 128, size=(1,) + shape)
    memory = np.zeros((1, 32 * 1024), np.uint8)
    write(memory, feature_map(op, "OFM"), arrange(op, values), op.title)
    for h, w, c in ((0, 0, 0), (1, 0, 17), (0, 31, 511), (1, 5, 300)):
        address = w * 1024 + h * 16 + (c // 16) * 32 + c % 16  # stored row w, column h, channel c in bricks
        assert memory[0, address].view(np.int8) == values[0, h, w, c]


@pytest.mark.parametrize("precision, reason", [
    (0x101 | 4 << 11, "OFM transpose code 4 is undefined"),
    (0x101 | 1 << 11 | 1 << 9, "both transposed (WHC) and reversed (H)"),
    (0x101 | 6 << 11 | 2 << 14, "in the chaining buffer is not modelled"),
    (0x101 | 3 << 9 | 2 << 14, "in the chaining buffer is not modelled"),
])
def test_orders_the_model_does_not_store_are_named(precision, reason):
    assert reason in (why_not(_op(precision, SHAPE)) or "")


def test_a_u55_operation_has_no_ofm_order():
    """The U55/U65's OFM_PRECISION has no transpose or reverse field: its bits there are left alone."""
    op = _op(0x101 | 1 << 11 | 1 << 9, SHAPE, registers=False)
    assert why_not(op) is None and stored_shape(op) == SHAPE
    values = np.zeros((1,) + SHAPE)
    assert arrange(op, values) is values
