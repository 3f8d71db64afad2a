"""Small int8 models, one kind of operation each, converted here and compiled with Vela: the NPU model must give
TFLite's reference outputs (up-scaling, padded pooling, dilation, strided depthwise, lookup tables, MEAN, ABS)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from edgedeploy.cli.app import app

SHAPE = (16, 16, 8)


def _zoo(name: str):
    from edgedeploy.keras import tfenv

    t = tfenv.load()
    tf, L = t.tf, t.keras.layers

    def two_convs(x):
        return L.Add()([L.Conv2D(8, 3, padding="same")(x), L.Conv2D(8, 1)(x)])

    return {
        "add_mul": lambda x: L.Multiply()([two_convs(x), L.Conv2D(8, 1)(x)]),
        "pool_same": lambda x: L.Concatenate()([L.AveragePooling2D(3, 1, padding="same")(x),
                                                L.MaxPooling2D(3, 2, padding="same")(L.UpSampling2D()(x))]),
        "dw_stride_dil": lambda x: L.Conv2D(16, 3, dilation_rate=2, padding="same")(
            L.DepthwiseConv2D(3, strides=2, padding="same")(x)),
        "lut_activations": lambda x: L.Concatenate()([L.Activation("tanh")(L.Conv2D(8, 1)(x)),
                                                      L.Activation("sigmoid")(L.Conv2D(8, 1)(x)),
                                                      L.LeakyReLU(0.1)(L.Conv2D(8, 1)(x))]),
        "resize": lambda x: L.Conv2D(4, 1)(tf.image.resize(x, (32, 32), method="nearest")),
        "tconv": lambda x: L.Conv2DTranspose(8, 3, strides=2, padding="same")(x),
        "mean_dense": lambda x: L.Dense(5)(L.GlobalAveragePooling2D()(L.Conv2D(24, 3, strides=2)(x))),
        "conv_dw_pool": lambda x: L.MaxPooling2D(2)(L.AveragePooling2D(2)(L.DepthwiseConv2D(3, padding="same")(
            L.Conv2D(16, 3, strides=2, padding="same", activation="relu")(x)))),
        "avgpool_same": lambda x: L.AveragePooling2D(3, 1, padding="same")(L.Conv2D(8, 1)(x)),
        "abs_hswish": lambda x: L.Conv2D(8, 1)(tf.abs(L.Conv2D(8, 1)(x)) - tf.nn.relu6(x + 3.0) * x / 6.0),
    }[name]


def _int8_model(name: str, path):
    from edgedeploy.keras import tfenv
    from edgedeploy.tflite.convert import function_converter

    t = tfenv.load()
    tf, keras = t.tf, t.keras
    rng = np.random.default_rng(0)
    inp = keras.Input(SHAPE)
    model = keras.Model(inp, _zoo(name)(inp))
    conv = function_converter(model)
    conv.optimizations = [tf.lite.Optimize.DEFAULT]
    conv.representative_dataset = lambda: ([rng.normal(size=(1,) + SHAPE).astype(np.float32)] for _ in range(30))
    conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    conv.inference_input_type = conv.inference_output_type = tf.int8
    path.write_bytes(conv.convert())
    return path


def _verify(name: str, tmp_path, targets: list[str]) -> list[dict]:
    model = _int8_model(name, tmp_path / f"{name}.tflite")
    run = tmp_path / "run"
    args = [str(model), "-o", str(run), "--allow-cpu-ops"]
    for t in targets:
        args += ["-t", t]
    done = CliRunner().invoke(app, ["compile", *args])
    assert done.exit_code == 0, done.output
    docs = []
    for t in targets:
        result = CliRunner().invoke(app, ["verify", str(run), "-t", t, "-n", "40", "--json"])
        assert result.exit_code == 0, result.output
        docs.append(json.loads(result.stdout))
    return docs


@pytest.mark.parametrize("name", ["pool_same", "tconv"])
def test_upscaling_and_padded_pooling(name, tmp_path):
    (doc,) = _verify(name, tmp_path, ["ethos-u55-128"])
    assert doc["status"] == "bit-exact" and doc["exact_cases"] == 40


@pytest.mark.slow
@pytest.mark.parametrize("name", ["add_mul", "dw_stride_dil", "lut_activations", "resize", "mean_dense", "abs_hswish"])
def test_operation_models_on_two_npus(name, tmp_path):
    for doc in _verify(name, tmp_path, ["ethos-u55-128", "ethos-u65-256"]):
        assert doc["status"] in ("bit-exact", "documented-difference"), doc
        assert doc["exact_cases"] + doc["documented_cases"] == 40


@pytest.mark.parametrize("name", ["conv_dw_pool", "dw_stride_dil", "avgpool_same"])
def test_u85_convolution_depthwise_and_pooling(name, tmp_path):
    docs = _verify(name, tmp_path, ["ethos-u85-128", "ethos-u85-256", "ethos-u85-512"])
    for doc in docs:
        assert doc["status"] == "bit-exact" and doc["exact_cases"] == 40, doc
        assert doc["operations"]["CONV"] == 1


@pytest.mark.parametrize("name", ["add_mul", "abs_hswish", "mean_dense", "tconv", "lut_activations", "resize"])
def test_u85_elementwise_chaining_lookup_tables_resize_and_transpose_convolution(name, tmp_path):
    (doc,) = _verify(name, tmp_path, ["ethos-u85-256"])
    # Dense is TFLite's FULLY_CONNECTED: within the documented rounding difference
    assert doc["status"] in (("bit-exact", "documented-difference") if name == "mean_dense" else ("bit-exact",)), doc
    assert doc["exact_cases"] + doc["documented_cases"] == 40
