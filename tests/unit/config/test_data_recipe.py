"""Data files and recipes are checked before any training starts (numpy only, no TensorFlow)."""

from __future__ import annotations

import numpy as np
import pytest

from edgedeploy.config.data import load_dataset
from edgedeploy.errors import InvalidInputError, UsageError
from edgedeploy.config.recipe import LEAVES, load_recipe, nodes_for


def _npz(tmp_path, **arrays):
    path = tmp_path / "d.npz"
    np.savez(path, **arrays)
    return path


def test_split_layout(tmp_path):
    x = np.arange(5 * 4, dtype=np.float32).reshape(5, 4, 1)
    path = _npz(tmp_path, x=x, y=np.array([0, 1, 2, 0, 1]), split=np.array([0, 0, 1, 1, 0]),
                labels=np.array(["a", "b", "c"]))
    d = load_dataset(path, (4, 1), 3)
    assert d.layout == "x/y/split" and len(d.x_fit) == 3 and len(d.x_eval) == 2
    assert d.y_eval.tolist() == [2, 0] and d.labels == ["a", "b", "c"]
    assert d.describe()["eval_split"] == "split == 1"


def test_calibration_samples_are_a_seeded_random_choice_not_the_first_ones(tmp_path):
    """Data sets are often sorted by class: the first samples would calibrate on one class only."""
    y = np.repeat(np.arange(10), 100)  # sorted, as the CIFAR-10 and Speech Commands files here are
    x = np.arange(1000, dtype=np.float32).reshape(1000, 1)
    d = load_dataset(_npz(tmp_path, x_train=x, y_train=y, x_test=x[:10], y_test=y[:10]), (1,), 10)
    calib, where = d.calibration(200, seed=3)
    assert len(calib) == 200 and "random" in where and "seed 3" in where
    classes = np.unique(y[calib[:, 0].astype(int)])
    assert len(classes) == 10  # every class, where the first 200 would give two
    again, _ = d.calibration(200, seed=3)
    np.testing.assert_array_equal(calib, again)
    other, _ = d.calibration(200, seed=4)
    assert not np.array_equal(calib, other)
    everything, where = d.calibration(5000, seed=3)
    assert len(everything) == 1000 and where.startswith("all 1000")


def test_train_test_layout_with_uint8_images_and_one_hot_labels(tmp_path):
    path = _npz(tmp_path, x_train=np.zeros((4, 2, 2, 3), np.uint8), y_train=np.eye(3)[[0, 1, 2, 0]],
                x_test=np.ones((2, 2, 2, 3), np.uint8), y_test=np.array([[1], [2]]).ravel())
    d = load_dataset(path, (2, 2, 3), 3)
    assert d.x_fit.dtype == np.float32 and d.y_fit.tolist() == [0, 1, 2, 0]
    assert d.p_fit is None  # one-hot rows are class labels


def test_probability_targets_are_kept_beside_their_arg_max(tmp_path):
    p = np.array([[0.7, 0.2, 0.1], [0.1, 0.3, 0.6], [1.0, 0.0, 0.0], [0.2, 0.5, 0.3]], np.float32)
    path = _npz(tmp_path, x_train=np.zeros((4, 2)), y_train=p, x_test=np.ones((2, 2)), y_test=p[:2])
    d = load_dataset(path, (2,), 3)
    assert d.p_fit is not None and np.array_equal(d.p_fit, p)  # learnt as they are
    assert d.y_fit.tolist() == [0, 2, 0, 1] and d.y_eval.tolist() == [0, 2]  # hold-out strata and accuracy


def test_squeezable_shape_is_reshaped(tmp_path):
    path = _npz(tmp_path, x=np.zeros((2, 49, 10), np.float32), y=np.array([0, 1]), split=np.array([0, 1]))
    d = load_dataset(path, (49, 10, 1), 2)
    assert d.x_fit.shape == (1, 49, 10, 1) and d.reshaped_from == (49, 10)


