"""2:4 structured sparsity on real TensorFlow, TFMOT and Vela: the groups Vela's Ethos-U85 skips, the
gradual 2:4 pruning of a small model through pruned_clustered and pcqat, and the check that names a layer that loses
the pattern."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from edgedeploy.config import pattern as structured
from helpers import input_models


def _conv_model(keras, seed: int):
    keras.utils.set_random_seed(seed)
    inp = keras.Input((12, 12, 16))
    x = keras.layers.Conv2D(32, 3, padding="same", activation="relu", name="conv_a")(inp)
    x = keras.layers.Conv2D(32, 3, padding="same", activation="relu", name="conv_b")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    out = keras.layers.Dense(8, name="fc")(x)
    return keras.Model(inp, out)


def test_vela_counts_fewer_macs_only_for_groups_along_input_channels(tmp_path):
    """Zero two of every four weights along the input channels (this module's groups) and, as a control, along
    the output channels: Vela 5.2 for Ethos-U85 counts fewer MACs only for the first."""
    from edgedeploy.keras import tfenv
    from edgedeploy.tflite.convert import convert_int8
    from edgedeploy.pipeline.compile import CompileOptions, compile_tflite

    env = tfenv.load()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 12, 12, 16)).astype(np.float32)
    for how in ("dense", "input", "output"):
        model = _conv_model(env.keras, 0)
        for layer in model.layers:
            if layer.name in ("conv_a", "conv_b", "fc"):
                w = layer.get_weights()
                kind = "Dense" if layer.name == "fc" else "Conv2D"
                if how == "input":
                    w[0] = w[0] * structured.mask_2of4(w[0], kind)
                elif how == "output":  # the same pattern on the wrong axis: groups of four output channels
                    swapped = np.swapaxes(w[0], -1, -2)
                    w[0] = np.swapaxes(swapped * structured.mask_2of4(swapped, kind), -1, -2)
                layer.set_weights(w)
        (tmp_path / f"{how}.tflite").write_bytes(convert_int8(model, x[:32]))
    # one compile of the three models (one Vela worker to start)
    outcome = compile_tflite([tmp_path / f"{how}.tflite" for how in ("dense", "input", "output")], ["ethos-u85-256"],
                             tmp_path / "out", CompileOptions(jobs=1))
    macs = {r.variant: r.metrics["macs"].value for r in outcome.records}
    print("Vela U85-256 MACs:", macs)
    assert macs["input"] < 0.7 * macs["dense"]
    assert macs["output"] == macs["dense"]


def _small_npz(src: Path, out: Path, fit: int, ev: int, seed: int = 0) -> Path:
    """A seeded random choice of fine-tune and evaluation clips (the files are stored sorted by class)."""
    d = np.load(src)
    rng = np.random.default_rng(seed)
    idx = np.concatenate([rng.choice(np.where(d["split"] == 0)[0], fit, replace=False),
                          rng.choice(np.where(d["split"] == 1)[0], ev, replace=False)])
    np.savez(out, x=d["x"][idx], y=d["y"][idx], split=d["split"][idx], labels=d["labels"])
    return out


def test_2of4_survives_pruned_clustered_and_pcqat_into_the_int8_kernels(tmp_path):
    """The committed tiny DS-CNN (a 1-channel-input convolution, one depthwise/pointwise block, a classifier): the
    check is the int8 kernels' pattern and the layer left out, not accuracy, so a small model and its few hundred
    samples do."""
    from edgedeploy.pipeline.driver import drive
    from edgedeploy.pipeline.run_plan import Plan
    from edgedeploy.config.recipe import load_recipe
    from edgedeploy.tflite.reader import read_weight_tensors

    models = input_models()
    data = tmp_path / "tiny.npz"
    np.savez(data, **models.tiny_arrays())
    recipe = load_recipe(overrides={"leaves": ["pruned_clustered", "pcqat"], "epochs": 1, "min_steps": 0, "seed": 3,
                                    "sparsity_pattern": "2:4", "calibration_samples": 64})
    outcome = drive(Plan(models.tiny_dscnn(1, 64), data, tmp_path / "run", recipe)).tree
    pruned = outcome.nodes["pruned"].details
    assert pruned["training"]["pruning"]["structured"]["left_out"] == {"conv": "1 input channels, not a multiple of 4"}
    for leaf in ("pruned_clustered", "pcqat"):
        rec = outcome.leaves[leaf]
        checked = 0
        for t in read_weight_tensors(outcome.run_dir / rec.output("int8_model").path):
            if t.op not in ("CONV_2D", "FULLY_CONNECTED") or t.shape[-1] % 4:
                continue
            groups = t.values().reshape(-1, 4)  # OHWI / [out, in]: four consecutive input channels
            assert np.all((groups == 0).sum(axis=1) >= 2), (leaf, t.name)
            checked += 1
        assert checked == 2  # the pointwise convolution and the classifier
        rows = {r["layer"]: r for r in rec.details["preservation"]}
        assert rows["conv"]["status"] == "left out" and "not a multiple of 4" in rows["conv"]["note"]
        assert all(r["groups_short"] == 0 for r in rows.values() if r.get("pattern") == "2:4")


def test_a_stage_that_breaks_the_pattern_fails_with_the_layer_named():
    from edgedeploy.optimize import preserve
    from edgedeploy.errors import PreservationError

    k = np.random.default_rng(0).normal(size=(1, 1, 8, 4)).astype(np.float32)
    k = k * structured.mask_2of4(k, "Conv2D")
    k[0, 0, 4:, 2] = 0.5  # one group of four input channels now holds no zero
    verdict = structured.check("pcqat", "int8", [("conv2d_3", "Conv2D", np.transpose(k, (3, 0, 1, 2)))])
    with pytest.raises(PreservationError) as err:
        preserve.raise_failures(preserve.Verdict([], [], verdict.failures), "pcqat (int8)")
    assert err.value.exit_code == 9 and "conv2d_3" in str(err.value) and "2:4" in str(err.value)


@pytest.mark.requires_data("kws/ds_cnn_s_arm_float.h5", "kws/speech_commands_v2_test_mfcc_arm.npz")
def test_ptq_16x8_leaf_compiles_for_u55_and_u85_without_cpu_operators(shared_data, tmp_path):
    from edgedeploy.pipeline.compile import CompileOptions, compile_run
    from edgedeploy.pipeline.driver import drive
    from edgedeploy.pipeline.run_plan import Plan
    from edgedeploy.config.recipe import load_recipe
    from edgedeploy.tflite.reader import read_tflite

    # 160 evaluation clips for the accuracy; the fine-tune clips only calibrate (a few batches of ranges do)
    data = _small_npz(shared_data / "kws" / "speech_commands_v2_test_mfcc_arm.npz", tmp_path / "kws.npz", 64, 160)
    recipe = load_recipe(overrides={"leaves": ["ptq", "ptq_16x8"], "calibration_samples": 64})
    outcome = drive(Plan(shared_data / "kws" / "ds_cnn_s_arm_float.h5", data, tmp_path / "run", recipe)).tree
    rec = outcome.leaves["ptq_16x8"]
    model = read_tflite(outcome.run_dir / rec.output("int8_model").path)
    assert model.is_integer()
    print("ptq_16x8 int8 accuracy", rec.metric("int8_accuracy"))
    assert rec.metric("int8_accuracy") > 80.0  # Arm's DS-CNN-S scores about 89% on this split
    comp = compile_run(outcome.run_dir, ["ethos-u55-128", "ethos-u85-256"], CompileOptions(jobs=1))
    for r in comp.records:
        assert r.metrics["cpu_operators"].value == 0, (r.variant, r.target)
    by = {(r.variant, r.target): r for r in comp.records}
    # int16 activations: more SRAM than int8 on both targets
    for t in ("ethos-u55-128", "ethos-u85-256"):
        assert by[("ptq_16x8", t)].metrics["sram_bytes"].value > by[("ptq", t)].metrics["sram_bytes"].value


def test_float16_and_dynamic_range_are_refused_as_not_npu_formats():
    from edgedeploy.errors import UsageError
    from edgedeploy.config.recipe import load_recipe

    for leaf in ("float16", "dynamic_range"):
        with pytest.raises(UsageError, match="not an NPU format"):
            load_recipe(overrides={"leaves": ["ptq", leaf]})


def test_ptq_16x8_names_an_lstm_the_converter_has_no_16x8_kernel_for():
    from edgedeploy.keras import tfenv
    from edgedeploy.tflite.convert16 import convert_16x8
    from edgedeploy.errors import ToolFailedError

    keras = tfenv.load().keras
    keras.utils.set_random_seed(0)
    inp = keras.Input((8, 4))
    model = keras.Model(inp, keras.layers.Dense(3)(keras.layers.LSTM(4)(inp)))
    x = np.random.default_rng(0).normal(size=(16, 8, 4)).astype(np.float32)
    with pytest.raises(ToolFailedError) as err:
        convert_16x8(model, x, source="lstm.h5")
    assert "operator UNIDIRECTIONAL_SEQUENCE_LSTM has no 16x8" in str(err.value), str(err.value)
    assert "\n" not in str(err.value)
