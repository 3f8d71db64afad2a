"""Keras 3 activations tf_keras lacks (or has as another function) and Keras 3 operations of a tensor and a number,
rebuilt on loading as tf_keras layers computing the same function; Keras 3's MobileNetV3 (hard-swish, and a hard
sigmoid written as ``ReLU(6)(x + 3) * (1 / 6)``) through optimize, compile and verify with its hard-swish on the NPU."""

from __future__ import annotations

import json

import numpy as np
import pytest

from edgedeploy.errors import InvalidInputError
from edgedeploy.keras.model import load_model
from edgedeploy.tflite.reader import read_tflite
from helpers import infer, one_error_line, run_in_process

# Keras 3 activations whose tf_keras form is another layer or several: tf_keras's own hard_sigmoid is another
# function (clip(0.2 x + 0.5)), hard_silu/hard_swish it has not, relu6 and leaky_relu (slope 0.2) only as layers
ACTIVATIONS = ["hard_sigmoid", "hard_silu", "hard_swish", "relu6", "leaky_relu", "silu"]


def _samples() -> np.ndarray:
    return np.random.default_rng(1).uniform(-1, 1, size=(16, 6, 6, 3)).astype("float32")


def _model(k, activation: str, where: str):
    """A conv whose outputs span [-8, 8] (both bends of the hard activations), its activation set on the conv
    (``setting``), as an Activation layer (``layer``), or in a Sequential model (``sequential``), then a conv head."""
    L = k.layers
    init = k.initializers.RandomUniform(-2.0, 2.0, seed=3)
    if where == "sequential":
        return k.Sequential([k.Input((6, 6, 3)), L.Conv2D(4, 1, kernel_initializer=init, activation=activation,
                                                         name="conv"), L.Conv2D(2, 1, name="head")])
    inp = k.Input((6, 6, 3))
    x = L.Conv2D(4, 1, kernel_initializer=init, name="conv",
                 activation=activation if where == "setting" else None)(inp)
    if where == "layer":
        x = L.Activation(activation, name="act")(x)
    return k.Model(inp, L.Conv2D(2, 1, name="head")(x))


WHERE = ["setting", "layer", "sequential"]
# Each activation in one of the three places in the default run (each place with two of them), the rest slow
CASES = [pytest.param(activation, where, id=f"{activation}-{where}",
                      marks=() if WHERE.index(where) == i % len(WHERE) else pytest.mark.slow)
         for i, activation in enumerate(ACTIVATIONS) for where in WHERE]


@pytest.mark.parametrize("activation,where", CASES)
def test_a_keras3_activation_loads_as_the_same_function(keras3, tf_keras, tmp_path, activation, where):
    model = _model(keras3, activation, where)
    model.save(tmp_path / "m.keras")
    loaded, _ = load_model(tmp_path / "m.keras")
    assert isinstance(loaded, tf_keras.Model)
    ref = infer(model, _samples())
    assert np.abs(ref).max() > 1.0  # the samples reach past the bends
    np.testing.assert_allclose(infer(loaded, _samples()), ref, atol=1e-5)


def test_keras3_operations_with_a_number_load_as_tensorflow_operations(keras3, tmp_path):
    L = keras3.layers
    inp = keras3.Input((6, 6, 3))
    x = L.Conv2D(4, 1, name="conv")(inp)
    model = keras3.Model(inp, L.ReLU(6.0)(x + 3.0) * (1.0 / 6.0))  # MobileNetV3's hard sigmoid
    model.save(tmp_path / "m.keras")
    loaded, _ = load_model(tmp_path / "m.keras")
    assert [layer.__class__.__name__ for layer in loaded.layers].count("TFOpLambda") == 2
    np.testing.assert_allclose(infer(loaded, _samples()), infer(model, _samples()),
                               atol=1e-6)


def test_an_activation_tf_keras_cannot_compute_is_refused_with_the_layer(keras3, tmp_path):
    inp = keras3.Input((4,))
    keras3.Model(inp, keras3.layers.Dense(2, activation="celu", name="head")(inp)).save(tmp_path / "m.keras")
    with pytest.raises(InvalidInputError, match="layer head \\(Dense\\) uses the activation celu"):
        load_model(tmp_path / "m.keras")


