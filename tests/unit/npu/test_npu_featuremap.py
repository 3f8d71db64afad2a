"""Where feature-map elements lie: NHWC, NHCWB16 bricks and the four tiles."""

from __future__ import annotations

import numpy as np
import pytest

from edgedeploy.errors import NpuModelError
from edgedeploy.npu.featuremap import FeatureMap, read, span, write


def fm(brick=False, size=1, bases=(0, 0, 0, 0), h0=100, h1=100, w0=100, strides=None):
    return FeatureMap("IFM", 1, bases, h0, h1, w0, strides or (0, 0, 0), size, True, brick, 0)


def test_nhwc_offsets():
    f = fm(strides=(5 * 3, 3, 1))
    offs = f.offsets(2, 5, 3)
    assert offs[1, 2, 1] == 1 * 15 + 2 * 3 + 1
    assert sorted(offs.ravel().tolist()) == list(range(30))


def test_nhcwb16_bricks_of_sixteen_channels():
    # 3 x 4 x 20 int8: bricks of 16 channels; a row holds 2 bricks x 4 columns x 16 bytes
    f = fm(brick=True, strides=(2 * 4 * 16, 16, 4 * 16))
    offs = f.offsets(3, 4, 20)
    assert offs[0, 1, 3] == 16 + 3
    assert offs[0, 1, 17] == 64 + 16 + 1
    assert offs[2, 3, 19] == 2 * 128 + 64 + 48 + 3


def test_int32_bricks_scale_channel_offsets():
    f = fm(brick=True, size=4, strides=(4 * 64, 64, 4 * 64))
    assert f.offsets(1, 4, 18)[0, 2, 17] == 4 * 64 + 2 * 64 + 1 * 4


def test_four_tiles():
    # tile 0: rows 0-1, columns 0-2; tile 1 (right): rows 0-3; tile 2 below tile 0; tile 3 below tile 1
    f = fm(bases=(1000, 2000, 3000, 4000), h0=2, h1=4, w0=3, strides=(10, 1, 1))
    offs = f.offsets(5, 5, 1)[..., 0]
    assert offs[1, 2] == 1000 + 10 + 2
    assert offs[3, 4] == 2000 + 30 + 1
    assert offs[2, 0] == 3000
    assert offs[4, 3] == 4000


def test_read_write_round_trip_batched():
    f = fm(size=2, strides=(4 * 2 * 2, 2 * 2, 2))
    memory = np.zeros((3, 64), np.uint8)
    values = np.arange(3 * 2 * 4 * 2).reshape(3, 2, 4, 2) - 20
    write(memory, f, values, "op")
    np.testing.assert_array_equal(read(memory, f, (2, 4, 2), "op"), values)


def test_out_of_region_read_is_named():
    with pytest.raises(NpuModelError, match="op: IFM reaches bytes"):
        read(np.zeros((1, 8), np.uint8), fm(strides=(4, 1, 1)), (4, 4, 1), "op")


@pytest.mark.parametrize("f, shape", [
    (fm(strides=(5 * 3, 3, 1)), (2, 5, 3)),
    (fm(brick=True, strides=(2 * 4 * 16, 16, 4 * 16)), (3, 4, 20)),
    (fm(brick=True, strides=(2 * 4 * 16, 16, 4 * 16)), (3, 4, 32)),
    (fm(brick=True, size=4, strides=(4 * 64, 64, 4 * 64)), (1, 4, 18)),
    (fm(bases=(1000, 2000, 3000, 4000), h0=2, h1=4, w0=3, strides=(10, 1, 1)), (5, 5, 1)),
    (fm(bases=(1000, 2000, 3000, 4000), h0=2, h1=4, w0=3, strides=(10, 1, 1)), (2, 2, 1)),
])
def test_span_is_the_offsets_range(f, shape):
    offs = f.offsets(*shape)
    assert span(f, shape) == (int(offs.min()), int(offs.max()) + f.size)


def test_a_span_past_int64_is_refused_before_offsets_are_made():
    # 65,536 rows 2**48 bytes apart: NumPy's int64 offsets would wrap round into the region
    huge = fm(h0=1 << 16, h1=1 << 16, strides=(1 << 48, 1, 1))
    assert span(huge, (1 << 16, 1, 1))[1] > 1 << 63
    with pytest.raises(NpuModelError, match="op: IFM reaches bytes 0..1844"):
        read(np.zeros((1, 8), np.uint8), huge, (1 << 16, 1, 1), "op")
