"""The thinned branch on real Keras models: its mirrored fine-tuning samples (``thin_augment = "hflip"``: each
image also mirrored left to right, its soft targets the float model's outputs on the mirrored image) and the 2:4
copy that its candidate widths are compiled as under ``sparsity_pattern = "2:4"``."""

from __future__ import annotations

from pathlib import Path

import numpy as np

SEED = 0


def _model(keras, shape=(6, 5, 2)):
    keras.utils.set_random_seed(SEED)
    inp = keras.Input(shape)
    if len(shape) != 3:
        return keras.Model(inp, keras.layers.Dense(3, name="out")(inp))
    x = keras.layers.Conv2D(8, 3, padding="same", activation="relu", name="conv")(inp)
    x = keras.layers.Flatten()(keras.layers.Conv2D(8, 1, name="pw")(x))
    return keras.Model(inp, keras.layers.Dense(3, name="out")(x))


def _data(model, x, mirrored: bool):
    from edgedeploy.config.data import Dataset
    from edgedeploy.optimize.finetune.fit import teacher_targets

    y = np.random.default_rng(SEED).integers(0, 3, len(x))
    return Dataset(Path("data.npz"), "test", x, y, x[:2], y[:2], None, "0" * 64,
                   soft_targets=teacher_targets(model, x, True),
                   mirrored_targets=teacher_targets(model, x[:, :, ::-1], True) if mirrored else None)


def test_hflip_adds_each_training_image_mirrored_with_the_float_models_targets():
    from edgedeploy.config.recipe import load_recipe
    from edgedeploy.keras import tfenv
    from edgedeploy.optimize.finetune.fit import teacher_targets, training_set

    model = _model(tfenv.load().keras)
    x = np.random.default_rng(SEED).normal(size=(30, 6, 5, 2)).astype(np.float32)
    data = _data(model, x, mirrored=True)
    recipe = load_recipe(overrides={"thin_augment": "hflip", "seed": SEED})
    plain, out = training_set(data, recipe), training_set(data, recipe, mirrored=True)
    n = len(plain.x)
    assert len(out.x) == len(out.y) == len(out.teacher) == 2 * n and 0 < n < 30
    np.testing.assert_array_equal(out.x[:n], plain.x)
    np.testing.assert_array_equal(out.x[n:, :, 0], plain.x[:, :, -1])  # the width axis reversed
    np.testing.assert_array_equal(out.y[n:], plain.y)
    np.testing.assert_allclose(out.teacher[n:], teacher_targets(model, plain.x[:, :, ::-1], True), rtol=1e-5)
    assert not np.allclose(out.teacher[n:], plain.teacher)  # the model is not mirror-symmetric: new targets
    np.testing.assert_array_equal(out.x_val, plain.x_val)  # the hold-out is left as it is
    assert "mirrored" in out.notes[-1]


def test_hflip_on_inputs_that_are_not_images_is_not_applied_and_says_so():
    from edgedeploy.config.recipe import load_recipe
    from edgedeploy.keras import tfenv
    from edgedeploy.optimize.finetune.fit import training_set

    model = _model(tfenv.load().keras, shape=(7,))
    x = np.random.default_rng(SEED).normal(size=(20, 7)).astype(np.float32)
    out = training_set(_data(model, x, mirrored=False), load_recipe(overrides={"thin_augment": "hflip"}),
                       mirrored=True)
    assert len(out.x) < 20 and "not applied" in out.notes[-1]


def test_the_thinned_branch_below_the_thinned_node_fine_tunes_on_mirrored_images_too():
    from edgedeploy.config.recipe import load_recipe
    from edgedeploy.config.tree import NODE_TABLE
    from edgedeploy.optimize.techniques.selection import mirrored

    recipe = load_recipe(overrides={"thin_augment": "hflip"})
    run = type("Run", (), {"recipe": recipe})
    for node, expected in (("thinned", True), ("thinned_pruned", True), ("thinned_pcqat", True),
                           ("pruned", False), ("qat", False)):
        run.node = NODE_TABLE[node]
        assert mirrored(run) is expected, node
        # a node trained on mirrored images is a different node: its cache key says so
        assert ("thin_augment" in recipe.node_params(node)) is expected, node


def test_the_2_of_4_copy_has_the_prune_stages_final_masks_and_leaves_the_model_alone():
    from edgedeploy.config import pattern
    from edgedeploy.config.recipe import load_recipe
    from edgedeploy.keras import tfenv
    from edgedeploy.optimize.techniques.selection import optimizable
    from edgedeploy.optimize.techniques.two_of_four import pruned_copy

    model = _model(tfenv.load().keras)
    before = [w.copy() for w in model.get_weights()]
    recipe = load_recipe(overrides={"skip_layers": ["out"]})
    copy = pruned_copy(model, lambda layer: optimizable(layer, recipe))
    for w, b in zip(model.get_weights(), before):
        np.testing.assert_array_equal(w, b)
    conv, pw, out = (copy.get_layer(n).get_weights()[0] for n in ("conv", "pw", "out"))
    assert pattern.why_left_out("Conv2D", conv.shape)  # 2 input channels: no groups of four, left dense
    np.testing.assert_array_equal(conv, model.get_layer("conv").get_weights()[0])
    assert pattern.violations(pw, "Conv2D") == 0 and np.mean(pw == 0) == 0.5
    kept = model.get_layer("pw").get_weights()[0]
    np.testing.assert_array_equal(pw[pw != 0], kept[pw != 0])  # the largest two of each four, unchanged
    np.testing.assert_array_equal(out, model.get_layer("out").get_weights()[0])  # skipped
