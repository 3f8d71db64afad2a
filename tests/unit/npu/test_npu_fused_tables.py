"""A documented difference seen through a fused lookup table: the NPU's output must be the table at an input
within the bound of TFLite's, and the table at TFLite's input TFLite's own activation output."""

from __future__ import annotations

import numpy as np
import pytest

from edgedeploy.npu.fused_tables import explained

# an int8 sigmoid-like table: entry i for input i - 128
TABLE = (np.clip(np.round(255 / (1 + np.exp(-(np.arange(256) - 128) / 16))), 0, 255) - 128).astype(np.int64), 128
BEFORE = np.array([-5, 0, 3, 40, 127, -128])  # TFLite's activation input (the fully-connected's output)
AFTER = TABLE[0][BEFORE + 128]  # TFLite's activation output: the table at its input


def _at(values) -> np.ndarray:
    return TABLE[0][np.clip(np.asarray(values) + 128, 0, 255)]


@pytest.mark.parametrize("npu, bound, after, ok", [
    (AFTER, 1, AFTER, True),  # no difference
    (_at(BEFORE + [1, 0, 0, 0, 0, 0]), 1, AFTER, True),  # one input one step up
    (_at(BEFORE + [0, -1, 0, 0, 1, -1]), 1, AFTER, True),  # steps past either end saturate
    (_at(BEFORE + [0, 2, 0, 0, 0, 0]), 1, AFTER, False),  # two steps: over the bound of 1
    (_at(BEFORE + [0, 2, 0, 0, 0, 0]), 2, AFTER, True),
    (AFTER + [0, 0, 1, 0, 0, 0], 1, AFTER + [0, 0, 1, 0, 0, 0], False),  # the table is not TFLite's activation
    (AFTER + [0, 0, 0, 0, 0, 0], 1, AFTER + [0, 0, 0, 1, 0, 0], False),
    (AFTER[:5], 1, AFTER, False),  # shapes that do not line up
])
def test_explained(npu, bound, after, ok):
    assert explained(np.asarray(npu), BEFORE, np.asarray(after), TABLE, bound) is ok


def test_an_output_off_the_table_is_not_explained():
    npu = AFTER.copy()
    npu[2] = 100  # no input near 3 gives 100
    assert not explained(npu, BEFORE, AFTER, TABLE, 1)
