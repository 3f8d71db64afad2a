"""Keras model helpers on real tf_keras models: loading, the separate-ReLU fix and kernel statistics."""

from __future__ import annotations

import logging
import re

import numpy as np
import pytest

from edgedeploy.keras.rewrites import fuse_separate_relu, separate_relu_layers
from edgedeploy.keras.model import keras_weight_stats, load_model
from helpers import infer
from zoo import settle_batch_norm


def test_separate_relu_is_folded_into_the_layer(keras):
    keras.utils.set_random_seed(3)
    inp = keras.Input((8, 8, 3))
    x = keras.layers.Conv2D(4, 3, name="c1")(inp)
    x = keras.layers.ReLU(name="r1")(x)
    x = keras.layers.Conv2D(4, 3, name="c2")(x)
    x = keras.layers.BatchNormalization(name="bn")(x)
    x = keras.layers.ReLU(name="r2")(x)  # after BN: QAT handles Conv->BN->ReLU, nothing to fold
    x = keras.layers.Flatten()(x)
    x = keras.layers.Dense(5, name="d")(x)
    out = keras.layers.Activation("relu", name="a")(x)
    model = keras.Model(inp, out)
    assert separate_relu_layers(model) == ["c1", "d"]
    fused, names = fuse_separate_relu(model)
    assert names == ["c1", "d"]
    assert [l.name for l in fused.layers if l.name in ("r1", "a")] == []
    assert fused.get_layer("c1").activation.__name__ == "relu"
    x = np.random.default_rng(0).normal(size=(4, 8, 8, 3)).astype("float32")
    np.testing.assert_allclose(infer(fused, x), infer(model, x), rtol=1e-6, atol=1e-6)
    assert separate_relu_layers(fused) == []


def test_a_sequential_model_loads_as_the_same_functional_model(keras, tmp_path):
    """Folding batch norms, fusing ReLUs and TFMOT's Conv + BatchNorm patterns need a functional graph."""
    from edgedeploy.optimize.palette.models import fold_batch_norm

    keras.utils.set_random_seed(5)
    layers = keras.layers
    model = keras.Sequential([
        layers.InputLayer((12, 10, 1)), layers.Conv2D(8, 3, use_bias=False, name="c1"),
        layers.BatchNormalization(name="bn1"), layers.ReLU(name="r1"), layers.DepthwiseConv2D(3, name="dw"),
        layers.BatchNormalization(name="bn2"), layers.ReLU(name="r2"), layers.GlobalAveragePooling2D(),
        layers.Dense(4, activation="softmax", name="d")])
    x = np.random.default_rng(0).normal(size=(16, 12, 10, 1)).astype("float32")
    settle_batch_norm(model, x)  # moving statistics away from 0 / 1
    model.save(tmp_path / "seq.h5")
    loaded, _ = load_model(tmp_path / "seq.h5")
    assert loaded.__class__.__name__ == "Functional"
    assert [l.name for l in loaded.layers[1:]] == [l.name for l in model.layers]
    np.testing.assert_allclose(infer(loaded, x), infer(model, x), rtol=1e-6, atol=1e-6)
    folded, factors = fold_batch_norm(loaded)
    assert sorted(factors) == ["c1", "dw"]
    np.testing.assert_allclose(infer(folded, x), infer(model, x), atol=1e-5)
    assert fuse_separate_relu(folded)[1] == ["c1", "dw"]


@pytest.mark.requires_data
def test_kernel_stats_of_the_real_dscnn(keras, shared_data):
    model = keras.models.load_model(shared_data / "kws" / "dscnn_mlperf_float.h5", compile=False)
    found = {s.layer: s for s in keras_weight_stats(model)}
    assert sorted({s.kind for s in found.values()}) == ["Conv2D", "Dense", "DepthwiseConv2D"]
    assert len(found) == 10
    assert found["conv2d"].shape == (10, 4, 1, 64) and found["conv2d"].channels == 64
    assert found["depthwise_conv2d"].channels == 64 and found["dense"].channels == 12
    assert all(s.sparsity < 0.05 for s in found.values())  # a dense, unpruned model
    assert separate_relu_layers(model) == []  # Conv -> BN -> Activation everywhere


