"""The Ethos-U85 fast weight format (FWD): streams Vela 5.2 wrote for a small int8 network, decoded back to the
TFLite model's own weights, on one core and interleaved across two; damaged streams are named."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from edgedeploy.errors import NpuModelError
from edgedeploy.npu import u85_fwd, u85_weights
from edgedeploy.npu.commands import decode_for
from edgedeploy.npu.leaf_layout import read_leaf
from edgedeploy.npu.u85_weights import Layout, fwd_order, order
from helpers import int8_kernels

DATA = Path(__file__).resolve().parents[2] / "data" / "npu"
MODEL = DATA / "fwd_convs_int8.tflite"


def _convolutions(name: str):
    """The leaf and each CONV with the region its weights are read from, as the stream's DMAs leave it."""
    leaf = read_leaf(DATA / f"{name}_vela.npz")
    weights = np.frombuffer(leaf.weights, np.uint8)
    fast = np.zeros(leaf.scratch_fast_size, np.uint8)
    convs = []
    for op in decode_for(leaf.product, leaf.commands, name):
        if op.kind == "DMA" and op.r0["DMA0_SRC_REGION"] & 7 == 0 and op.r0["DMA0_DST_REGION"] & 7 == 2:
            src, dst, n = op.r1["DMA0_SRC"], op.r1["DMA0_DST"], op.r1["DMA0_LEN"]
            fast[dst : dst + n] = weights[src : src + n]
        elif op.kind == "CONV":
            convs.append((op, (weights if op.r0["WEIGHT_REGION"] & 7 == 0 else fast).copy()))
    return leaf, convs


def _fwd_stream(name: str) -> tuple[bytes, int]:
    """The bytes of the FWD weight stream Vela wrote and the number of weights its layout holds."""
    leaf, convs = _convolutions(name)
    op, region = next((op, r) for op, r in convs if op.r0["WEIGHT_FORMAT"] & 1)
    base, length = op.r1["WEIGHT_BASE"], op.r1["WEIGHT_LENGTH"]
    lay = u85_weights.layout(op, leaf.macs, 8)
    return bytes(region[base : base + length]), fwd_order(lay, u85_weights.CORES[leaf.macs]).size


@pytest.mark.parametrize("name", ["fwd_convs_u85_256", "fwd_convs_u85_512"])
def test_fast_format_weights_are_the_tflite_models(name):
    leaf, convs = _convolutions(name)
    # the dense 3x3 convolution of random weights is the one Vela writes in FWD (the others compress well)
    assert [op.r0["WEIGHT_FORMAT"] & 1 for op, _ in convs] == [0, 1, 0, 0, 0]
    fwd = convs[1][0]
    assert u85_weights.layout(fwd, leaf.macs, 8).traversal == "PART_KERNEL_FIRST"
    if leaf.macs == 512:  # two cores, one FWD stream: the second core's stream is empty
        assert fwd.r1["WEIGHT1_LENGTH"] == 0 and convs[0][0].r1["WEIGHT1_LENGTH"] > 0
    decoded = [u85_weights.weights(op, region, leaf.macs, 8) for op, region in convs]
    expected = int8_kernels(MODEL)
    assert len(decoded) == len(expected)
    for got, want in zip(decoded, expected):
        np.testing.assert_array_equal(got, want)


def test_vela_writes_random_weights_in_raw_mode():
    data, count = _fwd_stream("fwd_convs_u85_256")
    bits = np.unpackbits(np.frombuffer(data, np.uint8), bitorder="little")
    assert (bits[0], bits[1]) == (1, 0)  # raw mode, not the 2-bit look-up mode
    assert len(data) == u85_fwd.stream_size(count, 8)
    values = u85_fwd.decode(data, count, "op")
    assert values.min() >= -127 and values.max() <= 127 and np.unique(values).size > 16


def _damaged(data: bytes, byte: int, mask: int) -> bytes:
    out = bytearray(data)
    out[byte] ^= mask
    return bytes(out)