def _mobilenet_v3(keras3, path, size: int, flat: bool) -> None:
    """Keras 3's MobileNetV3Small (seeded random weights), flat or as the base of a Functional with a Rescaling
    input and a Dense head, with seeded data (a class cue on the first rows)."""
    from zoo import settle_batch_norm

    keras3.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 255, size=(48, size, size, 3)).astype("float32")
    y = rng.integers(0, 4, 48)
    x[np.arange(48), y] = np.minimum(x[np.arange(48), y] + 80, 255)
    if flat:
        model = keras3.applications.MobileNetV3Small(input_shape=(size, size, 3), alpha=0.75, weights=None,
                                                     classes=4)
        settle_batch_norm(model, x[:16])
    else:
        L = keras3.layers
        inp = keras3.Input((size, size, 3))
        base = keras3.applications.MobileNetV3Small(input_shape=(size, size, 3), alpha=0.75, weights=None,
                                                    include_top=False, include_preprocessing=False)
        settle_batch_norm(base, x[:16] / 255)
        features = L.GlobalAveragePooling2D()(base(L.Rescaling(1 / 255)(inp)))
        model = keras3.Model(inp, L.Dense(4, activation="softmax", name="head")(features))
    model.save(path / "mnv3.keras")
    np.savez(path / "mnv3.npz", x=x, y=y, split=np.r_[np.zeros(32, int), np.ones(16, int)])


def _through_ptq_compile_and_verify(tmp_path, targets: list[str]) -> dict:
    from zoo import TINY_RECIPE

    (tmp_path / "tiny.toml").write_text(TINY_RECIPE)
    run = tmp_path / "run"
    proc = run_in_process("optimize", tmp_path / "mnv3.keras", "--data", tmp_path / "mnv3.npz", "-o", run,
                          "--recipe", tmp_path / "tiny.toml", "--leaves", "ptq")
    assert proc.returncode == 0, one_error_line(proc)
    ops = read_tflite(run / "convert" / "ptq" / "model_int8.tflite").op_counts
    proc = run_in_process("compile", run, *[a for t in targets for a in ("-t", t)], "--allow-cpu-ops", "--json")
    assert proc.returncode == 0, one_error_line(proc)
    results = json.loads(proc.stdout)["results"]
    assert sorted(r["target"] for r in results) == sorted(targets)
    assert all(r["status"] == "ok" and r["metrics"]["cpu_operators"]["value"] == 0 for r in results)
    proc = run_in_process("verify", run, "--leaf", "ptq", "-t", targets[0], "--count", "2")
    assert proc.returncode == 0, one_error_line(proc)
    return ops


@pytest.mark.slow
@pytest.mark.parametrize("flat", [False, True], ids=["nested", "flat"])
def test_keras3_mobilenet_v3_small_goes_through_with_hard_swish_on_the_npu(keras3, tmp_path, flat):
    _mobilenet_v3(keras3, tmp_path, 32, flat)
    ops = _through_ptq_compile_and_verify(tmp_path, ["ethos-u55-128", "ethos-u65-256", "ethos-u85-256"])
    assert ops.get("HARD_SWISH", 0) >= 10


def test_a_keras3_hard_swish_model_converts_to_hard_swish_on_the_npu(keras3, tmp_path):
    """The default run's small stand-in for MobileNetV3: conv, batch norm, hard-swish, a hard-sigmoid gate."""
    L = keras3.layers
    keras3.utils.set_random_seed(0)
    inp = keras3.Input((16, 16, 3))
    x = L.Rescaling(1 / 255)(inp)
    x = L.Conv2D(8, 3, strides=2, padding="same", use_bias=False, name="stem")(x)
    x = L.BatchNormalization(name="stem_bn")(x)
    x = L.Activation("hard_swish", name="stem_hard_swish")(x)
    gate = L.Conv2D(8, 1, activation="hard_sigmoid", name="gate")(L.GlobalAveragePooling2D(keepdims=True)(x))
    x = L.Multiply(name="excite")([x, gate])
    x = L.Conv2D(16, 1, activation="hard_silu", name="expand")(x)
    model = keras3.Model(inp, L.Dense(4, activation="softmax", name="head")(L.GlobalAveragePooling2D()(x)))
    model.save(tmp_path / "mnv3.keras")
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "mnv3.npz", x=rng.uniform(0, 255, size=(48, 16, 16, 3)).astype("float32"),
             y=rng.integers(0, 4, 48), split=np.r_[np.zeros(32, int), np.ones(16, int)])
    ops = _through_ptq_compile_and_verify(tmp_path, ["ethos-u55-128"])
    assert ops.get("HARD_SWISH") == 2