@pytest.mark.requires_data("kws/ds_cnn_s_arm_float.h5", "kws/speech_commands_v2_test_mfcc_arm.npz")
def test_qat_builds_around_layers_tfmot_cannot_quantize(keras, shared_data):
    """Arm's DS-CNN-S reshapes with `tf.reshape` (TFOpLambda), which TFMOT's QAT registry refuses."""
    from edgedeploy.keras import tfenv
    from edgedeploy.keras.qat_annotate import quantize_for_qat, unsupported_for_qat

    model = keras.models.load_model(shared_data / "kws" / "ds_cnn_s_arm_float.h5", compile=False)
    assert unsupported_for_qat(model) == ["tf.reshape", "tf.reshape_1"]
    with pytest.raises(RuntimeError, match="TFOpLambda"):
        tfenv.load().tfmot.quantization.keras.quantize_model(model)
    qat = quantize_for_qat(model)
    # every conv, depthwise and dense layer is quantization-aware; the batch norms were folded into them
    wrapped = [layer.layer.__class__.__name__ for layer in qat.layers if hasattr(layer, "quantize_config")]
    # the reshapes only move values: no quantizer of their own (their int8 output keeps the input's scale)
    assert {type(layer.quantize_config).__name__ for layer in qat.layers
            if getattr(layer, "layer", None) is not None and layer.layer.name.startswith("tf.reshape")} == {
        "NoOpQuantizeConfig"}
    assert wrapped.count("Conv2D") == 5 and wrapped.count("DepthwiseConv2D") == 4 and "Dense" in wrapped
    d = np.load(shared_data / "kws" / "speech_commands_v2_test_mfcc_arm.npz")
    samples, labels, split = d["x"], d["y"], d["split"]  # (each read of an npz key reads the file again)
    fit, ev = split == 0, split == 1
    # whole batches of 64 (a last, smaller one would trace the train step once more)
    x_fit, y_fit = samples[fit][::6][:448].astype(np.float32), labels[fit][::6][:448]
    x = samples[ev][::4].astype(np.float32)
    # one epoch at a tiny learning rate sets the fake-quantization ranges and hardly moves the weights:
    # the QAT model then decides (almost) as the float model does
    qat.compile(optimizer=keras.optimizers.Adam(1e-6), loss="sparse_categorical_crossentropy")
    qat.fit(x_fit, y_fit, batch_size=64, epochs=1, verbose=0, shuffle=False)
    float_pred = infer(model, x).argmax(-1)
    qat_pred = infer(qat, x).argmax(-1)
    agreement = np.mean(float_pred == qat_pred)
    assert agreement > 0.9


def test_qat_builds_and_converts_around_batch_norms_tfmot_cannot_fold(keras):
    """TFMOT folds a batch norm only into one linear Conv2D/DepthwiseConv2D/Dense before it; any other batch norm
    (here after a SeparableConv2D, a Conv2D with its own ReLU, and an Add) makes quantize_apply refuse the model."""
    from edgedeploy.keras.qat_annotate import quantize_for_qat, unsupported_for_qat

    keras.utils.set_random_seed(5)
    inp = keras.Input((12, 12, 3))
    a = keras.layers.Conv2D(8, 3, padding="same", name="conv")(inp)
    a = keras.layers.BatchNormalization(name="bn_conv")(a)  # folded by TFMOT
    b = keras.layers.SeparableConv2D(8, 3, padding="same", name="sep")(a)
    b = keras.layers.BatchNormalization(name="bn_sep")(b)
    c = keras.layers.Conv2D(8, 1, activation="relu", name="conv_relu")(b)
    c = keras.layers.BatchNormalization(name="bn_relu")(c)
    x = keras.layers.Add(name="add")([a, c])
    x = keras.layers.BatchNormalization(name="bn_add")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    out = keras.layers.Dense(4, activation="softmax", name="head")(x)
    model = keras.Model(inp, out)
    assert unsupported_for_qat(model) == ["sep", "bn_sep", "bn_relu", "bn_add"]
    qat = quantize_for_qat(model)
    wrapped = {layer.layer.name: type(layer.quantize_config).__name__ for layer in qat.layers
               if hasattr(layer, "quantize_config")}
    assert wrapped["conv"] != "NoOpQuantizeConfig" and wrapped["head"] != "NoOpQuantizeConfig"
    # no QAT config of their own, so only their outputs are fake-quantized
    assert all(wrapped[name] == "Default8BitOutputQuantizeConfig" for name in ("sep", "bn_sep", "bn_relu", "bn_add"))
    x = np.random.default_rng(0).normal(size=(64, 12, 12, 3)).astype(np.float32)
    assert infer(qat, x).shape == (64, 4)

    # their tensors have no QAT range: converted as QAT models are (no calibration) they stay in float (the
    # FloatOperatorsLeft that convert_qat_int8 catches, whose message it logs), ...
    from edgedeploy.tflite.convert import convert_qat_int8

    qat.compile(optimizer=keras.optimizers.Adam(1e-6), loss="sparse_categorical_crossentropy")
    qat.fit(x, np.arange(64) % 4, batch_size=16, epochs=1, verbose=0)  # sets the QAT ranges
    # ... so only then are they calibrated (the converter keeps the QAT ranges it finds)
    asked, logged = [], _Records()
    with logged:
        int8, described = convert_qat_int8(qat, lambda: asked.append(1) or (x, "64 samples"), source="leaf x")
    assert asked == [1] and described == "64 samples, for the layers without QAT ranges only"
    assert any(re.match(r"^leaf x: int8 conversion left .* in float \(.*CONV_2D.*\); calibrating the layers without "
                        r"QAT ranges on 64 samples$", m) for m in logged.messages), logged.messages
    assert int8[4:8] == b"TFL3"


