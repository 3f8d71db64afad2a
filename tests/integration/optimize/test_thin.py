"""Thinned models on real TensorFlow and Vela: the channel surgery through every coupling, the layers that cannot
be thinned named with the reason, the channel check that fails a stage (exit 9), and a thinned leaf whose widths
Vela's cycles chose, compiled for Ethos-U55."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from helpers import input_models

SEED = 0


def _coupled_model(keras):
    """A residual Add, a depthwise pass-through, a Concatenate, batch norm, Flatten into a hidden Dense."""
    keras.utils.set_random_seed(SEED)
    inp = keras.Input((8, 8, 3))
    a = keras.layers.Conv2D(8, 3, padding="same", name="c0")(inp)
    a = keras.layers.BatchNormalization(name="bn0")(a)
    a = keras.layers.ReLU(name="r0")(a)
    b = keras.layers.Conv2D(8, 3, padding="same", name="c1")(a)
    b = keras.layers.Add(name="add")([a, b])
    d = keras.layers.DepthwiseConv2D(3, padding="same", name="dw")(b)
    e = keras.layers.Conv2D(4, 1, name="c2")(d)
    c = keras.layers.Concatenate(name="cat")([d, e])
    f = keras.layers.Conv2D(6, 1, name="c3")(c)
    f = keras.layers.MaxPooling2D(name="pool")(f)
    f = keras.layers.Flatten(name="flat")(f)
    f = keras.layers.Dense(10, activation="relu", name="hidden")(f)
    out = keras.layers.Dense(3, name="out")(f)
    model = keras.Model(inp, out)
    bn = model.get_layer("bn0")  # batch statistics that are not the identity
    rng = np.random.default_rng(SEED)
    bn.set_weights([rng.uniform(0.5, 2, 8), rng.normal(size=8), rng.normal(size=8), rng.uniform(0.5, 2, 8)])
    return model


def _masked(keras, model, keep):
    """The original model with the removed channels' outputs forced to zero: what the thinned model computes."""
    copy = keras.models.clone_model(model)
    copy.set_weights(model.get_weights())
    for name, group in (("c0", "c0"), ("c1", "c0"), ("c2", "c2"), ("c3", "c3"), ("hidden", "hidden")):
        layer = copy.get_layer(name)
        w = layer.get_weights()
        mask = np.zeros(w[0].shape[-1], np.float32)
        mask[keep[group]] = 1
        layer.set_weights([w[0] * mask, w[1] * mask])
    gone = [i for i in range(8) if i not in keep["c0"]]
    bn = copy.get_layer("bn0").get_weights()
    bn[0][gone], bn[1][gone] = 0, 0
    copy.get_layer("bn0").set_weights(bn)
    dw = copy.get_layer("dw").get_weights()
    dw[1][gone] = 0
    copy.get_layer("dw").set_weights(dw)
    return copy


def test_thinning_through_add_concat_depthwise_flatten_computes_the_masked_model():
    from edgedeploy.keras import tfenv
    from edgedeploy.keras.channel_surgery import channel_groups, kernel_channels, thin_model

    keras = tfenv.load().keras
    model = _coupled_model(keras)
    graph = channel_groups(model)
    groups = graph.thinnable()
    assert sorted(groups) == ["c0", "c2", "c3", "hidden"]
    assert groups["c0"].producers == ["c0", "c1"]  # both branches of the residual Add
    assert graph.held() == {"out": "it is a model output"}
    keep = {"c0": [0, 2, 5, 7], "c2": [1, 3], "c3": [0, 1, 4], "hidden": [1, 2, 3, 9]}
    thinned = thin_model(model, graph, keep)
    assert kernel_channels(thinned) == {"c0": (3, 4), "c1": (4, 4), "dw": (4, 4), "c2": (4, 2), "c3": (6, 3),
                                        "hidden": (48, 4), "out": (4, 3)}
    x = np.random.default_rng(SEED).normal(size=(4, 8, 8, 3)).astype(np.float32)
    want = _masked(keras, model, keep).predict(x, verbose=0)
    np.testing.assert_allclose(thinned.predict(x, verbose=0), want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="out cannot be thinned: it is a model output"):
        thin_model(model, graph, {"out": [0]})


