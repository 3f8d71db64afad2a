"""The flatbuffer reader: real models read correctly; bad files give one-line errors."""

from __future__ import annotations

import pytest

from edgedeploy.errors import InvalidInputError
from edgedeploy.tflite.reader import check_int8_model, read_tflite, require_integer_model

pytestmark = pytest.mark.requires_data


def test_reads_mlperf_dscnn(dscnn_int8):
    m = read_tflite(dscnn_int8)
    assert m.size == dscnn_int8.stat().st_size
    (inp,) = m.inputs
    assert inp.shape == (1, 49, 10, 1) and inp.dtype == "int8"
    assert inp.scale == pytest.approx((0.5847029089927673,)) and inp.zero_point == (83,)
    assert m.outputs[0].dtype == "int8" and m.outputs[0].shape == (1, 12)
    assert m.op_counts == {"CONV_2D": 5, "DEPTHWISE_CONV_2D": 4, "AVERAGE_POOL_2D": 1, "RESHAPE": 1,
                           "FULLY_CONNECTED": 1, "SOFTMAX": 1}
    assert m.is_integer()
    require_integer_model(m)


@pytest.mark.requires_data("kws/ds_cnn_s_arm_int8.tflite")
def test_float_io_with_int8_inside_is_accepted(shared_data):
    m = read_tflite(shared_data / "kws" / "ds_cnn_s_arm_int8.tflite")
    assert m.inputs[0].dtype == "float32"
    assert m.op_counts["QUANTIZE"] == 1 and m.op_counts["DEQUANTIZE"] == 1
    assert m.is_integer()


def _copy(src, dst, data: bytes | None = None):
    dst.write_bytes(src.read_bytes() if data is None else data)
    return dst


def test_missing_file(tmp_path):
    with pytest.raises(InvalidInputError, match="does not exist"):
        read_tflite(tmp_path / "nope.tflite")


def test_empty_file(tmp_path):
    with pytest.raises(InvalidInputError, match="is empty"):
        read_tflite(_copy(None, tmp_path / "e.tflite", b""))


def test_not_a_tflite_file(tmp_path, shared_data):
    path = _copy(shared_data / "kws" / "dscnn_mlperf_float.h5", tmp_path / "model.tflite")
    with pytest.raises(InvalidInputError) as err:
        read_tflite(path)
    assert "not a TFLite flatbuffer" in err.value.one_line() and str(path) in err.value.one_line()


@pytest.mark.parametrize("keep", [0.5, 0.9, 0.99])
def test_truncated_file(tmp_path, dscnn_int8, keep):
    data = dscnn_int8.read_bytes()
    path = _copy(None, tmp_path / "cut.tflite", data[: int(len(data) * keep)])
    with pytest.raises(InvalidInputError, match="truncated|corrupt"):
        read_tflite(path)


def test_vela_output_is_refused_as_compile_input(tmp_path, shared_data):
    # A Vela-compiled model holds one ethos-u custom operator.
    from edgedeploy.tflite.reader import OP_CUSTOM

    m = read_tflite(shared_data / "kws" / "dscnn_mlperf_int8.tflite")
    assert not m.has_ethos_u_op() and OP_CUSTOM == 32


def test_check_int8_model_raises_picklable_error(tmp_path):
    import pickle

    with pytest.raises(InvalidInputError) as err:
        check_int8_model(str(tmp_path / "missing.tflite"))
    again = pickle.loads(pickle.dumps(err.value))
    assert again.one_line() == err.value.one_line() and again.hint


def test_bias_scales_match_the_scales_their_operators_compute_with(dscnn_int8):
    """The int8 kernels add a bias in units of input scale x weight scale; MLPerf's own DS-CNN keeps that for
    each of its 5 convolutions, 4 depthwise ones and the fully-connected head. A bias quantized for another
    input scale is read as such; a bias of zeros adds nothing whatever its scale."""
    from dataclasses import replace

    model = read_tflite(dscnn_int8)
    ops = [o for o in model.operators if o.bias_scale_ratio() is not None]
    assert len(ops) == 10 and all(o.bias_scale_ratio() == pytest.approx(1.0, abs=1e-4) for o in ops)
    assert model.misbiased_operators() == []
    head = next(o for o in ops if o.op == "FULLY_CONNECTED")
    inp, weights, bias = head.input_scales
    halved = replace(head, input_scales=(inp, weights, tuple(b / 2 for b in bias)))
    assert halved.bias_scale_ratio() == pytest.approx(0.5, abs=1e-4)
    edited = replace(model, operators=tuple(halved if o is head else o for o in model.operators))
    assert [(o.op, round(r, 3)) for o, r in edited.misbiased_operators()] == [("FULLY_CONNECTED", 0.5)]
    assert replace(halved, zero_bias=True).bias_scale_ratio() is None


def test_bias_operator_codes_are_the_schema_s():
    """BIAS_OPS names operators by BuiltinOperator code so that scales are read without the schema package."""
    import tflite

    from edgedeploy.tflite.reader import BIAS_OPS

    assert {c: n for c, n in BIAS_OPS.items()} == {getattr(tflite.BuiltinOperator, n): n for n in BIAS_OPS.values()}


def test_misbiased_descriptions_of_a_clean_model_are_empty(dscnn_int8):
    """What a Vela worker computes for compile's warnings: nothing for MLPerf's DS-CNN."""
    from edgedeploy.tflite.reader import misbiased_descriptions

    assert misbiased_descriptions(str(dscnn_int8)) == []
