"""The fine-tuning loop on small real Keras/TFMOT models: distillation loss, best-epoch restore, early stop,
frozen batch norm, pruning schedule eligibility and cluster-preserving QAT kernels (seconds each)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edgedeploy.config.data import Dataset
from edgedeploy.config.recipe import load_recipe

SEED = 5


@pytest.fixture(scope="module")
def env():
    from edgedeploy.keras import tfenv

    return tfenv.load()


def _dataset(n=360, classes=3, dim=8, seed=SEED) -> Dataset:
    rng = np.random.default_rng(seed)
    centres = rng.normal(scale=2.0, size=(classes, dim))
    y = rng.integers(0, classes, size=n)
    x = (centres[y] + rng.normal(size=(n, dim))).astype(np.float32)
    return Dataset(path=Path("synthetic.npz"), layout="x/y/split", x_fit=x, y_fit=y.astype(np.int64),
                   x_eval=x[:10], y_eval=y[:10].astype(np.int64), labels=None, sha256="0")


def _model(env, dim=8, classes=3, bn=True):
    keras = env.keras
    keras.utils.set_random_seed(SEED)
    inp = keras.Input((dim,))
    x = keras.layers.Dense(32, name="hidden")(inp)
    if bn:
        x = keras.layers.BatchNormalization(name="bn")(x)
    x = keras.layers.Activation("relu")(x)
    out = keras.layers.Dense(classes, activation="softmax", name="head")(x)
    return keras.Model(inp, out)


def _loss():
    from edgedeploy.config.task import Task

    return Task("sparse_categorical_crossentropy", False, "test")


# --------------------------------------------------------------------------- distillation loss


def _hand_loss(labels, student_logits, teacher_logits, t, w):
    def softmax(z):
        e = np.exp(z - z.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    p = softmax(student_logits)
    total = 0.0
    for i, label in enumerate(labels):
        ce = -np.log(p[i, label]) if label >= 0 else 0.0
        q_t = softmax(teacher_logits[i : i + 1] / t)[0]
        q_s = softmax(student_logits[i : i + 1] / t)[0]
        kl = float(np.sum(q_t * (np.log(q_t) - np.log(q_s))))
        total += w * ce + (1 - w) * t * t * kl
    return total / len(labels)


@pytest.mark.parametrize("from_logits", [False, True])
def test_distillation_loss_matches_a_hand_computation(env, from_logits):
    from edgedeploy.optimize.finetune.loop import distillation_loss, log_probs, pack_targets

    rng = np.random.default_rng(0)
    student = rng.normal(scale=3.0, size=(5, 4))
    teacher = rng.normal(scale=3.0, size=(5, 4))
    labels = np.array([0, 3, -1, 1, 2])  # one unlabelled sample: distillation only
    t, w = 3.0, 0.4
    expected = _hand_loss(labels, student, teacher, t, w)
    probs = np.exp(student) / np.exp(student).sum(axis=1, keepdims=True)
    y_pred = student if from_logits else probs
    # soft targets are the teacher's log-probabilities, as optimize computes them from a softmax output
    teacher_probs = np.exp(teacher) / np.exp(teacher).sum(axis=1, keepdims=True)
    packed = pack_targets(labels, log_probs(teacher_probs, from_logits=False), 4)
    fn = distillation_loss(env.tf, temperature=t, label_weight=w, from_logits=from_logits)
    got = float(fn(env.tf.constant(packed), env.tf.constant(y_pred, dtype=env.tf.float32)))
    assert got == pytest.approx(expected, rel=1e-4)
    # without distillation only the labelled cross-entropy is left
    ce_only = float(distillation_loss(env.tf, temperature=t, label_weight=w, from_logits=from_logits,
                                      distill=False)(packed, env.tf.constant(y_pred, dtype=env.tf.float32)))
    assert ce_only == pytest.approx(_hand_loss(labels, student, teacher, t, 1.0), rel=1e-4)


@pytest.mark.parametrize("from_logits", [False, True])
def test_distillation_loss_on_probability_targets_matches_a_hand_computation(env, from_logits):
    from edgedeploy.optimize.finetune.loop import distillation_loss, log_probs

    rng = np.random.default_rng(1)
    student, teacher = rng.normal(scale=3.0, size=(5, 4)), rng.normal(scale=3.0, size=(5, 4))
    target = rng.dirichlet(np.ones(4), size=5)
    t, w = 3.0, 0.4
    q = np.exp(student) / np.exp(student).sum(axis=1, keepdims=True)
    ce = -np.sum(target * np.log(q), axis=1)
    kl = np.array([_hand_loss([0], student[i:i + 1], teacher[i:i + 1], t, 0.0) for i in range(5)])
    expected = float(np.mean(w * ce + (1 - w) * kl))
    teacher_probs = np.exp(teacher) / np.exp(teacher).sum(axis=1, keepdims=True)
    packed = np.concatenate([target, log_probs(teacher_probs, from_logits=False)], axis=1).astype(np.float32)
    fn = distillation_loss(env.tf, temperature=t, label_weight=w, from_logits=from_logits, probabilities=4)
    got = float(fn(env.tf.constant(packed), env.tf.constant(student if from_logits else q, dtype=env.tf.float32)))
    assert got == pytest.approx(expected, rel=1e-4)


# The default run takes the plain cross-entropy on the probabilities; with distillation (the same fit, its loss the
# one test_distillation_loss_on_probability_targets_matches_a_hand_computation checks) runs with -m slow.
@pytest.mark.parametrize("distill", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_probability_targets_are_learnt_as_probabilities_not_as_their_arg_max(env, distill):
    """Two clusters whose targets are the distributions [0.7, 0.2, 0.1] and [0.1, 0.3, 0.6]: cross-entropy on the
    probabilities makes the model predict them; trained on the arg max it would push towards 1.0."""
    from edgedeploy.optimize import fine_tune as _fit

    rng = np.random.default_rng(SEED)
    dists = np.array([[0.7, 0.2, 0.1], [0.1, 0.3, 0.6]], np.float32)
    which = rng.integers(0, 2, size=400)
    x = (np.array([[3.0] * 8, [-3.0] * 8])[which] + rng.normal(scale=0.5, size=(400, 8))).astype(np.float32)
    p = dists[which]
    data = Dataset(path=Path("synthetic.npz"), layout="x/y/split", x_fit=x, y_fit=p.argmax(1).astype(np.int64),
                   x_eval=x[:20], y_eval=p[:20].argmax(1).astype(np.int64), labels=None, sha256="0", p_fit=p)
    model = _model(env, bn=False)
    if distill:  # a teacher that predicts the distributions (its log-probabilities): both terms pull one way
        data.soft_targets = np.log(p)
    # 8 epochs bring the mean outputs within 0.01 of the distributions; trained on the arg max they end 0.3 off
    recipe = load_recipe(overrides={"epochs": 8, "learning_rate": 1e-2, "batch_size": 32, "seed": SEED},
                         table={"distillation": {"enabled": distill, "label_weight": 0.9}})
    report = _fit(env, model, data, recipe, "qat", _loss(), "t")
    out = model.predict(x, verbose=0)
    for k in (0, 1):
        assert np.abs(out[which == k].mean(axis=0) - dists[k]).max() < 0.08, (k, out[which == k].mean(axis=0))
    assert report["targets"].startswith("probability rows") and report["selection"]["best_val_accuracy"] == 100.0


# --------------------------------------------------------------------------- best epoch, early stop


class _Sabotage:
    """From epoch ``start`` on, scrambles the weights at the end of each epoch (before the hold-out is scored),
    and keeps a copy of the weights the hold-out then sees."""

    def __init__(self, keras, start: int):
        self.seen: dict[int, list[np.ndarray]] = {}
        outer = self

        class CB(keras.callbacks.Callback):
            def on_epoch_end(self, epoch, logs=None):
                if epoch + 1 >= start:
                    rng = np.random.default_rng(epoch)
                    self.model.set_weights([w + rng.normal(scale=3.0, size=w.shape).astype(w.dtype) if w.ndim == 2
                                            else w for w in self.model.get_weights()])  # kernels only
                outer.seen[epoch + 1] = [w.copy() for w in self.model.get_weights()]

        self.callback = CB()


def _same(a, b) -> bool:
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


# The default run takes the default metric, loss; accuracy (the same restore, the Selector's other comparison, which
# tests/unit/optimize/test_finetune.py checks) runs with -m slow.
@pytest.mark.parametrize("metric", ["loss", pytest.param("accuracy", marks=pytest.mark.slow)])
def test_the_best_epoch_is_restored(env, metric):
    from edgedeploy.optimize import fine_tune as _fit

    data = _dataset()
    model = _model(env)
    recipe = load_recipe(overrides={"epochs": 5, "learning_rate": 1e-2, "batch_size": 32, "seed": SEED},
                         table={"distillation": {"enabled": False},
                                "selection": {"patience": 0, "metric": metric}})
    sabotage = _Sabotage(env.keras, start=3)
    report = _fit(env, model, data, recipe, "qat", _loss(), "t", callbacks=[sabotage.callback])
    best = report["selection"]["best_epoch"]
    assert best in (1, 2), report["curve"]  # the scrambled epochs score worse on the hold-out
    assert _same(model.get_weights(), sabotage.seen[best])
    assert not _same(model.get_weights(), sabotage.seen[5])
    assert report["epochs_run"] == 5 and report["selection"]["restored_best"]
    assert [row["epoch"] for row in report["curve"]] == [1, 2, 3, 4, 5]
    # hold-out: 10% of the fine-tune samples, stratified; never the evaluation split
    assert report["validation_samples"] == 36 and report["train_samples"] == 324


def test_without_restore_the_last_epoch_stays_and_patience_stops_early(env):
    from edgedeploy.optimize import fine_tune as _fit

    data = _dataset()
    model = _model(env)
    recipe = load_recipe(overrides={"epochs": 6, "learning_rate": 1e-2, "batch_size": 32, "seed": SEED},
                         table={"distillation": {"enabled": False},
                                "selection": {"patience": 2, "restore_best": False}})
    sabotage = _Sabotage(env.keras, start=3)
    report = _fit(env, model, data, recipe, "qat", _loss(), "t", callbacks=[sabotage.callback])
    assert report["selection"]["stopped_early"] and report["epochs_run"] == 4
    assert _same(model.get_weights(), sabotage.seen[4]) and not report["selection"]["restored_best"]


# --------------------------------------------------------------------------- batch norm, distillation


def test_frozen_batch_norm_keeps_its_statistics_and_is_unfrozen_after(env):
    from edgedeploy.optimize import fine_tune as _fit

    data = _dataset()
    for freeze in (True, False):
        model = _model(env)
        bn = model.get_layer("bn")
        before = [w.copy() for w in bn.get_weights()]
        recipe = load_recipe(overrides={"epochs": 2, "learning_rate": 1e-2, "seed": SEED},
                             table={"training": {"freeze_batch_norm": freeze}})
        report = _fit(env, model, data, recipe, "qat", _loss(), "t")
        after = bn.get_weights()
        assert _same(before, after) == freeze, report["batch_norm"]
        assert bn.trainable  # the saved model is left as it came
        assert ("frozen" in report["batch_norm"]) == freeze


def test_distillation_follows_the_teacher(env):
    """With only unlabelled samples and soft targets from a teacher, the student learns the teacher's answers."""
    from edgedeploy.optimize import fine_tune as _fit, teacher_targets

    data = _dataset(n=600)
    keras = env.keras
    teacher = _model(env, bn=False)
    teacher.compile(optimizer=keras.optimizers.Adam(1e-2), loss="sparse_categorical_crossentropy")
    teacher.fit(data.x_fit, data.y_fit, epochs=5, batch_size=32, verbose=0)  # (the student is judged on its answers)
    teacher_answers = teacher.predict(data.x_fit, verbose=0).argmax(1)
    data.soft_targets = teacher_targets(teacher, data.x_fit, from_logits=False)
    data.y_fit = np.full_like(data.y_fit, -1)  # no labels at all
    student = _model(env, bn=False)
    student.get_layer("head").set_weights([w * 0 for w in student.get_layer("head").get_weights()])
    recipe = load_recipe(overrides={"epochs": 15, "learning_rate": 1e-2, "batch_size": 32, "seed": SEED},
                         table={"selection": {"validation_fraction": 0}})
    report = _fit(env, student, data, recipe, "qat", _loss(), "t")
    agree = float(np.mean(student.predict(data.x_fit, verbose=0).argmax(1) == teacher_answers))
    assert report["unlabelled_samples"] == 600 and report["distillation"]["temperature"] == 4.0
    assert agree > 0.9
    # the plain recipe cannot use unlabelled samples
    from edgedeploy.errors import InvalidInputError

    with pytest.raises(InvalidInputError, match="no fine-tune sample is left"):
        _fit(env, _model(env, bn=False), data, load_recipe(overrides={"plain": True, "epochs": 1}), "qat", _loss(), "t")


