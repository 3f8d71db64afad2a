"""The output stage's rounding against plain-integer statements of TFLite's fixed-point functions."""

from __future__ import annotations

import numpy as np
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from helpers import examples

from edgedeploy.npu import arith

I32 = st.integers(-(1 << 31), (1 << 31) - 1)


def srdhm_ref(a: int, b: int) -> int:
    """gemmlowp's SaturatingRoundingDoublingHighMul, written out on Python integers."""
    if a == b == -(1 << 31):
        return (1 << 31) - 1
    ab = a * b
    nudge = (1 << 30) if ab >= 0 else 1 - (1 << 30)
    total = ab + nudge
    return total // (1 << 31) if total >= 0 else -((-total) // (1 << 31))


def rdbpot_ref(x: int, e: int) -> int:
    mask = (1 << e) - 1
    remainder = x & mask
    threshold = (mask >> 1) + (1 if x < 0 else 0)
    return (x >> e) + (1 if remainder > threshold else 0)


def tflite_mbqm(x: int, m: int, shift: int) -> int:
    """TFLite's MultiplyByQuantizedMultiplier with the NPU's shift (31 - TFLite's exponent)."""
    left, right = max(0, 31 - shift), max(0, shift - 31)
    return rdbpot_ref(srdhm_ref(x << left, m), right)


@settings(max_examples=examples(300), deadline=None)
@given(st.integers(-(1 << 24), 1 << 24), st.integers(1 << 30, (1 << 31) - 1), st.integers(20, 50))
def test_tfl_rounding_is_tflites_two_steps(x, m, shift):
    got = arith.scale(np.array([x]), np.array([m]), np.array([shift]), "TFL")
    assert int(got[0]) == tflite_mbqm(x, m, shift)


@settings(max_examples=examples(300), deadline=None)
@given(st.integers(-(1 << 40), 1 << 40), st.integers(1, (1 << 32) - 1), st.integers(0, 63))
def test_natural_and_truncate_round_once(x, m, shift):
    p = x * m
    natural = (p + (1 << (shift - 1) if shift else 0)) >> shift
    truncate = p >> shift if p >= 0 else -((-p) >> shift)
    assume(abs(natural) < 1 << 62)  # scaled results fit an output precision (larger ones saturate)
    assert int(arith.scale(np.array([x]), np.array([m]), np.array([shift]), "NATURAL")[0]) == natural
    assert int(arith.scale(np.array([x]), np.array([m]), np.array([shift]), "TRUNCATE")[0]) == truncate


@settings(max_examples=examples(200), deadline=None)
@given(I32, I32)
def test_int32_products_do_not_overflow(a, b):
    got = arith.srdhm(np.array([a], dtype=np.int64), np.array([b], dtype=np.int64))
    if not (a == b == -(1 << 31)):  # the one saturating case is outside what the NPU's MUL is given
        assert int(np.asarray(got)[0]) == srdhm_ref(a, b)


@given(st.integers(-(1 << 40), 1 << 40), st.integers(0, 40))
def test_rounding_divide_by_power_of_two(x, e):
    assert int(arith.rdbpot(np.array([x], dtype=np.int64), e)[0]) == rdbpot_ref(x, e)


def test_saturate_to_precision():
    v = np.array([-300, -128, 0, 127, 300])
    assert arith.saturate(v, 1, True).tolist() == [-128, -128, 0, 127, 127]
    assert arith.saturate(v, 1, False).tolist() == [0, 0, 0, 127, 255]
