"""The NPU's TANH and SIGMOID functions on 16-bit outputs: the interpolation table, the fixed-point functions over
every input that reaches them, and the output stage that applies them."""

from __future__ import annotations

import math

import numpy as np
import pytest

from edgedeploy.npu import sigmoid16

# Published entries of TFLite's (and CMSIS-NN's) sigmoid_table_uint16, spot checks of the generated table.
PUBLISHED = {0: 32768, 1: 33451, 2: 33451 + 682, 4: 35493, 8: 38180, 64: 61279, 128: 65221, 200: 65520,
             254: 65534, 255: 65535}
INPUTS = np.arange(-(1 << 18), 1 << 18, dtype=np.int64)  # 1/(3 * 4096) per step: about -21.3 .. 21.3


def test_table_matches_the_published_entries():
    t = sigmoid16.table()
    assert t.shape == (256,)
    assert {i: int(t[i]) for i in PUBLISHED} == PUBLISHED
    assert (np.diff(t) >= 0).all()


@pytest.mark.parametrize("name,fn,exact,lo,hi", [
    ("sigmoid", sigmoid16.sigmoid, lambda x: 32768 / (1 + math.exp(-x)), 1, 32767),
    ("tanh", sigmoid16.tanh, lambda x: 32768 * math.tanh(x), -32767, 32767),
])
def test_functions_follow_the_real_function_and_saturate(name, fn, exact, lo, hi):
    y = fn(INPUTS)
    assert (np.diff(y) >= 0).all(), name
    assert y.min() == lo and y.max() == hi
    want = np.array([exact(v / 12288) for v in INPUTS[::97]])
    assert np.abs(y[::97] - want).max() <= 2, name
    mirrored = fn(-INPUTS[1:])  # f(-x) beside f(x)
    total = y[1:] + mirrored
    assert np.abs(total - (32767 if name == "sigmoid" else -1)).max() <= 1


def test_zero_gives_the_midpoint():
    assert int(sigmoid16.sigmoid(np.zeros(1))[0]) == 16384
    assert int(sigmoid16.tanh(np.zeros(1))[0]) == 0
