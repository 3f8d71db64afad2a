"""The NPU model on recorded Vela raw output gives TFLite's reference outputs; damage is caught and named."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from edgedeploy.errors import NpuModelError
from edgedeploy.npu.commands import decode
from edgedeploy.npu.leaf_layout import read_leaf
from edgedeploy.npu.machine import run

DATA = Path(__file__).resolve().parents[2] / "data" / "npu"


def _cases(name: str):
    leaf = read_leaf(DATA / f"{name}_vela.npz")
    with np.load(DATA / f"{name}_cases.npz") as npz:
        return leaf, npz["x"], npz["y"]


@pytest.mark.parametrize("name", ["dscnn_u55_128", "resnet8_u65_256", "dscnn16x8_u55_128"])
def test_recorded_leaf_matches_tflite_reference(name):
    leaf, x, y = _cases(name)
    outs, trace = run(leaf, [x.reshape((x.shape[0],) + leaf.inputs[0].shape)])
    np.testing.assert_array_equal(outs[0].reshape(y.shape), y)
    assert sum(trace.counts().values()) == len(decode(leaf.commands))


def test_changed_zero_point_changes_outputs():
    leaf, x, y = _cases("dscnn_u55_128")
    words = list(leaf.commands)
    first = next(i for i, w in enumerate(words) if w & 0xFFFF == 0x109)  # NPU_SET_IFM_ZERO_POINT of the first conv
    words[first] = (words[first] & 0xFFFF) | (((words[first] >> 16) + 5) << 16)
    outs, _ = run(replace(leaf, commands=tuple(words)), [x.reshape((x.shape[0],) + leaf.inputs[0].shape)])
    assert not np.array_equal(outs[0].reshape(y.shape), y)


def test_damaged_weights_stop_or_change_outputs():
    leaf, x, y = _cases("dscnn_u55_128")
    weights = bytearray(leaf.weights)
    for i in range(1200, 1400):  # inside the first convolution's encoded weights
        weights[i] ^= 0xA5
    try:
        outs, _ = run(replace(leaf, weights=bytes(weights)), [x.reshape((x.shape[0],) + leaf.inputs[0].shape)])
    except NpuModelError as exc:
        assert "operation" in str(exc) and "weight stream" in str(exc)
    else:
        assert not np.array_equal(outs[0].reshape(y.shape), y)


def test_dma_past_its_region_is_named():
    leaf, x, _ = _cases("dscnn_u55_128")
    small = replace(leaf, weights=leaf.weights[:1000])
    with pytest.raises(NpuModelError, match=r"operation 0 \(DMA.*runs past a region"):
        run(small, [x.reshape((x.shape[0],) + leaf.inputs[0].shape)])


def test_unmodelled_activation_is_named():
    leaf, x, _ = _cases("dscnn_u55_128")
    words = list(leaf.commands)
    first = next(i for i, w in enumerate(words) if w & 0xFFFF == 0x125)  # NPU_SET_ACTIVATION
    words[first] = 0x125 | (3 << 16)  # TANH
    with pytest.raises(NpuModelError, match="activation TANH is not modelled"):
        run(replace(leaf, commands=tuple(words)), [x.reshape((x.shape[0],) + leaf.inputs[0].shape)])


def test_transport_answers_like_a_device():
    from edgedeploy.npu.transport import npu_transport

    device = npu_transport(DATA / "dscnn_u55_128_vela.npz")
    _, x, y = _cases("dscnn_u55_128")
    for case in range(3):
        out = device(x[case].tobytes())
        assert np.frombuffer(out, np.int8).tolist() == y[case].ravel().tolist()
    with pytest.raises(ValueError, match="takes 490"):
        device(b"\0" * 10)