class _Records(logging.Handler):
    """The messages edgedeploy's logger gives at INFO and above while the ``with`` block runs (whatever level and
    handlers a command run in this process left it with)."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())

    def __enter__(self):
        log = logging.getLogger("edgedeploy")
        self._level = log.level
        log.addHandler(self)
        log.setLevel(logging.INFO)
        return self

    def __exit__(self, *exc):
        log = logging.getLogger("edgedeploy")
        log.removeHandler(self)
        log.setLevel(self._level)


@pytest.mark.slow  # the default run's check: test_qat_rewrites.py's test_the_qat_twin_converts_to_int8_with_hard_...
def test_a_qat_model_with_a_range_everywhere_converts_without_asking_for_samples(keras):
    from edgedeploy.keras.qat_annotate import quantize_for_qat
    from edgedeploy.tflite.convert import convert_qat_int8

    keras.utils.set_random_seed(5)
    inp = keras.Input((12, 12, 3))
    a = keras.layers.BatchNormalization(name="bn_conv")(keras.layers.Conv2D(8, 3, padding="same", name="conv")(inp))
    q = quantize_for_qat(keras.Model(inp, keras.layers.Dense(4, name="plain_head")(keras.layers.Flatten()(a))))
    x = np.random.default_rng(0).normal(size=(64, 12, 12, 3)).astype(np.float32)
    q.compile(optimizer=keras.optimizers.Adam(1e-6), loss="mse")
    q.fit(x, np.zeros((64, 4), np.float32), batch_size=16, epochs=1, verbose=0)
    asked = []
    assert convert_qat_int8(q, lambda: asked.append(2) or (x, "64 samples"))[1] is None and asked == []


@pytest.mark.requires_data("ic/cifar10_jpeg_subset.npz")
def test_qat_of_a_model_that_rescales_its_input_converts_to_working_int8(keras, shared_data, tmp_path):
    """A ``Rescaling(1/255)`` input layer (TFMOT has no QAT config for it) gets its output fake-quantized: with no
    range of its own the converter folds the 1/255 into the first convolution after that kernel's fake
    quantization, and every int8 weight of it rounds to zero (a QAT leaf at chance accuracy). The conversion
    now refuses such a kernel with a one-line error."""
    from tensorflow_model_optimization.python.core.quantization.keras.default_8bit.default_8bit_quantize_configs import (
        NoOpQuantizeConfig,
    )

    from edgedeploy.keras import tfenv
    from edgedeploy.tflite.convert import convert_qat_int8
    from edgedeploy.errors import ToolFailedError
    from edgedeploy.keras.qat_annotate import quantize_for_qat, unsupported_for_qat
    from edgedeploy.tflite.reader import read_weight_tensors
    from edgedeploy.tflite.interpreter import make_interpreter

    keras.utils.set_random_seed(7)
    d = np.load(shared_data / "ic" / "cifar10_jpeg_subset.npz")
    train = np.random.default_rng(7).choice(len(d["y_train"]), 512, replace=False)  # the file is sorted by class
    x, y = d["x_train"][train].astype(np.float32), d["y_train"][train].ravel()
    inp = keras.Input((32, 32, 3))
    h = keras.layers.Rescaling(1 / 255.0, name="rescale")(inp)
    h = keras.layers.Conv2D(8, 3, strides=2, padding="same", use_bias=False, name="conv")(h)
    h = keras.layers.BatchNormalization(name="bn")(h)
    h = keras.layers.ReLU(6.0)(h)
    h = keras.layers.GlobalAveragePooling2D()(h)
    model = keras.Model(inp, keras.layers.Dense(10, name="head")(h))
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss=keras.losses.SparseCategoricalCrossentropy(True))
    model.fit(x, y, batch_size=64, epochs=2, verbose=0)
    assert unsupported_for_qat(model) == ["rescale"]

    def qat_of(annotated_model):
        annotated_model.compile(optimizer=keras.optimizers.Adam(1e-7), loss=keras.losses.SparseCategoricalCrossentropy(True))
        annotated_model.fit(x, y, batch_size=64, epochs=1, verbose=0, shuffle=False)  # sets the QAT ranges
        return annotated_model

    qat = qat_of(quantize_for_qat(model))
    configs = {layer.layer.name: type(layer.quantize_config).__name__ for layer in qat.layers
               if hasattr(layer, "quantize_config")}
    assert configs["rescale"] == "Default8BitOutputQuantizeConfig"
    int8, _ = convert_qat_int8(qat, lambda: (x, "512 images"), source="leaf qat")
    path = tmp_path / "qat.tflite"
    path.write_bytes(int8)
    first = next(t for t in read_weight_tensors(path) if t.op == "CONV_2D")
    assert np.count_nonzero(first.values()) > 0.9 * first.values().size
    interp = make_interpreter(int8)
    inp_d, out_d = interp.get_input_details()[0], interp.get_output_details()[0]
    scale, zero = inp_d["quantization"]
    ev_idx = np.random.default_rng(8).choice(len(d["y_test"]), 200, replace=False)
    ev = d["x_test"][ev_idx].astype(np.float32)
    preds = []
    for img in ev:
        interp.set_tensor(inp_d["index"], np.clip(np.round(img[None] / scale + zero), -128, 127).astype(np.int8))
        interp.invoke()
        preds.append(int(interp.get_tensor(out_d["index"])[0].argmax()))
    assert np.mean(np.array(preds) == infer(qat, ev).argmax(-1)) > 0.9

    # the rescaling left without a range, as TFMOT's no-op config leaves it: refused, not written
    quant = tfenv.load().tfmot.quantization.keras

    def annotate(layer):
        config = NoOpQuantizeConfig() if layer.name == "rescale" else None
        return quant.quantize_annotate_layer(layer, quantize_config=config)

    annotated = keras.models.clone_model(model, clone_function=annotate)
    annotated.set_weights(model.get_weights())
    with quant.quantize_scope({"NoOpQuantizeConfig": NoOpQuantizeConfig}):
        broken = qat_of(quant.quantize_apply(annotated))
    with pytest.raises(ToolFailedError, match=r"^leaf qat: int8 conversion rounded every weight of 1 kernel\(s\) to zero"):
        convert_qat_int8(broken, lambda: (x, "512 images"), source="leaf qat")


def test_qat_refusal_of_tensorflow_math_ops_says_how_to_write_them(keras):
    """TFMOT's cloning misroutes TensorFlow math ops (TFOpLambda) such as an input scaling ``x / 255 - 0.5``;
    the one-line error names them and the Keras layer that does the same."""
    from edgedeploy.errors import InvalidInputError
    from edgedeploy.keras.qat_annotate import quantize_for_qat

    inp = keras.Input((16, 16, 3))
    h = keras.layers.Conv2D(4, 3, strides=2, padding="same")(inp / 255.0 - 0.5)
    model = keras.Model(inp, keras.layers.Dense(3)(keras.layers.GlobalAveragePooling2D()(h)))
    with pytest.raises(InvalidInputError) as err:
        quantize_for_qat(model, what="stage qat")
    assert err.value.message.startswith("stage qat: TFMOT cannot build the quantization-aware model")
    assert "tf.math.truediv, tf.math.subtract" in err.value.hint and "keras.layers.Rescaling(1 / 255" in err.value.hint


def test_conv1d_layers_become_the_conv2d_they_compute(keras):
    """Same function and weights: causal, dilated and strided convolutions, one feeding the next, a batch norm
    and ReLU after one (moved into the 2-D part), a layer without bias; names kept for the convolutions."""
    from edgedeploy.keras.rewrites import conv1d_as_conv2d

    keras.utils.set_random_seed(21)
    inp = keras.Input((20, 3))
    x = keras.layers.Conv1D(4, 3, padding="causal", dilation_rate=2, name="causal")(inp)
    x = keras.layers.BatchNormalization(name="bn")(x)
    x = keras.layers.ReLU(name="relu")(x)
    x = keras.layers.Conv1D(5, 3, strides=2, padding="same", activation="relu", name="strided")(x)
    x = keras.layers.Conv1D(6, 2, use_bias=False, name="valid")(x)
    out = keras.layers.Dense(2)(keras.layers.Flatten()(x))
    model = keras.Model(inp, out)
    bn = model.get_layer("bn")  # statistics other than 0 / 1, so that a wrong axis would show
    bn.set_weights([w + np.random.default_rng(1).uniform(0.5, 1.5, w.shape).astype(np.float32)
                    for w in bn.get_weights()])
    new, names = conv1d_as_conv2d(model)
    assert names == ["causal", "strided", "valid"]
    kinds = {layer.name: layer.__class__.__name__ for layer in new.layers}
    assert all(kinds[n] == "Conv2D" for n in names)
    order = [layer.name for layer in new.layers]
    assert order.index("causal") < order.index("bn") < order.index("relu") < order.index("causal_1d")
    assert new.get_layer("causal").get_weights()[0].shape == (3, 1, 3, 4)
    x = np.random.default_rng(0).normal(size=(16, 20, 3)).astype(np.float32)
    np.testing.assert_allclose(infer(new, x), infer(model, x), atol=1e-5)
    assert conv1d_as_conv2d(new)[1] == []  # nothing left to rewrite


def test_int8_kernels_are_matched_to_their_own_layers_beside_a_separable_conv(keras, tmp_path):
    """A SeparableConv2D's pointwise kernel has the size of the 1x1 Conv2D after it; it has no statistics of its
    own, and must not be taken for that layer's kernel (its sparsity would then be checked on the wrong one)."""
    from edgedeploy.tflite.convert import convert_int8
    from edgedeploy.optimize import int8_stats as _int8_stats

    keras.utils.set_random_seed(6)
    inp = keras.Input((10, 10, 8))
    x = keras.layers.SeparableConv2D(8, 3, padding="same", name="sep")(inp)
    x = keras.layers.Conv2D(8, 1, name="pointwise")(x)
    out = keras.layers.Dense(3, name="head")(keras.layers.Flatten()(x))
    model = keras.Model(inp, out)
    kernel = model.get_layer("pointwise").get_weights()
    kernel[0][np.abs(kernel[0]) < np.median(np.abs(kernel[0]))] = 0.0  # half of it pruned
    model.get_layer("pointwise").set_weights(kernel)
    x_cal = np.random.default_rng(1).normal(size=(32, 10, 10, 8)).astype(np.float32)
    int8 = convert_int8(model, x_cal)
    found = {s.layer: s for s in _int8_stats(int8, keras_weight_stats(model), tmp_path,
                                             [layer.name for layer in model.layers])}
    assert set(found) == {"pointwise", "head"}
    assert found["pointwise"].sparsity == pytest.approx(0.5, abs=0.02)