# --------------------------------------------------------------------------- pruning and clustering


def test_polynomial_pruning_selects_only_epochs_at_the_target(env):
    from edgedeploy.optimize import prune

    data = _dataset()
    recipe = load_recipe(overrides={"epochs": 4, "learning_rate": 1e-3, "batch_size": 32, "seed": SEED,
                                    "sparsity": 0.5}, table={"selection": {"patience": 0}})
    record: dict = {}
    pruned = prune(env, _model(env), data, recipe, _loss(), record=record)
    plan = record["pruning"]
    eligible = [row["epoch"] for row in record["curve"] if row["eligible"]]
    assert eligible == list(range(plan["target_reached_after_epoch"], 5)) and 1 < eligible[0] <= 4
    assert record["selection"]["best_epoch"] in eligible
    for layer in ("hidden", "head"):
        kernel = pruned.get_layer(layer).get_weights()[0]
        assert np.mean(kernel == 0) >= 0.49, layer


def test_cluster_preserving_qat_kernels_hold_only_centroids(env):
    """Even with a large learning rate, the CQAT kernels end with at most `clusters` distinct values."""
    from edgedeploy.optimize import cluster, qat_model, settle_cluster_weights, fine_tune as _fit

    data = _dataset()
    recipe = load_recipe(overrides={"epochs": 1, "learning_rate": 1e-2, "batch_size": 32, "seed": SEED,
                                    "clusters": 4}, table={"selection": {"validation_fraction": 0}})
    clustered = cluster(env, _model(env), data, recipe, _loss(), preserve_sparsity=False)
    model = qat_model(env, clustered, "cqat")
    _fit(env, model, data, recipe, "qat", _loss(), "cqat")

    def distinct():
        return {l.name: len(np.unique(w.numpy())) for l in model.layers for w in l.weights
                if w.name.endswith("/kernel:0")}

    assert settle_cluster_weights(model) == 2
    assert all(n <= 4 for n in distinct().values()), distinct()


