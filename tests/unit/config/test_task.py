"""The task (loss, metric) from the model and the data; the metrics and their directions; the node table."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from edgedeploy.errors import InvalidInputError, UsageError
from edgedeploy.config.task import METRICS, decide, loss_name, mse, psnr, roc_auc, score


def _model(inp=(490,), out=(490,), activation="linear"):
    fn = SimpleNamespace(__name__=activation)
    return SimpleNamespace(input_shape=(None, *inp), output_shape=(None, *out),
                           layers=[SimpleNamespace(activation=fn)])


def test_no_targets_is_reconstruction_with_mse():
    t = decide(_model(), None, "d.npz", None)
    assert (t.kind, t.loss, t.metric) == ("reconstruction", "mean_squared_error", "mse")
    assert "reconstruction" in t.source and "auc" not in t.metrics
    assert "auc" in decide(_model(), None, "d.npz", None, has_anomaly=True).metrics


def test_integer_labels_are_sparse_cross_entropy_and_keep_the_classifier_source():
    t = decide(_model((49, 10, 1), (12,), "softmax"), None, "d.npz", np.arange(12))
    assert (t.kind, t.loss, t.from_logits, t.metric) == ("classification", "sparse_categorical_crossentropy", False,
                                                          "accuracy")
    assert t.source == "inferred: integer class labels and a softmax output"


def test_one_hot_rows_are_categorical_cross_entropy():
    t = decide(_model((8,), (4,)), None, "d.npz", np.eye(4, dtype=np.float32)[[0, 1, 2, 3, 1]])
    assert (t.kind, t.loss, t.from_logits) == ("classification", "categorical_crossentropy", True)
    assert t.source == "inferred: one-hot or probability rows and a logits output"


def test_probability_rows_are_trained_on_as_probabilities():
    t = decide(_model((8,), (3,), "softmax"), None, "d.npz", np.array([[0.7, 0.2, 0.1], [0.1, 0.3, 0.6]], np.float32))
    assert (t.kind, t.loss, t.metric) == ("classification", "categorical_crossentropy", "accuracy")
    assert t.source == "inferred: probability rows (fine-tuned on the probabilities) and a softmax output"
    keras = SimpleNamespace(losses=SimpleNamespace(CategoricalCrossentropy=lambda from_logits: ("cce", from_logits),
                                                   SparseCategoricalCrossentropy=lambda from_logits: ("scce", from_logits)))
    assert t.build(keras, probabilities=True) == ("cce", False) and t.build(keras) == ("scce", False)


def test_float_targets_of_the_output_shape_are_regression():
    t = decide(_model((8,), (3,)), None, "d.npz", np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32))
    assert (t.kind, t.loss, t.metric) == ("regression", "mean_squared_error", "mse")


def test_compile_config_wins_over_the_data():
    cfg = {"loss": {"class_name": "MeanAbsoluteError", "config": {}}}
    t = decide(_model((8,), (3,)), cfg, "d.npz", np.zeros((5, 3), np.float32))
    assert t.loss == "mean_absolute_error" and t.source.startswith("model compile config")


@pytest.mark.parametrize("targets, needles", [
    (np.zeros((5, 7), np.float32), ["d.npz", "[5, 7]", "float32", "[490]"]),
    (np.zeros((5, 490, 2), np.float64), ["[5, 490, 2]", "float64", "[490]"]),
])
def test_float_targets_of_another_shape_stop_with_one_line(targets, needles):
    with pytest.raises(InvalidInputError) as err:
        decide(_model(), None, "d.npz", targets)
    line = err.value.one_line()
    assert "\n" not in line and err.value.exit_code == 3
    for n in needles:
        assert n in line, line


def test_float_targets_with_a_classification_loss_stop():
    cfg = {"loss": "sparse_categorical_crossentropy"}
    with pytest.raises(InvalidInputError) as err:
        decide(_model((8,), (3,)), cfg, "d.npz", np.full((5, 3), 0.3, np.float32) + np.arange(3))
    assert "not class labels" in err.value.one_line() and "--loss mean_squared_error" in err.value.one_line()


def test_no_targets_needs_an_output_shaped_like_the_input():
    with pytest.raises(InvalidInputError, match="output shape"):
        decide(_model((8,), (3,)), None, "d.npz", None)


def test_loss_names_and_unknown_losses():
    assert loss_name("MeanSquaredError") == "mean_squared_error" and loss_name("mse") == "mean_squared_error"
    assert loss_name("SparseCategoricalCrossentropy") == "sparse_categorical_crossentropy"
    assert decide(_model(), None, "d.npz", None, loss="mae").loss == "mean_absolute_error"
    with pytest.raises(UsageError, match="not a Keras built-in loss"):
        decide(_model(), None, "d.npz", None, loss="wasserstein")


def test_metrics_know_their_unit_and_direction():
    assert (METRICS["accuracy"].unit, METRICS["accuracy"].higher_is_better) == ("%", True)
    assert METRICS["mse"].higher_is_better is False and METRICS["psnr"].unit == "dB"
    y = np.array([[0.0, 1.0], [2.0, 3.0]])
    assert mse(y, y + 0.5) == pytest.approx(0.25)
    assert psnr(y, y + 0.5) == pytest.approx(10 * np.log10(9 / 0.25))


def test_roc_auc_matches_the_pairwise_definition():
    rng = np.random.default_rng(3)
    labels = rng.integers(0, 2, 200)
    scores = rng.normal(size=200) + labels * 0.8
    scores[:20] = 0.0  # ties count one half
    pos, neg = scores[labels == 1], scores[labels == 0]
    pairwise = np.mean((pos[:, None] > neg[None, :]) + 0.5 * (pos[:, None] == neg[None, :])) * 100
    assert roc_auc(labels, scores) == pytest.approx(pairwise)


def test_score_gives_auc_only_with_anomaly_labels():
    t = decide(_model((4,), (4,)), None, "d.npz", None, has_anomaly=True)
    x = np.random.default_rng(0).normal(size=(10, 4))
    out = x.copy()
    out[5:] += 1.0  # the anomalous half reconstructs worse
    s = score(t, out, x, x, np.array([0] * 5 + [1] * 5))
    assert s["auc"] == pytest.approx(100.0) and s["mse"] == pytest.approx(0.5)
    assert "auc" not in score(t, out, x, x, None)


def test_user_metric_is_loaded_only_when_named(tmp_path, monkeypatch):
    (tmp_path / "my_metrics.py").write_text("def snr(y, out):\n    return 42.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    t = decide(_model(), None, "d.npz", None, metric="my_metrics:snr")
    assert t.metric == "my_metrics:snr" and score(t, np.zeros((2, 490)), np.zeros((2, 490)))["my_metrics:snr"] == 42.0
    with pytest.raises(UsageError, match="does not apply"):
        decide(_model(), None, "d.npz", None, metric="accuracy")


def test_the_node_table_is_the_one_tree():
    from edgedeploy.optimize import preserve
    from edgedeploy.config import recipe, tree
    from edgedeploy import report

    assert recipe.NODES is tree.NODES and preserve.PRUNED_NODES is tree.PRUNED_NODES
    assert report.LEAF_LEVELS is tree.LEAF_LEVELS
    assert tree.LEAF_LEVELS["ptq"] == 0 and tree.LEAF_LEVELS["pcqat"] == 4 and tree.LEAF_LEVELS["pcqat_palette"] == 4
    assert set(tree.QAT_NODES) == {"qat", "pqat", "cqat", "pcqat", "cqat_palette", "pcqat_palette", "thinned_qat",
                                   "thinned_pqat", "thinned_pcqat"}
    for node in tree.NODE_TABLE.values():  # every parent exists and every technique has a stage function
        assert node.parent is None or node.parent in tree.NODE_TABLE
    assert tree.DEFAULT_LEAVES == ("ptq", "qat", "pruned", "pqat", "clustered", "cqat", "pruned_clustered", "pcqat")


def test_inputs_only_layouts_load_as_reconstruction_with_anomaly_labels(tmp_path):
    from edgedeploy.config.data import load_dataset, read_targets

    rng = np.random.default_rng(0)
    x = rng.normal(size=(20, 6)).astype(np.float32)
    split = np.array([0] * 12 + [1] * 8)
    a = tmp_path / "xsplit.npz"
    np.savez(a, x=x, split=split, y_anomaly=np.array([0] * 16 + [1] * 4))
    assert read_targets(a) == (None, True)
    d = load_dataset(a, (6,), 6, kind="reconstruction")
    assert np.array_equal(d.y_eval, d.x_eval) and d.anomaly.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    assert d.describe()["task"] == "reconstruction" and d.describe()["n_fit_unlabelled"] == 0
    b = tmp_path / "traintest.npz"
    np.savez(b, x_train=x[:12], x_test=x[12:])
    assert read_targets(b) == (None, False)
    assert load_dataset(b, (6,), 6, kind="reconstruction").anomaly is None
    bad = tmp_path / "bad.npz"
    np.savez(bad, x=x, split=split, y_anomaly=np.arange(20))
    with pytest.raises(InvalidInputError, match="y_anomaly"):
        load_dataset(bad, (6,), 6, kind="reconstruction")


def test_float_targets_load_as_regression_values(tmp_path):
    from edgedeploy.config.data import load_dataset

    x = np.zeros((10, 4), np.float32)
    path = tmp_path / "r.npz"
    np.savez(path, x=x, y=np.linspace(0, 1, 10).astype(np.float32), split=np.array([0] * 6 + [1] * 4))
    d = load_dataset(path, (4,), 1, kind="regression")
    assert d.y_fit.shape == (6, 1) and d.y_fit.dtype == np.float32 and not d.labelled


def test_a_single_sigmoid_unit_with_labels_is_refused_with_the_fix():
    with pytest.raises(InvalidInputError) as err:
        decide(_model((8,), (1,), "sigmoid"), None, "d.npz", np.array([0, 1, 1, 0]))
    assert "one output unit" in err.value.one_line() and "--loss mean_squared_error" in err.value.one_line()
    assert decide(_model((8,), (1,)), None, "d.npz", np.array([0.5, 1.5]), loss="mse").kind == "regression"


def test_a_user_metric_that_fails_is_one_usage_error():
    from edgedeploy.errors import UsageError
    from edgedeploy.config.task import user_spec

    spec = user_spec("os.path:join")  # join(ndarray, ndarray) raises TypeError
    with pytest.raises(UsageError, match=r"metric 'os.path:join' failed \(TypeError"):
        spec.fn(np.zeros(3), np.zeros(3))
    with pytest.raises(UsageError, match="is not a function"):
        user_spec("os:sep")


USER_METRICS = '''import os
import sys


def exits0(y, out):
    raise SystemExit(0)


def exits3(y, out):
    sys.exit(3)


def interrupts(y, out):
    raise KeyboardInterrupt


def prints(y, out):
    print("scoring", len(y))
    sys.stdout.flush()
    os.write(1, b"descriptor 1\\n")
    return 7.5


def gives_text(y, out):
    return "high"
'''

ENDINGS = [  # (function, words of the one line, or the value returned)
    ("exits0", "metric 'um_{}:exits0' tried to end the command (SystemExit: 0)"),
    ("exits3", "metric 'um_{}:exits3' tried to end the command (SystemExit: 3)"),
    ("interrupts", "metric 'um_{}:interrupts' tried to end the command (KeyboardInterrupt)"),
    ("gives_text", "metric 'um_{}:gives_text' returned str, not a number"),
    ("prints", 7.5),
]


@pytest.mark.parametrize("name, expected", ENDINGS, ids=[c[0] for c in ENDINGS])
def test_a_user_metric_that_ends_the_command_or_prints_is_one_line_and_stdout_stays_clean(
        tmp_path, monkeypatch, capfd, name, expected):
    from edgedeploy.config.task import user_spec

    module = f"um_{name}"  # a module per case: each is imported afresh
    (tmp_path / f"{module}.py").write_text(USER_METRICS)
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = user_spec(f"{module}:{name}")
    if isinstance(expected, float):
        assert spec.fn(np.zeros(3), np.zeros(3)) == expected
        out, err = capfd.readouterr()
        assert out == "" and "scoring 3" in err and "descriptor 1" in err
        return
    with pytest.raises(UsageError) as caught:
        spec.fn(np.zeros(3), np.zeros(3))
    line = caught.value.one_line()
    assert expected.format(name) in line and "\n" not in line, line


LOADS = [  # (module text, words)
    ("import sys\nprint('loading')\nsys.exit(0)\n", "metric 'ul_{}:f' cannot be loaded (SystemExit: 0)"),
    ("raise KeyboardInterrupt\n", "metric 'ul_{}:f' cannot be loaded (KeyboardInterrupt)"),
    ("raise RuntimeError('no model')\n", "metric 'ul_{}:f' cannot be loaded (RuntimeError: no model)"),
]


@pytest.mark.parametrize("text, words", LOADS, ids=["exits", "interrupts", "raises"])
def test_a_user_metric_module_that_ends_while_loading_is_one_line(tmp_path, monkeypatch, capfd, text, words):
    from edgedeploy.config.task import user_spec

    case = str(LOADS.index((text, words)))
    (tmp_path / f"ul_{case}.py").write_text(text + "\ndef f(y, out):\n    return 1.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(UsageError) as caught:
        user_spec(f"ul_{case}:f")
    assert words.format(case) in caught.value.one_line(), caught.value.one_line()
    assert capfd.readouterr().out == ""


def _two_heads(first=("softmax", (4,)), second=("linear", (3,)), inp=(8,)):
    """A model with two outputs, ``class`` and ``box``, as decide() reads it (shapes, names, activations)."""
    layers = {"class": SimpleNamespace(activation=SimpleNamespace(__name__=first[0])),
              "box": SimpleNamespace(activation=SimpleNamespace(__name__=second[0]))}
    return SimpleNamespace(input_shape=(None, *inp), output_shape=[(None, *first[1]), (None, *second[1])],
                           output_names=["class", "box"], get_layer=layers.__getitem__, layers=list(layers.values()))


LABELS, BOXES = np.arange(6) % 4, np.zeros((6, 3), np.float32)


@pytest.mark.parametrize("model, targets, config, kinds, losses", [
    (_two_heads(), [LABELS, BOXES], None, ["classification", "regression"],
     ["sparse_categorical_crossentropy", "mean_squared_error"]),
    (_two_heads(), [LABELS, BOXES], {"loss": ["sparse_categorical_crossentropy", "mae"]},
     ["classification", "regression"], ["sparse_categorical_crossentropy", "mean_absolute_error"]),
    (_two_heads(), [LABELS, BOXES], {"loss": {"box": "huber_loss"}}, ["classification", "regression"],
     ["sparse_categorical_crossentropy", "huber"]),
    (_two_heads(("linear", (8,)), ("linear", (8,))), [None, None], None, ["reconstruction", "reconstruction"],
     ["mean_squared_error", "mean_squared_error"]),
], ids=["inferred", "compiled-list", "compiled-dict", "inputs-only"])
def test_each_output_of_a_model_gets_its_own_task(model, targets, config, kinds, losses):
    task = decide(model, config, "d.npz", targets)
    assert [t.kind for _, t in task.heads()] == kinds and [t.loss for _, t in task.heads()] == losses
    assert [name for name, _ in task.heads()] == ["class", "box"]
    assert task.describe()["outputs"][0]["output"] == "box"
    assert task.metric == ("accuracy" if kinds[0] == "classification" else "mse")


def test_the_loss_and_metric_asked_for_are_the_first_outputs_and_bad_targets_name_their_key():
    task = decide(_two_heads(("linear", (3,)), ("linear", (3,))), None, "d.npz", [BOXES, BOXES], loss="mae",
                  metric="psnr")
    assert (task.loss, task.metric) == ("mean_absolute_error", "psnr")
    assert (task.outputs[0][1].loss, task.outputs[0][1].metric) == ("mean_squared_error", "mse")
    with pytest.raises(InvalidInputError) as err:
        decide(_two_heads(), None, "d.npz", [LABELS, np.zeros((6, 2), np.float32)])
    assert err.value.one_line().startswith("d.npz (output 'box'): targets y_box ([6, 2] float32)")


@pytest.mark.parametrize("arrays, first, second", [
    ({"y": LABELS, "y_box": BOXES}, "y", "y_box"),
    ({"y_class": LABELS, "y_box": BOXES, "y": LABELS + 1}, "y_class", "y_box"),
], ids=["y-for-the-first", "named-first"])
def test_each_output_reads_its_own_targets(arrays, first, second):
    from edgedeploy.config.data import output_arrays

    views = output_arrays("d.npz", {"x": np.zeros((6, 8)), "split": np.zeros(6), **arrays}, ["class", "box"])
    assert views[0]["y"] is arrays[first] and views[1]["y"] is arrays[second]
    assert "x" in views[1] and "split" in views[1]


def test_the_train_test_layout_and_inputs_only_data_for_several_outputs():
    from edgedeploy.config.data import output_arrays

    given = {"x_train": np.zeros((4, 8)), "x_test": np.zeros((2, 8)), "y_train": LABELS[:4], "y_test": LABELS[:2],
             "y_train_box": BOXES[:4], "y_test_box": BOXES[:2]}
    views = output_arrays("d.npz", given, ["class", "box"])
    assert views[1]["y_train"] is given["y_train_box"] and views[1]["y_test"] is given["y_test_box"]
    inputs_only = {"x_train": given["x_train"], "x_test": given["x_test"]}
    assert output_arrays("d.npz", inputs_only, ["class", "box"]) == [inputs_only, inputs_only]


@pytest.mark.parametrize("arrays, missing", [
    ({"x": np.zeros((6, 8)), "split": np.zeros(6), "y": LABELS}, "no 'y_box'"),
    ({"x": np.zeros((6, 8)), "split": np.zeros(6), "y_box": BOXES}, "output 'class' (no 'y_class')"),
    ({"x_train": np.zeros((4, 8)), "x_test": np.zeros((2, 8)), "y_train": LABELS[:4], "y_test": LABELS[:2]},
     "no 'y_train_box' or 'y_test_box'"),
])
def test_a_file_without_every_outputs_targets_stops_naming_the_key_and_the_fix(arrays, missing):
    from edgedeploy.config.data import output_arrays

    with pytest.raises(InvalidInputError) as err:
        output_arrays("d.npz", arrays, ["class", "box"])
    line = err.value.one_line()
    assert line.startswith("d.npz: has no targets for the model's output") and missing in line and ". add y_" in line
