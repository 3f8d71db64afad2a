"""A model with one input and several outputs (a classifier and a box regressor on one trunk, the zoo's
``two_outputs``) through optimize (distilled, 2:4 pruned), compile, report and export; a data file without every
output's targets, and a model with two inputs, stop with one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from helpers import one_error_line, run_in_process

import zoo

U55 = "ethos-u55-128"


@pytest.fixture(scope="module")
def two_outputs(tmp_path_factory) -> Path:
    from edgedeploy.keras import tfenv

    out = tmp_path_factory.mktemp("two_outputs")
    zoo.write_zoo(tfenv.load().keras, out, ["two_outputs"])
    (out / "tiny.toml").write_text(zoo.TINY_RECIPE)
    return out


@pytest.fixture(scope="module")
def run(two_outputs, tmp_path_factory) -> Path:
    """ptq and a 2:4-pruned leaf (distilled from the float model's outputs, both heads), compiled for U55."""
    run = tmp_path_factory.mktemp("run") / "run"
    proc = run_in_process("optimize", two_outputs / "two_outputs.h5", "--data", two_outputs / "two_outputs.npz", "-o",
                          run, "--recipe", two_outputs / "tiny.toml", "--leaves", "ptq,pruned", "--sparsity-pattern",
                          "2:4", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    proc = run_in_process("compile", run, "-t", U55, "--allow-cpu-ops", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return run


def test_every_output_is_trained_and_scored_and_the_first_is_judged(run):
    manifest = json.loads((run / "manifest.json").read_text())
    stages = {r["id"]: r for r in manifest["stages"]}
    task = manifest["info"]["optimize"]["task"]
    assert (task["kind"], task["output"]) == ("classification", "class")
    assert [(o["output"], o["kind"], o["loss"]) for o in task["outputs"]] == [("box", "regression",
                                                                              "mean_squared_error")]
    for leaf in ("ptq", "pruned"):
        metrics = stages[f"convert/{leaf}"]["metrics"]
        assert {"int8_accuracy", "int8_box_mse", "int8_box_mae", "float_box_mse"} <= set(metrics)
        assert 0 <= metrics["int8_accuracy"]["value"] <= 100 and metrics["int8_box_mse"]["value"] > 0
    training = stages["optimize/pruned"]["details"]["training"]
    assert training["distillation"] is not None and np.isfinite(training["curve"][0]["accuracy"])
    assert [(o["output"], o["distilled"]) for o in training["outputs"]["each"]] == [("class", True), ("box", True)]
    proc = run_in_process("report", run, "-f", "json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {r["leaf"]: r["values"] for r in json.loads(proc.stdout)["rows"]}
    assert rows["ptq"]["int8_accuracy_pct"]["value"] == stages["convert/ptq"]["metrics"]["int8_accuracy"]["value"]
    assert rows["pruned"]["int8_other_metrics"]["value"].startswith("box MSE ")


@pytest.mark.parametrize("leaf", ["ptq", "pruned"])
def test_export_writes_every_output_in_the_keras_order(run, tmp_path, leaf):
    """The converter lists the box output first; the int8 model has them back in the Keras order, so the golden
    output 0 is the classifier's softmax (each row sums to 1) and the arg max is the class."""
    fw = tmp_path / "fw"
    proc = run_in_process("export", run, "--leaf", leaf, "-t", U55, "-o", fw, "--golden", "4")
    assert proc.returncode == 0, proc.stderr[-2000:]
    golden = np.load(fw / "golden.npz")
    bundle = json.loads((fw / "manifest.json").read_text())
    scales = [(t["scale"][0], t["zero_point"][0]) for t in bundle["outputs"]]
    sums = [((golden[f"output_{i}"].astype(np.float64) - zero) * scale).sum(axis=1) for i, (scale, zero)
            in enumerate(scales)]
    assert np.allclose(sums[0], 1.0, atol=0.05) and not np.allclose(sums[1], 1.0, atol=0.05)
    assert np.array_equal(golden["argmax"], golden["output_0"].argmax(axis=1))
    assert "ptq_golden_output_1" in (fw / f"{leaf}_golden.h").read_text().replace(leaf, "ptq")


def test_a_data_file_without_every_outputs_targets_stops_naming_the_key(two_outputs, tmp_path):
    arrays = dict(np.load(two_outputs / "two_outputs.npz"))
    del arrays["y_box"]
    np.savez(tmp_path / "no_box.npz", **arrays)
    proc = run_in_process("optimize", two_outputs / "two_outputs.h5", "--data", tmp_path / "no_box.npz", "-o",
                          tmp_path / "run", "--recipe", two_outputs / "tiny.toml", "--leaves", "ptq")
    assert proc.returncode == 3
    line = one_error_line(proc)
    assert "no_box.npz: has no targets for the model's output 'box' (no 'y_box')" in line and "add y_box" in line
    assert not (tmp_path / "run").exists()


def test_a_model_with_two_inputs_is_refused_in_one_line(two_outputs, tmp_path):
    from edgedeploy.keras import tfenv

    k = tfenv.load().keras
    a, b = k.Input((8,)), k.Input((8,))
    k.Model([a, b], k.layers.Dense(2, activation="softmax")(k.layers.Concatenate()([a, b]))).save(tmp_path / "m.h5")
    proc = run_in_process("optimize", tmp_path / "m.h5", "--data", two_outputs / "two_outputs.npz", "-o",
                          tmp_path / "run", "--leaves", "ptq")
    assert proc.returncode == 3
    assert "m.h5 has 2 inputs and 1 outputs" in one_error_line(proc) and not (tmp_path / "run").exists()
