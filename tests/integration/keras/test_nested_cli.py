"""The Keras 3 transfer-learning pattern (a keras.applications base called as a layer under a new head, saved as
.keras) through `edgedeploy optimize`, against its flat twin (input_tensor=) with the same weights."""

from __future__ import annotations

import json

import numpy as np
import pytest

from helpers import run_cli

SIZE = 32  # the smallest input MobileNetV2 takes


def _head(L, x):
    x = L.GlobalAveragePooling2D(name="gap")(x)
    return L.Dense(10, activation="softmax", name="head")(x)


def _twins(keras, x):
    """MobileNetV2 (alpha 0.35) nested in a Functional with a Rescaling input, and the same network built flat,
    with the same weights: random, but with the batch-norm statistics of the images ``x`` (with those of
    initialization the activations saturate and every image gets the same output)."""
    L = keras.layers
    keras.utils.set_random_seed(3)
    inp = keras.Input((SIZE, SIZE, 3))
    base = keras.applications.MobileNetV2(input_shape=(SIZE, SIZE, 3), alpha=0.35, include_top=False, weights=None)
    nested = keras.Model(inp, _head(L, base(L.Rescaling(1 / 255, name="scale")(inp), training=False)))
    norms = [layer for layer in base.layers if layer.__class__.__name__ == "BatchNormalization"]
    for layer in norms:
        layer.momentum = 0.0  # one pass in training mode sets each moving statistic to the batch's
    base(x / 255, training=True)
    for layer in norms:
        layer.momentum = 0.999
    inp = keras.Input((SIZE, SIZE, 3))
    twin = keras.applications.MobileNetV2(input_tensor=L.Rescaling(1 / 255, name="scale")(inp), alpha=0.35,
                                          include_top=False, weights=None)
    flat = keras.Model(inp, _head(L, twin.output))
    for layer in flat.layers:
        if layer.get_weights():
            source = nested if layer.name == "head" else base
            layer.set_weights(source.get_layer(layer.name).get_weights())
    return nested, flat


def _images(shared_data) -> tuple[np.ndarray, np.ndarray]:
    """64 fine-tune and 32 evaluation images: real CIFAR-10 (a seeded choice: the file is sorted by class) when
    the shared data has it, else seeded noise."""
    cifar = shared_data / "ic" / "cifar10_jpeg_subset.npz"
    rng = np.random.default_rng(4)
    if cifar.is_file():
        d = np.load(cifar)
        fit, ev = rng.choice(len(d["y_train"]), 64, replace=False), rng.choice(len(d["y_test"]), 32, replace=False)
        return (np.concatenate([d["x_train"][fit], d["x_test"][ev]]).astype("float32"),
                np.concatenate([d["y_train"][fit], d["y_test"][ev]]))
    return rng.integers(0, 256, (96, SIZE, SIZE, 3)).astype("float32"), rng.integers(0, 10, 96)


def _int8_outputs(model_path, x) -> np.ndarray:
    from edgedeploy.tflite.interpreter import make_interpreter

    interpreter = make_interpreter(model_path)
    inp, out = interpreter.get_input_details()[0], interpreter.get_output_details()[0]
    scale, zero = inp["quantization"]
    found = []
    for sample in x:
        interpreter.set_tensor(inp["index"], np.clip(np.round(sample / scale + zero), -128, 127).astype(np.int8)[None])
        interpreter.invoke()
        found.append(interpreter.get_tensor(out["index"])[0].copy())
    return np.array(found, dtype=np.int32)


def test_a_nested_keras3_application_gives_the_int8_outputs_of_its_flat_twin(shared_data, tmp_path):
    from edgedeploy.keras import tfenv

    tfenv.load()  # TensorFlow with tf_keras as tf.keras first (the int8 outputs are read in this process)
    import keras  # Keras 3, as a user saves the model today

    x, y = _images(shared_data)
    nested, flat = _twins(keras, x[:64])
    np.testing.assert_allclose(nested.predict(x[:8], verbose=0), flat.predict(x[:8], verbose=0), atol=1e-6)
    split = np.r_[np.zeros(64, int), np.ones(32, int)]
    np.savez(tmp_path / "d.npz", x=x, y=y, split=split)
    runs = {}
    for name, model in (("nested", nested), ("flat", flat)):
        model.save(tmp_path / f"{name}.keras")
        proc = run_cli("optimize", tmp_path / f"{name}.keras", "--data", tmp_path / "d.npz", "--leaves", "ptq,qat",
                       "-o", tmp_path / name, "--epochs", "1", "--min-steps", "0", "--seed", "7")
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[name] = json.loads((tmp_path / name / "manifest.json").read_text())
    record = runs["nested"]["info"]["optimize"]["flattened"]
    assert record["models"] == [nested.layers[2].name]  # mobilenetv2_0.35_32
    assert record["checked_on"] == "32 evaluation samples of d.npz" and record["max_abs_difference"] <= 1e-5
    assert "flattened" not in runs["flat"]["info"]["optimize"]
    baseline = next(s for s in runs["nested"]["stages"] if s["id"] == "optimize/baseline")
    assert baseline["details"]["flattened"] == record["models"]
    evaluation = x[split == 1]
    for leaf, lsb in (("ptq", 0), ("qat", 1)):
        got = _int8_outputs(tmp_path / "nested" / "convert" / leaf / "model_int8.tflite", evaluation)
        want = _int8_outputs(tmp_path / "flat" / "convert" / leaf / "model_int8.tflite", evaluation)
        assert np.ptp(want, axis=0).max() > 0  # the outputs differ from sample to sample
        assert np.abs(got - want).max() <= lsb, leaf
