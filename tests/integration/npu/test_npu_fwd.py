"""Ethos-U85 weights in the fast weight format (FWD): a small int8 network of dense random convolution weights,
which Vela 5.2 writes in FWD for the U85, runs on the NPU model bit for bit as on TFLite's reference kernels."""

from __future__ import annotations

import json

from helpers import invoke_cli as cli, write_int8_tflite

SHAPE = (12, 12, 8)
U85 = "ethos-u85-256"


def _dense_convs(path):
    """Two 3x3 convolutions of uniform random weights (little for the standard format to compress) and a head."""
    from edgedeploy.keras import tfenv

    keras = tfenv.load().keras
    L = keras.layers
    init = keras.initializers.RandomUniform(-0.3, 0.3, seed=3)
    inp = keras.Input(SHAPE)
    x = L.Conv2D(32, 3, padding="same", activation="relu", kernel_initializer=init)(inp)
    x = L.Conv2D(32, 3, strides=2, padding="same", kernel_initializer=init)(x)
    return write_int8_tflite(keras.Model(inp, L.Dense(6)(L.GlobalAveragePooling2D()(x))), path, seed=3)


def _weight_formats(vela_model) -> list[int]:
    from edgedeploy.npu.commands import decode_for
    from edgedeploy.npu.leaf_layout import read_leaf

    leaf = read_leaf(vela_model)
    ops = decode_for(leaf.product, leaf.commands, "leaf")
    return [op.r0.get("WEIGHT_FORMAT", 0) for op in ops if op.kind == "CONV"]


def test_fast_format_weights_are_bit_exact(tmp_path):
    model = _dense_convs(tmp_path / "dense_convs.tflite")
    run = tmp_path / "run"
    result = cli("compile", model, "-t", U85, "-o", run)
    assert result.exit_code == 0, result.output
    formats = _weight_formats(run / "compile" / "dense_convs" / U85 / "model_int8_vela.tflite")
    assert any(f & 1 for f in formats), formats  # the model exercises FWD, not only the standard format
    result = cli("verify", run, "-t", U85, "-n", 40, "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["status"] == "bit-exact" and doc["exact_cases"] == 40 and doc["npu"] == U85
