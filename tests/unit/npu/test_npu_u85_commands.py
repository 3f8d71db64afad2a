"""The Ethos-U85 command stream of recorded Vela raw output: decoded into operations and described; not executed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edgedeploy.errors import NpuModelError
from edgedeploy.npu import u85_commands
from edgedeploy.npu.u85_describe import describe
from edgedeploy.npu.commands import counts, decode, decode_for
from edgedeploy.npu.leaf import read_leaf
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


def test_running_a_u85_leaf_stops_at_its_first_operation(leaf):
    with np.load(DATA / "dscnn_u85_256_cases.npz") as npz:
        x = npz["x"]
    with pytest.raises(NpuModelError, match=r"operation 0 \(DMA, word 9\) on ethos-u85-256: .*not executed"):
        run(leaf, [x.reshape((x.shape[0],) + leaf.inputs[0].shape)])
    with pytest.raises(NpuModelError, match="not executed"):
        npu_transport(LEAF)
