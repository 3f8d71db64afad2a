"""The Ethos-U85's scaling: DOUBLE_SYMMETRIC is TFLite's two-step rounding, the double-rounding point moves it."""

from __future__ import annotations

import numpy as np
import pytest

from edgedeploy.npu import arith
from edgedeploy.npu.u85_elementwise import scale

DOUBLE_SYMMETRIC, NATURAL, TRUNCATE_TO_ZERO, TRUNCATE_TO_LOWER = 0, 1, 4, 5


@pytest.mark.parametrize("shift", [32, 35, 38, 40, 47])
def test_double_symmetric_is_tflites_two_step_rounding(shift):
    rng = np.random.default_rng(shift)
    x = rng.integers(-(1 << 31), 1 << 31, 3000)
    m = int(rng.integers(1 << 30, 1 << 31))
    got = np.asarray(scale(x, m, shift, DOUBLE_SYMMETRIC), dtype=np.int64)
    np.testing.assert_array_equal(got, arith.scale(x, np.array([m]), np.array([shift]), "TFL"))


@pytest.mark.parametrize("x, expected", [(7, 1), (-7, -1), (8, 1), (-8, -1), (12, 2), (-12, -1), (4, 1), (-4, 0)])
def test_one_step_rounding_modes(x, expected):
    # x / 8: NATURAL rounds half upwards
    assert scale(np.array([x]), 1, 3, NATURAL)[0] == expected


@pytest.mark.parametrize("mode, x, expected", [(TRUNCATE_TO_ZERO, -9, -1), (TRUNCATE_TO_ZERO, 9, 1),
                                               (TRUNCATE_TO_LOWER, -9, -2), (TRUNCATE_TO_LOWER, 15, 1)])
def test_truncating_modes(mode, x, expected):
    assert scale(np.array([x]), 1, 3, mode)[0] == expected


def test_the_double_rounding_point_is_tflites_rounding_of_a_left_shifted_operand():
    # TFLite's ADD shifts each operand left by 20 bits, then rounds a doubling high multiply and a shift right;
    # the U85 scales the unshifted operand with the double-rounding point at 20
    rng = np.random.default_rng(1)
    x = rng.integers(-255, 256, 2000)
    m, shift = 1623821475, 13  # IFM_SCALE of ResNet-8's first ADD on U85-256
    tfl = arith.scale(x.astype(np.int64) << 20, np.array([m]), np.array([shift + 20]), "TFL")
    np.testing.assert_array_equal(np.asarray(scale(x, m, shift, DOUBLE_SYMMETRIC, 20), dtype=np.int64), tfl)