@pytest.mark.parametrize(
    "arrays,shape,classes,message",
    [
        (dict(x=np.zeros((2, 3)), y=np.array([0, 1]), split=np.array([0, 1])), (4,), 2,
         "samples have shape [3] but the model's input is [4]"),
        (dict(x=np.zeros((2, 4)), y=np.array([0, 7]), split=np.array([0, 1])), (4,), 3,
         "evaluation labels range from 7 to 7 but the model has 3 classes"),
        (dict(x=np.zeros((2, 4)), y=np.array([0, 1]), split=np.array([0, 0])), (4,), 2, "the evaluation split is empty"),
        (dict(x=np.zeros((2, 4)), y=np.array([0, 1]), split=np.array([1, 1])), (4,), 2, "the fine-tune split is empty"),
        (dict(x=np.zeros((2, 4)), y=np.array([0, 1]), split=np.array([0, 2])), (4,), 2, "split has values [2]"),
        (dict(x=np.zeros((2, 4)), y=np.array([0.5, 1.0]), split=np.array([0, 1])), (4,), 2, "must be integer class indices"),
        (dict(images=np.zeros((2, 4))), (4,), 2, "not a layout edgedeploy reads"),
        (dict(x_train=np.zeros((2, 4)), x_test=np.zeros((1, 4))), (4,), 2, "holds inputs only"),
        (dict(x=np.zeros((2, 4)), split=np.array([0, 1])), (4,), 2, "holds inputs only"),
        (dict(x=np.zeros((2, 4)), y=np.array([0, 1]), split=np.array([0, 1]), labels=np.array(["a"])), (4,), 2,
         "'labels' names 1 classes but the model has 2 outputs"),
    ],
)
def test_bad_data(tmp_path, arrays, shape, classes, message):
    path = _npz(tmp_path, **arrays)
    with pytest.raises(InvalidInputError) as err:
        load_dataset(path, shape, classes)
    assert message in err.value.one_line() and str(path) in err.value.one_line()


def test_not_an_npz(tmp_path):
    path = tmp_path / "d.npz"
    path.write_text("hello")
    with pytest.raises(InvalidInputError, match="not a readable .npz"):
        load_dataset(path, (4,), 2)


def test_recipe_file_and_overrides(tmp_path):
    path = tmp_path / "r.toml"
    path.write_text('leaves = ["ptq", "pcqat"]\nsparsity = 0.6\nepochs = 3\n[pruning]\nschedule = "polynomial"\n'
                    '[stages.qat]\nepochs = 1\nlearning_rate = 1e-5\n')
    r = load_recipe(path, {"clusters": 8, "sparsity": None})
    assert r.leaves == ("ptq", "pcqat") and r.sparsity == 0.6 and r.clusters == 8
    assert r.stage("prune").epochs == 3 and r.stage("qat").epochs == 1 and r.stage("qat").learning_rate == 1e-5
    assert r.pruning_schedule == "polynomial"
    # pcqat needs the whole prune -> cluster chain; shared parents come once, parents first
    assert nodes_for(list(r.leaves)) == ["baseline", "pruned", "pruned_clustered", "pcqat"]
    assert nodes_for(list(LEAVES)).index("pruned") < nodes_for(list(LEAVES)).index("pqat")
    # where QAT's activation ranges start changes the QAT nodes only (their cache key), and --plain keeps TFMOT's
    assert r.qat_ranges == "calibrated" and r.node_params("pcqat")["qat_ranges"] == "calibrated"
    assert "qat_ranges" not in r.node_params("pruned_clustered")
    assert load_recipe(path, {"plain": True}).node_params("pcqat")["qat_ranges"] == "tfmot"


@pytest.mark.parametrize(
    "body,message",
    [
        ('leaves = ["ptq", "pqcat"]', "`leaves` has 'pqcat'; allowed values: ptq, qat"),
        ("sparsity = 1.5", "`sparsity` is 1.5"),
        ("clusters = 1", "`clusters` is 1"),
        ('[pruning]\nschedule = "cubic"', "`pruning.schedule` is 'cubic'; allowed values: constant, polynomial"),
        ('[clustering]\ncentroid_init = "kmeans"', "allowed values: kmeans++, linear, density, random"),
        ("[stages.distill]\nepochs = 1", "unknown key `stages.distill`"),
        ("epoch = 3", "unknown key `epoch`"),
        ('[training]\nqat_ranges = "ema"', "`training.qat_ranges` is 'ema'; allowed values: calibrated, tfmot"),
        ('epochs = "three"', "`epochs` is 'three'; it must be an integer"),
        ("thin_candidates = 4", "`thin_candidates` is 4; allowed values: 5, 3, 2"),
    ],
)
def test_bad_recipe_names_file_and_key(tmp_path, body, message):
    path = tmp_path / "r.toml"
    path.write_text(body + "\n")
    with pytest.raises(UsageError) as err:
        load_recipe(path)
    assert message in err.value.one_line() and str(path) in err.value.one_line()


