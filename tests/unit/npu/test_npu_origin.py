"""Each operation of a recorded Vela command stream mapped back, through Vela's recorded debug database, to the
TFLite operator it compiles (the MLPerf DS-CNN on Ethos-U55-128, tests/data/palette/SOURCE.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgedeploy.npu.commands import decode
from edgedeploy.npu.leaf_layout import read_leaf
from edgedeploy.npu.origin import describe, keras_layers, origins
from edgedeploy.tflite.reader import read_tflite
from edgedeploy.vela.debugdb import parse_debug_db

TESTS = Path(__file__).resolve().parents[2]
PALETTE = TESTS / "data" / "palette"
INT8 = TESTS.parent / "examples" / "kws" / "dscnn_mlperf_int8.tflite"


@pytest.fixture(scope="module")
def mapped():
    tables = parse_debug_db((PALETTE / "dscnn_u55_128_debug.xml").read_text(encoding="utf-8"))
    operators = read_tflite(INT8).operators
    ops = decode(read_leaf(PALETTE / "dscnn_u55_128_vela.tflite").commands)
    return ops, operators, origins(tables, operators)


def test_every_npu_operation_but_dma_is_mapped_to_a_tflite_operator(mapped):
    ops, _, found = mapped
    npu_ops = [op for op in ops if op.kind != "DMA"]
    assert len(npu_ops) == 40
    assert all(4 * op.word in found for op in npu_ops)
    assert not any(4 * op.word in found for op in ops if op.kind == "DMA")


def test_convolutions_map_to_the_tflite_operators_they_compile_in_order(mapped):
    ops, operators, found = mapped
    kinds = {"CONV": ("CONV_2D", "FULLY_CONNECTED"), "DEPTHWISE": ("DEPTHWISE_CONV_2D",)}
    indices = []
    for op in ops:
        if op.kind in kinds:
            origin = found[4 * op.word]
            assert origin["tflite_operator"] in kinds[op.kind], (op.title, origin)
            assert origin["tflite_output"] == operators[origin["tflite_operator_index"]].output_name
            indices.append(origin["tflite_operator_index"])
    # the first convolution is the model's first operator; the stream follows the graph's order
    assert indices[0] == 0 and indices == sorted(indices)
    # the DS-CNN's 5 standard and 4 depthwise convolutions and its classifier, each compiled (the first one in
    # two NPU operations: Vela splits its output depth)
    assert len(set(indices)) == 10


def test_keras_layers_come_from_the_path_after_the_model_scope():
    name = ("functional_1/activation/Relu;functional_1/batch_normalization/FusedBatchNormV3;"
            "functional_1/quant_conv2d/BiasAdd;functional_1/conv2d/Conv2D1")
    assert keras_layers(name) == ["activation", "batch_normalization", "conv2d"]
    assert keras_layers("Identity") == [] and keras_layers("serving_default_t:0") == []


def test_a_message_names_the_operator_and_layers():
    origin = {"tflite_operator_index": 2, "tflite_operator": "CONV_2D", "tflite_output": "m/conv2d_1/Conv2D",
              "keras_layers": ["conv2d_1"]}
    assert describe(origin) == "TFLite operator 2 CONV_2D 'm/conv2d_1/Conv2D' (its tensor names Keras layer conv2d_1)"


def test_rows_that_point_nowhere_are_left_out():
    operators = read_tflite(INT8).operators
    tables = {"queue": [{"offset": "8", "optimised_id": "1"}, {"offset": "12", "optimised_id": "9"},
                        {"offset": "x", "optimised_id": "1"}],
              "optimised": [{"id": "1", "source_id": "1", "operator": "Conv2D"}],
              "source": [{"id": "1", "ext_key": str(len(operators))}]}
    assert origins(tables, operators) == {}
    tables["source"] = [{"id": "1", "ext_key": "0"}]
    assert list(origins(tables, operators)) == [8]
