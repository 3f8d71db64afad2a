"""Nested models (a Functional or Sequential used as a layer), tf_keras and Keras 3, flattened on loading into
the same graph of plain layers with the same weights; what cannot be flattened is refused with the layer."""

from __future__ import annotations

import numpy as np
import pytest

from edgedeploy.errors import InvalidInputError
from edgedeploy.keras.model import load_model
from helpers import infer


def _block(k, name, channels=4, input_shape=(8, 8, 4)):
    """A user's own block model: conv, batch norm, ReLU, and an Add back to its input (an inner layer is called
    ``dense``-like ``conv``, as an outer one is: the flat model renames it)."""
    L = k.layers
    inp = k.Input(input_shape)
    x = L.Conv2D(channels, 3, padding="same", use_bias=False, name="conv")(inp)
    x = L.BatchNormalization(name="bn")(x)
    x = L.ReLU(name="relu")(x)
    return k.Model(inp, L.Add(name="add")([inp, x]), name=name)


def functional_in_functional(k):
    L = k.layers
    inp = k.Input((8, 8, 3))
    x = L.Rescaling(1 / 255, name="scale")(inp)
    x = L.Conv2D(4, 3, padding="same", name="conv")(x)
    x = _block(k, "block")(x, training=False)  # as the Keras guides call a frozen base
    x = L.GlobalAveragePooling2D(name="gap")(x)
    return k.Model(inp, L.Dense(3, activation="softmax", name="head")(x))


def sequential_in_functional(k):
    L = k.layers
    inp = k.Input((8, 8, 3))
    x = L.Conv2D(4, 3, padding="same", name="stem")(inp)
    seq = k.Sequential([L.DepthwiseConv2D(3, padding="same", name="dw"), L.BatchNormalization(name="bn"),
                        L.ReLU(6.0, name="relu6"), L.Conv2D(6, 1, name="pw")], name="seq")
    x = seq(x)
    x = L.Flatten(name="flat")(x)
    return k.Model(inp, L.Dense(3, name="head")(x))


def two_levels(k):
    """A Functional holding a block model and a Sequential, used twice over (two blocks of the same layout) in
    the outer model."""
    L = k.layers
    inner_in = k.Input((8, 8, 4))
    x = _block(k, "inner_block")(inner_in)
    x = k.Sequential([L.Conv2D(4, 1, name="mix"), L.ReLU(name="relu")], name="inner_seq")(x)
    stage = k.Model(inner_in, x, name="stage")
    inp = k.Input((8, 8, 3))
    x = L.Conv2D(4, 3, padding="same", name="conv")(inp)
    x = stage(x)
    x = _block(k, "block")(x)
    x = L.GlobalAveragePooling2D(name="gap")(x)
    return k.Model(inp, L.Dense(3, name="head")(x))


def functional_in_sequential(k):
    L = k.layers
    return k.Sequential([k.Input((8, 8, 3)), L.Conv2D(4, 3, padding="same", name="stem"), _block(k, "block"),
                         L.GlobalAveragePooling2D(name="gap"), L.Dense(3, name="head")], name="outer")


BUILDERS = {"functional_in_functional": (functional_in_functional, ["block"]),
            "sequential_in_functional": (sequential_in_functional, ["seq"]),
            "two_levels": (two_levels, ["stage", "stage/inner_block", "stage/inner_seq", "block"]),
            "functional_in_sequential": (functional_in_sequential, ["block"])}


def _randomize(model, seed=1):
    """Weights away from their initial values (batch-norm statistics too), every variance positive."""
    rng = np.random.default_rng(seed)
    model.set_weights([rng.uniform(0.2, 1.0, size=w.shape).astype("float32") for w in model.get_weights()])


def _samples(seed=2):
    return np.random.default_rng(seed).uniform(0, 255, size=(6, 8, 8, 3)).astype("float32")