def test_layers_that_cannot_be_thinned_are_named_with_the_reason():
    from edgedeploy.keras import tfenv
    from edgedeploy.keras.rewrites import conv1d_as_conv2d
    from edgedeploy.keras.channel_surgery import channel_groups

    keras = tfenv.load().keras
    inp = keras.Input((16, 4))
    x = keras.layers.Conv1D(8, 3, padding="same", name="c1d")(inp)
    x = keras.layers.Conv1D(8, 3, padding="same", name="c1d_b")(x)
    y = keras.layers.Softmax(name="norm")(x)  # normalizes over the channels
    y = keras.layers.GlobalAveragePooling1D()(y)
    out = keras.layers.Dense(2, name="out")(y)
    model, rewritten = conv1d_as_conv2d(keras.Model(inp, out))
    assert rewritten
    graph = channel_groups(model)
    assert list(graph.thinnable()) == ["c1d"]  # through the rewrite's reshapes
    held = graph.held()
    assert held["c1d_b"] == "norm (Softmax) has an unknown effect on channels"
    assert held["out"] == "it is a model output"


def test_a_stage_that_changes_a_thinned_width_fails_with_exit_9(tmp_path):
    from edgedeploy.keras import tfenv
    from edgedeploy.errors import PreservationError
    from edgedeploy.keras.channel_surgery import channel_groups, thin_model
    from edgedeploy.optimize.node import channels_kept

    env = tfenv.load()
    model = _coupled_model(env.keras)
    graph = channel_groups(model)
    parent = thin_model(model, graph, {"c3": [0, 1, 4]})
    parent.save(tmp_path / "parent.h5")
    assert all(r["status"] == "ok" for r in channels_kept(env, "thinned_pruned", tmp_path / "parent.h5", parent))
    with pytest.raises(PreservationError) as err:
        channels_kept(env, "thinned_pruned", tmp_path / "parent.h5", thin_model(model, graph, {"c3": [0, 1]}))
    assert err.value.exit_code == 9 and "layer c3" in str(err.value) and "(12, 2) != thinned (12, 3)" in str(err.value)


def _tiny_data(path):
    """The tiny DS-CNNs' data (tests/data/models/make_models.py): 240 fine-tune and 120 evaluation samples."""
    np.savez(path, **input_models().tiny_arrays())
    return path


def _tiny_dscnn(blocks: int, width: int) -> Path:
    """The committed tiny DS-CNN of ``blocks`` depthwise/pointwise blocks after a ``width``-channel convolution,
    fitted for 2 epochs on :func:`_tiny_data`'s fine-tune split."""
    return input_models().tiny_dscnn(blocks, width)


def _thinned_within_budget(model, data, out: Path, speedup: float, channel_rows: int, **recipe_keys) -> dict:
    """The ptq and thinned leaves of ``model`` for ``thin_speedup = speedup`` on Ethos-U55-128: the output layer
    left whole, the budget met, ``channel_rows`` channel checks passed in the int8 file, and the compiled thinned
    leaf within ``speedup`` of ptq's NPU cycles and within 2% of the node's own estimate. Returns the node's
    thinning record."""
    from edgedeploy.pipeline.compile import CompileOptions, compile_run
    from edgedeploy.pipeline.driver import drive
    from edgedeploy.pipeline.run_plan import Plan
    from edgedeploy.config.recipe import load_recipe

    recipe = load_recipe(overrides={"leaves": ["ptq", "thinned"], "epochs": 1, "min_steps": 0, "seed": SEED,
                                    "thin_speedup": speedup, "calibration_samples": 64, **recipe_keys})
    outcome = drive(Plan(model, data, out, recipe)).tree
    thinning = outcome.nodes["thinned"].details["thinning"]
    print("widths", thinning["widths"], "cycles", thinning["npu"]["npu_cycles"])
    assert thinning["not_thinned"] == {"fc": "it is a model output"}
    assert thinning["npu"]["held_on"] == "ethos-u55-128" and thinning["npu"]["met"]
    rows = [r for r in outcome.leaves["thinned"].details["preservation"] if r.get("check") == "channels"]
    assert len(rows) == channel_rows and all(r["status"] == "ok" and r["where"] == "int8" for r in rows)
    comp = compile_run(outcome.run_dir, ["ethos-u55-128"], CompileOptions(jobs=1))
    cycles = {r.variant: r.metrics["npu_cycles"].value for r in comp.records}
    print("U55-128 NPU cycles", cycles)
    assert cycles["thinned"] <= speedup * cycles["ptq"]
    # the node checked its widths on the weights before fine-tuning; Vela's weight encoding moves a little
    assert cycles["thinned"] == pytest.approx(thinning["npu"]["npu_cycles"]["ethos-u55-128"], rel=0.02)
    _time_by_step_within_the_nodes_total(outcome)
    return thinning


