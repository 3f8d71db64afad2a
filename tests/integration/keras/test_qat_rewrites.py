"""The rewrites before QAT (edgedeploy.optimize.techniques.qat.qat_float) on small real tf_keras models: the same
function, no layer TFMOT refuses left, and the int8 model of the quantization-aware twin computing every operator
in int8 with the operators ptq gets (HARD_SWISH, no ADD for a gate's + 3, one kernel for a batch norm)."""

from __future__ import annotations

import numpy as np
import pytest

from zoo import settle_batch_norm

from edgedeploy.keras.rewrites.bn_as_depthwise import batch_norms_as_depthwise
from edgedeploy.keras.rewrites.hard_swish import hard_activations_as_layers
from edgedeploy.keras.rewrites.split_activation import separate_swish

SEED = 3


def _x(n=8, shape=(8, 8, 3)):
    return np.random.default_rng(SEED).normal(size=(n, *shape)).astype(np.float32)


def _hard_net(keras, divide=False):
    """keras.applications' MobileNetV3 hard-swish and a squeeze-and-excitation's hard-sigmoid, as TF operations."""
    L = keras.layers

    def hard_sigmoid(x):
        shifted = L.ReLU(6.0)(x + 3.0)
        return shifted / 6.0 if divide else shifted * (1.0 / 6.0)

    inp = keras.Input((8, 8, 3))
    x = L.Conv2D(8, 3, padding="same", name="conv")(inp)
    x = L.Multiply(name="hswish")([x, hard_sigmoid(x)])
    s = L.Conv2D(8, 1, name="se")(L.GlobalAveragePooling2D(keepdims=True)(x))
    x = L.Multiply(name="excite")([x, hard_sigmoid(s)])
    return keras.Model(inp, L.Dense(4, name="out")(L.GlobalAveragePooling2D()(x)))


@pytest.mark.parametrize("divide", [False, True])
def test_hard_swish_and_sigmoid_become_one_layer_each_with_the_same_outputs(keras, divide):
    keras.utils.set_random_seed(SEED)
    model = _hard_net(keras, divide)
    new, names = hard_activations_as_layers(model)
    kinds = [layer.__class__.__name__ for layer in new.layers]
    assert (kinds.count("HardSwish"), kinds.count("HardSigmoid"), kinds.count("TFOpLambda")) == (1, 1, 0)
    assert "hswish" in names and new.get_layer("hswish").__class__.__name__ == "HardSwish"
    # the gate's + 3 moved into the bias of the convolution before it, its ReLU(6) now reading that convolution
    np.testing.assert_allclose(new.get_layer("se").get_weights()[1], model.get_layer("se").get_weights()[1] + 3)
    assert kinds.count("ReLU") == 1 and new.get_layer("se")._outbound_nodes[0].outbound_layer.__class__.__name__ == "ReLU"
    np.testing.assert_allclose(new(_x()).numpy(), model(_x()).numpy(), rtol=1e-6, atol=1e-6)
    assert hard_activations_as_layers(new)[1] == []  # nothing left to rewrite


def _dense_block(keras):
    """A batch norm TFMOT folds (after a convolution read by it alone), one after a Concatenate and one after a
    convolution read by another layer too."""
    L = keras.layers
    inp = keras.Input((8, 8, 3))
    x = L.Conv2D(4, 3, padding="same", use_bias=False, name="stem")(inp)
    y = L.ReLU(name="pre_relu")(L.BatchNormalization(name="pre_bn")(x))
    y = L.Conv2D(4, 3, padding="same", use_bias=False, name="conv")(y)
    x = L.Concatenate(name="concat")([x, y])
    x = L.ReLU(name="post_relu")(L.BatchNormalization(name="post_bn")(x))
    x = L.BatchNormalization(name="folded_bn")(L.Conv2D(4, 1, use_bias=False, name="tail")(x))
    return keras.Model(inp, L.Dense(4, name="out")(L.GlobalAveragePooling2D()(x)))


def _settled(keras, model):
    settle_batch_norm(model, _x(32) * 3 + 1)  # statistics that are not the identity's
    return model


def test_batch_norms_tfmot_cannot_fold_become_depthwise_convolutions(keras):
    keras.utils.set_random_seed(SEED)
    model = _settled(keras, _dense_block(keras))
    new, names = batch_norms_as_depthwise(model)
    assert names == ["post_bn", "pre_bn"]
    assert new.get_layer("post_bn").__class__.__name__ == "DepthwiseConv2D"
    assert new.get_layer("folded_bn").__class__.__name__ == "BatchNormalization"
    np.testing.assert_allclose(new(_x()).numpy(), model(_x()).numpy(), rtol=1e-5, atol=1e-5)


def test_a_kernels_swish_becomes_an_activation_layer_with_the_same_outputs(keras):
    keras.utils.set_random_seed(SEED)
    L = keras.layers
    inp = keras.Input((8, 8, 3))
    s = L.Dense(2, activation="swish", name="reduce")(L.GlobalAveragePooling2D()(inp))
    model = keras.Model(inp, L.Dense(3, activation="sigmoid", name="expand")(s))
    new, names = separate_swish(model)
    assert names == ["reduce"]
    assert new.get_layer("reduce").get_config()["activation"] == "linear"
    assert new.get_layer("reduce_swish").get_config()["activation"] in ("swish", "silu")
    np.testing.assert_array_equal(new(_x()).numpy(), model(_x()).numpy())


def test_the_qat_twin_converts_to_int8_with_hard_swish_and_no_float_operator(keras, tmp_path):
    from edgedeploy.keras import tfenv
    from edgedeploy.optimize.techniques.qat import qat_model
    from edgedeploy.tflite.convert import convert_qat_int8
    from edgedeploy.tflite.reader import read_tflite

    keras.utils.set_random_seed(SEED)
    L = keras.layers
    inp = keras.Input((8, 8, 3))
    x = L.Conv2D(8, 3, padding="same", name="conv")(inp)
    x = L.Multiply(name="hswish")([x, L.ReLU(6.0)(x + 3.0) * (1.0 / 6.0)])
    gate = L.Conv2D(8, 1, name="gate")(L.GlobalAveragePooling2D(keepdims=True)(x))
    x = L.Multiply(name="excite")([x, L.ReLU(6.0)(gate + 3.0) * (1.0 / 6.0)])
    y = L.Conv2D(4, 1, use_bias=False, name="branch")(x)
    x = L.Concatenate(name="concat")([x, y])
    x = L.ReLU(name="post_relu")(L.BatchNormalization(name="post_bn")(x))
    s = L.Dense(3, activation="swish", name="reduce")(L.GlobalAveragePooling2D()(x))
    model = _settled(keras, keras.Model(inp, L.Dense(4, name="out")(s)))
    details: dict = {}
    qat = qat_model(tfenv.load(), model, "qat", details)
    assert set(details["qat_rewrites"]) == {"hard_activations_as_layers", "batch_norms_as_depthwise", "separate_swish"}
    data, calibrated = convert_qat_int8(qat, lambda: (_x(8), "8 samples"))  # raises on a float or misbiased op
    path = tmp_path / "qat.tflite"
    path.write_bytes(data)
    ops = {o.op for o in read_tflite(path).operators}
    # (the gate's + 3 folded into its convolution's bias, as ptq's converter does: no ADD)
    assert "HARD_SWISH" in ops and "ADD" not in ops and calibrated is None, (ops, calibrated)
