"""The deployment tree on models that are not classifiers: small float models committed under tests/data/models
(made by its make_models.py, seeded, on the bundled Speech Commands features), with the data they were trained on.

An MLPerf Tiny anomaly-detection-style Dense autoencoder (Dense/BatchNorm/ReLU blocks down to an 8-unit
bottleneck and back, linear output) reconstructs the MFCC features of six keyword classes (a seeded choice); the
other classes are its anomalies. The data file holds inputs only (``x``, ``split``) and the 0/1 anomaly labels of
the evaluation split, so the task must be found from the model and the data.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from helpers import input_models, run_in_process

from edgedeploy.config.recipe import load_recipe
from edgedeploy.tflite.reader import read_weight_tensors

make_models = input_models()
MODELS = make_models.HERE
SEED = make_models.SEED
UNITS = make_models.UNITS


@pytest.fixture(scope="module")
def anomaly_data(tmp_path_factory):
    """x (standardized on the normal fine-tune clips), split, and y_anomaly (1: a class outside the six normal)."""
    path = tmp_path_factory.mktemp("ad") / "ad.npz"
    np.savez(path, **make_models.anomaly_arrays())
    return path


@pytest.fixture(scope="module")
def autoencoder() -> Path:
    """The float autoencoder, fitted with a reconstruction loss and saved uncompiled (so the loss must come from
    the data)."""
    return MODELS / "autoencoder.h5"


@pytest.fixture(scope="module")
def ad_tree(autoencoder, anomaly_data, tmp_path_factory):
    """The ptq leaf and the pruned_clustered leaf (two trained nodes: pruned, then clustered keeping its zeros).
    Quantization-aware training on a model with float targets is the denoiser's qat leaf below; pcqat's keeping of
    zeros and clusters is checked on the shared tree and the committed KWS models (optimize/test_optimize.py)."""
    from edgedeploy.pipeline.driver import drive
    from edgedeploy.pipeline.run_plan import Plan

    recipe = load_recipe(overrides={"leaves": ["ptq", "pruned_clustered"], "epochs": 1, "min_steps": 0, "sparsity": 0.5,
                                    "clusters": 16, "seed": SEED})
    return drive(Plan(autoencoder, anomaly_data, tmp_path_factory.mktemp("tree"), recipe)).tree


def test_inputs_only_train_with_a_reconstruction_loss(ad_tree):
    info = json.loads((ad_tree.run_dir / "manifest.json").read_text())["info"]["optimize"]
    assert info["loss"]["name"] == "mean_squared_error" and "reconstruction" in info["loss"]["source"]
    assert info["task"]["kind"] == "reconstruction" and info["task"]["metric"] == "mse"
    assert info["task"]["higher_is_better"] is False and "auc" in info["task"]["metrics"]
    assert "accuracy" not in json.dumps(ad_tree.nodes["pruned"].details["training"]["curve"])


def test_ptq_reconstruction_error_stays_within_1_3x_the_float_model(ad_tree):
    m = ad_tree.leaves["ptq"].metrics
    assert "int8_accuracy" not in m and m["int8_mse"].unit == ""
    assert m["int8_mse"].value <= 1.3 * m["float_mse"].value, (m["int8_mse"].value, m["float_mse"].value)
    # the ROC AUC of the reconstruction error over the anomaly labels, in float and in int8, and int8 keeps it
    assert 0 <= m["float_auc"].value <= 100 and m["float_auc"].unit == "%"
    assert abs(m["int8_auc"].value - m["float_auc"].value) < 2.0


def test_pruned_clustered_keeps_half_of_its_int8_dense_weights_zero(ad_tree):
    path = ad_tree.run_dir / ad_tree.leaves["pruned_clustered"].output("int8_model").path
    dense = [t for t in read_weight_tensors(path) if t.op == "FULLY_CONNECTED" and t.dtype == "int8"]
    assert len(dense) == len(UNITS) + 1
    for t in dense:
        assert np.mean(t.values() == 0) >= 0.5 - 0.02, t.name
        per_channel = max(len(np.unique(row)) for row in t.values())  # (int8 scales are per output channel)
        assert per_channel <= 16 + 1, t.name


def test_the_report_shows_mse_and_auc_not_accuracy(ad_tree):
    from edgedeploy.pipeline.compile import compile_run
    from edgedeploy.report import build_report
    from edgedeploy.report.render import render

    compile_run(ad_tree.run_dir, ["ethos-u55-128"])
    doc = build_report(ad_tree.run_dir)
    rows = {r["leaf"]: r for r in doc["rows"]}
    ptq, clustered = rows["ptq"]["values"], rows["pruned_clustered"]["values"]
    assert ptq["int8_metric"]["metric"] == "mse" and ptq["int8_metric"]["higher_is_better"] is False
    assert ptq["int8_accuracy_pct"]["value"] is None and "not a classifier" in ptq["int8_accuracy_pct"]["unavailable"]
    assert ptq["int8_metric_drop"]["value"] == 0 and clustered["int8_metric_drop"]["value"] is not None
    assert "AUC" in ptq["int8_other_metrics"]["value"]
    text = render(doc, "table")
    assert "MSE and file size of each leaf" in text and "Int8 MSE" in text and "AUC" in text
    assert "ccuracy" not in text  # the report speaks of the task's metric throughout


def test_a_reconstruction_leaf_exports_golden_vectors_without_class_labels(ad_tree, anomaly_data, tmp_path):
    """Its targets are the inputs, not class indices: export takes the evaluation rows in file order and
    writes golden outputs equal to a TFLM run, with no label."""
    from edgedeploy.pipeline.compile import compile_run

    compile_run(ad_tree.run_dir, ["ethos-u55-128"])
    fw = tmp_path / "fw"
    proc = run_in_process("export", ad_tree.run_dir, "--leaf", "ptq", "-t", "ethos-u55-128", "-o", fw, "--golden", "3",
                          "--data", anomaly_data)
    assert proc.returncode == 0, proc.stderr[-2000:]
    g = np.load(fw / "golden.npz")
    d = np.load(anomaly_data)
    assert g["row"].tolist() == np.flatnonzero(d["split"] == 1)[:3].tolist()
    assert g["label"].tolist() == [-1, -1, -1] and g["output_0"].shape == (3, 490)
    from tflite_micro.python.tflite_micro import runtime

    interp = runtime.Interpreter.from_file(str(fw / "ptq_int8.tflite"))
    for x, want in zip(g["input_0"], g["output_0"]):
        interp.set_input(x[None, ...], 0)
        interp.invoke()
        assert np.array_equal(np.asarray(interp.get_output(0))[0], want)


def test_float_targets_of_another_shape_stop_with_one_line(autoencoder, anomaly_data, tmp_path):
    d = np.load(anomaly_data)
    bad = tmp_path / "bad.npz"
    np.savez(bad, x=d["x"], split=d["split"], y=np.zeros((len(d["x"]), 7), np.float32))
    out = tmp_path / "o"
    proc = run_in_process("optimize", autoencoder, "--data", bad, "-o", out)
    assert proc.returncode == 3, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    for needle in ("bad.npz", "[", "7]", "float32", "[490]"):
        assert needle in lines[0], lines[0]
    assert not out.exists()


@pytest.fixture(scope="module")
def denoiser(tmp_path_factory):
    """A small convolutional denoiser: noisy MFCC maps in, the clean maps (float targets) out."""
    data = tmp_path_factory.mktemp("denoise") / "denoise.npz"
    np.savez(data, **make_models.denoise_arrays())
    return MODELS / "denoiser.h5", data


def test_a_conv_model_with_float_targets_is_trained_and_scored_as_regression(denoiser, tmp_path):
    from edgedeploy.pipeline.driver import drive
    from edgedeploy.pipeline.run_plan import Plan

    model, data = denoiser
    # qat: quantization-aware training on float targets, one node trained (from the baseline)
    recipe = load_recipe(overrides={"leaves": ["ptq", "qat"], "epochs": 1, "min_steps": 0, "seed": SEED})
    outcome = drive(Plan(model, data, tmp_path / "tree", recipe)).tree
    info = json.loads((outcome.run_dir / "manifest.json").read_text())["info"]["optimize"]
    assert info["loss"]["name"] == "mean_squared_error" and "float targets" in info["loss"]["source"]
    assert info["task"]["kind"] == "regression" and "auc" not in info["task"]["metrics"]
    training = outcome.nodes["qat"].details["training"]
    assert training["distillation"]["on"].startswith("outputs") and "random" in training["selection"]["hold_out"]
    ptq = outcome.leaves["ptq"].metrics
    assert ptq["int8_mse"].value <= 1.3 * ptq["float_mse"].value and ptq["int8_psnr"].unit == "dB"
    assert outcome.leaves["qat"].metrics["int8_mse"].value < 1.0  # (the noise alone is 0.25; the signal's variance 1)
    from edgedeploy.pipeline.compile import compile_run

    compile_run(outcome.run_dir, ["ethos-u55-128"])  # float targets are values, not labels: export takes them
    # (the data file named: the one the run recorded, which export would also follow while it is unchanged)
    proc = run_in_process("export", outcome.run_dir, "--leaf", "ptq", "-t", "ethos-u55-128", "-o", tmp_path / "fw",
                          "--golden", "2", "--data", data)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert np.load(tmp_path / "fw" / "golden.npz")["output_0"].shape == (2, 49, 10, 1)


U55 = "ethos-u55-128"


@pytest.fixture(scope="module")
def inputs_only(anomaly_data, tmp_path_factory) -> Path:
    """The autoencoder's samples as ``x_train`` and ``x_test`` alone: no targets, no anomaly labels."""
    d = np.load(anomaly_data)
    path = tmp_path_factory.mktemp("ae-io") / "ad_io.npz"
    np.savez(path, x_train=d["x"][d["split"] == 0], x_test=d["x"][d["split"] == 1])
    return path


