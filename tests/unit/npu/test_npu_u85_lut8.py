"""The Ethos-U85's 8-bit-indexed lookup tables (LUT_U8_U8, LUT_S8_S8, LUT_S8_S16, LUT_S8_S32): table ``t`` of a
function with entries of ``size`` bytes starts at byte ``t * 256 * size`` of the 2048-byte lookup memory, and the
activation's table field runs over as many tables as fit (8, 8, 4, 2)."""

from __future__ import annotations

import numpy as np
import pytest

from edgedeploy.errors import NpuModelError
from edgedeploy.npu.u85_elementwise import SHRAM, lookup, modelled_table

LUT_U8_U8, LUT_S8_S8, LUT_S8_S16, LUT_S8_S32, LUT_S16_S16, LUT_S16_S32 = 1, 4, 5, 7, 8, 9
ENTRY = {LUT_U8_U8: "u1", LUT_S8_S8: "i1", LUT_S8_S16: "<i2", LUT_S8_S32: "<i4"}
TABLES = {LUT_U8_U8: 8, LUT_S8_S8: 8, LUT_S8_S16: 4, LUT_S8_S32: 2}


class Op:
    """The registers an output stage reads (ACTIVATION: function in bits 0-4, table in bits 5-7)."""

    title = "operation 22 (ELEMENTWISE SUB, word 587)"

    def __init__(self, function: int, table: int) -> None:
        self.activation = function | table << 5

    def reg(self, name: str) -> int:
        assert name == "ACTIVATION"
        return self.activation


def _memory(function: int, batch: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """The lookup memory filled with distinct tables of ``function``'s entries (one row per batch element, the
    same in each), and those tables, one row per table."""
    dtype = np.dtype(ENTRY[function])
    info = np.iinfo(dtype)
    rng = np.random.default_rng(function)
    tables = rng.integers(info.min, int(info.max) + 1, (TABLES[function], 256)).astype(dtype)
    raw = tables.reshape(-1).view(np.uint8)
    assert raw.shape == (2048,)
    return np.broadcast_to(np.concatenate([raw, np.zeros(512, np.uint8)]), (batch, 2560)).copy(), tables


CASES = [(f, t) for f in TABLES for t in range(TABLES[f])]


@pytest.mark.parametrize("function, table", CASES)
def test_each_table_of_each_8_bit_indexed_function_is_read_where_vela_puts_it(function, table):
    memory, tables = _memory(function)
    lo = 0 if function == LUT_U8_U8 else -128
    values = np.arange(lo, lo + 256, dtype=np.int64)
    batch = np.stack([values, values[::-1]])
    got = lookup(Op(function, table), lambda region: memory if region == SHRAM else None, batch)
    want = tables[table].astype(np.int64)
    np.testing.assert_array_equal(got[0], want)  # entry i holds the value lo + i
    np.testing.assert_array_equal(got[1], want[::-1])
    assert modelled_table(function, table)


def test_the_32_bit_table_1_starts_at_byte_1024():
    memory = np.zeros((1, 2048), np.uint8)
    memory[0, 1024:2048] = (np.arange(256, dtype="<i4") * 1000 - 70000).view(np.uint8)
    got = lookup(Op(LUT_S8_S32, 1), lambda region: memory, np.array([[-128, 0, 127]]))
    np.testing.assert_array_equal(got, [[-70000, 58000, 185000]])
    # table 0 is the first 1024 bytes, all zero here
    np.testing.assert_array_equal(lookup(Op(LUT_S8_S32, 0), lambda region: memory, np.array([[-128, 127]])), [[0, 0]])


@pytest.mark.parametrize("function, table", [(LUT_S8_S16, 4), (LUT_S8_S16, 7), (LUT_S8_S32, 2), (LUT_S8_S32, 7),
                                             (LUT_S16_S16, 1), (LUT_S16_S32, 0), (2, 0), (12, 0)])
def test_a_table_past_the_lookup_memory_or_an_unmodelled_function_stops_with_its_name(function, table):
    memory = np.zeros((1, 4096), np.uint8)
    assert not modelled_table(function, table)
    with pytest.raises(NpuModelError, match=rf"activation function {function} \(table {table}\) is not modelled"):
        lookup(Op(function, table), lambda region: memory, np.zeros((1, 4), np.int64))


@pytest.mark.parametrize("function, value", [(LUT_S8_S8, 128), (LUT_S8_S32, -129), (LUT_U8_U8, -1), (LUT_U8_U8, 256)])
def test_an_index_outside_the_table_stops(function, value):
    memory, _ = _memory(function, batch=1)
    with pytest.raises(NpuModelError, match="a lookup index leaves 0..255"):
        lookup(Op(function, 0), lambda region: memory, np.array([[0, value]]))