THIN_STEPS = {"channel_scores", "sensitivity", "search", "search/candidate_int8", "search/candidate_vela", "refit",
              "fine_tune", "checks", "float_scores", "save"}


def _time_by_step_within_the_nodes_total(outcome) -> None:
    """The thinned node's record splits its time by step (wall and processor seconds, each >= 0), the steps and
    the other time add up to the record's total, which is within the stage's own seconds; the report shows them."""
    from edgedeploy.report import build_report
    from edgedeploy.report.render import render

    rec = outcome.nodes["thinned"]
    times = rec.details["time_by_step"]
    print("time by step", {s: t["wall"]["value"] for s, t in times["steps"].items()}, "total", times["total"])
    assert THIN_STEPS <= set(times["steps"])
    assert ("trials" in times["steps"]) == bool(rec.details["thinning"].get("trials"))
    facts = [t[k] for t in [*times["steps"].values(), times["other"], times["total"]] for k in ("wall", "processor")]
    assert all(f["unit"] == "s" and f["mode"] == "measured" and f["value"] >= 0 for f in facts)
    assert times["steps"]["search/candidate_vela"]["calls"] >= 1 and times["steps"]["search"]["calls"] == 1
    for kind in ("wall", "processor"):
        parts = sum(t[kind]["value"] for t in times["steps"].values()) + times["other"][kind]["value"]
        assert parts == pytest.approx(times["total"][kind]["value"], abs=0.002 * (len(times["steps"]) + 1))
    assert 0 < times["total"]["wall"]["value"] <= rec.metrics["train_seconds"].value + 0.01 <= rec.seconds + 0.02
    text = render(build_report(outcome.run_dir), "markdown")
    assert "## Time by step of each node" in text and "| thinned | search/candidate_vela |" in text


def test_thinned_leaf_meets_its_cycle_budget_on_u55_keeping_the_best_tried_width(tmp_path):
    """The tree's thinned leaf on a model with one group of channels: its width from Vela's staircase, kept in
    its int8 file, and compiled it is within ``thin_speedup`` of the ptq leaf's NPU cycles. With ``thin_trials``
    the search's width and the best other one within the budget by Vela are fine-tuned for
    ``thin_trial_epochs``; the node keeps the one of least hold-out loss where it beats the search's by more than
    two standard errors of the paired difference, else the search's, with the kept one's cycles in its record."""
    data = _tiny_data(tmp_path / "data.npz")
    model = _tiny_dscnn(blocks=0, width=64)
    # (the three-width grid, 64, 48 and 32 channels: the check is the budget and the trials, not the widths between,
    # which tests/unit/optimize/test_thin_widths.py checks)
    thinning = _thinned_within_budget(model, data, tmp_path / "run", 0.8, channel_rows=2, thin_trials=3,
                                      thin_trial_epochs=1, thin_candidates=3)
    assert thinning["npu"]["grid"]["compiles_per_target"] == 3  # one group: its three candidate widths
    assert thinning["widths"]["conv"] < 64
    trials, npu = thinning["trials"], thinning["npu"]
    print("trials", trials)
    assert len(trials) == 2 and trials[0]["widths"] != trials[1]["widths"]  # one group: one other width
    checks = {c["widths"]["conv"]: c for c in npu["checks"]}
    assert all(checks[t["widths"]["conv"]]["met"] for t in trials)  # each tried width within budget by Vela
    least = min(trials, key=lambda t: t["hold_out_loss"])
    versus = trials[1]["vs_search"]
    assert versus["difference"] == pytest.approx(trials[1]["hold_out_loss"] - trials[0]["hold_out_loss"], abs=2e-5)
    kept = least if least is trials[1] and versus["difference"] < -2 * versus["se"] else trials[0]
    assert thinning["widths"] == kept["widths"]
    assert npu["npu_cycles"] == checks[kept["widths"]["conv"]]["npu_cycles"]
    assert npu.get("search_choice", trials[0]["widths"]) == trials[0]["widths"]
    assert ("search_choice" in npu) == (kept is not trials[0])


