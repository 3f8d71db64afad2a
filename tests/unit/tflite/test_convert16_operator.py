"""The operator named when TFLite's 16x8 conversion refuses a model, read from the converter's own message."""

from edgedeploy.tflite.convert16 import _failed_operator


def test_the_converters_op_colon_message_names_the_operator():
    # TF 2.21's words for a tf_keras LSTM converted with 16x8 activations
    msg = "Quantization to 16x8-bit not yet supported for op: 'UNIDIRECTIONAL_SEQUENCE_LSTM'.\n"
    assert _failed_operator(msg) == "UNIDIRECTIONAL_SEQUENCE_LSTM"


def test_mlir_operation_names_still_match():
    assert _failed_operator("'tfl.custom' op is neither a custom op nor a flex op") == "tfl.custom"
