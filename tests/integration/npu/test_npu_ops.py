"""Small int8 models, one kind of operation each, converted here and compiled with Vela: the NPU model must give
TFLite's reference outputs (up-scaling, padded pooling, dilation, strided depthwise, lookup tables, MEAN, ABS)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from edgedeploy.cli.app import app
from helpers import write_int8_tflite

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
        "sigmoid_softmax": lambda x: L.Softmax()(L.Dense(5)(L.GlobalAveragePooling2D()(
            L.Activation("sigmoid")(L.Conv2D(8, 1)(x))))),
    }[name]


def _int8_model(name: str, path):
    from edgedeploy.keras import tfenv

    keras = tfenv.load().keras
    inp = keras.Input(SHAPE)
    return write_int8_tflite(keras.Model(inp, _zoo(name)(inp)), path)


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


# the transpose convolution converted once for both NPUs (Ethos-U85's elementwise, lookup and resize models below)
@pytest.mark.parametrize("name,targets", [("pool_same", ["ethos-u55-128"]),
                                          ("tconv", ["ethos-u55-128", "ethos-u85-256"])])
def test_upscaling_and_padded_pooling(name, targets, tmp_path):
    for doc in _verify(name, tmp_path, targets):
        assert doc["status"] == "bit-exact" and doc["exact_cases"] == 40, doc


@pytest.mark.slow
@pytest.mark.parametrize("name", ["add_mul", "dw_stride_dil", "lut_activations", "resize", "mean_dense", "abs_hswish"])
def test_operation_models_on_two_npus(name, tmp_path):
    for doc in _verify(name, tmp_path, ["ethos-u55-128", "ethos-u65-256"]):
        assert doc["status"] in ("bit-exact", "documented-difference"), doc
        assert doc["exact_cases"] + doc["documented_cases"] == 40


# 16x8 (int16 activations): each activation function after a convolution, converted with the tool's own 16x8
# converter. Vela 5.2 runs int16 SOFTMAX and EXP on interpolated 16-bit lookup tables, LeakyReLU as an elementwise
# LRELU, hard-swish (TFLite has no int16 HARD_SWISH kernel, so it stays ADD, relu6 and MUL) as elementwise
# operations, and LOGISTIC and TANH as a 1x1 AVERAGE pool with the NPU's SIGMOID and TANH functions.
SHAPE16 = (8, 8, 8)
MODELLED_16 = ["softmax", "exp", "leaky_relu", "hard_swish", "sigmoid", "tanh"]


def _zoo16(name: str):
    from edgedeploy.keras import tfenv

    t = tfenv.load()
    tf, L = t.tf, t.keras.layers
    return {
        "softmax": lambda x: L.Softmax()(L.Conv2D(8, 1)(x)),
        "exp": lambda x: L.Conv2D(8, 1)(tf.exp(L.Conv2D(8, 1)(x))),
        "leaky_relu": lambda x: L.LeakyReLU(0.1)(L.Conv2D(8, 1)(x)),
        "hard_swish": lambda x: L.Conv2D(8, 1)(tf.nn.relu6(x + 3.0) * x / 6.0),
        "sigmoid": lambda x: L.Activation("sigmoid")(L.Conv2D(8, 1)(x)),
        "tanh": lambda x: L.Activation("tanh")(L.Conv2D(8, 1)(x)),
    }[name]


def _compile16(name: str, tmp_path, targets: list[str]):
    from edgedeploy.keras import tfenv
    from edgedeploy.tflite.convert16 import convert_16x8

    keras = tfenv.load().keras
    inp = keras.Input(SHAPE16)
    calibration = np.random.default_rng(0).normal(size=(30,) + SHAPE16).astype(np.float32)
    model = tmp_path / f"{name}.tflite"
    model.write_bytes(convert_16x8(keras.Model(inp, _zoo16(name)(inp)), calibration))
    run = tmp_path / "run"
    args = [str(model), "-o", str(run), "--allow-cpu-ops"]
    for t in targets:
        args += ["-t", t]
    done = CliRunner().invoke(app, ["compile", *args])
    assert done.exit_code == 0, done.output
    return run


@pytest.mark.parametrize("name", MODELLED_16)
def test_int16_activation_functions_on_u55_and_u85(name, tmp_path):
    run = _compile16(name, tmp_path, ["ethos-u55-128", "ethos-u85-256"])  # one conversion, compiled for both
    docs = {}
    for target in ("ethos-u55-128", "ethos-u85-256"):
        result = CliRunner().invoke(app, ["verify", str(run), "-t", target, "-n", "40", "--json"])
        assert result.exit_code == 0, result.output
        docs[target] = doc = json.loads(result.stdout)
        assert doc["status"] == "bit-exact" and doc["exact_cases"] == 40, (target, doc)
    doc = docs["ethos-u55-128"]
    if name in ("softmax", "exp"):  # the interpolated tables are loaded into SHRAM
        assert doc["operations"]["DMA"] >= 1
    if name in ("sigmoid", "tanh"):
        assert doc["operations"] == {"CONV": 1, "POOL": 1}


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELLED_16)
def test_int16_activation_functions_on_u65(name, tmp_path):
    run = _compile16(name, tmp_path, ["ethos-u65-256"])
    result = CliRunner().invoke(app, ["verify", str(run), "-t", "ethos-u65-256", "-n", "40", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["status"] == "bit-exact"


def test_a_changed_16_bit_table_is_caught_and_named(tmp_path):
    from edgedeploy.npu.commands import decode
    from edgedeploy.npu.leaf_layout import read_leaf
    from edgedeploy.npu.machine import INTERNAL

    run = _compile16("softmax", tmp_path, ["ethos-u55-128"])
    (vela,) = run.glob("compile/*/ethos-u55-128/*_vela.tflite")
    leaf = read_leaf(vela)
    first_table = next(op for op in decode(leaf.commands) if op.kind == "DMA" and op.reg("DMA0_DST_REGION") & INTERNAL)
    start = first_table.reg32("DMA0_SRC") & ((1 << 40) - 1)
    data = bytearray(vela.read_bytes())
    at = data.find(leaf.weights[:64]) + start
    for i in range(at + 1024, at + 2048, 4):  # the upper half of the exp table: every base 64 steps up
        data[i] = (data[i] + 64) & 0xFF
    _rewrite(run, vela, bytes(data))
    result = CliRunner().invoke(app, ["verify", str(run), "-t", "ethos-u55-128", "-n", "40"])
    assert result.exit_code == 12, result.output
    assert "(ELEMENTWISE ADD, word" in result.output and "TFLite operator" in result.output
    assert "SOFTMAX" in result.output


def _rewrite(run, path, data: bytes) -> None:
    """Replace a compiled file and record its new digest, as if the compile had written it."""
    import hashlib

    path.write_bytes(data)
    manifest = json.loads((run / "manifest.json").read_text())
    rel = str(path.relative_to(run))
    for stage in manifest["stages"]:
        for out in stage["outputs"]:
            if out["path"] == rel:
                out["sha256"], out["bytes"] = hashlib.sha256(data).hexdigest(), len(data)
    (run / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize("name", ["conv_dw_pool", "dw_stride_dil", "avgpool_same"])
def test_u85_convolution_depthwise_and_pooling(name, tmp_path):
    docs = _verify(name, tmp_path, ["ethos-u85-128", "ethos-u85-256", "ethos-u85-512"])
    for doc in docs:
        assert doc["status"] == "bit-exact" and doc["exact_cases"] == 40, doc
        assert doc["operations"]["CONV"] == 1


@pytest.mark.parametrize("name", ["add_mul", "abs_hswish", "mean_dense", "lut_activations", "resize"])  # (tconv: above)
def test_u85_elementwise_chaining_lookup_tables_resize_and_transpose_convolution(name, tmp_path):
    (doc,) = _verify(name, tmp_path, ["ethos-u85-256"])
    # Dense is TFLite's FULLY_CONNECTED: within the documented rounding difference
    assert doc["status"] in (("bit-exact", "documented-difference") if name == "mean_dense" else ("bit-exact",)), doc
    assert doc["exact_cases"] + doc["documented_cases"] == 40


def _u85_activations(run) -> set[tuple[str, int]]:
    """(function, table) of every operation's activation in the run's one U85-256 leaf."""
    from edgedeploy.npu.commands import decode_for
    from edgedeploy.npu.leaf_layout import read_leaf
    from edgedeploy.npu.u85_commands import ACTIVATION

    (path,) = run.glob("compile/**/ethos-u85-256/*_vela.tflite")
    leaf = read_leaf(path)
    ops = decode_for(leaf.product, leaf.commands)
    return {(ACTIVATION[op.r0["ACTIVATION"] & 0x1F], (op.r0["ACTIVATION"] >> 5) & 0x7) for op in ops
            if "ACTIVATION" in op.r0}


def test_u85_int8_softmax_looks_up_its_32_bit_table_behind_a_sigmoid(tmp_path):
    # the sigmoid's 256-byte LUT_S8_S8 table takes slot 0, so the softmax's 1 KiB LUT_S8_S32 table goes to table 1
    (doc,) = _verify("sigmoid_softmax", tmp_path, ["ethos-u85-256"])
    assert {("LUT_S8_S8", 0), ("LUT_S8_S32", 1)} <= _u85_activations(tmp_path / "run")
    assert doc["status"] == "bit-exact" and doc["exact_cases"] == 40, doc