def test_palette_qat_keeps_the_palette_of_a_layer_followed_by_relu6(keras, tmp_path):
    """MobileNet-style Conv -> BN -> ReLU6: with the batch norm folded, TFMOT's QAT would take the ReLU6 as a
    separate ReLU and drop the convolution's weight quantizer (its palette with it). The palette node fuses it
    into the layer as relu6, which the palette QAT keeps as the layer's own activation."""
    from edgedeploy.optimize.palette.models import apply_plan, fold_batch_norm, kernel_layers
    from edgedeploy.optimize.palette.palette_qat import bake_palettes, palette_layers, palette_qat_model
    from edgedeploy.tflite.convert import convert_qat_int8
    from edgedeploy.keras.model import base_name
    from edgedeploy.tflite.reader import read_tflite, read_weight_tensors

    keras.utils.set_random_seed(7)
    inp = keras.Input((12, 12, 3))
    x = keras.layers.Conv2D(16, 3, use_bias=False, name="stem")(inp)
    x = keras.layers.BatchNormalization(name="bn")(x)
    x = keras.layers.ReLU(6.0, name="relu6")(x)
    x = keras.layers.Conv2D(16, 1, name="pw")(x)
    x = keras.layers.ReLU(6.0, name="relu6_b")(x)
    out = keras.layers.Dense(4, name="head")(keras.layers.GlobalAveragePooling2D()(x))
    model, folded = fold_batch_norm(keras.Model(inp, out))
    assert separate_relu_layers(model) == []  # a ReLU6 is not a plain ReLU ...
    model, fused = fuse_separate_relu(model, relu6=True)  # ... but the palette node fuses it too
    assert fused == ["stem", "pw"] and model.get_layer("stem").get_config()["activation"] == "relu6"
    plan = {name: {"clusters": 8, "sparsity": 0.0} for name, _ in kernel_layers(model)}
    apply_plan(model, plan, seed=0)
    qat = palette_qat_model(model, plan, 0, folded)
    assert sorted(base_name(layer.name) for layer, _ in palette_layers(qat)) == ["head", "pw", "stem"]
    x = np.random.default_rng(2).normal(size=(64, 12, 12, 3)).astype(np.float32)
    qat.compile(optimizer=keras.optimizers.Adam(1e-5), loss="mse")
    qat.fit(x, infer(model, x), batch_size=16, epochs=1, verbose=0)
    bake_palettes(qat)
    int8, calibrated = convert_qat_int8(qat, lambda: (x, "64 samples"))
    path = tmp_path / "m.tflite"
    path.write_bytes(int8)
    kernels = [t for t in read_weight_tensors(path) if t.op in ("CONV_2D", "FULLY_CONNECTED")]
    assert len(kernels) == 3 and all(np.unique(t.values()).size <= 8 for t in kernels)
    ops = [o.op for o in read_tflite(path).operators]
    assert "RELU6" not in ops and calibrated is None  # fused into the convolutions, every range from QAT