def test_fine_tuning_flags_reach_the_recipe(tmp_path, monkeypatch):
    """Each technique of the default fine-tuning can be turned off from the command line."""
    import importlib

    driver = importlib.import_module("edgedeploy.pipeline.driver")  # every run of a tree goes through driver.run
    from typer.testing import CliRunner

    from edgedeploy.cli.app import app
    from edgedeploy.errors import UsageError

    seen = []

    def capture(plan, runner):
        seen.append(plan.recipe)
        raise UsageError("stop here", "after the recipe was built")

    monkeypatch.setattr(driver, "run", capture)
    args = ["optimize", str(tmp_path / "m.h5"), "--data", str(tmp_path / "d.npz"), "-o", str(tmp_path / "out")]
    off = ["--no-distill", "--pruning-schedule", "constant", "--lr-schedule", "constant", "--train-batch-norm",
           "--validation-fraction", "0"]
    assert CliRunner().invoke(app, args).exit_code == 2
    assert CliRunner().invoke(app, args + off).exit_code == 2
    defaults, plain = seen
    assert (defaults.distill, defaults.pruning_schedule, defaults.lr_schedule, defaults.freeze_batch_norm,
            defaults.validation_fraction) == (True, "polynomial", "cosine", True, 0.1)
    assert (plain.distill, plain.pruning_schedule, plain.lr_schedule, plain.freeze_batch_norm,
            plain.validation_fraction) == (False, "constant", "constant", False, 0.0)
    result = CliRunner().invoke(app, args + ["--pruning-schedule", "cubic"])
    assert result.exit_code == 2 and "pruning.schedule" in result.output and "polynomial" in result.output


def test_error_and_warning_text_is_printed_as_written(tmp_path, monkeypatch):
    """Messages name recipe tables such as [training]; the terminal prints them as they are, not as markup."""
    import importlib

    driver = importlib.import_module("edgedeploy.pipeline.driver")  # every run of a tree goes through driver.run
    from typer.testing import CliRunner

    from edgedeploy.cli.app import app
    from edgedeploy.errors import UsageError

    def fail(*args, **kwargs):
        raise UsageError("set [training] qat_ranges", 'e.g. [training] qat_ranges = "calibrated" [/]')

    monkeypatch.setattr(driver, "run", fail)
    result = CliRunner().invoke(app, ["optimize", str(tmp_path / "m.h5"), "--data", str(tmp_path / "d.npz")])
    assert result.exit_code == 2
    assert 'set [training] qat_ranges. e.g. [training] qat_ranges = "calibrated" [/]' in " ".join(result.output.split())


def test_the_evaluation_set_is_named_by_its_clips_and_classes_whatever_the_features(tmp_path):
    rng = np.random.default_rng(0)
    files = np.array([f"clip{i}.wav" for i in range(8)])
    names = np.array(["yes", "no"])
    y = np.array([0, 1] * 4)
    split = np.array([0, 1] * 4)
    np.savez(tmp_path / "a.npz", x=rng.normal(size=(8, 4)).astype(np.float32), y=y, split=split, labels=names,
             files=files)
    # the same clips through another front end, the classes stored in the other order
    np.savez(tmp_path / "b.npz", x=rng.normal(size=(8, 2, 3)).astype(np.float32), y=1 - y, split=split,
             labels=names[::-1], files=files)
    np.savez(tmp_path / "c.npz", x=rng.normal(size=(8, 4)).astype(np.float32), y=1 - y, split=split, labels=names,
             files=files)  # the same clips with other classes
    a = load_dataset(tmp_path / "a.npz", (4,), 2)
    b = load_dataset(tmp_path / "b.npz", (2, 3), 2)
    c = load_dataset(tmp_path / "c.npz", (4,), 2)
    assert a.eval_set and a.eval_set == b.eval_set != c.eval_set and a.sha256 != b.sha256
    np.savez(tmp_path / "d.npz", x=rng.normal(size=(8, 4)).astype(np.float32), y=y, split=split)
    assert load_dataset(tmp_path / "d.npz", (4,), 2).eval_set is None  # no clip names: the file itself tells