@pytest.mark.slow
def test_thinned_widths_of_coupled_groups_from_the_orthogonal_grid(tmp_path):
    """Three groups (a first convolution and two pointwise ones) searched together on the 25-row grid."""
    data = _tiny_data(tmp_path / "data.npz")
    model = _tiny_dscnn(blocks=2, width=32)
    thinning = _thinned_within_budget(model, data, tmp_path / "run", 0.7, channel_rows=6)
    assert any(w < thinning["full_widths"][g] for g, w in thinning["widths"].items())


@pytest.mark.slow
def test_a_cycle_requirement_only_a_thinned_leaf_meets_stops_the_walk_there(tmp_path):
    """ptq, qat and pruned keep the full model's cycles on Ethos-U55; the thinned leaf, aimed by the walk at the
    requirement itself, meets it, is recommended, and the deeper pcqat is never trained."""
    from edgedeploy.pipeline.compile import CompileOptions, compile_run
    from edgedeploy.pipeline.driver import drive
    from edgedeploy.pipeline.run_plan import Plan
    from edgedeploy.config.recipe import load_recipe
    from edgedeploy import api
    from edgedeploy.report.judge import requirements_from_options

    data = _tiny_data(tmp_path / "data.npz")
    model = _tiny_dscnn(blocks=0, width=64)
    probe = drive(Plan(model, data, tmp_path / "probe", load_recipe(overrides={"leaves": ["ptq"]}))).tree
    full = compile_run(probe.run_dir, ["ethos-u55-128"], CompileOptions(jobs=1)).records[0].metrics["npu_cycles"].value
    recipe = load_recipe(overrides={"leaves": ["ptq", "qat", "pruned", "thinned", "pcqat"], "epochs": 1,
                                    "min_steps": 0, "seed": SEED, "calibration_samples": 64})
    limit = int(0.8 * full)
    done = api.walk(model, data, tmp_path / "walk", recipe, ["ethos-u55-128"],
                    requirements_from_options(max_npu_cycles=limit), CompileOptions(jobs=1))
    record = done.walk
    assert record["recommended"] == "thinned" and record["stopped"] == "met"
    assert "pcqat" in record["not_walked"] and "pcqat" not in record["nodes"]
    thinned = [r for r in done.compiled.records if r.variant == "thinned"][0]
    assert thinned.metrics["npu_cycles"].value <= limit


@pytest.mark.slow
def test_under_2_of_4_the_widths_are_chosen_on_the_cycles_of_the_thinned_model_pruned_2_of_4(tmp_path):
    """With ``sparsity_pattern = "2:4"`` the candidates are compiled with the prune stage's 2:4 masks, so the
    budget holds for the ``thinned_pruned`` leaf on Ethos-U85 (which skips the zeros), as a fraction of the dense
    ptq leaf's cycles; the dense ``thinned`` model alone would be over it. ``thinned_pqat`` (PQAT of the thinned
    2:4 model) keeps its pattern, channels and cycles."""
    from edgedeploy.config.recipe import load_recipe
    from edgedeploy.pipeline.compile import CompileOptions, compile_run
    from edgedeploy.pipeline.driver import drive
    from edgedeploy.pipeline.run_plan import Plan

    data = _tiny_data(tmp_path / "data.npz")
    model = _tiny_dscnn(blocks=1, width=64)
    speedup, target = 0.6, "ethos-u85-256"
    recipe = load_recipe(overrides={"leaves": ["ptq", "thinned", "thinned_pruned", "thinned_pqat"], "epochs": 1,
                                    "min_steps": 0,
                                    "seed": SEED, "sparsity_pattern": "2:4", "thin_speedup": speedup,
                                    "thin_targets": [target], "calibration_samples": 64})
    outcome = drive(Plan(model, data, tmp_path / "run", recipe)).tree
    npu = outcome.nodes["thinned"].details["thinning"]["npu"]
    assert npu["cycles_of"] == "the thinned model pruned 2:4" and npu["met"], npu
    assert all(w % 4 == 0 for w in outcome.nodes["thinned"].details["thinning"]["widths"].values())
    cycles = {r.variant: r.metrics["npu_cycles"].value
              for r in compile_run(outcome.run_dir, [target], CompileOptions(jobs=1)).records}
    print("U85-256 NPU cycles", cycles, "budget", npu["budget"])
    assert npu["budget"][target]["ptq_npu_cycles"] == cycles["ptq"]  # the budget is a share of dense ptq's
    assert cycles["thinned_pruned"] <= speedup * cycles["ptq"] < cycles["thinned"]
    assert cycles["thinned_pruned"] == pytest.approx(npu["npu_cycles"][target], rel=0.03)
    # PQAT below it keeps the zeros (its int8 file passed the 2:4 and channel checks) and so the cycles
    assert cycles["thinned_pqat"] == pytest.approx(cycles["thinned_pruned"], rel=0.03)
    rows = outcome.leaves["thinned_pqat"].details["preservation"]
    assert any(r.get("pattern") == "2:4" for r in rows) and any(r.get("check") == "channels" for r in rows), rows