# --------------------------------------------------------------------------- one trace of the training step


# The default run takes the model with a batch norm (its moving statistics beside the trained variables); the one
# without, the same code path with fewer variables, runs with -m slow.
@pytest.mark.parametrize("bn", [True, pytest.param(False, marks=pytest.mark.slow)])
def test_variables_made_before_fit_trace_the_step_once_and_train_the_same_weights(env, bn):
    """The optimizer's slots and the loss's and metrics' variables made before ``fit`` (as fine-tuning does): the
    training step is traced once instead of twice, and the weights after training are bit for bit those of a fit
    that made them in its first step."""
    from edgedeploy.optimize.finetune.fit import _build_step_variables

    data = _dataset()
    trained = []
    for prebuilt in (False, True):
        model = _model(env, bn=bn)
        optimizer = env.keras.optimizers.Adam(1e-2)
        model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy", metrics=["accuracy"])
        if prebuilt:
            _build_step_variables(model, optimizer, data.y_fit)
        env.keras.utils.set_random_seed(SEED)
        model.fit(data.x_fit, data.y_fit, batch_size=64, epochs=2, shuffle=True, verbose=0)
        assert model.train_function.experimental_get_tracing_count() == (1 if prebuilt else 2)
        trained.append(model.get_weights())
    for lazy, early in zip(*trained):
        np.testing.assert_array_equal(lazy, early)