@pytest.mark.parametrize("change, message", [
    (lambda d: d[:20], "less than its 32-byte header"),
    (lambda d: d[:-32], "where 15360 weights take 15392 B"),
    (lambda d: _damaged(d, 0, 0x02), "both raw and 2-bit look-up mode"),
    (lambda d: _damaged(d, 5, 0x10), "reserved bits 2-103 are not zero"),
])
def test_a_damaged_stream_is_named(change, message):
    data, count = _fwd_stream("fwd_convs_u85_256")
    # 32 x 48 weights a kernel position, 9 positions rounded up to 10: a whole number of 256-bit blocks
    assert count == 15360 and len(data) == 32 + 15360
    with pytest.raises(NpuModelError, match=message):
        u85_fwd.decode(change(data), count, "operation 1 (CONV, word 109): weight stream 0")


def test_a_changed_weight_byte_changes_one_weight():
    data, count = _fwd_stream("fwd_convs_u85_256")
    before = u85_fwd.decode(data, count, "op")
    after = u85_fwd.decode(_damaged(data, 32 + 100, 0x01), count, "op")
    assert np.flatnonzero(before != after).tolist() == [100]


def _lookup_stream(indices: list[int], table: list[int], width: int) -> bytes:
    """A look-up mode stream written from the format's description (Vela's encoder writes these for tensors of at
    most 16 distinct weights when FWD wins, which no recorded model reaches)."""
    folded = [abs(v) << 1 | (v < 0) for v in table + [0] * (16 - len(table))]
    bits = [0, int(width == 2)] + [0] * 110 + [b for f in folded for b in ((f >> k) & 1 for k in range(9))]
    bits += [b for i in indices for b in ((i >> k) & 1 for k in range(width))]
    bits += [0] * (-len(bits) % 256)
    return np.packbits(np.asarray(bits, np.uint8), bitorder="little").tobytes()


@pytest.mark.parametrize("width, table", [(2, [0, -127, 42, 127]), (4, [5, -3, 127, -128, 1, 0, 9, -60, 2])])
def test_look_up_modes_decode_their_table(width, table):
    rng = np.random.default_rng(0)
    indices = rng.integers(0, len(table), 300).tolist()
    data = _lookup_stream(indices, table, width)
    assert len(data) == u85_fwd.stream_size(300, width)
    values = u85_fwd.decode(data, 300, "op")
    assert values.tolist() == [table[i] for i in indices]
    with pytest.raises(NpuModelError, match="padding after its 300 weights is not zero"):
        u85_fwd.decode(data[:-1] + b"\x80", 300, "op")


# block: OFM micro-block x IFM micro-block x sub-kernel rounding / cores weights of each core in turn
@pytest.mark.parametrize("lay, cores, block", [
    (Layout((32, 3, 3, 48), (1, 1), (1, 1), 32, 16, 16, "PART_KERNEL_FIRST", False, 8, 512), 2, 16 * 16 * 5 // 2),
    (Layout((70, 1, 1, 150), (1, 1), (1, 1), 64, 64, 32, "DEPTH_FIRST", False, 8, 1024), 4, 32 * 64 // 4),
    (Layout((36, 3, 3, 40), (1, 1), (1, 1), 32, 16, 16, "PART_KERNEL_FIRST", True, 8, 2048), 4, 16 * 16 * 10 // 4),
])
def test_the_fast_format_interleaves_the_cores_orders(lay, cores, block):
    places = fwd_order(lay, cores)
    held = places[places >= 0]
    assert np.array_equal(np.sort(held), np.arange(int(np.prod(lay.shape))))
    per_core = [order(lay, s, cores) for s in range(cores)]
    assert places.size == sum(p.size for p in per_core)
    for turn in range(2):
        for s in range(cores):
            at = (turn * cores + s) * block
            np.testing.assert_array_equal(places[at : at + block], per_core[s][turn * block : (turn + 1) * block])


def test_fast_format_depthwise_weights_are_named():
    leaf = read_leaf(DATA / "dscnn_u85_256_vela.npz")
    op = next(op for op in decode_for(leaf.product, leaf.commands, "dscnn") if op.kind == "DEPTHWISE")
    with pytest.raises(NpuModelError, match="fast-format .FWD. depthwise weights are not modelled"):
        u85_weights.layout(replace(op, r0={**op.r0, "WEIGHT_FORMAT": 1}), leaf.macs, 8)