@pytest.fixture(scope="module")
def inputs_only_run(autoencoder, inputs_only, tmp_path_factory) -> Path:
    """``optimize`` (the ptq leaf) and ``compile`` for the U55, each through the command line."""
    run = tmp_path_factory.mktemp("ae-io-run") / "run"
    proc = run_in_process("optimize", autoencoder, "--data", inputs_only, "-o", run, "--leaves", "ptq", "--seed", SEED)
    assert proc.returncode == 0, proc.stderr[-2000:]
    proc = run_in_process("compile", run, "-t", U55)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return run


@pytest.fixture(scope="module")
def imported_run(inputs_only_run, tmp_path_factory) -> Path:
    """The ptq leaf's int8 model compiled on its own: a run that records no data and so no task."""
    run = tmp_path_factory.mktemp("ae-io-tflite") / "run"
    int8 = inputs_only_run / "convert" / "ptq" / "model_int8.tflite"
    proc = run_in_process("compile", int8, "-t", U55, "-o", run)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return run


@pytest.mark.parametrize("which", ["optimized", "imported"])
def test_verify_takes_inputs_only_data(which, inputs_only_run, imported_run, inputs_only):
    run = inputs_only_run if which == "optimized" else imported_run
    leaf = ["--leaf", "ptq"] if which == "optimized" else []
    proc = run_in_process("verify", run, *leaf, "-t", U55, "--data", inputs_only, "--count", "4", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(proc.stdout)
    assert doc["status"] == "bit-exact" and doc["cases"] == 4, doc
    assert "evaluation rows of ad_io.npz" in doc["inputs"], doc


@pytest.mark.parametrize("which", ["optimized", "imported"])
def test_export_golden_takes_inputs_only_data(which, inputs_only_run, imported_run, inputs_only, tmp_path):
    """Golden cases are the evaluation rows in file order, unlabelled, with the model's own outputs."""
    run = inputs_only_run if which == "optimized" else imported_run
    leaf = ["--leaf", "ptq"] if which == "optimized" else []
    fw = tmp_path / "fw"
    proc = run_in_process("export", run, *leaf, "-t", U55, "-o", fw, "--golden", "3", "--data", inputs_only)
    assert proc.returncode == 0, proc.stderr[-2000:]
    g = np.load(fw / "golden.npz")
    assert g["row"].tolist() == [0, 1, 2] and g["label"].tolist() == [-1, -1, -1]
    assert g["output_0"].shape == (3, 490) and "labels" not in g.files
    from tflite_micro.python.tflite_micro import runtime

    interp = runtime.Interpreter.from_file(str(next(fw.glob("*_int8.tflite"))))
    for x, want in zip(g["input_0"], g["output_0"]):
        interp.set_input(x[None, ...], 0)
        interp.invoke()
        assert np.array_equal(np.asarray(interp.get_output(0))[0], want)


def test_report_and_the_hil_sample_take_an_inputs_only_run(inputs_only_run, inputs_only, tmp_path):
    from helpers import pytest_argv
    import subprocess

    proc = run_in_process("report", inputs_only_run, "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    row = json.loads(proc.stdout)["rows"][0]["values"]
    assert row["int8_metric"]["metric"] == "mse" and row["int8_metric"]["value"] is not None, row["int8_metric"]
    fw = tmp_path / "fw"
    proc = run_in_process("export", inputs_only_run, "--leaf", "ptq", "-t", U55, "-o", fw, "--golden", "3",
                          "--data", inputs_only)
    assert proc.returncode == 0, proc.stderr[-2000:]
    tests = Path(__file__).resolve().parents[3] / "examples" / "hil"
    hil = subprocess.run(pytest_argv("-q", str(tests), "--edgedeploy-bundle", str(fw), "--edgedeploy-device", "npu"),
                         capture_output=True, text=True, cwd=tests, timeout=600)
    assert hil.returncode == 0 and " passed" in hil.stdout and "failed" not in hil.stdout, hil.stdout[-3000:] + hil.stderr[-2000:]
