"""The thinned node's mirrored fine-tuning samples (``thin_augment = "hflip"``) on a real Keras model: each image
also mirrored left to right, its soft targets the float model's outputs on the mirrored image."""

from __future__ import annotations

import numpy as np

SEED = 0


def _model(keras):
    keras.utils.set_random_seed(SEED)
    inp = keras.Input((6, 5, 2))
    x = keras.layers.Conv2D(4, 3, padding="same", activation="relu")(inp)
    x = keras.layers.Flatten()(x)
    return keras.Model(inp, keras.layers.Dense(3)(x))


def _training_set(x, model):
    from edgedeploy.optimize.finetune.fit import TrainingSet, teacher_targets

    rng = np.random.default_rng(SEED)
    y = rng.integers(0, 3, len(x))
    return TrainingSet(x=x, y=y, teacher=teacher_targets(model, x, True), x_val=x[:2], y_val=y[:2],
                       teacher_val=teacher_targets(model, x[:2], True))


def test_hflip_adds_each_image_mirrored_with_the_float_models_targets():
    from edgedeploy.keras import tfenv
    from edgedeploy.optimize.finetune.fit import teacher_targets
    from edgedeploy.optimize.thin import _augmented
    from edgedeploy.config.task import Task

    keras = tfenv.load().keras
    model = _model(keras)
    x = np.random.default_rng(SEED).normal(size=(8, 6, 5, 2)).astype(np.float32)
    ts = _training_set(x, model)
    warnings: list[str] = []
    out = _augmented(ts, model, "hflip", Task("sparse_categorical_crossentropy", True, "test"), True, warnings)
    assert not warnings and len(out.x) == 16 and len(out.y) == 16 and len(out.teacher) == 16
    np.testing.assert_array_equal(out.x[:8], x)
    np.testing.assert_array_equal(out.x[8:, :, 0], x[:, :, -1])  # the width axis reversed
    np.testing.assert_array_equal(out.y[8:], ts.y)
    np.testing.assert_allclose(out.teacher[8:], teacher_targets(model, x[:, :, ::-1], True), rtol=1e-6)
    assert not np.allclose(out.teacher[8:], ts.teacher)  # the model is not mirror-symmetric: new targets
    assert len(out.x_val) == 2 and "mirrored" in out.notes[-1]


def test_hflip_on_inputs_that_are_not_images_is_not_applied_and_says_so():
    from edgedeploy.keras import tfenv
    from edgedeploy.optimize.thin import _augmented
    from edgedeploy.config.task import Task

    keras = tfenv.load().keras
    keras.utils.set_random_seed(SEED)
    inp = keras.Input((7,))
    model = keras.Model(inp, keras.layers.Dense(3)(inp))
    x = np.random.default_rng(SEED).normal(size=(5, 7)).astype(np.float32)
    ts = _training_set(x, model)
    warnings: list[str] = []
    assert _augmented(ts, model, "hflip", Task("sparse_categorical_crossentropy", True, "test"), True,
                      warnings) is ts
    assert warnings and "not applied" in warnings[0]
