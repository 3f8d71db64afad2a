"""Keras model helpers on real tf_keras models: loading, the separate-ReLU fix and kernel statistics."""

from __future__ import annotations

import numpy as np
import pytest

from edgedeploy.keras_model import fuse_separate_relu, keras_weight_stats, load_model, separate_relu_layers


@pytest.fixture(scope="module")
def keras():
    from edgedeploy import tfenv

    return tfenv.load().keras


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
    np.testing.assert_allclose(fused.predict(x, verbose=0), model.predict(x, verbose=0), rtol=1e-6, atol=1e-6)
    assert separate_relu_layers(fused) == []


def test_a_sequential_model_loads_as_the_same_functional_model(keras, tmp_path):
    """Folding batch norms, fusing ReLUs and TFMOT's Conv + BatchNorm patterns need a functional graph."""
    from edgedeploy import palette

    keras.utils.set_random_seed(5)
    layers = keras.layers
    model = keras.Sequential([
        layers.InputLayer((12, 10, 1)), layers.Conv2D(8, 3, use_bias=False, name="c1"),
        layers.BatchNormalization(name="bn1"), layers.ReLU(name="r1"), layers.DepthwiseConv2D(3, name="dw"),
        layers.BatchNormalization(name="bn2"), layers.ReLU(name="r2"), layers.GlobalAveragePooling2D(),
        layers.Dense(4, activation="softmax", name="d")])
    x = np.random.default_rng(0).normal(size=(16, 12, 10, 1)).astype("float32")
    model.compile("adam", "sparse_categorical_crossentropy")
    model.fit(x, np.arange(16) % 4, epochs=1, verbose=0)  # moving statistics away from 0 / 1
    model.save(tmp_path / "seq.h5")
    loaded, _ = load_model(tmp_path / "seq.h5")
    assert loaded.__class__.__name__ == "Functional"
    assert [l.name for l in loaded.layers[1:]] == [l.name for l in model.layers]
    np.testing.assert_allclose(loaded.predict(x, verbose=0), model.predict(x, verbose=0), rtol=1e-6, atol=1e-6)
    folded, factors = palette.fold_batch_norm(loaded)
    assert sorted(factors) == ["c1", "dw"]
    np.testing.assert_allclose(folded.predict(x, verbose=0), model.predict(x, verbose=0), atol=1e-5)
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


@pytest.mark.requires_data
def test_qat_builds_around_layers_tfmot_cannot_quantize(keras, shared_data):
    """Arm's DS-CNN-S reshapes with `tf.reshape` (TFOpLambda), which TFMOT's QAT registry refuses."""
    from edgedeploy import tfenv
    from edgedeploy.keras_model import quantize_for_qat, unsupported_for_qat

    model = keras.models.load_model(shared_data / "kws" / "ds_cnn_s_arm_float.h5", compile=False)
    assert unsupported_for_qat(model) == ["tf.reshape", "tf.reshape_1"]
    with pytest.raises(RuntimeError, match="TFOpLambda"):
        tfenv.load().tfmot.quantization.keras.quantize_model(model)
    qat = quantize_for_qat(model)
    # every conv, depthwise and dense layer is quantization-aware; the batch norms were folded into them
    wrapped = [layer.layer.__class__.__name__ for layer in qat.layers if hasattr(layer, "quantize_config")]
    assert wrapped.count("Conv2D") == 5 and wrapped.count("DepthwiseConv2D") == 4 and "Dense" in wrapped
    d = np.load(shared_data / "kws" / "speech_commands_v2_test_mfcc_arm.npz")
    fit, ev = d["split"] == 0, d["split"] == 1
    x_fit, y_fit = d["x"][fit][::3].astype(np.float32), d["y"][fit][::3]
    x = d["x"][ev][::4].astype(np.float32)
    # one epoch at a tiny learning rate sets the fake-quantization ranges and hardly moves the weights:
    # the QAT model then decides (almost) as the float model does
    qat.compile(optimizer=keras.optimizers.Adam(1e-6), loss="sparse_categorical_crossentropy")
    qat.fit(x_fit, y_fit, batch_size=64, epochs=1, verbose=0, shuffle=False)
    float_pred = model.predict(x, verbose=0).argmax(-1)
    qat_pred = qat.predict(x, verbose=0).argmax(-1)
    agreement = np.mean(float_pred == qat_pred)
    assert agreement > 0.9