def _check_flat(loaded, info, flattened, ref):
    assert list(info.flattened) == flattened
    assert not any(hasattr(layer, "layers") for layer in loaded.layers)  # no model inside the model
    assert len({layer.name for layer in loaded.layers}) == len(loaded.layers)
    np.testing.assert_allclose(infer(loaded, _samples()), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_a_nested_tf_keras_model_loads_flat_with_the_same_outputs(tf_keras, tmp_path, name):
    build, flattened = BUILDERS[name]
    model = build(tf_keras)
    _randomize(model)
    model.save(tmp_path / "m.h5")
    loaded, info = load_model(tmp_path / "m.h5")
    _check_flat(loaded, info, flattened, infer(model, _samples()))
    assert "head" in [layer.name for layer in loaded.layers]  # the outer model's names are kept


# Keras 3 files of the two nestings two_levels holds (a block Functional and a Sequential inside a Functional) in the
# slow run; the default run has two_levels and functional_in_sequential, and test_nested_cli.py a Keras 3 base called
# with training=False
KERAS3_CASES = [pytest.param(name, marks=pytest.mark.slow) if name in ("functional_in_functional",
                                                                        "sequential_in_functional") else name
                for name in sorted(BUILDERS)]


@pytest.mark.parametrize("name", KERAS3_CASES)
def test_a_nested_keras3_model_loads_flat_with_the_same_outputs(keras3, tf_keras, tmp_path, name):
    build, flattened = BUILDERS[name]
    model = build(keras3)
    _randomize(model)
    model.save(tmp_path / "m.keras")
    loaded, info = load_model(tmp_path / "m.keras")
    assert isinstance(loaded, tf_keras.Model)
    _check_flat(loaded, info, flattened, infer(model, _samples()))


def test_inner_layers_keep_their_names_unless_an_outer_layer_has_them(tf_keras, tmp_path):
    model = functional_in_functional(tf_keras)
    model.save(tmp_path / "m.h5")
    loaded, _ = load_model(tmp_path / "m.h5")
    names = [layer.name for layer in loaded.layers]
    assert names.count("conv") == 1 and "conv_" in names  # the outer conv keeps its name
    assert {"bn", "relu", "add", "head"} <= set(names)


def _shared_twice(k):
    L = k.layers
    inp = k.Input((8, 8, 4))
    block = _block(k, "shared")
    x = block(block(inp))
    return k.Model(inp, L.Dense(2, name="head")(L.GlobalAveragePooling2D()(x)))


@pytest.mark.parametrize("flavour, suffix", [("tf_keras", ".h5"), ("keras3", ".keras")])
def test_a_nested_model_called_twice_is_refused_with_its_name(request, tmp_path, flavour, suffix):
    k = request.getfixturevalue(flavour)
    path = tmp_path / f"m{suffix}"
    _shared_twice(k).save(path)
    with pytest.raises(InvalidInputError) as err:
        load_model(path)
    assert "layer shared is a nested Functional model called 2 times" in str(err.value)
    assert "cannot be flattened" in str(err.value) and "\n" not in str(err.value)
    assert str(path) in str(err.value)


def test_a_subclassed_model_inside_is_refused_with_its_name(tf_keras, tmp_path):
    from edgedeploy.keras.flatten import flatten_nested

    class Doubler(tf_keras.Model):
        def call(self, x):
            return x * 2.0

    inp = tf_keras.Input((4,))
    model = tf_keras.Model(inp, tf_keras.layers.Dense(2, name="head")(Doubler(name="doubler")(inp)))
    with pytest.raises(InvalidInputError, match=r"layer doubler is a subclassed model \(Doubler\)"):
        flatten_nested(model, tmp_path / "m.h5")


def test_a_subclassed_keras3_model_inside_is_refused_with_its_name(keras3, tmp_path):
    @keras3.saving.register_keras_serializable(package="edgedeploy_tests")
    class Halver(keras3.Model):
        def call(self, x):
            return x * 0.5

    inp = keras3.Input((4,))
    path = tmp_path / "m.keras"
    keras3.Model(inp, keras3.layers.Dense(2, name="head")(Halver(name="halver")(inp))).save(path)
    with pytest.raises(InvalidInputError) as err:
        load_model(path)
    assert f"{path}: layer halver is a subclassed model (Halver)" in str(err.value)
    assert "cannot be flattened" in str(err.value)


def test_a_subclassed_layer_in_a_nested_tf_keras_block_is_refused_with_its_class(tf_keras, tmp_path):
    """A tf_keras file does not hold a custom layer's code: one line names the class, not Keras's advice to use
    a custom-object scope (which edgedeploy has no way to take)."""
    L = tf_keras.layers

    class Scale(L.Layer):
        def build(self, shape):
            self.w = self.add_weight("w", shape=(shape[-1],), initializer="ones")

        def call(self, x):
            return x * self.w

    block = tf_keras.Sequential([L.Conv2D(4, 3, name="conv"), Scale(name="scale")], name="block")
    inp = tf_keras.Input((8, 8, 3))
    path = tmp_path / "m.h5"
    tf_keras.Model(inp, L.Dense(2, name="head")(L.GlobalAveragePooling2D()(block(inp)))).save(path)
    with pytest.raises(InvalidInputError) as err:
        load_model(path)
    assert str(err.value).startswith(f"{path}: the model uses Scale, a custom layer class")
    assert "\n" not in str(err.value)
    assert "custom_object_scope" not in str(err.value) and "built-in Keras layers" in str(err.value.hint)


def test_a_flat_model_is_left_as_it_is(tf_keras, tmp_path):
    from edgedeploy.keras.flatten import flatten_nested

    inp = tf_keras.Input((4,))
    model = tf_keras.Model(inp, tf_keras.layers.Dense(2)(inp))
    assert flatten_nested(model, tmp_path / "m.h5") == (model, [])


def test_outputs_that_differ_stop_with_one_line(tf_keras, tmp_path):
    from edgedeploy.keras.flatten import same_outputs, seeded_samples

    model = functional_in_functional(tf_keras)
    other = functional_in_functional(tf_keras)
    _randomize(other, seed=9)
    with pytest.raises(InvalidInputError, match="differ from the nested model's by up to .* on 8 seeded samples"):
        same_outputs(model, other, seeded_samples(model), tmp_path / "m.h5", "8 seeded samples")
    assert same_outputs(model, model, seeded_samples(model), tmp_path / "m.h5", "8 seeded samples") == 0.0
