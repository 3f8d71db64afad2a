"""The per-layer palette sweep on the real DS-CNN: work items in a process pool or as Ray tasks, sizes from Vela."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.requires_data


@pytest.fixture(scope="module")
def folded(shared_data, tmp_path_factory):
    """The published float DS-CNN with its batch norms folded (the palette node's first step), and its hold-out."""
    from edgedeploy import palette, tfenv
    from edgedeploy.keras_model import fuse_separate_relu

    keras = tfenv.load().keras
    original = keras.models.load_model(shared_data / "kws" / "dscnn_mlperf_float.h5", compile=False)
    model, names = palette.fold_batch_norm(original)
    model, _ = fuse_separate_relu(model)
    d = np.load(shared_data / "kws" / "speech_commands_v2_test_mfcc_mlperf.npz")
    fit = np.sort(np.random.default_rng(0).choice(np.where(d["split"] == 0)[0], 256, replace=False))
    x, y = d["x"][fit].reshape(-1, 49, 10, 1).astype(np.float32), d["y"][fit]  # (the file is sorted by class)
    # folding is exact: the same outputs as the original model
    assert len(names) == 9
    np.testing.assert_allclose(model.predict(x[:64], verbose=0), original.predict(x[:64], verbose=0), atol=1e-4)
    path = tmp_path_factory.mktemp("sweep") / "folded.h5"
    model.save(path, include_optimizer=False)
    return model, path, x, y


ITEMS = [("conv2d_1", {"clusters": 4, "sparsity": 0.0}), ("conv2d_1", {"clusters": 16, "sparsity": 0.0}),
         ("depthwise_conv2d", {"clusters": 8, "sparsity": 0.0}), ("dense", {"clusters": 4, "sparsity": 0.6})]


def test_items_in_a_process_pool_match_in_process(folded, tmp_path):
    from edgedeploy import palette, tfenv

    keras = tfenv.load().keras
    model, path, x, y = folded
    results = palette.run_items(ITEMS, path, x, y, tmp_path, "process", workers=2)
    assert [(r["layer"], r["setting"]) for r in results] == ITEMS
    # the same item computed here, independently of the pool
    for (layer, setting), r in zip(ITEMS, results):
        copy = keras.models.clone_model(model)
        copy.set_weights(model.get_weights())
        palette.apply_plan(copy, {layer: setting})
        expected = float(np.mean(np.argmax(copy.predict(x, verbose=0), axis=-1) == y)) * 100
        assert r["accuracy"] == pytest.approx(expected, abs=1e-9)
        assert len(r["projection"]["palette"]) <= setting["clusters"]
    # 4 clusters hurt at least as much as 16 on the same layer (within two samples of noise)
    assert results[0]["accuracy"] <= results[1]["accuracy"] + 100 * 2 / len(y)


def test_items_as_ray_tasks_match_the_process_pool(folded, tmp_path, ray_home):
    pytest.importorskip("ray", reason="Ray is not installed (pip install -e '.[ray]')")
    from edgedeploy import palette

    _, path, x, y = folded
    local = palette.run_items(ITEMS, path, x, y, tmp_path, "process", workers=2)
    remote = palette.run_items(ITEMS, path, x, y, tmp_path, "ray", workers=2)
    assert [r["accuracy"] for r in remote] == [r["accuracy"] for r in local]


@pytest.mark.slow
def test_sweep_chooses_a_plan_within_budget_with_vela_sizes(folded, shared_data, tmp_path):
    from edgedeploy import palette
    from edgedeploy.data import load_dataset
    from edgedeploy.recipe import load_recipe

    model, _, _, _ = folded
    data = load_dataset(shared_data / "kws" / "speech_commands_v2_test_mfcc_mlperf.npz", (49, 10, 1), 12)
    recipe = load_recipe(table={"palette": {"search": True, "clusters": [8, 16], "sparsities": [0.0],
                                            "accuracy_budget": 1.0}})
    res = palette.sensitivity_sweep(model, data, recipe, tmp_path / "work")
    layers = [n for n, _ in palette.kernel_layers(model)]
    assert sorted(res["options"]) == sorted(layers) and set(res["plan"]) == set(layers)
    for layer, options in res["options"].items():
        by_k = {o["setting"]["clusters"]: o for o in options}
        assert set(by_k) == {8, 16, 32}  # the candidates and Vela's 32, where the walk starts
        # a smaller palette never encodes larger (Vela's own bytes, per layer)
        assert by_k[8]["bytes"] <= by_k[16]["bytes"] <= by_k[32]["bytes"], layer
    assert res["holdout"]["samples"] > 200 and "fine-tune" in res["holdout"]["from"]
    # every kept step was checked on the whole model and stayed within the budget
    assert all(st["joint_drop"] <= 1.0 for st in res["steps"] if st["kept"])
    assert res["checks"]["encoded_bytes"] <= res["checks"]["start_encoded_bytes"]
    if any(st["kept"] for st in res["steps"]):
        assert res["checks"]["encoded_bytes"] < res["checks"]["start_encoded_bytes"]
