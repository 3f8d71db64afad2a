"""The Ethos-U85's 16-bit lookup table (LUT_S16_S16) and its TANH and SIGMOID functions are the U55's: the same
table bytes give the same lookups, the functions the same values."""

from __future__ import annotations

import numpy as np
import pytest

from edgedeploy.errors import NpuModelError
from edgedeploy.npu import lut, sigmoid16
from edgedeploy.npu.u85_elementwise import SHRAM, lookup, tanh_sigmoid

LUT_S16_S16, TANH, SIGMOID, LUT_S8_S8 = 8, 10, 11, 4
VALUES = np.arange(-32768, 32768, dtype=np.int64)


class Op:
    """The registers an output stage reads (ACTIVATION: function in bits 0-4, table in bits 5-7)."""

    title = "operation 3 (ELEMENTWISE ADD, word 90)"

    def __init__(self, activation: int) -> None:
        self.activation = activation

    def reg(self, name: str) -> int:
        assert name == "ACTIVATION"
        return self.activation


def _table(samples) -> np.ndarray:
    """512 entries as the DMA leaves them at the start of the U85's internal memory (2 batch rows)."""
    raw = lut.table16(samples).astype("<u4").view(np.uint8)
    return np.broadcast_to(np.concatenate([raw, np.zeros(1024, np.uint8)]), (2, 3072)).copy()


@pytest.mark.parametrize("seed", [0, 1])
def test_the_16_bit_table_is_looked_up_as_on_the_u55(seed):
    samples = np.sort(np.random.default_rng(seed).integers(-32768, 32768, 513))  # rising, bases of both signs
    memory = _table(samples)
    got = lookup(Op(LUT_S16_S16), lambda region: memory if region == SHRAM else None, np.stack([VALUES, VALUES]))
    u55 = lut.interpolate16(memory[0, :2048].view("<i4"), VALUES)
    np.testing.assert_array_equal(got[0], u55)
    np.testing.assert_array_equal(got[1], u55)
    # at each step's start the table gives the sample itself
    np.testing.assert_array_equal(got[0][::128], samples[:512])


def test_a_16_bit_table_other_than_table_0_stops_with_its_name():
    memory = _table(np.arange(513) * 64 - 16384)
    with pytest.raises(NpuModelError, match=r"activation function 8 \(table 1\) is not modelled on the Ethos-U85"):
        lookup(Op(LUT_S16_S16 | 1 << 5), lambda region: memory, np.zeros((2, 4), np.int64))


@pytest.mark.parametrize("function, u55", [(TANH, sigmoid16.tanh), (SIGMOID, sigmoid16.sigmoid)])
def test_tanh_and_sigmoid_are_the_u55s_functions_on_16_bit_outputs(function, u55):
    x = np.linspace(-300000, 300000, 4001).astype(np.int64)
    value, left = tanh_sigmoid(Op(function), x, 16)
    np.testing.assert_array_equal(value, u55(x))
    assert left == 0  # nothing left to look up
    same, left = tanh_sigmoid(Op(LUT_S8_S8), x, 8)
    assert same is x and left == LUT_S8_S8


@pytest.mark.parametrize("function", [TANH, SIGMOID])
def test_tanh_and_sigmoid_on_8_bit_outputs_stop(function):
    with pytest.raises(NpuModelError, match=f"activation function {function} is not modelled on 8-bit outputs"):
        tanh_sigmoid(Op(function), np.zeros(3, np.int64), 8)