def test_separable_conv_is_split_so_both_kernels_get_palettes(keras, tmp_path):
    """A SeparableConv2D (strided, depth multiplier 2, with bias and a batch norm after it) becomes the
    DepthwiseConv2D and 1x1 Conv2D the converter writes for it: the same function, and then each kernel gets its
    own palette in the int8 model (left whole, neither would: the palette node knows Conv/Depthwise/Dense only)."""
    from edgedeploy.optimize.palette.models import apply_plan, fold_batch_norm, kernel_layers
    from edgedeploy.optimize.palette.stages import check_palette, int8_palette_rows
    from edgedeploy.tflite.convert import convert_int8
    from edgedeploy.keras.rewrites import split_separable

    keras.utils.set_random_seed(8)
    inp = keras.Input((12, 12, 3))
    x = keras.layers.SeparableConv2D(16, 3, strides=2, padding="same", depth_multiplier=2, name="sep")(inp)
    x = keras.layers.BatchNormalization(name="bn")(x)
    x = keras.layers.ReLU(name="relu")(x)
    x = keras.layers.SeparableConv2D(8, 3, activation="relu", use_bias=False, name="sep_b")(x)
    out = keras.layers.Dense(4, name="head")(keras.layers.GlobalAveragePooling2D()(x))
    model = keras.Model(inp, out)
    bn = model.get_layer("bn")  # statistics that are not the identity, so folding has something to do
    rng = np.random.default_rng(3)
    bn.set_weights([rng.uniform(0.5, 2, 16), rng.normal(size=16), rng.normal(size=16), rng.uniform(0.5, 2, 16)])
    x = rng.normal(size=(64, 12, 12, 3)).astype(np.float32)

    split_model, split = split_separable(model)
    assert split == {"sep": "sep_depthwise", "sep_b": "sep_b_depthwise"}
    kinds = {layer.name: layer.__class__.__name__ for layer in split_model.layers}
    assert kinds["sep_depthwise"] == "DepthwiseConv2D" and kinds["sep"] == "Conv2D" and kinds["sep_b"] == "Conv2D"
    assert split_model.get_layer("sep_depthwise").get_config()["depth_multiplier"] == 2
    np.testing.assert_allclose(infer(split_model, x), infer(model, x), rtol=1e-5, atol=1e-5)
    assert split_separable(split_model) == (split_model, {})  # nothing left to split

    folded, factors = fold_batch_norm(split_model)
    assert set(factors) == {"sep"}  # the batch norm folds into the 1x1 half, which kept the layer's name
    plan = {name: {"clusters": 8, "sparsity": 0.0} for name, _ in kernel_layers(folded)}
    assert set(plan) == {"sep_depthwise", "sep", "sep_b_depthwise", "sep_b", "head"}
    apply_plan(folded, plan, seed=0)
    rows = int8_palette_rows(convert_int8(folded, x), folded, plan, tmp_path)
    assert sorted(r["layer"] for r in rows) == sorted(plan)
    assert all(r["distinct"] <= 8 for r in rows)
    judged, failures = check_palette("clustered_palette", rows, tolerance=0.02)
    assert failures == [] and {r["status"] for r in judged} == {"ok"}