@pytest.mark.parametrize("budget,refused", [
    ({"thin_max_npu_cycles": 1}, None),  # below every width's cycles: the nearest taken, recorded as not met
    ({"thin_max_latency_ms": 1e-9}, "thin_max_latency_ms = 1e-09 ms is within the time ethos-u55-128 spends on "
                                    "this model beyond its NPU cycles"),  # below the fixed time: refused
])
def test_a_budget_the_widths_cannot_reach_is_never_recorded_as_met(tmp_path, budget, refused):
    """A cycle budget under the fewest cycles any width gives ends with the narrowest compiled choice, its record
    saying the budget was not met and a warning; a latency at or below what the target spends beyond the NPU's
    cycles (which no width removes) is refused with one line (exit 8) once the grid has measured it."""
    from edgedeploy.config.recipe import load_recipe
    from edgedeploy.errors import BudgetExceededError
    from edgedeploy.pipeline.driver import drive
    from edgedeploy.pipeline.run_plan import Plan

    data = _tiny_data(tmp_path / "data.npz")
    model = _tiny_dscnn(blocks=0, width=64)
    # (the coarsest grid, 64 and 32 channels: what is checked is the end of the search, not the widths between)
    recipe = load_recipe(overrides={"leaves": ["thinned"], "epochs": 0, "min_steps": 0, "seed": SEED,
                                    "calibration_samples": 64, "thin_candidates": 2, **budget})
    if refused:
        with pytest.raises(BudgetExceededError) as err:
            drive(Plan(model, data, tmp_path / "run", recipe))
        line = err.value.one_line()
        print(line)
        assert err.value.exit_code == 8 and refused in line and "ask for more than" in line
        return
    node = drive(Plan(model, data, tmp_path / "run", recipe)).tree.nodes["thinned"]
    npu = node.details["thinning"]["npu"]
    print(npu["budget"], npu["npu_cycles"])
    assert npu["met"] is False and npu["budget"]["ethos-u55-128"]["npu_cycles"] == 1
    assert all(not c["met"] for c in npu["checks"])
    assert npu["npu_cycles"]["ethos-u55-128"] == min(c["npu_cycles"]["ethos-u55-128"] for c in npu["checks"])
    assert node.details["thinning"]["widths"] == {"conv": 32}  # the narrowest candidate width
    assert any("miss the cycle budget on ethos-u55-128" in w for w in node.warnings)


def _se_hard_swish_model(keras):
    """Hard-swish (x * relu6(x + 3) / 6, as two TFOpLambda operations with scalars), a depthwise convolution and a
    squeeze-and-excitation gate (GlobalAveragePooling -> Dense -> Dense -> Reshape -> Multiply)."""
    keras.utils.set_random_seed(SEED)
    L = keras.layers
    inp = keras.Input((8, 8, 3))
    x = L.Conv2D(8, 3, padding="same", name="c0")(inp)
    x = L.Multiply(name="hswish")([x, L.ReLU(6.0, name="r6")(x + 3.0) * (1.0 / 6.0)])
    x = L.DepthwiseConv2D(3, padding="same", name="dw")(x)
    s = L.GlobalAveragePooling2D(name="squeeze")(x)
    s = L.Dense(4, activation="relu", name="se_reduce")(s)
    s = L.Dense(8, activation="sigmoid", name="se_expand")(s)
    x = L.Multiply(name="excite")([x, L.Reshape((1, 1, 8), name="se_reshape")(s)])
    x = L.Conv2D(6, 1, name="c1")(x)
    x = L.GlobalAveragePooling2D(name="pool")(x)
    return keras.Model(inp, L.Dense(3, name="out")(x))


