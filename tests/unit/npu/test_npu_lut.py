"""Lookup tables: the 16-bit interpolated table against TFLite's int16 table lookup, slots, and a recorded 16x8 leaf
whose softmax runs on two such tables."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from edgedeploy.errors import NpuModelError
from edgedeploy.npu import lut
from edgedeploy.npu.commands import decode
from edgedeploy.npu.leaf_layout import read_leaf
from edgedeploy.npu.machine import INTERNAL, run

DATA = Path(__file__).resolve().parents[2] / "data" / "npu"
ALL_INT16 = np.arange(-32768, 32768, dtype=np.int64)


def _samples(fn, in_scale: float, out_scale: float) -> np.ndarray:
    """513 int16 samples of ``fn`` over the int16 input range (as TFLite's and Vela's table generators space them)."""
    x = -32768 * in_scale + np.arange(513) * (65536 * in_scale / 512)
    return np.clip(np.round(np.vectorize(fn)(x) / out_scale), -32768, 32767).astype(np.int64)


def _tflite_lookup(samples: np.ndarray, value: int) -> int:
    """TFLite's int16 reference lookup (``generic_int16_table_lookup``) over 513 samples, one value."""
    index = 256 + (value >> 7)
    offset = value & 0x7F
    base = int(samples[index])
    slope = int(samples[index + 1]) - base
    return base + ((slope * offset + 64) >> 7)


FUNCTIONS = {
    "sigmoid": (lambda x: 1 / (1 + math.exp(-x)), 8 / 32768, 1 / 32768),
    "tanh": (math.tanh, 4 / 32768, 1 / 32768),  # negative bases
    "hard_swish": (lambda x: x * min(max(x + 3, 0), 6) / 6, 6 / 32768, 6 / 32768),
    "exp": (math.exp, 10 / 65536, 1 / 32768),  # the int16 EXP operator's table
    "leaky_relu": (lambda x: x if x > 0 else 0.1 * x, 1 / 4096, 1 / 4096),
    "steep": (lambda x: 40000 * x, 1 / 32768, 1 / 32768),  # slopes that saturate at the int16 range
}


@pytest.mark.parametrize("name", list(FUNCTIONS))
def test_interpolated_table_gives_tflites_int16_lookup_for_every_input(name):
    samples = _samples(*FUNCTIONS[name])
    entries = lut.table16(samples)
    got = lut.interpolate16(entries, ALL_INT16)
    want = np.array([_tflite_lookup(samples, int(v)) for v in ALL_INT16])
    np.testing.assert_array_equal(got, want)
    base, slope = lut.split16(entries)
    np.testing.assert_array_equal(base, samples[:-1])
    np.testing.assert_array_equal(slope, np.diff(samples))


@pytest.mark.parametrize("name", ["tanh", "leaky_relu"])
def test_a_negative_base_keeps_its_slope(name):
    samples = _samples(*FUNCTIONS[name])
    entries = lut.table16(samples)
    assert (samples[:-1] < 0).any()
    halves = (entries >> 16).astype(np.int16).astype(np.int64)  # the top half alone is one short there
    assert (halves != np.diff(samples)).any()
    np.testing.assert_array_equal(lut.split16(entries)[1], np.diff(samples))


def _shram_with(entries: np.ndarray, slot: int = 0) -> np.ndarray:
    shram = np.zeros(4096, dtype=np.uint8)
    raw = entries.astype("<u4").view(np.uint8)
    start = shram.size - lut.LUT_BYTES + slot * lut.LUT_SLOT
    shram[start : start + min(raw.size, shram.size - start)] = raw[: shram.size - start]
    return shram


def test_lookup_reads_the_16_bit_table_from_the_top_of_shram():
    samples = _samples(*FUNCTIONS["tanh"])
    shram = _shram_with(lut.table16(samples))
    values = np.array([[-32768, -1, 0, 1, 127, 128, 32767]])
    got = lut.lookup(shram, 0, values, 2, True, "op")
    np.testing.assert_array_equal(got[0], [_tflite_lookup(samples, int(v)) for v in values[0]])


@pytest.mark.parametrize("slot,signed,message", [
    (1, True, r"op: a 2048-byte lookup table at slot 1 runs past SHRAM"),
    (0, False, r"op: a 16-bit lookup table on an unsigned output is not modelled"),
])
def test_a_16_bit_table_that_cannot_be_read_is_named(slot, signed, message):
    shram = _shram_with(lut.table16(_samples(*FUNCTIONS["sigmoid"])))
    with pytest.raises(NpuModelError, match=message):
        lut.lookup(shram, slot, np.zeros((1, 4)), 2, signed, "op")


def test_8_bit_tables_index_by_the_signed_value():
    shram = np.zeros(2048, dtype=np.uint8)
    shram[256:512] = np.arange(256, dtype=np.uint8)[::-1]  # slot 1: 127 - (value + 128) as int8
    got = lut.lookup(shram, 1, np.array([-128, 0, 127]), 1, True, "op")
    np.testing.assert_array_equal(got, np.arange(256, dtype=np.uint8)[::-1].view(np.int8)[[0, 128, 255]])


def _leaf_16x8():
    leaf = read_leaf(DATA / "dscnn16x8_u55_128_vela.npz")
    with np.load(DATA / "dscnn16x8_u55_128_cases.npz") as npz:
        return leaf, npz["x"].reshape((-1,) + leaf.inputs[0].shape), npz["y"]


def test_recorded_16x8_leaf_loads_two_interpolated_tables():
    leaf, x, y = _leaf_16x8()
    ops = decode(leaf.commands)
    tables = [op for op in ops if op.kind == "DMA" and op.reg("DMA0_DST_REGION") & INTERNAL]
    assert [op.reg32("DMA0_LEN") for op in tables] == [2048, 2048]  # the softmax's exp and 1/(1+x) tables
    assert leaf.inputs[0].dtype == "int16" and y.dtype == np.int16
    assert sum(1 for op in ops if op.kind == "ELEMENTWISE" and lut.is_table(op.reg("ACTIVATION") & 0xFFF)) == 2


@pytest.mark.parametrize("which", [0, 1])
def test_a_changed_16_bit_table_changes_the_outputs(which):
    leaf, x, y = _leaf_16x8()
    dma = [op for op in decode(leaf.commands) if op.kind == "DMA" and op.reg("DMA0_DST_REGION") & INTERNAL][which]
    start, n = op_source(dma)
    weights = bytearray(leaf.weights)
    for i in range(start, start + n, 4):  # every base, one step up
        weights[i] = (weights[i] + 16) & 0xFF
    outs, _ = run(replace(leaf, weights=bytes(weights)), [x])
    assert not np.array_equal(outs[0].reshape(y.shape), y)


def op_source(dma) -> tuple[int, int]:
    return dma.reg32("DMA0_SRC") & ((1 << 40) - 1), dma.reg32("DMA0_LEN")
