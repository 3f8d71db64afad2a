"""The per-layer palette sweep on the real DS-CNN: work items in a process pool or as Ray tasks, sizes from Vela."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.requires_data


@pytest.fixture(scope="module")
def folded(shared_data, tmp_path_factory):
    """The published float DS-CNN with its batch norms folded (the palette node's first step), and its hold-out."""
    from edgedeploy.keras import tfenv
    from edgedeploy.optimize.palette.models import fold_batch_norm
    from edgedeploy.keras.rewrites import fuse_separate_relu

    keras = tfenv.load().keras
    original = keras.models.load_model(shared_data / "kws" / "dscnn_mlperf_float.h5", compile=False)
    model, names = fold_batch_norm(original)
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


@pytest.fixture(scope="module")
def hessians(folded, shared_data):
    """Layer-input hessians of the folded DS-CNN from 512 fine-tune clips that the tests do not score."""
    from edgedeploy.optimize.palette.models import kernel_layers, layer_hessians

    model, _, x, _ = folded
    d = np.load(shared_data / "kws" / "speech_commands_v2_test_mfcc_mlperf.npz")
    fit = np.where(d["split"] == 0)[0]
    scored = np.random.default_rng(0).choice(fit, 256, replace=False)  # the clips `folded` scores (same draw)
    rest = np.random.default_rng(1).permutation(np.setdiff1d(fit, scored))[:512]
    xh = d["x"][np.sort(rest)].reshape(-1, 49, 10, 1).astype(np.float32)
    return layer_hessians(model, xh, [n for n, _ in kernel_layers(model)]), xh


ITEMS = [("conv2d_1", {"clusters": 4, "sparsity": 0.0}), ("conv2d_1", {"clusters": 16, "sparsity": 0.0}),
         ("depthwise_conv2d", {"clusters": 8, "sparsity": 0.0}), ("dense", {"clusters": 4, "sparsity": 0.6})]


def _scores(model, x, y):
    probs = model.predict(x, verbose=0)
    return (float(np.mean(np.argmax(probs, axis=-1) == y)) * 100,
            float(-np.mean(np.log(np.clip(probs[np.arange(len(y)), y], 1e-7, 1.0)))))


@pytest.fixture(scope="module")
def pool_results(folded, hessians, tmp_path_factory):
    """The items run in a process pool, without and with compensation (each run once a module). One worker (one
    TensorFlow to start): the check is what comes back from the pool, not how many ran at once."""
    from edgedeploy.optimize.palette.sensitivity import run_items

    _, path, x, y = folded
    done: dict[bool, list] = {}

    def results(compensated: bool) -> list:
        if compensated not in done:
            done[compensated] = run_items(ITEMS, path, x, y, tmp_path_factory.mktemp("pool"), "process", workers=1,
                                          hessians=hessians[0] if compensated else None)
        return done[compensated]

    return results


# The default run takes the compensated items (their hessians go to the workers too, and the Ray test compares with
# them); the pool's nearest-value items run with -m slow: the same pool path, and nearest-value snapping in this
# process is checked by test_compensation_keeps_the_real_model_closer_on_unseen_clips.
@pytest.mark.parametrize("compensated", [pytest.param(False, marks=pytest.mark.slow), True], ids=["nearest", "gptq"])
def test_items_in_a_process_pool_match_in_process(folded, hessians, pool_results, compensated):
    from edgedeploy.keras import tfenv
    from edgedeploy.optimize.palette.models import apply_plan

    keras = tfenv.load().keras
    model, path, x, y = folded
    h = hessians[0] if compensated else None
    results = pool_results(compensated)
    assert [(r["layer"], r["setting"]) for r in results] == ITEMS
    # the same item computed here, independently of the pool (one copy, its weights reset for each item)
    copy = keras.models.clone_model(model)
    for (layer, setting), r in zip(ITEMS, results):
        copy.set_weights(model.get_weights())
        done = apply_plan(copy, {layer: setting}, hessians=h)
        assert done[layer]["method"] == ("gptq" if compensated else "nearest")
        accuracy, loss = _scores(copy, x, y)
        assert r["accuracy"] == pytest.approx(accuracy, abs=1e-9)
        assert r["loss"] == pytest.approx(loss, rel=1e-4)
        assert len(r["projection"]["palette"]) <= setting["clusters"]
    # 4 clusters cost more loss than 16 on the same layer
    assert results[0]["loss"] > results[1]["loss"]


def test_items_as_ray_tasks_match_the_process_pool(folded, hessians, pool_results, tmp_path, ray_home):
    pytest.importorskip("ray", reason="Ray is not installed (pip install -e '.[ray]')")
    from edgedeploy.optimize.palette.sensitivity import run_items

    _, path, x, y = folded
    local = pool_results(True)
    # one worker (one TensorFlow to start): the check is what comes back from the tasks, not how many ran at once
    remote = run_items(ITEMS, path, x, y, tmp_path, "ray", workers=1, hessians=hessians[0])
    assert [r["accuracy"] for r in remote] == [r["accuracy"] for r in local]
    assert [r["loss"] for r in remote] == pytest.approx([r["loss"] for r in local], rel=1e-6)


def test_layer_hessians_reproduce_each_layers_own_output(folded, hessians):
    """k^T H k must equal the mean square of the layer's linear output (no bias, no activation) for any kernel k:
    checked with TensorFlow's own convolutions, so patch order, padding, strides and depthwise channels agree."""
    from edgedeploy.keras import tfenv
    from edgedeploy.optimize.palette.models import kernel_layers
    from edgedeploy.optimize.palette.projection import channels_last

    env = tfenv.load()
    tf, keras = env.tf, env.keras
    model, _, _, _ = folded
    h, xh = hessians
    assert set(h) == {n for n, _ in kernel_layers(model)}
    layers = kernel_layers(model)
    # every kernel layer's input from one pass over the clips (one model, one traced predict)
    taps = keras.Model(model.inputs, [model.get_layer(name).input for name, _ in layers]).predict(xh, verbose=0)
    for (name, kind), inputs in zip(layers, taps):
        layer = model.get_layer(name)
        kernel = layer.get_weights()[0]
        cfg = layer.get_config()
        if kind == "Dense":
            out = inputs.reshape(-1, inputs.shape[-1]) @ kernel
        elif kind == "Conv2D":
            out = tf.nn.conv2d(inputs, kernel, cfg["strides"], cfg["padding"].upper(),
                               dilations=cfg["dilation_rate"]).numpy()
        else:
            out = tf.nn.depthwise_conv2d(inputs, kernel, [1, *cfg["strides"], 1], cfg["padding"].upper(),
                                         dilations=cfg["dilation_rate"]).numpy()
        mean_square = np.mean(out.reshape(-1, out.shape[-1]).astype(np.float64) ** 2, axis=0)
        flat = channels_last(kernel.astype(np.float64), kind)
        if h[name].ndim == 3:
            predicted = np.einsum("ic,cij,jc->c", flat, h[name], flat)
        else:
            predicted = np.einsum("ic,ij,jc->c", flat, h[name], flat)
        np.testing.assert_allclose(predicted, mean_square, rtol=2e-3, err_msg=name)


def test_compensation_keeps_the_real_model_closer_on_unseen_clips(folded, hessians):
    """Every layer at 8 palette values: the error-compensated model loses far less than nearest-value snapping,
    scored on fine-tune clips the hessians never saw."""
    from edgedeploy.keras import tfenv
    from edgedeploy.optimize.palette.models import apply_plan, kernel_layers

    keras = tfenv.load().keras
    model, _, x, y = folded
    plan = {n: {"clusters": 8, "sparsity": 0.0} for n, _ in kernel_layers(model)}
    base = _scores(model, x, y)[1]
    rises = {}
    copy = keras.models.clone_model(model)
    for method, h in (("nearest", None), ("gptq", hessians[0])):
        copy.set_weights(model.get_weights())
        apply_plan(copy, plan, hessians=h)
        rises[method] = _scores(copy, x, y)[1] - base
    print("loss rise on unseen clips:", rises)
    assert rises["gptq"] < 0.5 * rises["nearest"], rises


@pytest.mark.slow
def test_sweep_chooses_a_plan_within_budget_with_vela_sizes(folded, shared_data, tmp_path):
    from edgedeploy.optimize.palette.models import kernel_layers
    from edgedeploy.optimize.palette.sensitivity import sensitivity_sweep
    from edgedeploy.config.data import load_dataset
    from edgedeploy.config.recipe import load_recipe

    model, _, _, _ = folded
    data = load_dataset(shared_data / "kws" / "speech_commands_v2_test_mfcc_mlperf.npz", (49, 10, 1), 12)
    recipe = load_recipe(table={"palette": {"search": True, "clusters": [8, 16], "sparsities": [0.0],
                                            "accuracy_budget": 1.0}})
    res = sensitivity_sweep(model, data, recipe, tmp_path / "work")
    layers = [n for n, _ in kernel_layers(model)]
    assert sorted(res["options"]) == sorted(layers) and set(res["plan"]) == set(layers)
    for layer, options in res["options"].items():
        by_k = {o["setting"]["clusters"]: o for o in options}
        assert set(by_k) == {8, 16, 32}  # the candidates and Vela's 32, where the walk starts
        # a smaller palette never encodes larger (Vela's own bytes, per layer)
        assert by_k[8]["bytes"] <= by_k[16]["bytes"] <= by_k[32]["bytes"], layer
    assert res["measured_on"]["samples"] > 200 and "fine-tune" in res["measured_on"]["from"]
    # without hessians the sweep snaps to the nearest values; drops are judged from the loss rise
    assert res["projection"] == "nearest" and res["points_per_nat"] > 0
    assert all({"measured_drop", "loss_rise"} <= set(o) for opts in res["options"].values() for o in opts)
    # every kept step was checked on the whole model and stayed within the budget, which (budget_from =
    # "palette", the default) counts from the start: every layer at 32 values
    start = res["checks"]["start_drop"]
    assert res["effective_budget_points"] == pytest.approx(1.0 + max(start, 0.0), abs=1e-3)
    assert all(st["joint_drop"] <= res["effective_budget_points"] for st in res["steps"] if st["kept"])
    assert all(st["joint_drop"] > res["effective_budget_points"] for st in res["steps"] if not st["kept"])
    assert res["checks"]["encoded_bytes"] <= res["checks"]["start_encoded_bytes"]
    if any(st["kept"] for st in res["steps"]):
        assert res["checks"]["encoded_bytes"] < res["checks"]["start_encoded_bytes"]


@pytest.mark.slow
def test_sweep_meets_a_size_budget_that_vela_confirms(folded, shared_data, tmp_path):
    """``size_budget``: the plan's encoded weights, compiled anew by Vela, are within the fraction of the int8
    reference's (the published model, as the ptq leaf converts it)."""
    from edgedeploy.keras import tfenv
    from edgedeploy.optimize.palette.models import apply_plan
    from edgedeploy.optimize.palette.sensitivity import ALL_WEIGHTS, layer_bytes, sensitivity_sweep
    from edgedeploy.tflite.convert import convert_int8
    from edgedeploy.config.data import load_dataset
    from edgedeploy.config.recipe import load_recipe

    keras = tfenv.load().keras
    model, _, _, _ = folded
    reference = keras.models.load_model(shared_data / "kws" / "dscnn_mlperf_float.h5", compile=False)
    data = load_dataset(shared_data / "kws" / "speech_commands_v2_test_mfcc_mlperf.npz", (49, 10, 1), 12)
    recipe = load_recipe(table={"palette": {"search": True, "clusters": [8, 16], "sparsities": [0.0, 0.5],
                                            "size_budget": 0.5, "measure_samples": 1000}})
    res = sensitivity_sweep(model, data, recipe, tmp_path / "work", reference=reference)
    size = res["size"]
    print("size budget:", {k: v for k, v in size.items() if k != "walks"}, "walks:", size["walks"], res["checks"])
    assert size["fits"] and size["encoded_bytes"] <= 0.5 * size["reference_encoded_bytes"]
    assert res["budget_points"] is None and len(size["walks"]) > 1
    # the least drop over the walks that fit
    limit = 0.5 * size["reference_encoded_bytes"] - size["fixed_encoded_bytes"]
    fitting = [w for w in size["walks"] if w["bytes"] <= limit]
    assert res["checks"]["drop"] == min(w["drop"] for w in fitting)
    # Vela, on the plan applied to a fresh copy (a model the sweep never encoded), agrees with the sweep's sum
    copy = keras.models.clone_model(model)
    copy.set_weights(model.get_weights())
    apply_plan(copy, res["plan"], recipe.seed)
    calibration, _ = data.calibration(recipe.calibration_samples, recipe.seed)
    tflite = tmp_path / "plan.tflite"
    tflite.write_bytes(convert_int8(copy, calibration, float_io=recipe.float_io))
    sizes = layer_bytes({"plan": tflite}, "ethos-u55-128", tmp_path / "check", list(res["plan"]))
    assert sizes["plan"][ALL_WEIGHTS] == size["encoded_bytes"]
