"""Ethos-U85 weight and scale streams of recorded Vela output, decoded back to the TFLite model's own weights."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edgedeploy.errors import NpuModelError
from edgedeploy.npu import u85_weights
from edgedeploy.npu.commands import decode_for
from edgedeploy.npu.leaf_layout import read_leaf
from edgedeploy.npu.u85_weights import Layout, order
from helpers import int8_kernels

DATA = Path(__file__).resolve().parents[2] / "data" / "npu"
MODEL = Path(__file__).resolve().parents[3] / "examples" / "kws" / "dscnn_mlperf_int8.tflite"


def _after_dma(name: str):
    """The leaf, its operations, and each convolution with the fast scratch as the stream's DMAs leave it."""
    leaf = read_leaf(DATA / f"{name}_vela.npz")
    ops = decode_for(leaf.product, leaf.commands, name)
    weights = np.frombuffer(leaf.weights, np.uint8)
    fast = np.zeros(leaf.scratch_fast_size, np.uint8)
    convs = []
    for op in ops:
        if op.kind == "DMA" and op.r0["DMA0_SRC_REGION"] & 7 == 0 and op.r0["DMA0_DST_REGION"] & 7 == 2:
            src, dst, n = op.r1["DMA0_SRC"], op.r1["DMA0_DST"], op.r1["DMA0_LEN"]
            fast[dst : dst + n] = weights[src : src + n]
        elif op.kind in ("CONV", "DEPTHWISE"):
            assert op.r0["WEIGHT_REGION"] == 2 and op.r0["SCALE_REGION"] == 2
            convs.append((op, fast.copy()))
    return leaf, convs


@pytest.mark.parametrize("name", ["dscnn_u85_256", "dscnn_u85_512"])
def test_decoded_weights_are_the_tflite_models(name):
    leaf, convs = _after_dma(name)
    decoded = [u85_weights.weights(op, fast, leaf.macs, 8) for op, fast in convs]
    # Vela splits the first convolution's 64 output channels into operations of 16 and 48
    assert [w.shape[0] for w in decoded[:2]] == [16, 48]
    layers = [np.concatenate(decoded[:2])] + decoded[2:]
    expected = int8_kernels(MODEL)
    assert len(layers) == len(expected)
    for got, want in zip(layers, expected):
        np.testing.assert_array_equal(got, want)


def test_the_sparse_and_part_kernel_first_layout_is_read():
    _, convs = _after_dma("dscnn_u85_256")
    lay = u85_weights.layout(convs[0][0], 256, 8)
    assert (lay.traversal, lay.sparse, lay.stride, lay.ifm_block) == ("PART_KERNEL_FIRST", True, (2, 2), 16)
    assert u85_weights.layout(convs[2][0], 256, 8).traversal == "DEPTHWISE"


def test_scale_records_decode():
    _, convs = _after_dma("dscnn_u85_256")
    op, fast = convs[-1]  # the fully-connected layer: one multiplier and shift for all 12 channels
    bias, mult, shift = u85_weights.scales(op, fast, 12)
    assert set(mult.tolist()) == {1278221461} and set(shift.tolist()) == {38}
    assert bias[:3].tolist() == [-78, -16, -66]


def test_damaged_weight_stream_is_named_or_changes_the_weights():
    leaf, convs = _after_dma("dscnn_u85_256")
    op, fast = convs[3]
    base = op.r1["WEIGHT_BASE"]
    damaged = fast.copy()
    damaged[base + 40 : base + 60] ^= 0x5A
    try:
        got = u85_weights.weights(op, damaged, leaf.macs, 8)
    except NpuModelError as exc:
        assert "weight stream 0" in str(exc)
    else:
        assert not np.array_equal(got, u85_weights.weights(op, fast, leaf.macs, 8))


def test_a_stream_past_its_region_is_named():
    leaf, convs = _after_dma("dscnn_u85_256")
    op, fast = convs[0]
    with pytest.raises(NpuModelError, match="weight stream 0 .* runs past its region"):
        u85_weights.weights(op, fast[: op.r1["WEIGHT_BASE"] + 10], leaf.macs, 8)


@pytest.mark.parametrize("lay, streams", [
    (Layout((24, 3, 3, 1), (1, 1), (1, 1), 16, 1, 16, "DEPTHWISE", False, 8, 256), 1),
    (Layout((40, 5, 5, 1), (2, 2), (1, 1), 16, 1, 16, "DEPTHWISE", False, 8, 512), 2),
    (Layout((20, 3, 3, 24), (2, 2), (1, 1), 32, 16, 8, "PART_KERNEL_FIRST", False, 8, 256), 1),
    (Layout((20, 10, 4, 1), (2, 2), (1, 1), 32, 16, 8, "PART_KERNEL_FIRST", True, 8, 256), 1),
    (Layout((36, 9, 9, 3), (1, 1), (2, 2), 16, 16, 16, "PART_KERNEL_FIRST", False, 8, 512), 2),
    (Layout((70, 1, 1, 150), (1, 1), (1, 1), 32, 64, 8, "DEPTH_FIRST", False, 8, 256), 1),
    (Layout((64, 3, 3, 200), (1, 1), (1, 1), 64, 128, 16, "DEPTH_FIRST", True, 8, 512), 2),
    (Layout((130, 1, 1, 40), (1, 1), (1, 1), 64, 64, 32, "DEPTH_FIRST", False, 8, 1024), 4),
])
def test_every_weight_has_one_place_across_the_streams(lay, streams):
    places = np.concatenate([order(lay, s, streams) for s in range(streams)])
    held = places[places >= 0]
    assert np.array_equal(np.sort(held), np.arange(int(np.prod(lay.shape))))
