"""Input preprocessing folded into the first kernels before QAT (edgedeploy.keras.input_affine), on real tf_keras
models: the same function where the fold is exact, the layer left with its reason where it is not, and the int8
model of the quantization-aware twin without an elementwise operator over the input."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edgedeploy.keras.input_affine import fold_input_affine
from helpers import infer

SEED = 5


def _images(n=16):
    return np.random.default_rng(SEED).uniform(0, 255, (n, 12, 12, 3)).astype(np.float32)


def _front(keras, kind, inp):
    L = keras.layers
    if kind == "rescale":
        return L.Rescaling(1 / 255, name="pre")(inp)
    if kind == "offset":
        return L.Rescaling(1 / 127.5, offset=-1, name="pre")(inp)
    if kind == "norm":
        norm = L.Normalization(name="pre")
        norm.adapt(_images(64))
        return norm(inp)
    if kind == "chain":  # scaling, per-channel normalization and a batch norm, one after another
        h = L.Rescaling(1 / 255, name="pre")(inp)
        h = L.Normalization(mean=[0.5, 0.4, 0.3], variance=[0.04, 0.05, 0.06], name="pre2")(h)
        bn = L.BatchNormalization(name="pre3")
        out = bn(h)
        bn.set_weights([np.array([1.5, 0.5, 2.0]), np.array([0.1, -0.2, 0.3]), np.array([0.2, -0.1, 0.0]),
                        np.array([0.5, 2.0, 1.0])])
        return out
    raise AssertionError(kind)


def _model(keras, front, first):
    L = keras.layers
    inp = keras.Input((12, 12, 3))
    h = pre = _front(keras, front, inp)
    if first == "pad_conv":
        h = L.Conv2D(6, 3, strides=2, name="k")(L.ZeroPadding2D(1, name="zp")(h))
    elif first == "depthwise":
        h = L.DepthwiseConv2D(3, depth_multiplier=2, padding="valid", use_bias=False, name="k")(h)
    elif first == "dense":
        h = L.Dense(6, name="k")(L.Flatten(name="flat")(h))
    else:
        h = L.Conv2D(6, 3, strides=2, padding="same" if first == "output" else first, name="k")(h)
    h = L.ReLU()(h)
    if first != "dense":
        h = L.GlobalAveragePooling2D()(h)
    if first == "output":  # the scaled input is an output of its own too
        return keras.Model(inp, [L.Dense(4, name="head")(h), pre])
    return keras.Model(inp, L.Dense(4, name="head")(h))


@pytest.mark.parametrize("front,first,left", [
    ("rescale", "same", None),  # no offset: a padded border reads zero either way
    ("rescale", "pad_conv", None),
    ("rescale", "depthwise", None),
    ("rescale", "dense", None),
    ("offset", "valid", None),
    pytest.param("norm", "valid", None, marks=pytest.mark.slow),  # (an adapted Normalization folds: norm-depthwise)
    ("norm", "depthwise", None),
    ("chain", "valid", None),
    ("offset", "same", "k pads its input (padding 'same'), where the offset would be"),
    ("norm", "same", "k pads its input (padding 'same'), where the offset would be"),
    ("offset", "pad_conv", "zp pads with zeros where the offset would be"),
    ("norm", "dense", "flat moves the channels the scaling applies to"),
    ("rescale", "output", "its output is an output of the model"),
])
def test_the_fold_is_exact_or_left_with_its_reason(keras, front, first, left):
    keras.utils.set_random_seed(SEED)
    model = _model(keras, front, first)
    x = _images()
    folded, done, kept = fold_input_affine(model)
    names = [layer.name for layer in model.layers if layer.name.startswith("pre")]
    if left is None:
        assert set(done) == set(names) and all(into == ["k"] for into in done.values()) and kept == {}
        assert not any(layer.name.startswith("pre") for layer in folded.layers)
        assert not folded.get_layer("k").trainable and folded.get_layer("head").trainable
    else:  # at an image input the chain stays as one 1x1 depthwise convolution, which TFMOT can quantize
        assert done == {} and kept == {name: left + "; computed as one 1x1 depthwise convolution" for name in names}
        assert [(layer.name, layer.__class__.__name__) for layer in folded.layers if layer.name.startswith("pre")] \
            == [("pre", "DepthwiseConv2D")]
    outs = [infer(m, x) for m in (model, folded)]
    for want, got in (zip(*outs) if first == "output" else [outs]):  # (each output of the model)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))


def test_a_folded_qat_model_converts_without_an_operator_over_the_input(keras, tmp_path):
    """The quantization-aware twin of the folded model, trained a few steps, converts to the same operators as
    ptq (no MUL), its first convolution's int8 weights are not rounded away, and the layer folded into kept the
    weights it was given."""
    from edgedeploy.keras.qat_annotate import freeze_quantized, quantize_for_qat
    from edgedeploy.tflite.convert import convert_int8, convert_qat_int8
    from edgedeploy.tflite.reader import read_tflite, read_weight_tensors

    keras.utils.set_random_seed(SEED)
    model = _model(keras, "rescale", "same")
    x, y = _images(64), np.random.default_rng(SEED).normal(size=(64, 4)).astype(np.float32)
    folded, done, _ = fold_input_affine(model)
    before = folded.get_layer("k").get_weights()[0].copy()
    qat = quantize_for_qat(folded)
    assert freeze_quantized(qat, done["pre"]) == ["k"]
    assert "k/kernel:0" not in {w.name for w in qat.trainable_weights}
    qat.compile(keras.optimizers.Adam(1e-3), "mse")
    qat.fit(x, y, batch_size=16, epochs=1, verbose=0)
    after = next(w for w in qat.weights if w.name == "k/kernel:0").numpy()
    np.testing.assert_array_equal(after, before)
    assert not np.array_equal(next(w for w in qat.weights if w.name == "head/kernel:0").numpy(),
                              folded.get_layer("head").get_weights()[0])  # the rest trains

    def ops(data: bytes) -> list[str]:
        path = tmp_path / "m.tflite"
        path.write_bytes(data)
        return [o.op for o in read_tflite(path).operators]

    int8, _ = convert_qat_int8(qat, lambda: (x, "64 images"))
    assert ops(int8) == ops(convert_int8(model, x)) and "MUL" not in ops(int8)
    first = next(t for t in read_weight_tensors(tmp_path / "m.tflite") if t.op == "CONV_2D")
    assert np.count_nonzero(first.values()) > 0.9 * first.values().size


# one code path (the kept chain as a 1x1 depthwise convolution under QAT): a Normalization in the default run, a
# Rescaling with an offset in the slow run
@pytest.mark.parametrize("front", [pytest.param("offset", marks=pytest.mark.slow), "norm"])
def test_an_input_affine_left_before_a_padded_conv_converts_from_qat_without_cpu_operators(keras, tmp_path, front):
    """An offset that cannot be folded (the convolution pads its input) stays as a 1x1 depthwise convolution: the
    QAT model converts to int8 operators only, without the DEQUANTIZE/QUANTIZE pair a fake-quantized
    ``Rescaling``/``Normalization`` left at the input (which runs on the CPU), and computes what the float does."""
    from edgedeploy.keras.qat_annotate import quantize_for_qat
    from edgedeploy.tflite.convert import convert_qat_int8, tflite_predict
    from edgedeploy.tflite.interpreter import make_interpreter
    from edgedeploy.tflite.reader import read_tflite

    keras.utils.set_random_seed(SEED)
    model = _model(keras, front, "same")
    x = _images(64)
    folded, done, kept = fold_input_affine(model)
    assert done == {} and list(kept) == ["pre"]
    qat = quantize_for_qat(folded)
    qat.compile(keras.optimizers.Adam(1e-4), "mse")
    qat.fit(x, infer(model, x), batch_size=16, epochs=1, verbose=0)
    int8, _ = convert_qat_int8(qat, lambda: (x, "64 images"))
    path = tmp_path / "m.tflite"
    path.write_bytes(int8)
    ops = [o.op for o in read_tflite(path).operators]
    assert ops[:2] == ["DEPTHWISE_CONV_2D", "CONV_2D"], ops
    assert not {"DEQUANTIZE", "QUANTIZE", "MUL", "ADD", "SUB"} & set(ops), ops
    want = infer(model, x)
    scale, zero = make_interpreter(int8).get_output_details()[0]["quantization"]
    got = scale * (tflite_predict(int8, x).astype(np.float32) - zero)
    assert np.abs(got - want).max() < 0.2 * np.abs(want).max()  # int8 error; a dropped offset is far larger