def test_thinning_through_squeeze_excitation_and_hard_swish_computes_the_masked_model():
    """The gate's second Dense is tied to the channels it multiplies; hard-swish's scalar operations pass the
    channels through; the thinned model computes what the full one does with the removed channels at zero."""
    from edgedeploy.keras import tfenv
    from edgedeploy.keras.channel_surgery import channel_groups, kernel_channels, thin_model

    keras = tfenv.load().keras
    model = _se_hard_swish_model(keras)
    graph = channel_groups(model)
    groups = graph.thinnable()
    assert sorted(groups) == ["c0", "c1", "se_reduce"]
    assert groups["c0"].producers == ["c0", "se_expand"]
    assert graph.held() == {"out": "it is a model output"}
    keep = {"c0": [0, 2, 5, 7], "se_reduce": [1, 3], "c1": [0, 1, 4]}
    thinned = thin_model(model, graph, keep)
    assert kernel_channels(thinned) == {"c0": (3, 4), "dw": (4, 4), "se_reduce": (4, 2), "se_expand": (2, 4),
                                        "c1": (4, 3), "out": (3, 3)}
    masked = keras.models.clone_model(model)
    masked.set_weights(model.get_weights())
    for name, group in (("c0", "c0"), ("se_reduce", "se_reduce"), ("c1", "c1"), ("dw", "c0")):
        layer = masked.get_layer(name)
        w = layer.get_weights()
        mask = np.zeros(w[-1].shape[-1], np.float32)
        mask[keep[group]] = 1
        layer.set_weights([w[0] if name == "dw" else w[0] * mask, w[1] * mask])
    x = np.random.default_rng(SEED).normal(size=(4, 8, 8, 3)).astype(np.float32)
    np.testing.assert_allclose(thinned.predict(x, verbose=0), masked.predict(x, verbose=0), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case, held", [
    ("depth_multiplier", {"c0": "dw (DepthwiseConv2D) has depth_multiplier 2: each input channel feeds several "
                                "output channels, which are kept together with it", "out": "it is a model output"}),
    ("softmax", {"c0": "norm (Activation softmax) normalizes across the channels", "out": "it is a model output"}),
    ("tensor_constant", {"c0": "TFOpLAMBDA", "out": "it is a model output"}),
    ("flat_activation", {"out": "it is a model output"}),
])
def test_layers_that_tie_channels_hold_them_with_the_reason(case, held):
    from edgedeploy.keras import tfenv
    from edgedeploy.keras.channel_surgery import channel_groups

    keras = tfenv.load().keras
    L = keras.layers
    inp = keras.Input((8, 8, 3))
    x = L.Conv2D(4, 3, padding="same", name="c0")(inp)
    if case == "depth_multiplier":
        x = L.DepthwiseConv2D(3, depth_multiplier=2, padding="same", name="dw")(x)
    elif case == "softmax":
        x = L.Activation("softmax", name="norm")(x)
    elif case == "tensor_constant":
        x = x * np.arange(4, dtype=np.float32)  # a different factor per channel
    else:
        x = L.ReLU(name="relu")(L.Flatten(name="flat")(x))
    x = L.Conv2D(4, 1, name="c1")(x) if case != "flat_activation" else L.Dense(5, name="hidden")(x)
    out = L.Dense(2, name="out")(L.Flatten(name="flat_out")(x) if case != "flat_activation" else x)
    graph = channel_groups(keras.Model(inp, out))
    found = graph.held()
    if held["c0" if "c0" in held else "out"] == "TFOpLAMBDA":  # the operation's name counts up in one process
        assert re.fullmatch(r"tf\.math\.multiply(_\d+)? \(TFOpLambda\) has an unknown effect on channels", found["c0"])
        held = {**held, "c0": found["c0"]}
    assert found == held
    assert "c1" in graph.thinnable() or "hidden" in graph.thinnable()
    if case == "flat_activation":
        assert sorted(graph.thinnable()) == ["c0", "hidden"]  # through Flatten and the element-wise ReLU
