"""The Ethos-U85 command stream of recorded Vela raw output: decoded into operations, described, and run to
TFLite's reference outputs."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from edgedeploy.errors import NpuModelError
from edgedeploy.npu import u85_commands
from edgedeploy.npu.commands import counts, decode, decode_for
from edgedeploy.npu.u85_describe import describe
from edgedeploy.npu.leaf_layout import read_leaf
from edgedeploy.npu.machine import run
from edgedeploy.npu.transport import npu_transport

DATA = Path(__file__).resolve().parents[2] / "data" / "npu"
LEAF = DATA / "dscnn_u85_256_vela.npz"


@pytest.fixture(scope="module")
def leaf():
    return read_leaf(LEAF)


@pytest.fixture(scope="module")
def ops(leaf):
    return decode_for(leaf.product, leaf.commands, str(LEAF))


def test_u85_leaf_is_read_as_the_driver_sees_it(leaf):
    assert leaf.product == u85_commands.PRODUCT and leaf.npu == "ethos-u85-256"
    assert leaf.inputs[0].shape == (1, 49, 10, 1) and leaf.outputs[0].nbytes == 12


def test_u85_stream_has_the_operations_vela_emits(ops):
    # Vela 5.2's U85 stream for DS-CNN: the convolutions and pooling of the U55's, and 25 elementwise operations
    # (the U55's has 26)
    assert counts(ops) == {"DMA": 12, "CONV": 7, "DEPTHWISE": 4, "POOL": 3, "ELEMENTWISE": 25}
    assert all(op.registers is u85_commands.registers() for op in ops)
    assert [op.sub_op for op in ops if op.kind == "POOL"] == ["SUM", "MAX", "REDUCE_SUM"]


def test_the_u55_register_set_does_not_read_a_u85_stream(leaf):
    with pytest.raises(NpuModelError, match=r"word \d+ is an unknown"):
        decode(leaf.commands, str(LEAF))


@pytest.mark.parametrize("index, field, expected", [
    (1, ("kernel", "shape"), [10, 4]),
    (1, ("kernel", "stride"), [2, 2]),
    (1, ("kernel", "padding"), [4, 1, 5, 1]),
    (1, ("ifm", "shape"), [49, 10, 1]),
    (1, ("ifm", "zero_point"), 83),
    (1, ("ofm", "shape"), [25, 5, 16]),
    (1, ("ofm", "zero_point"), -128),
    (1, ("ofm", "format"), "NHCWB16"),
    (1, ("weights", "order"), "PART_KERNEL_FIRST"),
    (1, ("weights", "sparsity"), "2:4"),  # Vela chose the 2:4 sparse format for this layer
    (5, ("kernel", "shape"), [3, 3]),
    (5, ("weights", "sparsity"), "NONE"),
    (5, ("weights", "format"), "STANDARD"),
    (7, ("kernel", "shape"), [1, 1]),
    (7, ("ofm_scale", "rounding"), "DOUBLE_SYMMETRIC"),
    (20, ("kernel", "shape"), [25, 5]),  # the average pool: a SUM over the whole map, divided by OFM_SCALE
    (20, ("ofm_scale", "rounding"), "NATURAL"),
    (20, ("ofm", "scale"), "GLOBAL"),
    (22, ("ofm", "shape"), [1, 1, 12]),  # the fully-connected layer
    (22, ("ofm", "zero_point"), 14),
    (25, ("activation", "function"), "LUT_S8_S32"),  # softmax's exponent table
    (30, ("ofm", "storage"), "CHAINED"),  # an OFM passed to the next operation
])
def test_operation_descriptions_follow_the_registers(ops, index, field, expected):
    value = describe(ops[index])
    for key in field:
        value = value[key]
    assert value == expected


def test_ofm_scale_fields_come_from_the_payload_and_the_parameter(ops):
    scale = describe(ops[1])["ofm_scale"]
    assert scale["scale"] == 1359514674 and scale["shift"] == 37


def test_weight_streams_lie_inside_the_weights(leaf, ops):
    for op in ops:
        if op.kind in ("CONV", "DEPTHWISE"):
            streams = describe(op)["weights"]["streams"]
            assert streams and all(0 <= base and base + n <= len(leaf.weights) for base, n in streams)


def test_a_branch_is_named(leaf):
    words = list(leaf.commands)
    words[0:0] = [0x4000 | 256, 0]  # NPU_OP_BRANCH with its payload word
    with pytest.raises(NpuModelError, match="word 0 is NPU_OP_BRANCH, which is not modelled"):
        decode_for(leaf.product, words, "test")


@pytest.mark.parametrize("name", ["dscnn_u85_256", "dscnn_u85_512"])
def test_recorded_u85_leaf_matches_tflite_reference(name):
    leaf = read_leaf(DATA / f"{name}_vela.npz")
    with np.load(DATA / f"{name}_cases.npz") as npz:
        x, y = npz["x"], npz["y"]
    outs, trace = run(leaf, [x.reshape((x.shape[0],) + leaf.inputs[0].shape)])
    np.testing.assert_array_equal(outs[0].reshape(y.shape), y)
    assert trace.counts()["ELEMENTWISE MUL"] == 11  # softmax: chained 32-bit products


def test_the_transport_runs_a_u85_leaf(leaf):
    with np.load(DATA / "dscnn_u85_256_cases.npz") as npz:
        x, y = npz["x"], npz["y"]
    device = npu_transport(LEAF)
    assert device(x[0].astype(np.int8).tobytes()) == y[0].astype(np.int8).tobytes()


def test_an_operation_not_modelled_stops_the_stream_before_it_runs(leaf):
    words = list(leaf.commands)
    ops = decode_for(leaf.product, words, "test")
    resize = ops[5].word  # the first depthwise convolution made a BILINEAR RESIZE
    words[resize] = 7
    with np.load(DATA / "dscnn_u85_256_cases.npz") as npz:
        x = npz["x"]
    with pytest.raises(NpuModelError, match=r"operation 5 \(RESIZE, word 150\) on ethos-u85-256: BILINEAR and "
                                            r"REPLICATE resize are not modelled"):
        run(replace(leaf, commands=tuple(words)), [x.reshape((x.shape[0],) + leaf.inputs[0].shape)])


def _u85_run_to(leaf, x, last: int):
    """Run the U85 stream's operations up to ``last`` on the recorded inputs; the OFM of ``last``."""
    from edgedeploy.npu import machine, u85_ops
    from edgedeploy.npu.featuremap import feature_map, read
    from edgedeploy.npu.ops import ofm_shape

    ops = decode_for(leaf.product, leaf.commands, str(LEAF))
    regions = machine._regions(leaf, x.shape[0])
    t = leaf.inputs[0]
    regions[t.region][:, t.address : t.address + t.nbytes] = x.astype(np.int8).view(np.uint8).reshape(x.shape[0], -1)
    for op in ops[: last + 1]:
        u85_ops.execute(op, regions.__getitem__, leaf.macs, {})
    fm = feature_map(ops[last], "OFM")
    return read(regions[fm.region], fm, ofm_shape(ops[last]), ops[last].title)


def test_u85_convolutions_and_pooling_give_the_u55_models_logits(leaf):
    # the U55 model of the same network is bit-exact against TFLite; up to the fully-connected layer (operation 22
    # on the U85, 21 on the U55) the two NPUs' streams must compute the same values
    from edgedeploy.npu.featuremap import feature_map, read
    from edgedeploy.npu.ops import ofm_shape

    with np.load(DATA / "dscnn_u85_256_cases.npz") as npz:
        x = npz["x"]
    u55 = read_leaf(DATA / "dscnn_u55_128_vela.npz")
    logits = {}

    def keep(op, memory):
        if op.kind == "CONV" and ofm_shape(op) == (1, 1, 12):
            fm = feature_map(op, "OFM")
            logits["u55"] = read(memory(fm.region), fm, ofm_shape(op), op.title)

    run(u55, [x.reshape((x.shape[0],) + u55.inputs[0].shape)], on_op=keep)
    u85 = _u85_run_to(leaf, x, 22)
    assert u85.shape == logits["u55"].shape == (x.shape[0], 1, 1, 12)
    np.testing.assert_array_equal(u85, logits["u55"])
    assert len(np.unique(u85)) > 12  # not a constant output
